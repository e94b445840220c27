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
//! the edges, f32 inside (the dot product runs in `LANES` independent accumulators so
//! the compiler can vectorise it), rounded half away from zero and saturated on the way
//! out. The coefficients are computed once (in f64, [`taps`]).

use std::sync::LazyLock;

/// Pairs of non-zero odd taps on each side of the centre (the interpolator has twice as
/// many). 16 gives a 63-tap half-band filter, 2 ms of delay each way.
const HALF_TAPS: usize = 16;
/// The Kaiser window's β: sets the stopband attenuation (≈ 0.1102·(A − 8.7) dB).
const KAISER_BETA: f64 = 6.0;
/// Independent accumulators in the dot product (one AVX register of f32).
const LANES: usize = 8;
/// The history (and interpolator) length: `2·HALF_TAPS` rounded up to whole lanes; the
/// oldest positions carry zero coefficients.
const WINDOW: usize = (2 * HALF_TAPS).div_ceil(LANES) * LANES;

static TAPS: LazyLock<[f32; WINDOW]> = LazyLock::new(design);

/// The interpolator `g`, as used: `WINDOW` f32 coefficients, oldest input first, the
/// `2·HALF_TAPS` non-zero ones at the end, symmetric, summing to 1 (in f64).
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

/// The last `WINDOW` samples, stored twice so that they are always one contiguous slice.
#[derive(Debug, Clone)]
struct History {
    buf: [f32; 2 * WINDOW],
    /// Where the next sample goes; the window starts here (oldest first).
    pos: usize,
}

impl History {
    const fn new() -> Self {
        Self {
            buf: [0.0; 2 * WINDOW],
            pos: 0,
        }
    }

    #[inline]
    fn push(&mut self, sample: i16) {
        let s = f32::from(sample);
        self.buf[self.pos] = s;
        self.buf[self.pos + WINDOW] = s;
        self.pos = if self.pos + 1 == WINDOW {
            0
        } else {
            self.pos + 1
        };
    }

    /// The last `WINDOW` samples, oldest first.
    #[inline]
    fn window(&self) -> &[f32] {
        &self.buf[self.pos..self.pos + WINDOW]
    }
}

#[inline]
fn dot(taps: &[f32; WINDOW], window: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (t, w) in taps.chunks_exact(LANES).zip(window.chunks_exact(LANES)) {
        for ((a, t), w) in acc.iter_mut().zip(t).zip(w) {
            *a += t * w;
        }
    }
    acc.iter().sum()
}

/// Rounds half away from zero and saturates to i16 (a cast, no libm call).
#[inline]
fn to_i16(v: f32) -> i16 {
    (v + 0.5f32.copysign(v)).clamp(-32768.0, 32767.0) as i16
}

/// 8 kHz → 16 kHz, stateful across calls (one stream's history).
#[derive(Debug, Clone)]
pub struct Upsampler2x {
    history: History,
    taps: &'static [f32; WINDOW],
}

impl Default for Upsampler2x {
    fn default() -> Self {
        Self::new()
    }
}

impl Upsampler2x {
    /// The delay at 16 kHz: output `DELAY_OUT_SAMPLES + 2k` is input `k` (2 ms).
    pub const DELAY_OUT_SAMPLES: usize = 2 * HALF_TAPS;

    /// A resampler with a silent history.
    pub fn new() -> Self {
        Self {
            history: History::new(),
            taps: taps(),
        }
    }

    /// Appends exactly `2 * input.len()` samples at 16 kHz to `out`.
    pub fn process(&mut self, input: &[i16], out: &mut Vec<i16>) {
        self.process_iter(input.iter().copied(), out);
    }

    /// [`process`](Self::process) over any source of 8 kHz samples (the decoder feeds
    /// expanded G.711 codes without an intermediate buffer).
    #[inline]
    pub(crate) fn process_iter(&mut self, input: impl Iterator<Item = i16>, out: &mut Vec<i16>) {
        out.reserve(2 * input.size_hint().0);
        for x in input {
            self.history.push(x);
            let window = self.history.window();
            out.push(to_i16(window[WINDOW - 1 - HALF_TAPS]));
            out.push(to_i16(dot(self.taps, window)));
        }
    }

    /// Forgets the history (after a gap in the stream): the next call starts from silence.
    pub fn reset(&mut self) {
        self.history = History::new();
    }
}

/// 16 kHz → 8 kHz, stateful across calls (the outbound stream), the same half-band
/// low-pass before dropping every other sample.
#[derive(Debug, Clone)]
pub struct Downsampler2x {
    /// The even-numbered inputs (the centre taps' samples).
    even: History,
    /// The odd-numbered inputs (the interpolator's).
    odd: History,
    /// The even sample of a pair whose odd one has not arrived yet.
    pending: Option<i16>,
    taps: &'static [f32; WINDOW],
}

impl Default for Downsampler2x {
    fn default() -> Self {
        Self::new()
    }
}

impl Downsampler2x {
    /// The delay at 8 kHz: output `DELAY_OUT_SAMPLES + k` is (the low-passed) input `2k`
    /// (2 ms).
    pub const DELAY_OUT_SAMPLES: usize = HALF_TAPS;

    /// A resampler with a silent history.
    pub fn new() -> Self {
        Self {
            even: History::new(),
            odd: History::new(),
            pending: None,
            taps: taps(),
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
        if let Some(even) = self.pending.take() {
            match input.split_first() {
                Some((&odd, tail)) => {
                    emit(self.pair(even, odd));
                    rest = tail;
                }
                None => {
                    self.pending = Some(even);
                    return;
                }
            }
        }
        let mut pairs = rest.chunks_exact(2);
        for pair in &mut pairs {
            emit(self.pair(pair[0], pair[1]));
        }
        if let [last] = pairs.remainder() {
            self.pending = Some(*last);
        }
    }

    #[inline]
    fn pair(&mut self, even: i16, odd: i16) -> i16 {
        self.even.push(even);
        // Centre: even input m − HALF_TAPS; the interpolator sees odd inputs up to m − 1.
        let centre = self.even.window()[WINDOW - 1 - HALF_TAPS];
        let y = 0.5 * (centre + dot(self.taps, self.odd.window()));
        self.odd.push(odd);
        to_i16(y)
    }

    /// Forgets the history and any pending odd sample.
    pub fn reset(&mut self) {
        self.even = History::new();
        self.odd = History::new();
        self.pending = None;
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

    /// Passband flat to 3.4 kHz (±0.1 dB, measured far less), ≥ 50 dB from 4.6 kHz.
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
        assert!(stop >= 50.0, "stopband attenuation {stop} dB");
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
