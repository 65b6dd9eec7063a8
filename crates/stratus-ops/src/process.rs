//! Figures of this process, read from Linux's `/proc` at scrape time.

/// Bytes of this process's memory resident in RAM (`VmRSS` of `/proc/self/status`), or `None`
/// where that file does not exist or cannot be read. Log memory is reserved at start but
/// becomes resident only as it is used, so this grows with the data held.
pub fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_resident_kib(&status).map(|kib| kib.saturating_mul(1024))
}

fn parse_resident_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let kib = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(kib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_from_the_status_file() {
        let status = "Name:\tstratus\nVmPeak:\t  900 kB\nVmRSS:\t    1234 kB\nThreads:\t9\n";
        assert_eq!(parse_resident_kib(status), Some(1234));
        assert_eq!(parse_resident_kib("Name:\tx\n"), None);
        assert_eq!(parse_resident_kib("VmRSS:\t12 MB\n"), None, "only kB is understood");
        if cfg!(target_os = "linux") {
            assert!(resident_memory_bytes().is_some_and(|bytes| bytes > 0));
        }
    }
}
