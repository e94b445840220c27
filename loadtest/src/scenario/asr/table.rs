//! The rows of the `asr-shortfall` and `asr-churn` tables (one column per design or
//! run), in the style of the other scenarios' tables.

use super::{AsrReport, ChurnReport};
use crate::report::{Row, RunReport, ms, opt_ms, or_dash, p50_p99};

/// The column heading of a report: `<streams> <asr design>` for `asr-shortfall`,
/// `<streams> <flap design>` for `producer-flap`.
pub fn column_label(r: &RunReport) -> String {
    match (&r.asr, &r.flap) {
        (Some(a), _) => format!("{} {}", r.streams, a.design),
        (None, Some(f)) => format!("{} {}", r.streams, f.design),
        (None, None) => format!("{} {}", r.streams, r.design),
    }
}

fn a(r: &RunReport) -> AsrReport {
    r.asr.clone().unwrap_or_default()
}

fn c(r: &RunReport) -> ChurnReport {
    r.churn.clone().unwrap_or_default()
}

fn slots(v: Option<f64>) -> String {
    or_dash(v, |s| format!("{s:.0}"))
}

/// The rows for `r`'s scenario.
pub fn rows(r: &RunReport) -> Vec<Row> {
    if r.churn.is_some() {
        return churn_rows();
    }
    vec![
        ("workers x slots @ rtf", |r| {
            let a = a(r);
            format!("{}x{} @ {}", a.workers, a.slots, a.rtf)
        }),
        ("keeps up with (streams)", |r| {
            format!("{:.1}", a(r).streams_at_real_time)
        }),
        ("streams offered", |r| a(r).offered.to_string()),
        ("admitted", |r| a(r).admitted.to_string()),
        ("refused (door / later)", |r| {
            let a = a(r);
            format!("{} ({}/{})", a.refused, a.refused_at_door, a.refused_later)
        }),
        ("refusals with Retry-After", |r| {
            a(r).refusals_with_retry_after.to_string()
        }),
        ("refusal p50/p99 ms", |r| p50_p99(&a(r).refusal_ms)),
        ("handed within 1 s (%)", |r| {
            or_dash(a(r).within_max_age_pct, |p| format!("{p:.2}"))
        }),
        ("stale drops / admitted", |r| {
            format!("{:.1}", a(r).stale_drops_per_admitted)
        }),
        ("handed late (> 1 s)", |r| a(r).handed_late.to_string()),
        ("lag p50 / p99 ms", |r| {
            let l = a(r).lag_ms;
            format!("{}/{}", ms(l.p50), ms(l.p99))
        }),
        ("lag max ms", |r| ms(a(r).lag_ms.max)),
        ("frames refused by workers", |r| {
            a(r).frames_refused_by_workers.to_string()
        }),
        ("naive RAM buffer max frames", |r| {
            or_dash(a(r).naive_buffered_frames_max, |n| n.to_string())
        }),
    ]
}

fn churn_rows() -> Vec<Row> {
    vec![
        ("workers x slots", |r| {
            let c = c(r);
            format!("{}x{}", c.workers, c.slots)
        }),
        ("killed / added at s", |r| {
            let c = c(r);
            format!("{:.1}/{:.1}", c.killed_at_s, c.added_at_s)
        }),
        ("door slots before/killed/end", |r| {
            let c = c(r);
            format!(
                "{}/{}/{}",
                slots(c.slots_before),
                slots(c.slots_after_kill),
                slots(c.slots_end)
            )
        }),
        ("slots left the gauge ms", |r| {
            opt_ms(c(r).slots_left_view_ms)
        }),
        ("first probe refused ms", |r| opt_ms(c(r).first_refused_ms)),
        ("last probe admitted ms", |r| opt_ms(c(r).last_admitted_ms)),
        ("probes admitted before gauge", |r| {
            c(r).probes_admitted_before_left.to_string()
        }),
        ("probes admitted after gauge", |r| {
            c(r).probes_admitted_after_left.to_string()
        }),
        ("probes refused no_capacity", |r| {
            c(r).probes_refused_no_capacity.to_string()
        }),
        ("probes refused otherwise", |r| {
            c(r).probes_refused_other.to_string()
        }),
        ("added: admissions resumed ms", |r| {
            opt_ms(c(r).admissions_resumed_ms)
        }),
        ("added: slots back ms", |r| opt_ms(c(r).slots_back_ms)),
    ]
}

/// The one-line summary of an asr run (`None` for other scenarios).
pub fn summary_line(r: &RunReport) -> Option<String> {
    if let Some(c) = &r.churn {
        return Some(format!(
            "[asr-churn] worker killed at {:.1} s: its slots left the door's gauge after {} ms, \
             the first probe on its partitions was refused after {} ms; probes admitted {} \
             before / {} after the gauge, refused no_capacity {}; \
             worker added at {:.1} s: admissions resumed after {} ms, slots back after {} ms",
            c.killed_at_s,
            opt_ms(c.slots_left_view_ms),
            opt_ms(c.first_refused_ms),
            c.probes_admitted_before_left,
            c.probes_admitted_after_left,
            c.probes_refused_no_capacity,
            c.added_at_s,
            opt_ms(c.admissions_resumed_ms),
            opt_ms(c.slots_back_ms)
        ));
    }
    let a = r.asr.as_ref()?;
    Some(format!(
        "[asr-shortfall {} {}] offered {} admitted {} refused {} (refusal p99 {} ms); handed \
         within 1 s {}%, stale drops/admitted {:.1}, lag p99 {} ms",
        r.streams,
        a.design,
        a.offered,
        a.admitted,
        a.refused,
        ms(a.refusal_ms.p99),
        or_dash(a.within_max_age_pct, |p| format!("{p:.2}")),
        a.stale_drops_per_admitted,
        ms(a.lag_ms.p99)
    ))
}
