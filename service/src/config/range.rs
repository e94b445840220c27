//! A key's allowed values as data: validation and the docs key table both read the
//! same [`Range`], so a bound is written once and never parsed back out of text.

use std::fmt;
use std::num::NonZeroUsize;
use std::time::Duration;

use super::{ConfigError, ConfigErrorKind};

/// The unit of an integer key, shown in refusals (`5 ms is out of range; allowed
/// 20..=60000 ms`); the key's name carries it in the tables (`_ms`, `_s`, `_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A count or a plain number.
    Count,
    /// Milliseconds.
    Ms,
    /// Seconds.
    S,
    /// Bytes.
    Bytes,
}

impl Unit {
    fn suffix(self) -> &'static str {
        match self {
            Self::Count => "",
            Self::Ms => " ms",
            Self::S => " s",
            Self::Bytes => " bytes",
        }
    }
}

/// `d` in whole milliseconds, as a `*_ms` key holds it (saturating).
pub fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The allowed values of one key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    /// Any value of the key's type (a flag, a free text).
    Any,
    /// Allowed values in words, checked by the component (an enum, an address, a file).
    Text(&'static str),
    /// Whole numbers `min..=max`; `note` follows the bounds in the table (`" (0 =
    /// off)"`, `"; at most `other`"`) and states what the component checks beyond them.
    Int {
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
        /// The unit.
        unit: Unit,
        /// Text after the bounds.
        note: &'static str,
    },
    /// Decimal numbers `min..=max`.
    Decimal {
        /// Smallest allowed.
        min: f64,
        /// Largest allowed.
        max: f64,
        /// Text after the bounds.
        note: &'static str,
    },
}

impl Range {
    /// Whole numbers `min..=max` of `unit`.
    const fn with_unit(min: u64, max: u64, unit: Unit) -> Self {
        Self::Int {
            min,
            max,
            unit,
            note: "",
        }
    }
    /// A count `min..=max`.
    pub const fn int(min: u64, max: u64) -> Self {
        Self::with_unit(min, max, Unit::Count)
    }
    /// Milliseconds `min..=max`.
    pub const fn ms(min: u64, max: u64) -> Self {
        Self::with_unit(min, max, Unit::Ms)
    }
    /// Seconds `min..=max`.
    pub const fn secs(min: u64, max: u64) -> Self {
        Self::with_unit(min, max, Unit::S)
    }
    /// Bytes `min..=max`.
    pub const fn bytes(min: u64, max: u64) -> Self {
        Self::with_unit(min, max, Unit::Bytes)
    }
    /// Decimals `min..=max`.
    pub const fn decimal(min: f64, max: f64) -> Self {
        Self::Decimal { min, max, note: "" }
    }
    /// Allowed values in words.
    pub const fn text(text: &'static str) -> Self {
        Self::Text(text)
    }
    /// The same bounds with `note` after them.
    pub const fn note(self, note: &'static str) -> Self {
        match self {
            Self::Int { min, max, unit, .. } => Self::Int {
                min,
                max,
                unit,
                note,
            },
            Self::Decimal { min, max, .. } => Self::Decimal { min, max, note },
            other => other,
        }
    }

    /// The integer bounds, if any.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        match *self {
            Self::Int { min, max, .. } => Some((min, max)),
            _ => None,
        }
    }

    /// `v` of `key` inside the bounds; a key without integer bounds is a programming
    /// error, refused rather than left unchecked.
    pub fn check(&self, key: &str, v: u64) -> Result<u64, ConfigError> {
        match *self {
            Self::Int { min, max, .. } if (min..=max).contains(&v) => Ok(v),
            Self::Int {
                min,
                max,
                unit,
                note,
            } => Err(ConfigError::out_of_range(
                key,
                format!("{v}{}", unit.suffix()),
                format!("{min}..={max}{}{note}", unit.suffix()),
            )),
            _ => Err(ConfigError::new(
                key,
                ConfigErrorKind::Invalid,
                "the key has no integer range",
            )),
        }
    }

    /// [`Range::check`] as milliseconds.
    pub fn millis(&self, key: &str, v: u64) -> Result<Duration, ConfigError> {
        self.check(key, v).map(Duration::from_millis)
    }

    /// [`Range::check`] as a `usize`.
    pub fn size(&self, key: &str, v: u64) -> Result<usize, ConfigError> {
        self.check(key, v)
            .map(|v| usize::try_from(v).unwrap_or(usize::MAX))
    }

    /// [`Range::check`] as a count that is not zero.
    pub fn count(&self, key: &str, v: u64) -> Result<NonZeroUsize, ConfigError> {
        NonZeroUsize::new(self.size(key, v)?)
            .ok_or_else(|| ConfigError::out_of_range(key, 0, format!("{self}, not 0")))
    }

    /// `v` of `key` inside decimal bounds.
    pub fn check_decimal(&self, key: &str, v: f64) -> Result<f64, ConfigError> {
        match *self {
            Self::Decimal { min, max, .. } if (min..=max).contains(&v) => Ok(v),
            Self::Decimal { .. } => Err(ConfigError::out_of_range(key, v, self)),
            _ => Err(ConfigError::new(
                key,
                ConfigErrorKind::Invalid,
                "the key has no decimal range",
            )),
        }
    }
}

impl fmt::Display for Range {
    /// As the key table shows it: bounds without the unit (the key's name has it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => Ok(()),
            Self::Text(text) => f.write_str(text),
            Self::Int { min, max, note, .. } => write!(f, "{min}..={max}{note}"),
            Self::Decimal { min, max, note } => write!(f, "{min}..={max}{note}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_check_and_refusals_name_the_value_and_the_range_with_the_unit() {
        let r = Range::ms(20, 60_000);
        assert_eq!(r.check("max_age_ms", 20), Ok(20));
        let e = r.check("max_age_ms", 5).expect_err("below");
        assert_eq!(e.kind(), ConfigErrorKind::OutOfRange);
        assert_eq!(
            (e.value(), e.allowed()),
            (Some("5 ms"), Some("20..=60000 ms"))
        );
        assert_eq!(
            e.to_string(),
            "config key `max_age_ms`: 5 ms is out of range; allowed 20..=60000 ms"
        );
        assert_eq!(r.to_string(), "20..=60000");
        let noted = Range::int(0, 10).note(" (0 = off)");
        assert_eq!(noted.to_string(), "0..=10 (0 = off)");
        assert!(Range::int(1, 4).count("n", 0).is_err());
        assert_eq!(Range::decimal(0.5, 0.999).to_string(), "0.5..=0.999");
        assert!(Range::decimal(0.0, 1.0).check_decimal("r", 1.5).is_err());
        assert!(Range::Any.check("flag", 1).is_err());
    }
}
