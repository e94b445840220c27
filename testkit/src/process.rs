//! Facts about running processes, from `/proc` (Linux): what the load test and the
//! memory tests measure a binary with.

/// VmRSS of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// Parses the `VmRSS:   1234 kB` line of `/proc/<pid>/status`.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line.split_whitespace().skip(1);
    let value: u64 = parts.next()?.parse().ok()?;
    let unit = parts.next().unwrap_or("kB");
    let mult = match unit {
        "kB" => 1024,
        "mB" | "MB" => 1024 * 1024,
        "B" => 1,
        _ => return None,
    };
    Some(value * mult)
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
