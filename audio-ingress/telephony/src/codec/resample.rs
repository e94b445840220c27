//! 8 kHz ↔ 16 kHz by a fixed 2:1 half-band FIR (Kaiser-windowed sinc), polyphase.
//!
//! The filter `h` (at 16 kHz, length `4·HALF_TAPS − 1`) is a half-band low-pass: its
//! centre tap is ½ and every other tap beside it is zero, so only the `2·HALF_TAPS` odd
//! taps cost anything. Both directions use the same interpolator `g` (the odd taps,
//! doubled, summing to 1), which estimates the sample half-way between the middle two
//! of its `2·HALF_TAPS` inputs:
//!
//! - up: output `2k` is input `k − HALF_TAPS` (exactly), output `2k + 1` is `g` over the
//!   inputs `k − 2·HALF_TAPS + 1 ..= k` — a delay of [`Upsampler2x::DELAY_OUT_SAMPLES`]
//!   (`2·HALF_TAPS`) samples at 16 kHz;
//! - down: output `m` is ½ (even input `2m − 2·HALF_TAPS` + `g` over the odd inputs
//!   around it) — a delay of [`Downsampler2x::DELAY_OUT_SAMPLES`] (`HALF_TAPS`) samples
//!   at 8 kHz.
//!
//! Invariants: unit gain at DC in both directions (`g` is normalised to sum 1); the
//! state is a fixed-size history, so `process` allocates nothing beyond `out`'s growth
//! and the output does not depend on how a stream is cut into calls; samples are i16 at
//! the edges, f32 inside (`LANES` outputs are computed side by side so the compiler
//! vectorises the taps' loop), saturated and rounded to nearest (ties to even) on the way
//! out. The coefficients are computed once, in f64, on first use; the tests measure
//! the response of the f32 taps actually used (ripple 0.045 dB to 3.4 kHz, 45.8 dB from
//! 4.6 kHz).

use std::sync::LazyLock;

/// Pairs of non-zero odd taps on each side of the centre (the interpolator has twice as
/// many). 10 gives a 39-tap half-band filter, 1.25 ms of delay each way, 45.8 dB from
/// 4.6 kHz: already below G.711's own quantisation noise (its SNR is about 38 dB), so
/// longer filters (47 taps: 53.6 dB; 63: 65 dB) bought nothing audible for 20–60 %
/// more CPU per chunk, the door's largest cost per frame.
const HALF_TAPS: usize = 10;
/// The Kaiser window's β, which sets the stopband attenuation A (β ≈ 0.1102·(A − 8.7));
/// 4.0 measures 45.8 dB from 4.6 kHz with these 39 taps (3.5: 41.5 dB; 4.5: 45.9 dB
/// with a wider transition band).
const KAISER_BETA: f64 = 4.0;
/// Outputs computed side by side (one AVX register, two SSE ones, of f32).
const LANES: usize = 8;
/// The history (and interpolator) length: `2·HALF_TAPS`.
const WINDOW: usize = 2 * HALF_TAPS;

static TAPS: LazyLock<[f32; WINDOW]> = LazyLock::new(design);
/// The interpolator's distinct coefficients, innermost pair first: `HALF[i]` weighs the
/// inputs `HALF_TAPS − 1 − i` and `HALF_TAPS + i` of a window.
static HALF: LazyLock<[f32; HALF_TAPS]> =
    LazyLock::new(|| std::array::from_fn(|i| TAPS[HALF_TAPS + i]));

/// The interpolator `g`, as used: `WINDOW` f32 coefficients, oldest input first, the
/// `2·HALF_TAPS` non-zero ones at the end, symmetric, summing to 1 (in f64).
#[cfg(test)]
pub(crate) fn taps() -> &'static [f32; WINDOW] {
    &TAPS
}

