//! What the servers say about their flash tier: their metrics endpoints (`GET /metrics`,
//! Prometheus text), summed over the servers, and the I/O mode each server's log names.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// How long one scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(20);

/// The figures of the flash tier and of the log the benchmark reads, summed over servers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlashFigures {
    /// `stratus_flash_objects_demoted_total`.
    pub objects_demoted: f64,
    /// `stratus_flash_image_bytes_written_total`.
    pub image_bytes_written: f64,
    /// `stratus_flash_images`.
    pub images: f64,
    /// `stratus_flash_image_bytes`.
    pub image_bytes: f64,
    /// `stratus_flash_images_refused_total`.
    pub images_refused: f64,
    /// `stratus_flash_images_deleted_total`.
    pub images_deleted: f64,
    /// `stratus_master_objects`: live objects, in memory or on flash.
    pub objects_live: f64,
    /// `stratus_log_live_bytes`: every live entry in memory (FLASH_OBJECT entries included).
    pub log_live_bytes: f64,
    /// `stratus_log_live_object_bytes`: OBJECT entries in memory (not on flash).
    pub log_live_object_bytes: f64,
    /// `stratus_log_tombstone_bytes`.
    pub log_tombstone_bytes: f64,
    /// `stratus_log_allocated_bytes`.
    pub log_allocated_bytes: f64,
    /// `stratus_hash_table_bytes`.
    pub hash_table_bytes: f64,
    /// `stratus_cleaner_segments_cleaned_total` where the server has it (0 otherwise).
    pub segments_cleaned: f64,
}

impl FlashFigures {
    /// Bytes of memory the log's live entries take besides objects in memory and tombstones:
    /// the FLASH_OBJECT entries, plus segment headers and digests (a few dozen bytes per
    /// segment) and completion records (none with exactly-once off).
    pub fn stub_bytes(&self) -> f64 {
        (self.log_live_bytes - self.log_live_object_bytes - self.log_tombstone_bytes).max(0.0)
    }
}

/// Scrapes every server's metrics and sums the figures.
pub fn flash_figures(servers: &[String]) -> Result<FlashFigures, String> {
    let mut sum = FlashFigures::default();
    for address in servers {
        let text = scrape(address)?;
        let value = |name: &str| series_sample(&text, name).unwrap_or(0.0);
        sum.objects_demoted += value("stratus_flash_objects_demoted_total");
        sum.image_bytes_written += value("stratus_flash_image_bytes_written_total");
        sum.images += value("stratus_flash_images");
        sum.image_bytes += value("stratus_flash_image_bytes");
        sum.images_refused += value("stratus_flash_images_refused_total");
        sum.images_deleted += value("stratus_flash_images_deleted_total");
        sum.objects_live += value("stratus_master_objects");
        sum.log_live_bytes += value("stratus_log_live_bytes");
        sum.log_live_object_bytes += value("stratus_log_live_object_bytes");
        sum.log_tombstone_bytes += value("stratus_log_tombstone_bytes");
        sum.log_allocated_bytes += value("stratus_log_allocated_bytes");
        sum.hash_table_bytes += value("stratus_hash_table_bytes");
        sum.segments_cleaned += value("stratus_cleaner_segments_cleaned_total");
    }
    Ok(sum)
}

/// The body of `GET /metrics` at `address` (`host:port`).
pub(crate) fn scrape(address: &str) -> Result<String, String> {
    let failed = |error: std::io::Error| format!("metrics of {address}: {error}");
    let mut stream = TcpStream::connect(address).map_err(failed)?;
    stream.set_read_timeout(Some(SCRAPE_TIMEOUT)).map_err(failed)?;
    let request = format!("GET /metrics HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(failed)?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).map_err(failed)?;
    let text = String::from_utf8_lossy(&bytes);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("metrics of {address}: no whole HTTP head"))?;
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(format!("metrics of {address}: {status}"));
    }
    Ok(body.to_string())
}

/// The value of the sample written exactly `series` in Prometheus text `text`: a name, or a
/// name with its labels as servers write them (`stratus_tier_auto_reads_total{from="dram"}`).
pub(crate) fn series_sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (sample, value) = line.rsplit_once(' ')?;
        (sample == series).then(|| value.trim().parse().ok()).flatten()
    })
}

/// How server `index` of a `stratus up` cluster in `directory` opened its flash directory
/// (`Direct` or `Buffered`, from the line its log has when it opens it), if it says.
pub fn server_flash_io(directory: &Path, index: u32) -> Option<String> {
    let log =
        std::fs::read_to_string(directory.join("logs").join(format!("server-{index}.log"))).ok()?;
    let line = log.lines().find(|line| line.contains("flash tier") && line.contains("mode="))?;
    let mode = line.split("mode=").nth(1)?.split_whitespace().next()?;
    Some(mode.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_found_by_its_whole_name_and_labels() {
        let text = "# HELP stratus_flash_images Segments.\n# TYPE stratus_flash_images gauge\n\
                    stratus_flash_images 7\nstratus_flash_images_refused_total 2\n\
                    stratus_master_table_objects{table=\"1\"} 5\nstratus_master_objects 1.5e3\n";
        assert_eq!(series_sample(text, "stratus_flash_images"), Some(7.0));
        assert_eq!(series_sample(text, "stratus_flash_images_refused_total"), Some(2.0));
        assert_eq!(series_sample(text, "stratus_master_objects"), Some(1500.0));
        assert_eq!(series_sample(text, "stratus_master_table_objects"), None);
        assert_eq!(series_sample(text, "stratus_flash"), None);
        assert_eq!(series_sample(text, "stratus_master_table_objects{table=\"1\"}"), Some(5.0));
        assert_eq!(series_sample(text, "stratus_master_table_objects{table=\"2\"}"), None);
    }
}
