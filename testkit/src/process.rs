//! Facts about running processes, from `/proc` (Linux): what the load test and the
//! memory tests measure a binary with.

use weir_service::process::parse_vm_rss;

/// VmRSS of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vm_rss() {
        let s = "Name:\tx\nVmPeak:\t  999 kB\nVmRSS:\t   12345 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(s), Some(12345 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }

    #[test]
    fn reads_its_own_rss() {
        assert!(rss_bytes(std::process::id()).unwrap_or(0) > 0);
    }
}
