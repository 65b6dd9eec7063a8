//! `stratus status`: what the cluster is made of and how full it is, as tables a person can
//! scan, or (`--json`) as one JSON document for scripts. Both render one
//! [`ClusterOverview`] (the client gathers it, as it does for the status page), so they always
//! say the same thing.

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};
use stratus_client::{
    dram_hit_ratio, Client, ClusterOverview, Error as ClientError, ServerOverview,
};
use stratus_types::TabletState;
use stratus_wire::{BackupDurability, ServerStatistics, ServerStatus};

/// How long one server may take to report its figures before it is shown as not answering.
const SERVER_PATIENCE: Duration = Duration::from_secs(2);

/// Everything `stratus status` shows, gathered once.
pub struct ClusterStatus {
    overview: ClusterOverview,
}

impl ClusterStatus {
    /// Asks the coordinator for servers, tables and tablets, then every live server for its
    /// master's and backup's figures.
    pub async fn gather(client: &Client) -> Result<ClusterStatus, ClientError> {
        Ok(ClusterStatus { overview: client.cluster_overview(SERVER_PATIENCE).await? })
    }

    /// Whether no complete copy of `server`'s log exists, so its tablets wait for an operator.
    fn recovery_impossible(&self, server: &ServerOverview) -> bool {
        self.overview.tablets.iter().any(|tablet| {
            tablet.owner == server.entry.server_id && tablet.state == TabletState::Unavailable
        })
    }

