//! The two Stratus servers of the benchmark, each a one-server `stratus up` cluster (R = 0,
//! metrics on): one whose auto table holds the data set in a DRAM budget a fifth of it, the
//! rest on flash; one whose log holds the same data set in a memory table. Both are loaded
//! with the YCSB driver's records; what the auto tier did is read from the server's metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use stratus_client::{TableId, Tier};

use super::{Sizes, TieringArguments};
use crate::flash::server::{scrape, series_sample};
use crate::flash::{ClusterShape, FlashCluster};
use crate::ycsb::driver::load;
use crate::ycsb::systems::Running;
use crate::ycsb::YcsbArguments;

/// How often the wait for the auto tier to settle reads the metrics.
const SETTLE_POLL: Duration = Duration::from_millis(200);
/// The longest the auto tier may take to bring its DRAM down to the budget after the load.
const SETTLE_PATIENCE: Duration = Duration::from_secs(120);

/// A server's cluster, its YCSB table loaded.
pub(super) struct LoadedServer {
    /// What the driver connects to (it shares the cluster's `stratus up` process).
    pub(super) running: Running,
    /// `auto` or `memory`.
    pub(super) tier: &'static str,
    /// Seconds the load took.
    pub(super) load_seconds: f64,
    /// Declared last: the cluster stops after the driver's handle on it is gone.
    pub(super) cluster: FlashCluster,
}

/// The auto tier's figures of a server's metrics (summed over the servers given).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct AutoFigures {
    /// `stratus_tier_auto_reads_total{from="dram"}`.
    pub(super) reads_from_dram: f64,
    /// `stratus_tier_auto_reads_total{from="flash"}`.
    pub(super) reads_from_flash: f64,
    /// `stratus_tier_auto_promotions_total`: objects a read brought back to DRAM.
    pub(super) promotions: f64,
    /// `stratus_tier_auto_promotions_refused_total`.
    pub(super) promotions_refused: f64,
    /// `stratus_tier_auto_demotions_total`: segments demoted over the budget.
    pub(super) demotions: f64,
    /// `stratus_tier_auto_objects_demoted_total`.
    pub(super) objects_demoted: f64,
    /// `stratus_tier_auto_bytes{place="dram"}`.
    pub(super) dram_bytes: f64,
    /// `stratus_tier_auto_bytes{place="flash"}`.
    pub(super) flash_bytes: f64,
    /// `stratus_tier_auto_objects{place="dram"}`.
    pub(super) dram_objects: f64,
    /// `stratus_tier_auto_objects{place="flash"}`.
    pub(super) flash_objects: f64,
    /// `stratus_cleaner_segments_cleaned_total` (combined cleaning), where the server has it.
    pub(super) segments_cleaned: f64,
}

impl AutoFigures {
    /// Scrapes `servers`' metrics.
    pub(super) fn scrape(servers: &[String]) -> Result<AutoFigures, String> {
        let mut sum = AutoFigures::default();
        for address in servers {
            let text = scrape(address)?;
            let value = |series: &str| {
                series_sample(&text, series)
                    .ok_or_else(|| format!("metrics of {address} have no {series}"))
            };
            sum.reads_from_dram += value("stratus_tier_auto_reads_total{from=\"dram\"}")?;
            sum.reads_from_flash += value("stratus_tier_auto_reads_total{from=\"flash\"}")?;
            sum.promotions += value("stratus_tier_auto_promotions_total")?;
            sum.promotions_refused += value("stratus_tier_auto_promotions_refused_total")?;
            sum.demotions += value("stratus_tier_auto_demotions_total")?;
            sum.objects_demoted += value("stratus_tier_auto_objects_demoted_total")?;
            sum.dram_bytes += value("stratus_tier_auto_bytes{place=\"dram\"}")?;
            sum.flash_bytes += value("stratus_tier_auto_bytes{place=\"flash\"}")?;
            sum.dram_objects += value("stratus_tier_auto_objects{place=\"dram\"}")?;
            sum.flash_objects += value("stratus_tier_auto_objects{place=\"flash\"}")?;
            sum.segments_cleaned +=
                series_sample(&text, "stratus_cleaner_segments_cleaned_total").unwrap_or(0.0);
        }
        Ok(sum)
    }

    /// Reads of auto objects since `before`, and the share of them served from DRAM (`None`
    /// when there were none).
    pub(super) fn reads_since(&self, before: &AutoFigures) -> (f64, Option<f64>) {
        let dram = self.reads_from_dram - before.reads_from_dram;
        let all = dram + self.reads_from_flash - before.reads_from_flash;
        (all, (all > 0.0).then(|| dram / all))
    }
}

