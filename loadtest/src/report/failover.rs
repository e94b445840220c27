//! The failover scenarios' part of the report: their summary line and table rows.

use super::table::or_dash;
use super::{FailoverReport, Row, RunReport, opt_ms};

fn spread(v: &[usize]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("/")
}

/// The summary line of a failover run (what `one_line` prints for one).
pub fn failover_line(r: &RunReport, f: &FailoverReport) -> String {
    let a = &f.frames;
    let ownership = match (&f.takeover, &f.renewals) {
        (Some(t), _) => format!(
            "{}/{} orphaned partitions re-owned after median {} ms, max {} ms; spread {} → {} → {}; \
             restarted worker back to its share after {} ms",
            t.reowned,
            t.orphaned,
            opt_ms(t.reowned_ms_median),
            opt_ms(t.reowned_ms_max),
            spread(&f.spread_before),
            spread(&f.spread_before_restart),
            spread(&f.spread_end),
            opt_ms(f.rejoin_share_ms)
        ),
        (None, Some(n)) => format!(
            "owner changes {} (fenced {}), renewals resumed on {}/{} after max {} ms, longest \
             renewal gap {} ms",
            n.owner_changes,
            n.fenced,
            n.resumed,
            f.partitions,
            opt_ms(n.resumed_ms_max),
            opt_ms(n.longest_renewal_gap_ms)
        ),
        (None, None) => String::new(),
    };
    format!(
        "[{} {}] {} killed at {:.1} s: {ownership}; frames published {} handed {} double \
         deliveries {} lost in handover {} (declared {}) detected {} undeclared {} mid-stream + {} \
         at a stream's tail; machine {:.2} cores",
        r.scenario,
        r.streams,
        f.victim,
        f.killed_at_s,
        a.published,
        a.handed,
        a.double_deliveries,
        a.lost_in_handover,
        a.handover_declared,
        a.lost_detected,
        a.undeclared,
        a.undeclared_tail,
        f.cpu.machine_cores
    )
}

/// The rows of a failover scenario's table.
pub(super) fn rows() -> Vec<Row> {
    fn f(r: &RunReport) -> FailoverReport {
        r.failover.clone().unwrap_or_default()
    }
    vec![
        ("victim", |r| f(r).victim),
        ("killed / restarted at s", |r| {
            let f = f(r);
            format!("{:.1}/{:.1}", f.killed_at_s, f.restarted_at_s)
        }),
        ("workers x partitions", |r| {
            let f = f(r);
            format!("{}x{}", f.workers, f.partitions)
        }),
        ("spread before kill", |r| spread(&f(r).spread_before)),
        ("spread before restart", |r| {
            spread(&f(r).spread_before_restart)
        }),
        ("spread at end", |r| spread(&f(r).spread_end)),
        ("orphans re-owned", |r| {
            or_dash(f(r).takeover, |t| format!("{}/{}", t.reowned, t.orphaned))
        }),
        ("re-owned after p50 ms", |r| {
            or_dash(f(r).takeover, |t| opt_ms(t.reowned_ms_median))
        }),
        ("re-owned after max ms", |r| {
            or_dash(f(r).takeover, |t| opt_ms(t.reowned_ms_max))
        }),
        ("rejoin: share / balanced ms", |r| {
            let f = f(r);
            if f.takeover.is_none() {
                return "-".into();
            }
            format!(
                "{}/{}",
                opt_ms(f.rejoin_share_ms),
                opt_ms(f.rejoin_balanced_ms)
            )
        }),
        ("owner changes (fenced)", |r| {
            or_dash(f(r).renewals, |n| {
                format!("{} ({})", n.owner_changes, n.fenced)
            })
        }),
        ("renewals resumed max ms", |r| {
            or_dash(f(r).renewals, |n| opt_ms(n.resumed_ms_max))
        }),
        ("longest renewal gap ms", |r| {
            or_dash(f(r).renewals, |n| opt_ms(n.longest_renewal_gap_ms))
        }),
        ("frames published", |r| f(r).frames.published.to_string()),
        ("frames handed", |r| f(r).frames.handed.to_string()),
        ("double deliveries", |r| {
            f(r).frames.double_deliveries.to_string()
        }),
        ("lost in handover (declared)", |r| {
            let a = f(r).frames;
            format!("{} ({})", a.lost_in_handover, a.handover_declared)
        }),
        ("lost, detected by consumer", |r| {
            f(r).frames.lost_detected.to_string()
        }),
        ("undeclared losses", |r| {
            let a = f(r).frames;
            (a.undeclared + a.undeclared_tail).to_string()
        }),
        ("  of which at a stream's tail", |r| {
            f(r).frames.undeclared_tail.to_string()
        }),
        ("machine / other cores", |r| {
            let c = f(r).cpu;
            format!("{:.2}/{:.2}", c.machine_cores, c.other_cores)
        }),
    ]
}