    /// The tables a person reads: servers, backups, tables with their tablets, and a line for
    /// each thing that needs attention.
    pub fn print_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut servers = TextTable::new(&[
            "SERVER",
            "ADDRESS",
            "STATUS",
            "TABLETS>",
            "OBJECTS>",
            "LIVE>",
            "LOG USED>",
            "LOG SIZE>",
            "UTIL>",
            "REQUESTS>",
        ]);
        let mut backups = TextTable::new(&[
            "SERVER",
            "DURABILITY",
            "REPLICAS>",
            "OPEN>",
            "BUFFERS>",
            "FRAMES FREE>",
            "DISK WRITTEN>",
        ]);
        // Where each master's memory goes: the log's resident pages (and what the memory
        // target asks of them), the hash table, and everything else in the process.
        let mut memory =
            TextTable::new(&["SERVER", "RSS>", "LOG RESIDENT>", "LOG TARGET>", "INDEX>", "OTHER>"]);
        let mut attention = Vec::new();
        for server in &self.overview.servers {
            let id = server.entry.server_id.to_string();
            let up = server.entry.status == ServerStatus::Up;
            let mut row = vec![id.clone(), server.entry.address.clone(), status_name(server)];
            match &server.statistics {
                Some(statistics) => row.extend([
                    statistics.tablets_owned.to_string(),
                    statistics.objects_live.to_string(),
                    bytes_text(statistics.log_bytes_live),
                    bytes_text(statistics.log_bytes_allocated),
                    bytes_text(statistics.log_bytes_total),
                    utilization_text(statistics),
                    statistics.requests_served.to_string(),
                ]),
                None if up && server.entry.services.has_master() => {
                    row.extend(std::iter::repeat_n("?".to_string(), 7))
                }
                None => row.extend(std::iter::repeat_n("-".to_string(), 7)),
            }
            servers.push(row);
            if let Some(statistics) = &server.statistics {
                let other = statistics
                    .process_resident_bytes
                    .saturating_sub(statistics.log_bytes_resident)
                    .saturating_sub(statistics.hash_table_bytes);
                memory.push(vec![
                    id.clone(),
                    bytes_text(statistics.process_resident_bytes),
                    bytes_text(statistics.log_bytes_resident),
                    match statistics.log_bytes_target {
                        0 => "off".to_string(),
                        target => bytes_text(target),
                    },
                    bytes_text(statistics.hash_table_bytes),
                    bytes_text(other),
                ]);
            }
            if let Some(backup) = &server.backup {
                backups.push(vec![
                    id.clone(),
                    durability_name(backup.durability).to_string(),
                    backup.replicas.to_string(),
                    backup.replicas_open.to_string(),
                    format!("{}/{}", backup.buffers_in_use, backup.buffer_count),
                    format!("{}/{}", backup.frames_free, backup.frame_count),
                    bytes_text(backup.disk_data_bytes_written),
                ]);
                if let Some(reason) = &backup.storage_failure {
                    attention.push(format!(
                        "server {id}: backup storage FAILED, it refuses writes until restarted: \
                         {reason}"
                    ));
                }
            }
            if let Some(problem) = &server.problem {
                attention.push(format!("server {id}: unreachable: {problem}"));
            }
            if self.recovery_impossible(server) {
                attention.push(format!(
                    "server {id}: RECOVERY IMPOSSIBLE: no complete copy of its log exists, its \
                     tablets are unavailable; `stratus recovery accept-loss {id}` hands them \
                     over empty"
                ));
            }
        }
        servers.print(out)?;
        if !memory.rows.is_empty() {
            writeln!(out)?;
            memory.print(out)?;
        }
        if !backups.rows.is_empty() {
            writeln!(out)?;
            backups.print(out)?;
        }
        writeln!(out)?;
        let mut tables = TextTable::new(&[
            "TABLE",
            "ID",
            "TIER",
            "TABLET START",
            "TABLET END",
            "SERVER",
            "STATE",
        ]);
        for table in &self.overview.tables {
            let tablets =
                self.overview.tablets.iter().filter(|tablet| tablet.table_id == table.table_id);
            for tablet in tablets {
                tables.push(vec![
                    table.name.clone(),
                    table.table_id.to_string(),
                    table.tier.to_string(),
                    format!("{:#018x}", tablet.range.start),
                    format!("{:#018x}", tablet.range.end),
                    tablet.owner.to_string(),
                    tablet_state_name(tablet.state).to_string(),
                ]);
            }
        }
        if self.overview.tables.is_empty() {
            writeln!(out, "no tables")?;
        } else {
            tables.print(out)?;
        }
        self.print_auto_tables(out)?;
        for line in attention {
            writeln!(out, "\n{line}")?;
        }
        Ok(())
    }

    /// Where each auto table's objects are (summed over its masters) and how its reads were
    /// served since those masters started; nothing when there is no auto table.
    fn print_auto_tables(&self, out: &mut impl Write) -> std::io::Result<()> {
        let figures = self.overview.auto_tables();
        if figures.is_empty() {
            return Ok(());
        }
        let mut auto = TextTable::new(&[
            "AUTO TABLE",
            "ID",
            "DRAM OBJECTS>",
            "DRAM>",
            "FLASH OBJECTS>",
            "FLASH>",
            "DRAM HIT RATIO>",
            "PROMOTED>",
            "DEMOTED>",
        ]);
        for (table_id, table) in &figures {
            let name = self.overview.tables.iter().find(|entry| entry.table_id == *table_id);
            auto.push(vec![
                name.map_or_else(|| "?".to_string(), |entry| entry.name.clone()),
                table_id.to_string(),
                table.dram_objects.to_string(),
                bytes_text(table.dram_bytes),
                table.flash_objects.to_string(),
                bytes_text(table.flash_bytes),
                dram_hit_ratio(table)
                    .map_or_else(|| "–".to_string(), |ratio| format!("{ratio:.3}")),
                table.promotions.to_string(),
                table.objects_demoted.to_string(),
            ]);
        }
        writeln!(out)?;
        auto.print(out)
    }

    /// One JSON document with every figure the servers reported (the text shows a selection).
    pub fn to_json(&self) -> Value {
        let servers: Vec<Value> =
            self.overview.servers.iter().map(|server| self.server_json(server)).collect();
        let auto_tables = self.overview.auto_tables();
        let tables: Vec<Value> = self
            .overview
            .tables
            .iter()
            .map(|table| {
                let tablets: Vec<Value> = self
                    .overview
                    .tablets
                    .iter()
                    .filter(|tablet| tablet.table_id == table.table_id)
                    .map(|tablet| {
                        json!({
                            "start_hash": tablet.range.start,
                            "end_hash": tablet.range.end,
                            "server_id": tablet.owner.0,
                            "server_address": tablet.owner_address,
                            "state": tablet_state_name(tablet.state),
                        })
                    })
                    .collect();
                let mut entry = json!({
                    "name": table.name,
                    "table_id": table.table_id.0,
                    "tier": table.tier.name(),
                    "tablets": tablets,
                });
                if let Some(figures) = auto_tables.get(&table.table_id) {
                    entry["auto"] = json!({
                        "dram_objects": figures.dram_objects,
                        "dram_bytes": figures.dram_bytes,
                        "flash_objects": figures.flash_objects,
                        "flash_bytes": figures.flash_bytes,
                        "reads_from_dram": figures.reads_from_dram,
                        "reads_from_flash": figures.reads_from_flash,
                        "dram_hit_ratio": dram_hit_ratio(figures),
                        "promotions": figures.promotions,
                        "objects_demoted": figures.objects_demoted,
                    });
                }
                entry
            })
            .collect();
        json!({ "servers": servers, "tables": tables })
    }

    fn server_json(&self, server: &ServerOverview) -> Value {
        let master = server.statistics.as_ref().map(|statistics| {
            json!({
                "tablets": statistics.tablets_owned,
                "objects_live": statistics.objects_live,
                "log_bytes_live": statistics.log_bytes_live,
                "log_bytes_live_objects": statistics.log_bytes_live_objects,
                "log_bytes_allocated": statistics.log_bytes_allocated,
                "log_bytes_total": statistics.log_bytes_total,
                "seglets_free": statistics.seglets_free,
                "seglets_total": statistics.seglets_total,
                "segments_in_log": statistics.segments_in_log,
                "requests_served": statistics.requests_served,
                "replicas": statistics.replicas,
                "bytes_replicated": statistics.bytes_replicated,
                "cleaner_bytes_replicated": statistics.cleaner_bytes_replicated,
                "segments_cleaned": statistics.segments_cleaned,
                "cleaner_bytes_relocated": statistics.cleaner_bytes_relocated,
                "compactions": statistics.compactions,
                "bytes_compacted": statistics.bytes_compacted,
                "memory": {
                    "process_resident_bytes": statistics.process_resident_bytes,
                    "log_bytes_resident": statistics.log_bytes_resident,
                    "log_bytes_target": statistics.log_bytes_target,
                    "hash_table_bytes": statistics.hash_table_bytes,
                    "other_bytes": statistics.process_resident_bytes
                        .saturating_sub(statistics.log_bytes_resident)
                        .saturating_sub(statistics.hash_table_bytes),
                },
            })
        });
        let backup = server.backup.as_ref().map(|backup| {
            json!({
                "durability": durability_name(backup.durability),
                "replicas": backup.replicas,
                "replicas_open": backup.replicas_open,
                "buffers_in_use": backup.buffers_in_use,
                "buffer_count": backup.buffer_count,
                "frames_free": backup.frames_free,
                "frame_count": backup.frame_count,
                "disk_syncs": backup.disk_syncs,
                "disk_write_jobs": backup.disk_write_jobs,
                "disk_data_bytes_written": backup.disk_data_bytes_written,
                "storage_failure": backup.storage_failure,
            })
        });
        json!({
            "server_id": server.entry.server_id.0,
            "address": server.entry.address,
            "status": status_name(server),
            "failure_domain": server.entry.failure_domain,
            "runs_master": server.entry.services.has_master(),
            "runs_backup": server.entry.services.has_backup(),
            "recovery_impossible": self.recovery_impossible(server),
            "problem": server.problem,
            "master": master,
            "backup": backup,
        })
    }
}