fn design() -> [f32; WINDOW] {
    // h[n], n = 0..len, centre M = 2·HALF_TAPS − 1; odd offsets t = ±1, ±3, … carry
    // 0.5·sinc(t/2)·kaiser(n). The interpolator's taps are 2·h at those offsets.
    let len = 4 * HALF_TAPS - 1;
    let centre = (len - 1) as f64 / 2.0;
    let i0_beta = bessel_i0(KAISER_BETA);
    let mut half = [0f64; HALF_TAPS]; // half[i] for offset 2i + 1
    for (i, c) in half.iter_mut().enumerate() {
        let t = (2 * i + 1) as f64;
        let x = t / 2.0 * std::f64::consts::PI;
        let sinc = x.sin() / x;
        let r = t / centre; // position in the window, 0 at the centre, ±1 at the ends
        let window = bessel_i0(KAISER_BETA * (1.0 - r * r).max(0.0).sqrt()) / i0_beta;
        *c = sinc * window; // = 2·h(t)
    }
    let sum: f64 = 2.0 * half.iter().sum::<f64>();
    let mut taps = [0f32; WINDOW];
    // Window position j (oldest first) of the newest 2·HALF_TAPS inputs: the two middle
    // ones are offsets ±1 from the half-way point, the ends ±(2·HALF_TAPS − 1).
    let first = WINDOW - 2 * HALF_TAPS;
    for (i, c) in half.iter().enumerate() {
        let c = (c / sum) as f32;
        taps[first + HALF_TAPS - 1 - i] = c;
        taps[first + HALF_TAPS + i] = c;
    }
    taps
}

