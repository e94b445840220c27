//! Metric names added by the consumer's staleness guard and possible-loss accounting.
//!
//! They live here, next to the code that records them, until the crate-wide list
//! (`crate::metrics`) takes them over; the names follow its conventions
//! (`weir_consumer_` prefix, `_total` on counters).

/// Counter: frames dropped before the handler because they were older than
/// `max_frame_age_ms` (the [`Counters::stale_frames`](super::Counters::stale_frames)).
pub const CONSUMER_FRAMES_STALE_TOTAL: &str = "weir_consumer_frames_stale_total";
/// Counter: frames of holes inside a range declared by `Weir-Possibly-Lost`, counted
/// when the hole is found inside a declared range or when a declaration re-labels an
/// earlier hole. A subset of `weir_consumer_frames_lost_total`, which counts every hole
/// at detection: undeclared loss = lost − possibly lost.
pub const CONSUMER_FRAMES_POSSIBLY_LOST_TOTAL: &str = "weir_consumer_frames_possibly_lost_total";
/// Counter: packets that carried a valid `Weir-Possibly-Lost` header.
pub const CONSUMER_POSSIBLE_LOSS_DECLARATIONS_TOTAL: &str =
    "weir_consumer_possible_loss_declarations_total";
