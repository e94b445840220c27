//! Paused-clock tests of the token buckets: reservation, refill, `retry_after_ms`,
//! reconciliation up and down, garbage usage, the key bound.

use std::num::{NonZeroU64, NonZeroUsize};
use std::time::Duration;

use tokio::time::{Instant, advance};
use weir_protocol::llm::ErrorCode;

use super::*;
use crate::admission::usage::{RequestCost, reported_usage};
use crate::config::{KeySource, OnBusy};

fn budgets(tpm: u64, default_max_tokens: u64, max_keys: usize) -> TokenBudgets {
    TokenBudgets::new(&[KeyLimit {
        name: "client".into(),
        key: KeySource::Client,
        limit: NonZeroUsize::new(1000).expect("non-zero"),
        on_busy: OnBusy::Reject,
        tokens: Some(TokenBudget {
            tokens_per_minute: NonZeroU64::new(tpm).expect("non-zero"),
            default_max_tokens,
            max_keys: NonZeroUsize::new(max_keys).expect("non-zero"),
        }),
        priority: None,
    }])
}

fn keys(k: &str) -> Vec<Option<String>> {
    vec![Some(k.to_owned())]
}

fn cost(max_tokens: Option<u64>, prompt: u64) -> RequestCost {
    RequestCost { max_tokens, prompt }
}

/// Check then reserve, as `State::submit` does: the reservation, or the refusal's
/// `retry_after_ms`.
fn take(b: &mut TokenBudgets, key: &str, c: RequestCost) -> Result<Reservation, u64> {
    let keys = keys(key);
    let ask = TokenAsk {
        keys: &keys,
        cost: c,
        now: Instant::now(),
    };
    match b.check(&ask) {
        Ok(()) => Ok(b.reserve(&ask)),
        Err(r) => {
            assert_eq!(r.body.code, ErrorCode::TokenBudgetExceeded);
            assert_eq!(r.rule.as_deref(), Some("client.tokens"));
            let d = &r.body.details;
            assert_eq!(d.key.as_deref(), Some(key));
            assert_eq!(d.limit, b.stats()["client"].tokens_per_minute.into());
            Err(d.retry_after_ms.expect("retry_after_ms on every refusal"))
        }
    }
}

fn available(b: &TokenBudgets, key: &str) -> f64 {
    b.keys(Instant::now())
        .into_iter()
        .find(|v| v.key == key)
        .map_or(f64::NAN, |v| v.available)
}

#[tokio::test(start_paused = true)]
async fn reserves_until_the_budget_is_spent_then_refuses_with_when_it_fits() {
    // 6,000 per minute = 100 per second.
    let mut b = budgets(6_000, 100, 16);
    for _ in 0..6 {
        take(&mut b, "a", cost(Some(900), 100)).expect("fits");
    }
    assert_eq!(available(&b, "a"), 0.0);
    // 1,000 more needs 10 s of refill.
    assert_eq!(take(&mut b, "a", cost(Some(900), 100)), Err(10_000));
    // Other keys have their own budget.
    take(&mut b, "b", cost(Some(900), 100)).expect("another key");
    // After 4 s, 400 are back: a 400-token request fits, a 1,000 one in 6 s.
    advance(Duration::from_secs(4)).await;
    assert_eq!(take(&mut b, "a", cost(Some(900), 100)), Err(6_000));
    take(&mut b, "a", cost(Some(300), 100)).expect("400 fit after 4 s");
    // The hint is exact: refused 1 ms before, admitted at it.
    let retry = take(&mut b, "a", cost(Some(150), 0)).expect_err("empty");
    assert_eq!(retry, 1_500);
    advance(Duration::from_millis(retry - 1)).await;
    assert!(take(&mut b, "a", cost(Some(150), 0)).is_err());
    advance(Duration::from_millis(1)).await;
    take(&mut b, "a", cost(Some(150), 0)).expect("fits at retry_after_ms");
    let t = &b.stats()["client"];
    assert_eq!(t.reserved, 6 * 1000 + 1000 + 400 + 150);
    assert_eq!(t.outstanding, t.reserved);
    assert_eq!(t.keys, 2);
}

