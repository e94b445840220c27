//! ITU-T G.711 µ-law and A-law, sample by sample, on 16-bit left-justified linear PCM.
//!
//! The algorithms are those of the ITU-T G.191 software tools' `g711.c` (the reference
//! implementation of G.711): expansion by a 256-entry table built at compile time by a
//! `const fn`, compression by arithmetic (sign, segment, mantissa). Both are exact: every
//! code expands to the value G.711's tables give (µ-law: ±32124 at most, A-law: ±32256),
//! and compressing an expanded value gives the code back — except µ-law's negative zero
//! `0x7F`, which expands to 0 and compresses to the positive zero `0xFF`.
//!
//! Negative inputs are taken as their one's complement (`!x`), as the reference does, so
//! `-1` is "negative zero" and the quantiser is symmetric around −½.

/// µ-law code → 16-bit linear, built once at compile time.
static MULAW_TO_LINEAR: [i16; 256] = mulaw_table();
/// A-law code → 16-bit linear, built once at compile time.
static ALAW_TO_LINEAR: [i16; 256] = alaw_table();

/// Expands one µ-law code (G.711 PCMU) to 16-bit linear PCM.
#[inline]
pub fn mulaw_to_linear(code: u8) -> i16 {
    MULAW_TO_LINEAR[usize::from(code)]
}

/// Expands one A-law code (G.711 PCMA) to 16-bit linear PCM.
#[inline]
pub fn alaw_to_linear(code: u8) -> i16 {
    ALAW_TO_LINEAR[usize::from(code)]
}

/// Compresses one 16-bit linear sample to µ-law (G.711 PCMU). Magnitudes past the
/// largest code (32124 + half a step) clip to it.
#[inline]
pub fn linear_to_mulaw(sample: i16) -> u8 {
    let x = i32::from(sample);
    // 14-bit magnitude plus the bias of 33 (the segments then start at powers of two).
    let biased = (if x < 0 { !x } else { x } >> 2) + 33;
    let biased = biased.min(0x1FFF) as u32; // 33..=8191
    // Segment 1..=8: one more than the bit length of biased / 64.
    let segment = 1 + (u32::BITS - (biased >> 6).leading_zeros());
    let high = 8 - segment;
    let low = 0x0F - ((biased >> segment) & 0x0F);
    let code = ((high << 4) | low) as u8;
    if x >= 0 { code | 0x80 } else { code }
}

/// Compresses one 16-bit linear sample to A-law (G.711 PCMA). Magnitudes past the
/// largest code (32256 + half a step) clip to it.
#[inline]
pub fn linear_to_alaw(sample: i16) -> u8 {
    let x = i32::from(sample);
    // 12-bit magnitude (0..=2047 after the shift; negative values by one's complement).
    let mut ix = (if x < 0 { !x } else { x } >> 4) as u32;
    if ix > 15 {
        // Segment 1..=7: the bit length of ix above 4 bits; the leading 1 is implied.
        let exponent = (u32::BITS - ix.leading_zeros()) - 4; // 1..=7
        ix = ((ix >> (exponent - 1)) - 16) + (exponent << 4);
    }
    let code = if x >= 0 { ix | 0x80 } else { ix } as u8;
    code ^ 0x55
}

const fn mulaw_table() -> [i16; 256] {
    let mut table = [0i16; 256];
    let mut code = 0usize;
    while code < 256 {
        let inverted = !(code as u8);
        let exponent = ((inverted >> 4) & 0x07) as i32;
        let mantissa = (inverted & 0x0F) as i32;
        let step = 4 << (exponent + 1);
        let magnitude = (0x80 << exponent) + step * mantissa + step / 2 - 4 * 33;
        table[code] = if code < 0x80 { -magnitude } else { magnitude } as i16;
        code += 1;
    }
    table
}