/// The auto server: `--auto-dram-mib` of DRAM for auto tables, its table loaded with
/// `sizes.records` records; returns once the cleaner has brought the table's DRAM down to the
/// budget (or [`SETTLE_PATIENCE`] has passed: the row then shows what was in DRAM).
pub(super) fn start_auto(
    arguments: &TieringArguments,
    sizes: &Sizes,
) -> Result<LoadedServer, String> {
    let shape = shape(arguments, sizes.auto_log_mib, Some(arguments.auto_dram_mib));
    let server = start_loaded(arguments, sizes, &shape, Tier::Auto)?;
    settle(&server.cluster, arguments.auto_dram_mib << 20, arguments.segment_mib << 20)?;
    Ok(server)
}

/// The memory server: a log that holds the whole data set, its memory table loaded.
pub(super) fn start_memory(
    arguments: &TieringArguments,
    sizes: &Sizes,
) -> Result<LoadedServer, String> {
    let shape = shape(arguments, sizes.memory_log_mib, None);
    start_loaded(arguments, sizes, &shape, Tier::Memory)
}

fn shape(arguments: &TieringArguments, log_mib: u64, auto_dram_mib: Option<u64>) -> ClusterShape {
    ClusterShape {
        servers: 1,
        replicas: 0,
        log_mib,
        segment_mib: arguments.segment_mib,
        flash_gib: arguments.flash_gib,
        auto_dram_mib,
    }
}

fn start_loaded(
    arguments: &TieringArguments,
    sizes: &Sizes,
    shape: &ClusterShape,
    tier: Tier,
) -> Result<LoadedServer, String> {
    let tier_name = match tier {
        Tier::Auto => "auto",
        _ => "memory",
    };
    let cluster = FlashCluster::start_with(shape)?;
    let table: TableId = cluster
        .runtime
        .block_on(cluster.client.create_table_with_tier(&format!("usertable-{tier_name}"), 1, tier))
        .map_err(|error| format!("creating the {tier_name} table: {error}"))?;
    // Exactly-once clients, as in `bench ycsb`: they also retry a write refused with RETRY
    // while the log waits for the cleaner.
    let running = Running::Stratus {
        cluster: Arc::clone(&cluster.process),
        coordinator: cluster.coordinator.clone(),
        table,
        exactly_once: true,
        tls: None,
    };
    let loaded = load(&running, &driver_arguments(arguments, sizes, arguments.operations))
        .map_err(|error| format!("loading the {tier_name} table: {error}"))?;
    let load_seconds = loaded.runtime.as_secs_f64();
    println!(
        "# tiering: {tier_name} table loaded, {} records in {load_seconds:.1} s",
        sizes.records
    );
    Ok(LoadedServer { running, tier: tier_name, load_seconds, cluster })
}

/// The driver's arguments for phases of `operations` on the benchmark's records.
pub(super) fn driver_arguments(
    arguments: &TieringArguments,
    sizes: &Sizes,
    operations: u64,
) -> YcsbArguments {
    YcsbArguments::for_table(sizes.records, operations, arguments.threads, sizes.auto_log_mib)
}

/// Waits until the auto objects in DRAM are within the budget and one segment (the open
/// head, which is never demoted), and some are on flash.
fn settle(cluster: &FlashCluster, budget_bytes: u64, segment_bytes: u64) -> Result<(), String> {
    let started = Instant::now();
    let ceiling = (budget_bytes + segment_bytes) as f64;
    loop {
        let figures = AutoFigures::scrape(cluster.server_metrics())?;
        if figures.dram_bytes <= ceiling && figures.flash_bytes > 0.0 {
            println!(
                "# tiering: auto tier settled in {:.1} s: {:.1} MiB in DRAM, {:.1} MiB on flash",
                started.elapsed().as_secs_f64(),
                figures.dram_bytes / f64::from(1 << 20),
                figures.flash_bytes / f64::from(1 << 20)
            );
            return Ok(());
        }
        if started.elapsed() > SETTLE_PATIENCE {
            println!(
                "# tiering: auto tier not within its budget after {} s: {:.1} MiB in DRAM, \
                 {:.1} MiB on flash; measuring anyway",
                SETTLE_PATIENCE.as_secs(),
                figures.dram_bytes / f64::from(1 << 20),
                figures.flash_bytes / f64::from(1 << 20)
            );
            return Ok(());
        }
        std::thread::sleep(SETTLE_POLL);
    }
}
