//! The process's own figures, for `/metrics`.
//!
//! [`RESIDENT_MEMORY_BYTES`] uses the name every Prometheus client library's process
//! collector uses, so existing dashboards and rules find it. It is sampled when
//! [`sample`] is called (each service calls it before rendering `/metrics`).

/// Gauge: resident set size of this process, in bytes (`VmRSS` of `/proc/self/status`;
/// absent where `/proc` is not available).
pub const RESIDENT_MEMORY_BYTES: &str = "process_resident_memory_bytes";

/// This process's resident set size in bytes, from `/proc/self/status` (Linux); `None`
/// elsewhere or if it cannot be read.
pub fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Sets [`RESIDENT_MEMORY_BYTES`] to the current value (no-op without a recorder, or
/// where it cannot be read).
pub fn sample() {
    if let Some(rss) = resident_memory_bytes() {
        metrics::gauge!(RESIDENT_MEMORY_BYTES).set(rss as f64);
    }
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
    fn this_process_has_a_resident_size_on_linux() {
        if cfg!(target_os = "linux") {
            let rss = resident_memory_bytes().expect("VmRSS");
            assert!(rss > 1024 * 1024, "{rss}");
        }
    }
}