#[tokio::test(start_paused = true)]
async fn refill_is_continuous_and_stops_at_a_full_budget() {
    let mut b = budgets(600, 10, 16); // 10 per second
    take(&mut b, "a", cost(Some(600), 0)).expect("a whole budget");
    advance(Duration::from_millis(2_500)).await;
    assert_eq!(available(&b, "a"), 25.0);
    advance(Duration::from_secs(3600)).await;
    assert_eq!(available(&b, "a"), 600.0);
    // The default max_tokens applies without one.
    let r = take(&mut b, "a", cost(None, 5)).expect("default");
    assert_eq!(r.held, vec![(0, "a".to_owned(), 15)]);
}

#[tokio::test(start_paused = true)]
async fn a_cost_above_the_whole_budget_passes_only_on_a_full_bucket() {
    let mut b = budgets(600, 10, 16);
    take(&mut b, "a", cost(Some(1_000), 0)).expect("full bucket");
    // In debt down to −600 at most (the floor); a full refill takes two minutes.
    assert_eq!(available(&b, "a"), -400.0);
    assert_eq!(take(&mut b, "a", cost(Some(1_000), 0)), Err(100_000));
    advance(Duration::from_secs(100)).await;
    take(&mut b, "a", cost(Some(1_000), 0)).expect("full again");
    take(&mut b, "b", cost(Some(u64::MAX), u64::MAX)).expect("full bucket");
    assert_eq!(available(&b, "b"), -600.0, "debt floored at one budget");
}

#[tokio::test(start_paused = true)]
async fn settlement_refunds_unused_tokens_and_charges_usage_above_the_reservation() {
    let mut b = budgets(6_000, 100, 16);
    let r = take(&mut b, "a", cost(Some(1_000), 200)).expect("fits");
    assert_eq!(available(&b, "a"), 4_800.0);
    // Down: 300 used of 1,200 → 900 back.
    b.settle(
        r,
        Ended::Answered(Some(Usage { total: 300 })),
        Instant::now(),
    );
    assert_eq!(available(&b, "a"), 5_700.0);
    // Up: 2,000 used of 1,200 → 800 more.
    let r = take(&mut b, "a", cost(Some(1_000), 200)).expect("fits");
    b.settle(
        r,
        Ended::Answered(Some(Usage { total: 2_000 })),
        Instant::now(),
    );
    assert_eq!(available(&b, "a"), 5_700.0 - 2_000.0);
    // Never started: everything back. Failed after starting: the prompt charged.
    let r = take(&mut b, "a", cost(Some(1_000), 200)).expect("fits");
    b.settle(r, Ended::NotStarted, Instant::now());
    assert_eq!(available(&b, "a"), 3_700.0);
    let r = take(&mut b, "a", cost(Some(1_000), 200)).expect("fits");
    b.settle(r, Ended::Failed(None), Instant::now());
    assert_eq!(available(&b, "a"), 3_500.0);
    // Answered without a usage: the reservation stands.
    let r = take(&mut b, "a", cost(Some(1_000), 200)).expect("fits");
    b.settle(r, Ended::Answered(None), Instant::now());
    assert_eq!(available(&b, "a"), 2_300.0);
    let t = &b.stats()["client"];
    assert_eq!(t.reserved, 5 * 1_200);
    assert_eq!(t.used, 300 + 2_000 + 200 + 1_200);
    assert_eq!(t.refunded, 900 + 1_200 + 1_000);
    assert_eq!(t.overcharged, 800);
    assert_eq!(
        t.reserved + t.overcharged,
        t.used + t.refunded + t.outstanding
    );
    assert_eq!(
        (t.outstanding, t.usage_reported, t.usage_missing),
        (0, 2, 1)
    );
    // A refund never fills beyond the budget.
    advance(Duration::from_secs(120)).await;
    let r = take(&mut b, "a", cost(Some(1_000), 0)).expect("fits");
    advance(Duration::from_secs(120)).await;
    b.settle(r, Ended::NotStarted, Instant::now());
    assert_eq!(available(&b, "a"), 6_000.0);
}

