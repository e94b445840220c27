//! [`Marks`]: the ledger of marks sent to the carrier and not yet played back.
//!
//! Invariants a reader must not break:
//! - Bounded: at most `max_outstanding` names (default [`MAX_OUTSTANDING_MARKS`]). One
//!   more forgets the oldest, counted in [`Marks::forgotten`]; its echo, if it ever
//!   comes, is then an [`UnknownMark`].
//! - A carrier echo that matches nothing outstanding (never sent, forgotten, or
//!   echoed twice) is an [`UnknownMark`] value for the door to count, never a panic, and
//!   changes nothing.
//! - Names are kept in the order sent; the same name may be outstanding more than once
//!   (an echo settles the oldest one). Carriers echo in order, so an echo almost always
//!   matches the front: O(1); otherwise a scan of at most `max_outstanding` names.
//! - [`Marks::cleared`] hands back every outstanding name in order and forgets them: at
//!   a barge-in the carrier drops its buffered audio and will not echo those marks.

use std::collections::VecDeque;

/// The default bound on marks sent and not yet played back.
pub const MAX_OUTSTANDING_MARKS: usize = 1_024;

/// A carrier echoed a mark that is not outstanding: never sent on this stream,
/// forgotten by the bound, or already echoed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mark {name:?} was not outstanding")]
pub struct UnknownMark {
    /// The echoed name.
    pub name: String,
}

impl UnknownMark {
    /// Stable snake_case code: `unknown_mark`.
    pub fn code(&self) -> &'static str {
        "unknown_mark"
    }
}

/// Marks sent to the carrier and not yet echoed back (played).
#[derive(Debug, Clone)]
pub struct Marks {
    outstanding: VecDeque<String>,
    max_outstanding: usize,
    forgotten: u64,
}

impl Default for Marks {
    fn default() -> Self {
        Self::new(MAX_OUTSTANDING_MARKS)
    }
}

impl Marks {
    /// An empty ledger holding at most `max_outstanding` names (at least 1).
    pub fn new(max_outstanding: usize) -> Self {
        let max_outstanding = max_outstanding.max(1);
        Self {
            outstanding: VecDeque::with_capacity(max_outstanding.min(64)),
            max_outstanding,
            forgotten: 0,
        }
    }

    /// Records a mark sent to the carrier. If the ledger was full, the oldest name is
    /// forgotten (counted) and returned.
    pub fn sent(&mut self, name: String) -> Option<String> {
        let oldest = if self.outstanding.len() >= self.max_outstanding {
            self.forgotten += 1;
            self.outstanding.pop_front()
        } else {
            None
        };
        self.outstanding.push_back(name);
        oldest
    }

    /// The carrier played a mark back: settles the oldest outstanding mark of that
    /// name. Unknown (or already settled) → `Err`, nothing changed.
    pub fn played(&mut self, name: &str) -> Result<(), UnknownMark> {
        let Some(at) = self.outstanding.iter().position(|n| n == name) else {
            return Err(UnknownMark {
                name: name.to_owned(),
            });
        };
        self.outstanding.remove(at);
        Ok(())
    }

    /// The marks sent and not played back, in the order sent; the ledger forgets them.
    pub fn cleared(&mut self) -> Vec<String> {
        self.outstanding.drain(..).collect()
    }

    /// Marks sent and not yet played back.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Marks forgotten because the ledger was full, since it was made.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn echoes_in_order_settle_marks() {
        let mut marks = Marks::default();
        assert_eq!(marks.sent("a".into()), None);
        assert_eq!(marks.sent("b".into()), None);
        assert_eq!(marks.outstanding(), 2);
        assert_eq!(marks.played("a"), Ok(()));
        assert_eq!(marks.played("b"), Ok(()));
        assert_eq!(marks.outstanding(), 0);
        assert_eq!(marks.cleared(), Vec::<String>::new());
    }

    #[test]
    fn unknown_and_duplicate_echoes_are_errors_that_change_nothing() {
        let mut marks = Marks::default();
        marks.sent("a".into());
        marks.sent("b".into());
        let err = marks.played("zzz").expect_err("never sent");
        assert_eq!(err.name, "zzz");
        assert_eq!(err.code(), "unknown_mark");
        assert_eq!(marks.played("a"), Ok(()));
        assert_eq!(
            marks.played("a"),
            Err(UnknownMark { name: "a".into() }),
            "a second echo of the same mark is not outstanding"
        );
        assert_eq!(marks.cleared(), names(&["b"]));
    }

    #[test]
    fn a_repeated_name_settles_one_at_a_time() {
        let mut marks = Marks::default();
        marks.sent("end".into());
        marks.sent("x".into());
        marks.sent("end".into());
        assert_eq!(marks.played("end"), Ok(()));
        assert_eq!(marks.outstanding(), 2);
        // The oldest "end" went; the order of the rest is kept.
        assert_eq!(marks.cleared(), names(&["x", "end"]));
    }

    #[test]
    fn an_out_of_order_echo_settles_only_its_mark() {
        let mut marks = Marks::default();
        for n in ["a", "b", "c"] {
            marks.sent(n.into());
        }
        assert_eq!(marks.played("b"), Ok(()));
        assert_eq!(marks.cleared(), names(&["a", "c"]));
    }

    #[test]
    fn cleared_returns_unplayed_in_order_and_forgets_them() {
        let mut marks = Marks::default();
        for n in ["a", "b", "c", "d"] {
            marks.sent(n.into());
        }
        assert_eq!(marks.played("a"), Ok(()));
        assert_eq!(marks.cleared(), names(&["b", "c", "d"]));
        assert_eq!(marks.outstanding(), 0);
        assert!(marks.played("b").is_err(), "a cleared mark is forgotten");
        assert_eq!(marks.cleared(), Vec::<String>::new());
    }

    #[test]
    fn the_ledger_is_bounded_and_counts_what_it_forgets() {
        let mut marks = Marks::default();
        for i in 0..MAX_OUTSTANDING_MARKS {
            assert_eq!(marks.sent(format!("m{i}")), None);
        }
        assert_eq!(marks.forgotten(), 0);
        for i in 0..10 {
            let n = MAX_OUTSTANDING_MARKS + i;
            assert_eq!(marks.sent(format!("m{n}")), Some(format!("m{i}")));
        }
        assert_eq!(marks.outstanding(), MAX_OUTSTANDING_MARKS);
        assert_eq!(marks.forgotten(), 10);
        assert!(marks.played("m0").is_err(), "the forgotten mark is unknown");
        assert_eq!(marks.played("m10"), Ok(()));
        let rest = marks.cleared();
        assert_eq!(rest.len(), MAX_OUTSTANDING_MARKS - 1);
        assert_eq!(rest.first().map(String::as_str), Some("m11"));
        let last = format!("m{}", MAX_OUTSTANDING_MARKS + 9);
        assert_eq!(rest.last(), Some(&last));
    }

    #[test]
    fn a_zero_bound_still_holds_one_mark() {
        let mut marks = Marks::new(0);
        assert_eq!(marks.sent("a".into()), None);
        assert_eq!(marks.sent("b".into()), Some("a".into()));
        assert_eq!(marks.forgotten(), 1);
        assert_eq!(marks.cleared(), names(&["b"]));
    }
}
