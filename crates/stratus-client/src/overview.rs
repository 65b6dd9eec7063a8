//! The whole cluster at a glance: servers with their statistics, tables and tablets, gathered
//! with the ordinary RPCs (GET_SERVER_LIST, LIST_TABLES, GET_TABLET_MAP, GET_SERVER_STATISTICS,
//! BACKUP_GET_STATISTICS). What `stratus status` prints and the status page draws.

use std::time::Duration;

use std::collections::BTreeMap;

use stratus_wire::{
    AutoTableFigures, BackupServiceStatistics, ServerEntry, ServerStatistics, ServerStatus,
    TableEntry, TabletEntry,
};

use tokio::sync::Semaphore;

use crate::client::Client;
use crate::error::Result;
use crate::TableId;

/// Servers asked for their statistics at once: enough that a large cluster is gathered in a
/// few round trips, few enough that the connections and requests in flight stay bounded.
pub const OVERVIEW_ASKS_IN_FLIGHT_MAX: usize = 64;

/// One server and what it said about itself.
#[derive(Clone, Debug)]
pub struct ServerOverview {
    /// Its entry in the coordinator's server list.
    pub entry: ServerEntry,
    /// Its master's statistics (servers that are up and run a master, when they answered).
    pub statistics: Option<ServerStatistics>,
    /// Its backup's statistics (servers that are up and run a backup, when they answered).
    pub backup: Option<BackupServiceStatistics>,
    /// Why a server that is up did not answer, if it did not.
    pub problem: Option<String>,
}

/// The cluster at one moment (each server's figures taken within the same gathering, not at
/// one instant).
#[derive(Clone, Debug)]
pub struct ClusterOverview {
    /// Every server the coordinator knows, by id.
    pub servers: Vec<ServerOverview>,
    /// Every table.
    pub tables: Vec<TableEntry>,
    /// Every tablet, by table and range.
    pub tablets: Vec<TabletEntry>,
}

impl ClusterOverview {
    /// Each auto table's figures summed over the servers that reported it (a table's tablets
    /// may be on several masters), by table id. A master reports its 128 largest auto tables.
    pub fn auto_tables(&self) -> BTreeMap<TableId, AutoTableFigures> {
        let mut tables: BTreeMap<TableId, AutoTableFigures> = BTreeMap::new();
        let reported = self.servers.iter().filter_map(|server| server.statistics.as_ref());
        for figures in reported.flat_map(|statistics| &statistics.auto_tables) {
            let sum = tables.entry(figures.table_id).or_insert(AutoTableFigures {
                table_id: figures.table_id,
                ..AutoTableFigures::default()
            });
            // Saturating: the figures come from other processes, and a sum is no reason to
            // panic.
            let add = |total: &mut u64, value: u64| *total = total.saturating_add(value);
            add(&mut sum.dram_objects, figures.dram_objects);
            add(&mut sum.dram_bytes, figures.dram_bytes);
            add(&mut sum.flash_objects, figures.flash_objects);
            add(&mut sum.flash_bytes, figures.flash_bytes);
            add(&mut sum.reads_from_dram, figures.reads_from_dram);
            add(&mut sum.reads_from_flash, figures.reads_from_flash);
            add(&mut sum.promotions, figures.promotions);
            add(&mut sum.objects_demoted, figures.objects_demoted);
        }
        tables
    }
}

/// Reads served from DRAM over all reads of `figures`' table; `None` before any read.
pub fn dram_hit_ratio(figures: &AutoTableFigures) -> Option<f64> {
    let reads = figures.reads_from_dram.saturating_add(figures.reads_from_flash);
    (reads > 0).then(|| figures.reads_from_dram as f64 / reads as f64)
}

impl Client {
    /// Gathers the cluster overview: the server list, tables and tablet map from the
    /// coordinator, then every server's statistics, asked of up to
    /// [`OVERVIEW_ASKS_IN_FLIGHT_MAX`] servers at once, each answer waited for at most
    /// `per_server_patience` (a server that does not answer in time is reported with its
    /// problem, not waited for).
    pub async fn cluster_overview(&self, per_server_patience: Duration) -> Result<ClusterOverview> {
        let servers = self.server_list().await?;
        let tables = self.list_tables().await?;
        let tablets = self.tablet_map(TableId(0)).await?;
        let permits = std::sync::Arc::new(Semaphore::new(OVERVIEW_ASKS_IN_FLIGHT_MAX));
        let mut asks = tokio::task::JoinSet::new();
        for (index, entry) in servers.iter().enumerate() {
            if entry.status != ServerStatus::Up {
                continue;
            }
            let (client, entry, permits) = (self.clone(), entry.clone(), permits.clone());
            asks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let statistics = async {
                    match entry.services.has_master() {
                        true => Some(client.server_statistics(&entry.address).await),
                        false => None,
                    }
                };
                let backup = async {
                    match entry.services.has_backup() {
                        true => Some(client.backup_statistics(&entry.address).await),
                        false => None,
                    }
                };
                let ask = async { tokio::join!(statistics, backup) };
                (index, tokio::time::timeout(per_server_patience, ask).await)
            });
        }
        let mut overview: Vec<ServerOverview> = servers
            .into_iter()
            .map(|entry| ServerOverview { entry, statistics: None, backup: None, problem: None })
            .collect();
        while let Some(joined) = asks.join_next().await {
            let Ok((index, answer)) = joined else { continue };
            let server = &mut overview[index];
            let Ok((statistics, backup)) = answer else {
                server.problem = Some(format!("no answer within {per_server_patience:?}"));
                continue;
            };
            let mut problems = Vec::new();
            match statistics {
                Some(Ok(statistics)) => server.statistics = Some(statistics),
                Some(Err(error)) => problems.push(format!("master: {error}")),
                None => {}
            }
            match backup {
                Some(Ok(backup)) => server.backup = Some(backup),
                Some(Err(error)) => problems.push(format!("backup: {error}")),
                None => {}
            }
            if !problems.is_empty() {
                server.problem = Some(problems.join("; "));
            }
        }
        overview.sort_by_key(|server| server.entry.server_id);
        Ok(ClusterOverview { servers: overview, tables, tablets })
    }
}