#[tokio::test(start_paused = true)]
async fn garbage_or_absurd_usage_cannot_corrupt_a_budget() {
    let mut b = budgets(6_000, 100, 16);
    let replies: [&[u8]; 6] = [
        br#"{"usage":{"total_tokens":-5}}"#,
        br#"{"usage":{"total_tokens":"12"}}"#,
        br#"{"usage":{"total_tokens":1e300}}"#,
        br#"{"usage":{"total_tokens":99999999999999999999999}}"#,
        br#"{"usage":[1,2]}"#,
        b"\xff\xfe garbage",
    ];
    for reply in replies {
        let r = take(&mut b, "a", cost(Some(100), 0)).expect("fits");
        b.settle(r, Ended::Answered(reported_usage(reply)), Instant::now());
    }
    // Each charged its reservation, no more, no less.
    assert_eq!(available(&b, "a"), 6_000.0 - 600.0);
    // Absurdly large but valid: clamped at 4 × the reservation.
    let r = take(&mut b, "a", cost(Some(100), 0)).expect("fits");
    let huge = reported_usage(br#"{"usage":{"total_tokens":18446744073709551615}}"#);
    assert_eq!(huge, Some(Usage { total: u64::MAX }));
    b.settle(r, Ended::Answered(huge), Instant::now());
    assert_eq!(available(&b, "a"), 6_000.0 - 600.0 - 400.0);
    // Many of them: the level stays at or above −budget, and refills from there.
    for _ in 0..100 {
        let ask_keys = keys("a");
        let ask = TokenAsk {
            keys: &ask_keys,
            cost: cost(Some(5_000), 0),
            now: Instant::now(),
        };
        let r = b.reserve(&ask); // shadow mode reserves without the check
        b.settle(r, Ended::Answered(huge), Instant::now());
    }
    assert_eq!(available(&b, "a"), -6_000.0);
    advance(Duration::from_secs(120)).await;
    assert_eq!(available(&b, "a"), 6_000.0);
    let t = &b.stats()["client"];
    assert_eq!((t.usage_missing, t.usage_clamped), (6, 101));
    assert_eq!(t.outstanding, 0);
}

#[tokio::test(start_paused = true)]
async fn the_tracked_keys_stay_bounded_and_idle_ones_go_first() {
    let mut b = budgets(600, 10, 3);
    let held = take(&mut b, "busy", cost(Some(10), 0)).expect("fits");
    for i in 0..50 {
        let r = take(&mut b, &format!("k{i}"), cost(Some(10), 0)).expect("fits");
        b.settle(r, Ended::NotStarted, Instant::now());
        assert!(b.stats()["client"].keys <= 3);
    }
    // The key with a reservation outstanding was never evicted.
    assert!(!available(&b, "busy").is_nan());
    let t = &b.stats()["client"];
    assert_eq!(t.evicted, 48);
    b.settle(held, Ended::NotStarted, Instant::now());
    // Once refilled, idle keys are dropped as new ones come (not counted as evicted).
    advance(Duration::from_secs(60)).await;
    take(&mut b, "fresh", cost(Some(10), 0)).expect("fits");
    let t = &b.stats()["client"];
    assert_eq!((t.keys, t.evicted), (1, 48));
}

#[test]
fn a_request_outside_every_budget_is_not_read() {
    let b = budgets(600, 10, 3);
    assert!(b.applies(&keys("a")));
    assert!(!b.applies(&[None]));
    assert!(!TokenBudgets::new(&[]).applies(&keys("a")));
}