const fn alaw_table() -> [i16; 256] {
    let mut table = [0i16; 256];
    let mut code = 0usize;
    while code < 256 {
        let toggled = (code as u8 ^ 0x55) & 0x7F;
        let exponent = (toggled >> 4) as i32;
        let mut mantissa = (toggled & 0x0F) as i32;
        if exponent > 0 {
            mantissa += 16; // the implied leading 1
        }
        mantissa = (mantissa << 4) + 0x08; // left-justified, plus half a step
        if exponent > 1 {
            mantissa <<= exponent - 1;
        }
        table[code] = if code > 0x7F { mantissa } else { -mantissa } as i16;
        code += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points of the G.711 expansion tables (as the G.191 tools print them).
    #[test]
    fn mulaw_expansion_matches_the_reference_points() {
        let points: [(u8, i16); 16] = [
            (0x00, -32124),
            (0x01, -31100),
            (0x0F, -16764),
            (0x10, -15996),
            (0x20, -7932),
            (0x30, -3900),
            (0x40, -1884),
            (0x50, -876),
            (0x60, -372),
            (0x70, -120),
            (0x7E, -8),
            (0x7F, 0),
            (0x80, 32124),
            (0x90, 15996),
            (0xFE, 8),
            (0xFF, 0),
        ];
        for (code, linear) in points {
            assert_eq!(mulaw_to_linear(code), linear, "µ-law code {code:#04x}");
        }
    }

    #[test]
    fn alaw_expansion_matches_the_reference_points() {
        let points: [(u8, i16); 12] = [
            (0x00, -5504),
            (0x01, -5248),
            (0x2A, -32256),
            (0x54, -24),
            (0x55, -8),
            (0x02, -6016),
            (0x80, 5504),
            (0xAA, 32256),
            (0xD4, 24),
            (0xD5, 8),
            (0x20, -22016),
            (0xFF, 848),
        ];
        for (code, linear) in points {
            assert_eq!(alaw_to_linear(code), linear, "A-law code {code:#04x}");
        }
    }

    #[test]
    fn compression_matches_the_reference_points() {
        // Zero, "negative zero" (-1), full scale, and a point on each side of a decision
        // level (µ-law: 0..=3 → +0, 4 → code 0xFE (+8) after the bias; see the table).
        let mulaw: [(i16, u8); 8] = [
            (0, 0xFF),
            (-1, 0x7F),
            (3, 0xFF),
            (4, 0xFE),
            (-4, 0x7F),
            (-5, 0x7E),
            (i16::MAX, 0x80),
            (i16::MIN, 0x00),
        ];
        for (linear, code) in mulaw {
            assert_eq!(linear_to_mulaw(linear), code, "µ-law of {linear}");
        }
        let alaw: [(i16, u8); 8] = [
            (0, 0xD5),
            (-1, 0x55),
            (15, 0xD5),
            (16, 0xD4),
            (-16, 0x55),
            (-17, 0x54),
            (i16::MAX, 0xAA),
            (i16::MIN, 0x2A),
        ];
        for (linear, code) in alaw {
            assert_eq!(linear_to_alaw(linear), code, "A-law of {linear}");
        }
    }

    #[test]
    fn every_code_round_trips() {
        for code in 0..=255u8 {
            let expected = if code == 0x7F { 0xFF } else { code };
            assert_eq!(
                linear_to_mulaw(mulaw_to_linear(code)),
                expected,
                "µ-law {code:#04x}"
            );
            assert_eq!(
                linear_to_alaw(alaw_to_linear(code)),
                code,
                "A-law {code:#04x}"
            );
        }
    }

    /// Over the whole 16-bit range the quantisers are monotonic and the error stays
    /// within half a step of the segment (plus the reference's one's-complement skew).
    #[test]
    fn quantisation_is_monotonic_and_within_half_a_step() {
        let mut last_mu = i16::MIN;
        let mut last_a = i16::MIN;
        for x in i16::MIN..=i16::MAX {
            let mu = mulaw_to_linear(linear_to_mulaw(x));
            let a = alaw_to_linear(linear_to_alaw(x));
            assert!(mu >= last_mu && a >= last_a, "not monotonic at {x}");
            last_mu = mu;
            last_a = a;
            // Steps double per segment: µ-law 8..=1024, A-law 16..=1024 (16-bit scale).
            let (x, mu, a) = (i32::from(x), i32::from(mu), i32::from(a));
            let mu_step = if x.abs() < 32124 {
                8 << mu_segment(x)
            } else {
                2 * (x.abs() - 32124)
            };
            let a_step = if x.abs() < 32256 {
                16 << a_segment(x)
            } else {
                2 * (x.abs() - 32256)
            };
            assert!(
                (mu - x).abs() <= mu_step / 2 + 4,
                "µ-law error at {x}: {mu}"
            );
            assert!((a - x).abs() <= a_step / 2 + 16, "A-law error at {x}: {a}");
        }
    }

    fn mu_segment(x: i32) -> u32 {
        let biased = ((x.unsigned_abs() >> 2) + 33).min(0x1FFF);
        u32::BITS - (biased >> 6).leading_zeros()
    }

    fn a_segment(x: i32) -> u32 {
        let ix = x.unsigned_abs() >> 4;
        (u32::BITS - ix.leading_zeros()).saturating_sub(5)
    }
}
