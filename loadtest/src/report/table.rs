//! The terminal and Markdown tables of the reports: one column per (streams, design),
//! one row per figure, a block per scenario.

use std::fmt::Write as _;

use super::{CeilingReport, LlmReport, RunReport};
use crate::ingress::Design;
use crate::scenario::asr::column_label;
use crate::stats::Percentiles;

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

pub(crate) fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `p50/p99` of a latency summary, or `-` when it counted nothing.
pub(crate) fn p50_p99(p: &Percentiles) -> String {
    if p.count == 0 {
        "-".into()
    } else {
        format!("{}/{}", ms(p.p50), ms(p.p99))
    }
}

/// A latency of the timeliness summary, or `-` when no frame was timed.
fn timed(r: &RunReport, v: f64) -> String {
    if r.frames.timeliness.e2e_latency_ms.count == 0 {
        "-".into()
    } else {
        ms(v)
    }
}

/// An LLM figure, or `-` when the LLM side did not run.
fn llm(r: &RunReport, f: impl Fn(&LlmReport) -> String) -> String {
    if r.llm.enabled { f(&r.llm) } else { "-".into() }
}

/// A figure of an optional part, or `-` without it.
pub(crate) fn or_dash<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map_or_else(|| "-".into(), f)
}

/// One row of the table: a label and how to read it from a report.
pub(crate) type Row = (&'static str, fn(&RunReport) -> String);

fn rows() -> Vec<Row> {
    [ingress_rows(), frame_rows(), llm_rows()].concat()
}

/// The ingress's memory, queues, windows and events.
fn ingress_rows() -> Vec<Row> {
    vec![
        ("RSS peak / end (MiB)", |r| {
            format!(
                "{}/{}",
                mib(r.ingress.rss_peak_bytes),
                mib(r.ingress.rss_end_bytes)
            )
        }),
        ("pending bytes max", |r| {
            r.ingress.pending_bytes_max.to_string()
        }),
        ("  limit (streams x per-stream)", |r| {
            r.ingress
                .pending_bytes_limit
                .map_or_else(|| "none".into(), |l| l.to_string())
        }),
        ("queue wait p50 ms", |r| ms(r.ingress.queue_wait_ms.p50)),
        ("queue wait p99 ms", |r| ms(r.ingress.queue_wait_ms.p99)),
        ("queue wait max ms", |r| ms(r.ingress.queue_wait_ms.max)),
        ("oldest frame age max ms", |r| {
            ms(r.ingress.oldest_frame_age_ms_max)
        }),
        ("tokio tasks max", |r| r.ingress.tasks_max.to_string()),
        ("unconfirmed bytes max / limit", |r| {
            match (
                r.ingress.unconfirmed_bytes_max,
                r.ingress.window_limit_bytes_max,
            ) {
                (None, None) => "-".into(),
                (u, l) => format!(
                    "{}/{}",
                    or_dash(u, |v| v.to_string()),
                    or_dash(l, |v| v.to_string())
                ),
            }
        }),
        ("confirm round p99 ms", |r| {
            or_dash(r.ingress.confirm_round_ms.filter(|p| p.count > 0), |p| {
                ms(p.p99)
            })
        }),
        ("overloads / gaps", |r| {
            format!("{}/{}", r.ingress.overloads, r.ingress.gaps)
        }),
        ("admission rejects", |r| {
            r.ingress.admission_rejects.to_string()
        }),
    ]
}

/// The frames' accounting and timeliness, and the ingress's CPU.
fn frame_rows() -> Vec<Row> {
    vec![
        ("frames offered", |r| r.frames.offered.to_string()),
        ("frames published", |r| r.frames.published.to_string()),
        ("frames received", |r| r.frames.received.to_string()),
        ("  stale (dropped by consumer)", |r| {
            r.frames.stale_dropped_by_consumer.to_string()
        }),
        ("  handed to handler", |r| {
            r.frames.handed_to_handler.to_string()
        }),
        ("frames dropped (reason)", |r| r.frames.dropped.to_string()),
        ("frames unaccounted", |r| r.frames.unaccounted.to_string()),
        ("  pending at end", |r| {
            r.frames.explained.pending_at_end.to_string()
        }),
        ("  lost declared / undetected", |r| {
            format!(
                "{}/{}",
                r.frames.explained.lost_declared, r.frames.explained.lost_undetected
            )
        }),
        ("consumer-detected holes", |r| {
            r.frames.explained.consumer_detected_holes.to_string()
        }),
        ("out of order (refused)", |r| {
            r.consumer.fleet.out_of_order_refused.to_string()
        }),
        ("reaped without end", |r| {
            r.consumer.fleet.streams_reaped_without_end.to_string()
        }),
        ("delivered late (> late_after)", |r| {
            r.frames.timeliness.delivered_late.to_string()
        }),
        ("e2e to handler p50 ms", |r| {
            timed(r, r.frames.timeliness.e2e_latency_ms.p50)
        }),
        ("e2e to handler p99 ms", |r| {
            timed(r, r.frames.timeliness.e2e_latency_ms.p99)
        }),
        ("e2e to handler max ms", |r| {
            timed(r, r.frames.timeliness.e2e_latency_ms.max)
        }),
        ("ingress CPU s", |r| format!("{:.1}", r.ingress.cpu_seconds)),
        ("ingress CPU µs/frame", |r| match r.frames.offered {
            0 => "-".to_owned(),
            n => format!("{:.2}", r.ingress.cpu_seconds * 1e6 / n as f64),
        }),
    ]
}

/// The LLM fleet's figures (`-` in a run without one).
fn llm_rows() -> Vec<Row> {
    vec![
        ("llm offered/completed", |r| {
            llm(r, |l| format!("{}/{}", l.offered, l.completed))
        }),
        ("llm refused (after waiting)", |r| {
            llm(r, |l| {
                format!("{} ({})", l.refused, l.refused_after_waiting)
            })
        }),
        ("llm caller timeouts", |r| {
            llm(r, |l| l.caller_timeouts.to_string())
        }),
        ("llm started after deadline", |r| {
            llm(r, |l| l.started_after_deadline.to_string())
        }),
        ("llm answered after deadline", |r| {
            llm(r, |l| l.answered_after_deadline.to_string())
        }),
        ("llm refusal p50/p99 ms", |r| {
            llm(r, |l| {
                format!("{}/{}", ms(l.refusal_ms.p50), ms(l.refusal_ms.p99))
            })
        }),
        ("llm queue wait p95 ms", |r| {
            llm(r, |l| ms(l.queue_wait_ms.p95))
        }),
        ("llm ttft p50/p99 ms", |r| {
            llm(r, |l| {
                format!("{}/{}", ms(l.ttft_ms.p50), ms(l.ttft_ms.p99))
            })
        }),
        ("llm goodput /s", |r| {
            llm(r, |l| format!("{:.1}", l.goodput_per_s))
        }),
        ("llm stalled backend ejected after ms", |r| {
            llm(r, |l| {
                or_dash(l.stall.as_ref(), |s| {
                    (s.ejected_after_ms).map_or("never".to_owned(), |v| format!("{v:.0}"))
                })
            })
        }),
        ("llm goodput after ejection /s (share)", |r| {
            llm(r, |l| {
                let stall = l.stall.as_ref();
                let after = stall.and_then(|s| s.goodput_after_ejection_per_s.zip(s.goodput_share));
                or_dash(after, |(g, share)| {
                    format!("{g:.1} ({:.0} %)", share * 100.0)
                })
            })
        }),
        ("llm sessions ≥ 95 % on one backend", |r| {
            llm(r, |l| match &l.affinity {
                None => "-".to_owned(),
                Some(a) => format!("{}/{}", a.sessions_95pct_on_one, a.sessions),
            })
        }),
        ("llm backend errors", |r| {
            llm(r, |l| {
                let n: u64 = (l.refused_by_code.iter())
                    .filter(|(code, _)| code.starts_with("backend_"))
                    .map(|(_, n)| n)
                    .sum();
                n.to_string()
            })
        }),
    ]
}

pub(crate) fn opt_ms(v: Option<f64>) -> String {
    or_dash(v, ms)
}

/// The terminal table: per scenario, one column per (streams, design).
pub fn table(reports: &[RunReport]) -> String {
    render(reports, false)
}

/// The same comparison as Markdown tables (for docs/loadtest.md).
pub fn markdown(reports: &[RunReport]) -> String {
    render(reports, true)
}

fn render(reports: &[RunReport], md: bool) -> String {
    let mut out = String::new();
    let mut scenarios: Vec<&str> = Vec::new();
    for r in reports {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
    }
    let bullet = if md { "- " } else { "  " };
    for scenario in scenarios {
        let mut cols: Vec<&RunReport> = reports.iter().filter(|r| r.scenario == scenario).collect();
        cols.sort_by_key(|r| {
            (
                r.streams,
                r.asr.as_ref().map(|a| a.design),
                r.flap.as_ref().map(|f| f.design),
                r.design,
            )
        });
        let first = cols[0];
        let fault = first
            .fault
            .as_ref()
            .map(|f| format!(" — {} {:.0} s at t={:.0} s", f.kind, f.duration_s, f.at_s))
            .unwrap_or_default();
        let title = format!("{scenario} ({:.0} s of audio{fault})", first.duration_s);
        let rows = if first.failover.is_some() {
            super::failover::rows()
        } else if first.asr.is_some() || first.churn.is_some() {
            crate::scenario::asr::table_rows(first)
        } else if first.flap.is_some() {
            crate::scenario::flap::table_rows()
        } else {
            rows()
        };
        if md {
            let _ = writeln!(out, "\n#### {title}\n");
        } else {
            let _ = writeln!(out, "\n{title}");
        }
        // At most 6 columns per block keeps the text table within 110 characters.
        let block = if md { markdown_block } else { text_block };
        for chunk in cols.chunks(if md { 8 } else { 6 }) {
            block(&mut out, chunk, &rows);
        }
        ceiling_verdicts(&mut out, &cols, bullet);
        if md {
            out.push('\n');
        }
        for r in &cols {
            for n in &r.notes {
                let col = column_label(r);
                let _ = writeln!(out, "{bullet}note [{} {col}]: {n}", r.scenario);
            }
        }
    }
    out
}

/// One Markdown table: a column per report of `chunk`, a line per row.
fn markdown_block(out: &mut String, chunk: &[&RunReport], rows: &[Row]) {
    out.push_str("| |");
    for r in chunk {
        let _ = write!(out, " {} |", column_label(r));
    }
    out.push_str("\n|---|");
    for _ in chunk {
        out.push_str("---:|");
    }
    out.push('\n');
    for (label, f) in rows {
        let _ = write!(out, "| {} |", label.trim());
        for r in chunk {
            let _ = write!(out, " {} |", f(r));
        }
        out.push('\n');
    }
    out.push('\n');
}

/// One text table: 13 characters a column, wider when a heading or a cell needs it
/// (two spaces between columns).
fn text_block(out: &mut String, chunk: &[&RunReport], rows: &[Row]) {
    let width = chunk
        .iter()
        .flat_map(|r| std::iter::once(column_label(r)).chain(rows.iter().map(|(_, f)| f(r))))
        .map(|c| c.chars().count() + 2)
        .fold(13, usize::max);
    let _ = write!(out, "{:<31}", "");
    for r in chunk {
        let _ = write!(out, "{:>width$}", column_label(r));
    }
    out.push('\n');
    for (label, f) in rows {
        let _ = write!(out, "{label:<31}");
        for r in chunk {
            let _ = write!(out, "{:>width$}", f(r));
        }
        out.push('\n');
    }
}

/// The ceiling ramp's verdict, once per design.
fn ceiling_verdicts(out: &mut String, cols: &[&RunReport], bullet: &str) {
    let mut verdicts: Vec<(Design, usize, &CeilingReport)> = Vec::new();
    for r in cols {
        if let (Some(max), Some(c)) = (r.max_streams, &r.ceiling)
            && !verdicts.iter().any(|(d, _, _)| *d == r.design)
        {
            verdicts.push((r.design, max, c));
        }
    }
    for (design, max, c) in verdicts {
        let _ = writeln!(
            out,
            "\nlargest sustainable stream count ({design}): {max}\n"
        );
        for step in &c.steps {
            let _ = writeln!(
                out,
                "{bullet}{:>5} streams: {}",
                step.streams,
                if step.sustainable {
                    "sustainable".to_owned()
                } else {
                    step.limited_by.join("; ")
                }
            );
        }
        for l in &c.limited_by {
            let _ = writeln!(out, "{bullet}limited by: {l}");
        }
    }
}
