//! Every figure weir reads from `/proc` (Linux), in one place: the process's own for
//! `/metrics` and the build-info series, and another process's by pid (what the tests
//! and the load test measure a binary with). CPU times are converted at the kernel's
//! clock tick rate (`sysconf(_SC_CLK_TCK)`), not an assumed 100 Hz; the parsing is the
//! `procfs` crate's.
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
use std::time::Duration;

use procfs::process::{LimitValue, Process};
use procfs::{Current as _, CurrentSI as _};

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

/// A process's `/proc` entry: this process or another one by pid.
fn process(pid: Option<u32>) -> Option<Process> {
    match pid {
        None => Process::myself().ok(),
        Some(pid) => Process::new(i32::try_from(pid).ok()?).ok(),
    }
}

/// The kernel's clock tick rate for `/proc` CPU times (`sysconf(_SC_CLK_TCK)`).
fn ticks(n: u64) -> Duration {
    let per_second = procfs::ticks_per_second().max(1);
    Duration::from_secs(n / per_second)
        + Duration::from_nanos((n % per_second) * 1_000_000_000 / per_second)
}

/// This process's resident set size in bytes (`VmRSS`); `None` where `/proc` cannot be
/// read.
pub fn resident_memory_bytes() -> Option<u64> {
    rss_bytes_of(None)
}

/// The resident set size of process `pid` (or this process for `None`), in bytes.
pub fn rss_bytes_of(pid: Option<u32>) -> Option<u64> {
    process(pid)?.status().ok()?.vmrss?.checked_mul(1024)
}

/// This process's CPU time (user + system) in seconds.
pub fn cpu_seconds() -> Option<f64> {
    cpu_time_of(None).map(|d| d.as_secs_f64())
}

/// The CPU time (user + system) process `pid` (or this process for `None`) has used.
pub fn cpu_time_of(pid: Option<u32>) -> Option<Duration> {
    let stat = process(pid)?.stat().ok()?;
    Some(ticks(stat.utime.saturating_add(stat.stime)))
}

/// The one-letter scheduler state of process `pid` (`R`, `S`, `T` for stopped, ...).
pub fn state_of(pid: u32) -> Option<char> {
    Some(process(Some(pid))?.stat().ok()?.state)
}

/// Open file descriptors of this process.
pub fn open_fds() -> Option<u64> {
    Some(Process::myself().ok()?.fd_count().ok()? as u64)
}

/// The soft open-files limit.
pub fn max_fds() -> Option<u64> {
    let limits = Process::myself().ok()?.limits().ok()?;
    match limits.max_open_files.soft_limit {
        LimitValue::Value(n) => Some(n),
        LimitValue::Unlimited => None,
    }
}

/// CPU time the whole machine spent busy (all cores: user, nice, system, irq, softirq,
/// steal; not idle or iowait).
pub fn machine_busy() -> Option<Duration> {
    let t = procfs::KernelStats::current().ok()?.total;
    let busy = [
        Some(t.user),
        Some(t.nice),
        Some(t.system),
        t.irq,
        t.softirq,
        t.steal,
    ]
    .into_iter()
    .flatten()
    .fold(0u64, u64::saturating_add);
    Some(ticks(busy))
}

/// The one-minute load average.
pub fn load_average_1m() -> Option<f64> {
    Some(f64::from(procfs::LoadAverage::current().ok()?.one))
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
    fn this_process_renders_every_figure_on_linux() {
        if cfg!(target_os = "linux") {
            let rss = resident_memory_bytes().expect("VmRSS");
            assert!(rss > 1024 * 1024, "{rss}");
            assert_eq!(
                rss_bytes_of(Some(std::process::id())).map(|b| b > 0),
                Some(true)
            );
            let mut text = String::new();
            render(&mut text);
            for name in [RESIDENT_MEMORY_BYTES, CPU_SECONDS_TOTAL, OPEN_FDS, MAX_FDS] {
                assert!(text.contains(&format!("# TYPE {name} ")), "{name}: {text}");
            }
            assert!(open_fds().expect("fds") >= 3);
            assert!(matches!(state_of(std::process::id()), Some('R' | 'S')));
            assert!(machine_busy().expect("/proc/stat") > Duration::ZERO);
            assert!(load_average_1m().is_some());
        }
    }

    #[test]
    fn cpu_ticks_are_converted_at_the_kernels_rate() {
        let hz = procfs::ticks_per_second();
        assert_eq!(ticks(hz), Duration::from_secs(1));
        assert_eq!(ticks(hz * 3 / 2), Duration::from_millis(1500));
        if cfg!(target_os = "linux") {
            let first = cpu_time_of(None).expect("stat");
            assert!(cpu_time_of(None).expect("stat") >= first);
        }
    }
}