fn status_name(server: &ServerOverview) -> String {
    match server.entry.status {
        ServerStatus::Up => "up",
        ServerStatus::Crashed => "crashed",
        ServerStatus::Removed => "removed",
        ServerStatus::Stopped => "stopped",
    }
    .to_string()
}

fn durability_name(durability: BackupDurability) -> &'static str {
    match durability {
        BackupDurability::Buffered => "buffered",
        BackupDurability::Fsync => "fsync",
    }
}

fn tablet_state_name(state: TabletState) -> &'static str {
    match state {
        TabletState::Normal => "normal",
        TabletState::Recovering => "recovering",
        TabletState::Unavailable => "unavailable",
    }
}

/// Live bytes over allocated bytes: how full the memory the log holds is.
fn utilization_text(statistics: &ServerStatistics) -> String {
    if statistics.log_bytes_allocated == 0 {
        return "-".to_string();
    }
    let percent = 100.0 * statistics.log_bytes_live as f64 / statistics.log_bytes_allocated as f64;
    format!("{percent:.1}%")
}

/// Bytes in binary units, three significant figures at most.
fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value < 10.0 {
        format!("{value:.2} {}", UNITS[unit])
    } else if value < 100.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

/// Columns padded to their widest cell. A header that ends with `>` names a column of
/// quantities, right-aligned (the `>` is not printed); the others are left-aligned.
struct TextTable {
    header: Vec<String>,
    right_aligned: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl TextTable {
    fn new(header: &[&str]) -> TextTable {
        TextTable {
            header: header.iter().map(|cell| cell.trim_end_matches('>').to_string()).collect(),
            right_aligned: header.iter().map(|cell| cell.ends_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    fn push(&mut self, row: Vec<String>) {
        assert_eq!(row.len(), self.header.len(), "a row has one cell per column");
        self.rows.push(row);
    }

    fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|column| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .map(|row| row[column].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (column, cell) in row.iter().enumerate() {
                if column > 0 {
                    line.push_str("  ");
                }
                let width = widths[column];
                if self.right_aligned[column] {
                    line.push_str(&format!("{cell:>width$}"));
                } else {
                    line.push_str(&format!("{cell:<width$}"));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_in_binary_units_with_three_figures() {
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(1023), "1023 B");
        assert_eq!(bytes_text(1024), "1.00 KiB");
        assert_eq!(bytes_text(15 << 20), "15.0 MiB");
        assert_eq!(bytes_text(256 << 20), "256 MiB");
        assert_eq!(bytes_text(3 << 30), "3.00 GiB");
    }

    #[test]
    fn a_table_pads_columns_and_right_aligns_numbers() {
        let mut table = TextTable::new(&["NAME", "COUNT>"]);
        table.push(vec!["a".to_string(), "5".to_string()]);
        table.push(vec!["longer".to_string(), "1234".to_string()]);
        let mut out = Vec::new();
        table.print(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAME    COUNT\na           5\nlonger   1234\n"
        );
        let empty = TextTable::new(&["NAME", "COUNT>"]);
        let mut out = Vec::new();
        empty.print(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "NAME  COUNT\n");
    }
}
