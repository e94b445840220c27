//! Facts about running processes: what the load test and the memory tests measure a
//! binary with (read by `weir_service::process`, the one `/proc` reader).

/// VmRSS of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    weir_service::process::rss_bytes_of(Some(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_rss() {
        assert!(rss_bytes(std::process::id()).unwrap_or(0) > 0);
    }
}