/// The modified Bessel function of the first kind, order 0 (power series; converges
/// fast for the β used here, bounded at 64 terms).
fn bessel_i0(x: f64) -> f64 {
    let q = x * x / 4.0;
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..64 {
        term *= q / (k * k) as f64;
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    sum
}

/// Inputs taken per block (a multiple of `LANES`): the block and the history sit in one
/// stack buffer, so each output's window is a contiguous slice.
const BLOCK: usize = 64;

/// `LANES` consecutive outputs of the interpolator: `out[l] = Σ_j taps[j]·buf[l + j]`,
/// computed from the symmetry as `Σ_i HALF[i]·(buf[l + HALF_TAPS − 1 − i] +
/// buf[l + HALF_TAPS + i])`: one multiply per pair of taps. One coefficient times `LANES`
/// neighbouring pairs per step: the compiler vectorises the inner loop, and each output's
/// sum runs in the same order wherever its block starts.
#[inline]
fn interpolate_lanes(half: &[f32; HALF_TAPS], buf: &[f32]) -> [f32; LANES] {
    let mut acc = [0f32; LANES];
    let buf = &buf[..WINDOW + LANES - 1];
    for (i, &c) in half.iter().enumerate() {
        let older = &buf[HALF_TAPS - 1 - i..][..LANES];
        let newer = &buf[HALF_TAPS + i..][..LANES];
        for ((a, &x), &y) in acc.iter_mut().zip(older).zip(newer) {
            *a += c * (x + y);
        }
    }
    acc
}

/// Saturates to i16 and rounds to the nearest integer (ties to even) by the float's own
/// rounding: adding 1.5 · 2^23 leaves the integer in the mantissa's low bits. Integer
/// operations only after the clamp, so the conversion loops vectorise (a saturating
/// float-to-int cast stays scalar, and it was a third of the decoder's time).
#[inline]
fn to_i16(v: f32) -> i16 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    let c = v.clamp(-32768.0, 32767.0);
    ((c + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32) as i16
}

/// 8 kHz → 16 kHz, stateful across calls (one stream's history).
#[derive(Debug, Clone)]
pub struct Upsampler2x {
    /// The last `WINDOW − 1` inputs, oldest first.
    history: [f32; WINDOW - 1],
    half: &'static [f32; HALF_TAPS],
}

impl Default for Upsampler2x {
    fn default() -> Self {
        Self::new()
    }
}

impl Upsampler2x {
    /// The delay at 16 kHz: output `DELAY_OUT_SAMPLES + 2k` is input `k` (1.25 ms).
    pub const DELAY_OUT_SAMPLES: usize = 2 * HALF_TAPS;

    /// A resampler with a silent history.
    pub fn new() -> Self {
        Self {
            history: [0.0; WINDOW - 1],
            half: &HALF,
        }
    }

    /// Appends exactly `2 * input.len()` samples at 16 kHz to `out`.
    pub fn process(&mut self, input: &[i16], out: &mut Vec<i16>) {
        self.process_iter(input.iter().copied(), out);
    }

    /// [`process`](Self::process) over any source of 8 kHz samples (the decoder feeds
    /// expanded G.711 codes without an intermediate buffer).
    #[inline]
    pub(crate) fn process_iter(
        &mut self,
        mut input: impl Iterator<Item = i16>,
        out: &mut Vec<i16>,
    ) {
        out.reserve(2 * input.size_hint().0);
        // buf = history ++ this block's inputs; input k's window is buf[k..k + WINDOW].
        let mut buf = [0f32; WINDOW - 1 + BLOCK];
        buf[..WINDOW - 1].copy_from_slice(&self.history);
        loop {
            let mut n = 0;
            for (slot, x) in buf[WINDOW - 1..].iter_mut().zip(input.by_ref()) {
                *slot = f32::from(x);
                n += 1;
            }
            if n == 0 {
                break;
            }
            let mut odd = [0f32; BLOCK];
            for (group, start) in odd.chunks_exact_mut(LANES).zip((0..n).step_by(LANES)) {
                group.copy_from_slice(&interpolate_lanes(self.half, &buf[start..]));
            }
            // Interleaved in f32 first, then converted slice to slice, a loop the
            // compiler vectorises (converting pair by pair stayed scalar).
            let mut both = [0f32; 2 * BLOCK];
            let even = &buf[WINDOW - 1 - HALF_TAPS..];
            for ((pair, &e), &o) in both.chunks_exact_mut(2).zip(even).zip(&odd) {
                pair[0] = e;
                pair[1] = o;
            }
            let start = out.len();
            out.resize(start + 2 * n, 0);
            for (o, &v) in out[start..].iter_mut().zip(&both[..2 * n]) {
                *o = to_i16(v);
            }
            buf.copy_within(n..n + WINDOW - 1, 0);
        }
        self.history.copy_from_slice(&buf[..WINDOW - 1]);
    }

    /// Forgets the history (after a gap in the stream): the next call starts from silence.
    pub fn reset(&mut self) {
        self.history = [0.0; WINDOW - 1];
    }
}

/// 16 kHz → 8 kHz, stateful across calls (the outbound stream), the same half-band
/// low-pass before dropping every other sample.
#[derive(Debug, Clone)]
pub struct Downsampler2x {
    /// The last `HALF_TAPS` even-numbered inputs (the centre taps' samples), oldest first.
    even: [f32; HALF_TAPS],
    /// The last `WINDOW` odd-numbered inputs (the interpolator's), oldest first.
    odd: [f32; WINDOW],
    /// The even sample of a pair whose odd one has not arrived yet.
    pending: Option<i16>,
    half: &'static [f32; HALF_TAPS],
}

impl Default for Downsampler2x {
    fn default() -> Self {
        Self::new()
    }
}

impl Downsampler2x {
    /// The delay at 8 kHz: output `DELAY_OUT_SAMPLES + k` is (the low-passed) input `2k`
    /// (1.25 ms).
    pub const DELAY_OUT_SAMPLES: usize = HALF_TAPS;

    /// A resampler with a silent history.
    pub fn new() -> Self {
        Self {
            even: [0.0; HALF_TAPS],
            odd: [0.0; WINDOW],
            pending: None,
            half: &HALF,
        }
    }

    /// Appends one 8 kHz sample per whole pair of 16 kHz samples to `out`:
    /// `input.len() / 2`, one more or less when a previous call left an odd sample, which
    /// is kept (one at most) for the next call.
    pub fn process(&mut self, input: &[i16], out: &mut Vec<i16>) {
        out.reserve(input.len() / 2 + 1);
        self.process_with(input, |s| out.push(s));
    }

    /// [`process`](Self::process), handing each 8 kHz sample to `emit` (the encoder
    /// compresses it straight into its payload).
    #[inline]
    pub(crate) fn process_with(&mut self, input: &[i16], mut emit: impl FnMut(i16)) {
        let mut rest = input;
        let mut first = None;
        if let Some(even) = self.pending.take() {
            match input.split_first() {
                Some((&odd, tail)) => {
                    first = Some((even, odd));
                    rest = tail;
                }
                None => self.pending = Some(even),
            }
        }
        let pairs = rest.chunks_exact(2);
        if let [last] = pairs.remainder() {
            self.pending = Some(*last);
        }
        let mut pairs = first.into_iter().chain(pairs.map(|p| (p[0], p[1])));
        // Output m of a block: ½·(evens[m] + the interpolator over odds[m..m + WINDOW]),
        // i.e. even input m − HALF_TAPS and the odd inputs m − WINDOW ..= m − 1.
        let mut evens = [0f32; HALF_TAPS + BLOCK];
        let mut odds = [0f32; WINDOW + BLOCK];
        evens[..HALF_TAPS].copy_from_slice(&self.even);
        odds[..WINDOW].copy_from_slice(&self.odd);
        loop {
            let mut n = 0;
            let slots = evens[HALF_TAPS..].iter_mut().zip(&mut odds[WINDOW..]);
            for ((e, o), (even, odd)) in slots.zip(pairs.by_ref()) {
                (*e, *o) = (f32::from(even), f32::from(odd));
                n += 1;
            }
            if n == 0 {
                break;
            }
            for start in (0..n).step_by(LANES) {
                let interpolated = interpolate_lanes(self.half, &odds[start..]);
                let centres = &evens[start..start + LANES];
                for (&c, &i) in centres.iter().zip(&interpolated).take(n - start) {
                    emit(to_i16(0.5 * (c + i)));
                }
            }
            evens.copy_within(n..n + HALF_TAPS, 0);
            odds.copy_within(n..n + WINDOW, 0);
        }
        self.even.copy_from_slice(&evens[..HALF_TAPS]);
        self.odd.copy_from_slice(&odds[..WINDOW]);
    }

    /// Forgets the history and any pending odd sample.
    pub fn reset(&mut self) {
        *self = Self::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::PI;

    /// |H(f)| of the 16 kHz half-band filter h (centre ½, odd offsets ±(2i+1): g_i / 2),
    /// from the f32 taps actually used.
    fn response(f_hz: f64) -> f64 {
        let g = &taps()[WINDOW - 2 * HALF_TAPS..];
        let w = 2.0 * PI * f_hz / 16_000.0;
        // g[HALF_TAPS + i] belongs to offset 2i + 1 (both sides).
        let odd: f64 = (0..HALF_TAPS)
            .map(|i| f64::from(g[HALF_TAPS + i]) * (w * (2 * i + 1) as f64).cos())
            .sum();
        (0.5 + odd).abs()
    }

    fn db(x: f64) -> f64 {
        20.0 * x.log10()
    }

    /// Passband flat to 3.4 kHz (±0.1 dB, measured far less), ≥ 45 dB from 4.6 kHz (above
    /// G.711's own SNR of about 38 dB).
    #[test]
    fn filter_meets_the_mask() {
        let (mut ripple, mut stop) = (0f64, f64::INFINITY);
        for k in 0..=1600 {
            let f = k as f64 * 5.0; // 0..=8000 Hz in 5 Hz steps
            let h = response(f);
            if f <= 3400.0 {
                ripple = ripple.max(db(h).abs());
            }
            if f >= 4600.0 {
                stop = stop.min(-db(h));
            }
        }
        let sum: f32 = taps().iter().sum();
        println!("passband ripple {ripple:.4} dB, stopband {stop:.1} dB, taps sum {sum}");
        assert!(ripple < 0.1, "passband ripple {ripple} dB");
        assert!(stop >= 45.0, "stopband attenuation {stop} dB");
        assert!((sum - 1.0).abs() < 1e-5, "interpolator sum {sum}");
        assert!(
            (db(response(4000.0)) + 6.02).abs() < 0.01,
            "half-band at fs/4"
        );
    }

    #[test]
    fn taps_are_symmetric() {
        let t = taps();
        let g = &t[WINDOW - 2 * HALF_TAPS..];
        for i in 0..g.len() {
            assert_eq!(g[i], g[g.len() - 1 - i]);
        }
        assert!(t[..WINDOW - 2 * HALF_TAPS].iter().all(|&c| c == 0.0));
    }
}
