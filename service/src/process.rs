//! The process's own figures, for `/metrics`, and the build-info series.
//!
//! The names are the ones every Prometheus client library's process collector uses
//! (`process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`,
//! `process_max_fds`), so existing dashboards and rules find them. They are read from
//! `/proc/self` when `/metrics` is scraped and rendered as text by [`render`]: nothing
//! samples them in between. Where `/proc` is not available they are absent.
//!
//! RSS is the figure weir exists to bound: compare it with each service's
//! `*_memory_bound_bytes`.

use std::fmt::Write as _;

/// Gauge: resident set size of this process, in bytes (`VmRSS` of `/proc/self/status`).
pub const RESIDENT_MEMORY_BYTES: &str = "process_resident_memory_bytes";
/// Counter: user + system CPU time of this process, in seconds (`/proc/self/stat`).
pub const CPU_SECONDS_TOTAL: &str = "process_cpu_seconds_total";
/// Gauge: open file descriptors (entries of `/proc/self/fd`).
pub const OPEN_FDS: &str = "process_open_fds";
/// Gauge: the soft limit on open file descriptors (`/proc/self/limits`).
pub const MAX_FDS: &str = "process_max_fds";
/// Gauge, always 1: the service and version, as labels `service` and `version`.
pub const BUILD_INFO: &str = "weir_build_info";

/// Every name [`render`] and [`build_info`] may write, for the deploy-kit check.
pub const NAMES: &[&str] = &[
    RESIDENT_MEMORY_BYTES,
    CPU_SECONDS_TOTAL,
    OPEN_FDS,
    MAX_FDS,
    BUILD_INFO,
];

/// Clock ticks per second of `/proc/self/stat`'s `utime`/`stime` (`USER_HZ`, fixed at
/// 100 in the Linux ABI on every architecture weir builds for).
const USER_HZ: f64 = 100.0;

/// This process's resident set size in bytes, from `/proc/self/status` (Linux); `None`
/// elsewhere or if it cannot be read.
pub fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

/// Parses the `VmRSS:   1234 kB` line of a `/proc/<pid>/status` into bytes (the
/// kernel writes it in kB).
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// This process's CPU time (user + system) in seconds.
pub fn cpu_seconds() -> Option<f64> {
    parse_cpu_seconds(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `utime` and `stime` are fields 14 and 15 of `/proc/<pid>/stat`; the command name
/// (field 2) is in parentheses and may contain spaces, so count after its `)`.
fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// Open file descriptors of this process.
pub fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// The soft open-files limit.
pub fn max_fds() -> Option<u64> {
    parse_max_fds(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Appends the process metrics, as of now, in the Prometheus text format.
pub fn render(out: &mut String) {
    let mut one = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {v}");
        }
    };
    one(
        RESIDENT_MEMORY_BYTES,
        "gauge",
        "Resident memory size in bytes.",
        resident_memory_bytes().map(|b| b as f64),
    );
    one(
        CPU_SECONDS_TOTAL,
        "counter",
        "Total user and system CPU time spent in seconds.",
        cpu_seconds(),
    );
    one(
        OPEN_FDS,
        "gauge",
        "Number of open file descriptors.",
        open_fds().map(|n| n as f64),
    );
    one(
        MAX_FDS,
        "gauge",
        "Maximum number of open file descriptors.",
        max_fds().map(|n| n as f64),
    );
}

/// Sets `weir_build_info{service, version} 1` (call once, after installing the
/// recorder).
pub fn build_info(service: &'static str, version: &'static str) {
    metrics::gauge!(BUILD_INFO, "service" => service, "version" => version).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tx\nVmHWM:\t  9000 kB\nVmRSS:\t   1234 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        // A command name with spaces and a parenthesis; utime 250, stime 50 ticks.
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(parse_cpu_seconds(stat), Some(3.0));
        assert_eq!(parse_cpu_seconds("42 (x) S 1"), None);
    }

    #[test]
    fn the_soft_open_files_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(parse_max_fds("Limit\n"), None);
    }

    #[test]
    fn this_process_renders_every_figure_on_linux() {
        if cfg!(target_os = "linux") {
            let rss = resident_memory_bytes().expect("VmRSS");
            assert!(rss > 1024 * 1024, "{rss}");
            let mut text = String::new();
            render(&mut text);
            for name in [RESIDENT_MEMORY_BYTES, CPU_SECONDS_TOTAL, OPEN_FDS, MAX_FDS] {
                assert!(text.contains(&format!("# TYPE {name} ")), "{name}: {text}");
            }
            assert!(open_fds().expect("fds") >= 3);
        }
    }
}
