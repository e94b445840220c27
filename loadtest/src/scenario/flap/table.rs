//! The rows of the `producer-flap` table (one column per design), in the style of the
//! other scenarios' tables.

use super::FlapReport;
use crate::report::{Row, RunReport, ms, or_dash, p50_p99};

fn f(r: &RunReport) -> FlapReport {
    r.flap.clone().unwrap_or_default()
}

fn le(v: Option<f64>) -> String {
    or_dash(v, |v| format!("<={}", ms(v)))
}

/// The rows.
pub fn rows() -> Vec<Row> {
    vec![
        ("cut every s / cuts", |r| {
            let f = f(r);
            format!("{:.0}/{}", f.flap_every_s, f.producers.cuts)
        }),
        ("calls passing every check", |r| {
            let a = f(r).audit;
            format!("{}/{}", a.streams_ok, a.streams)
        }),
        ("instances per call mean/max", |r| {
            let a = f(r).audit;
            if a.streams == 0 {
                return "-".into();
            }
            format!(
                "{:.2}/{}",
                a.instances as f64 / a.streams as f64,
                a.instances_max
            )
        }),
        ("frames offered", |r| f(r).audit.frames_offered.to_string()),
        ("frames published", |r| {
            f(r).audit.frames_published.to_string()
        }),
        ("declared lost (resume)", |r| {
            let a = f(r).audit;
            format!(
                "{} ({})",
                a.frames_declared_lost,
                a.declared_by_reason.get("resume").copied().unwrap_or(0)
            )
        }),
        ("lost undeclared", |r| {
            f(r).audit.frames_lost_undeclared.to_string()
        }),
        ("duplicates", |r| f(r).audit.duplicates.to_string()),
        ("out of order", |r| f(r).audit.out_of_order.to_string()),
        ("ends producer/other/none", |r| {
            let a = f(r).audit;
            let producer = a.ends_by_reason.get("producer").copied().unwrap_or(0);
            let all: u64 = a.ends_by_reason.values().sum();
            format!("{producer}/{}/{}", all - producer, a.streams_without_end)
        }),
        ("resume p50/p99 ms (client)", |r| {
            p50_p99(&f(r).producers.resume_ms)
        }),
        ("reconnect 101 p50/p99 ms", |r| {
            p50_p99(&f(r).producers.reconnect_ms)
        }),
        ("door resume p50/p99 ms", |r| {
            f(r).server_resume.map_or_else(
                || "-".into(),
                |s| format!("{}/{}", le(s.p50_le_ms), le(s.p99_le_ms)),
            )
        }),
        ("door resumes <= 250 ms (%)", |r| {
            let pct = f(r).server_resume.and_then(|s| s.within_target_pct);
            or_dash(pct, |p| format!("{p:.1}"))
        }),
        ("door parked (of the cuts)", |r| {
            let f = f(r);
            or_dash(f.server_parked, |p| format!("{p}/{}", f.producers.cuts))
        }),
        ("refused attempts", |r| f(r).producers.refused.to_string()),
        ("unplanned drops / taken over", |r| {
            let p = f(r).producers;
            format!("{}/{}", p.unplanned_drops, p.taken_over)
        }),
        ("ticks missed", |r| f(r).producers.ticks_missed.to_string()),
    ]
}

/// The one-line summary of a `producer-flap` run (`None` for other scenarios).
pub fn summary_line(r: &RunReport) -> Option<String> {
    let f = r.flap.as_ref()?;
    let a = &f.audit;
    let p = &f.producers;
    Some(format!(
        "[producer-flap {} {}] {} cuts; calls ok {}/{}; instances {}; offered {} published {} \
         declared lost {} lost undeclared {}; duplicates {} out of order {}; resume p50/p99 {} ms; \
         door p99 {} ms",
        r.streams,
        f.design,
        p.cuts,
        a.streams_ok,
        a.streams,
        a.instances,
        a.frames_offered,
        a.frames_published,
        a.frames_declared_lost,
        a.frames_lost_undeclared,
        a.duplicates,
        a.out_of_order,
        p50_p99(&p.resume_ms),
        le(f.server_resume.as_ref().and_then(|s| s.p99_le_ms)),
    ))
}
