//! The YCSB rows: workloads A, B and C (the `bench ycsb` driver and generators: 10 × 100-byte
//! fields, ScrambledZipfian keys) on a flash table about four times the server's log memory,
//! and on a memory table of a quarter of the log memory, in one cluster of one server (R = 0).
//!
//! Throughput per dollar, with flash at p $/GB and DRAM at 23 p, for the same data of B bytes:
//! the memory table costs 23 p B; the flash table p B for its values plus 23 p i B for what it
//! keeps in DRAM, where i is its measured DRAM bytes per byte of data (the DRAM row's figure,
//! for this table: FLASH_OBJECT entries and hash-table slots over record bytes). So
//!
//! ```text
//! per_dollar_ratio            = (T_flash / T_memory) × 23 / (1 + 23 i)
//! per_dollar_ratio_values_only = (T_flash / T_memory) × 23          (T2's accounting)
//! ```

use std::sync::Arc;

use stratus_client::Tier;

use super::load::{close_head_segment, memory_table_beside, remove_filler, wait_for_demotion};
use super::server::flash_figures;
use super::{FlashArguments, FlashCluster};
use crate::report::{print_json, Field};
use crate::ycsb::driver::{load, run_phase};
use crate::ycsb::generators::{Workload, FIELD_COUNT, FIELD_LENGTH, RECORD_LOG_BYTES};
use crate::ycsb::measure::PhaseResult;
use crate::ycsb::systems::Running;
use crate::ycsb::YcsbArguments;

/// DRAM's price per GB over flash's (T2).
const DRAM_OVER_FLASH_PRICE: f64 = 23.0;

/// Runs the YCSB rows.
pub(super) fn run(arguments: &FlashArguments) -> Result<(), String> {
    let workloads: Vec<Workload> = arguments
        .ycsb_workloads
        .iter()
        .map(|name| {
            let letter = name.trim().chars().next().unwrap_or('?');
            match letter {
                'a' | 'b' | 'c' => Workload::core(letter).ok_or(()),
                _ => Err(()),
            }
            .map_err(|()| format!("--ycsb-workloads takes a, b and c, not {name:?}"))
        })
        .collect::<Result<_, _>>()?;
    let flash_records = match arguments.ycsb_flash_records {
        0 => 4 * (arguments.ycsb_log_mib << 20) / RECORD_LOG_BYTES,
        records => records,
    };
    // A quarter of the log: the log keeps about three segments in reserve, and the flash
    // table's entries and the updates not yet demoted stay in memory beside it (half the log
    // did not fit at 64 MiB: its load was refused with RETRY, log full).
    let memory_records = match arguments.ycsb_memory_records {
        0 => ((arguments.ycsb_log_mib << 20) / 4 / RECORD_LOG_BYTES).max(1),
        records => records,
    };
    let cluster =
        FlashCluster::start(arguments, 1, 0, arguments.ycsb_log_mib, arguments.flash_gib)?;
    let (flash, memory) = create_tables(&cluster)?;
    // The flash table is loaded without exactly-once, so that no completion record counts in
    // the DRAM it keeps; everything else runs as `bench ycsb` does, with exactly-once (whose
    // clients also retry a write refused with RETRY while the log is full; others get the
    // refusal as an error).
    let flash_loading = running(&cluster, flash, false);
    let flash_running = running(&cluster, flash, true);
    let memory_running = running(&cluster, memory, true);
    let record_bytes = (FIELD_COUNT * FIELD_LENGTH) as f64;
    let before = flash_figures(cluster.server_metrics())?;
    load(&flash_loading, &driver_arguments(arguments, flash_records))
        .map_err(|error| format!("loading the flash table: {error}"))?;
    cluster.runtime.block_on(close_head_segment(&cluster.client, memory, cluster.segment_bytes))?;
    let after = wait_for_demotion(cluster.server_metrics(), &before, flash_records)?;
    // The filler that closed the head segment would take an eighth of the log from the memory
    // table: gone before the workloads run.
    cluster.runtime.block_on(remove_filler(&cluster.client, memory, cluster.segment_bytes))?;
    let demoted = after.objects_demoted - before.objects_demoted;
    let dram_per_record = (after.stub_bytes() - before.stub_bytes()) / demoted
        + after.hash_table_bytes / after.objects_live.max(1.0);
    let index_fraction = dram_per_record / record_bytes;
    let mut flash_results = Vec::new();
    for workload in &workloads {
        let ran = run_phase(&flash_running, &driver_arguments(arguments, flash_records), *workload)
            .map_err(|error| format!("workload {} on flash: {error}", workload.name))?;
        flash_results.push(ran);
    }
    load(&memory_running, &driver_arguments(arguments, memory_records))
        .map_err(|error| format!("loading the memory table: {error}"))?;
    for (workload, flash) in workloads.iter().zip(&flash_results) {
        let memory_result =
            run_phase(&memory_running, &driver_arguments(arguments, memory_records), *workload)
                .map_err(|error| {
                    let figures = flash_figures(cluster.server_metrics());
                    format!(
                        "workload {} in memory: {error}; the server then: {figures:?}",
                        workload.name
                    )
                })?;
        let sizes = Sizes { flash_records, memory_records, index_fraction, dram_per_record };
        report(arguments, workload, &sizes, flash, &memory_result);
    }
    Ok(())
}

fn create_tables(
    cluster: &FlashCluster,
) -> Result<(stratus_client::TableId, stratus_client::TableId), String> {
    let client = &cluster.client;
    cluster.runtime.block_on(async {
        let flash = client
            .create_table_with_tier("usertable-flash", 1, Tier::Flash)
            .await
            .map_err(|error| format!("creating the flash table: {error}"))?;
        let memory =
            memory_table_beside(client, flash, "usertable-memory", cluster.servers).await?;
        Ok((flash, memory))
    })
}

fn running(cluster: &FlashCluster, table: stratus_client::TableId, exactly_once: bool) -> Running {
    Running::Stratus {
        cluster: Arc::clone(&cluster.process),
        coordinator: cluster.coordinator.clone(),
        table,
        exactly_once,
        tls: None,
    }
}

/// The driver's arguments for one table.
fn driver_arguments(arguments: &FlashArguments, records: u64) -> YcsbArguments {
    YcsbArguments::for_table(
        records,
        arguments.ycsb_operations,
        arguments.ycsb_threads,
        arguments.ycsb_log_mib,
    )
}

/// The tables' sizes and what the flash table keeps in DRAM.
struct Sizes {
    flash_records: u64,
    memory_records: u64,
    /// DRAM bytes per byte of record on flash.
    index_fraction: f64,
    dram_per_record: f64,
}

fn ops_per_sec(result: &PhaseResult) -> f64 {
    result.operations as f64 / result.runtime.as_secs_f64().max(1e-9)
}

fn report(
    arguments: &FlashArguments,
    workload: &Workload,
    sizes: &Sizes,
    flash: &PhaseResult,
    memory: &PhaseResult,
) {
    let (flash_rate, memory_rate) = (ops_per_sec(flash), ops_per_sec(memory));
    let ratio = flash_rate / memory_rate;
    let per_dollar_values_only = ratio * DRAM_OVER_FLASH_PRICE;
    let per_dollar = per_dollar_values_only / (1.0 + DRAM_OVER_FLASH_PRICE * sizes.index_fraction);
    let config = format!("ycsb-{}", workload.name);
    let cpu = flash.cpu.system_us_per_op(flash.operations);
    super::rows::line(
        "ycsb",
        &config,
        "ops/s flash vs memory table",
        flash_rate,
        Some(memory_rate),
        cpu,
    );
    println!(
        "{:<6} {config:<8} {:<34} {:>12.3} {:>12.3}",
        "ycsb", "per dollar (with DRAM index / T2)", per_dollar, per_dollar_values_only
    );
    let mut fields = vec![
        ("bench", Field::Text("flash".into())),
        ("row", Field::Text("ycsb".into())),
        ("config", Field::Text(config)),
        ("workload", Field::Text(workload.name.to_string())),
        ("threads", Field::Number(f64::from(arguments.ycsb_threads))),
        ("operations", Field::Number(flash.operations as f64)),
        ("flash_records", Field::Number(sizes.flash_records as f64)),
        ("memory_records", Field::Number(sizes.memory_records as f64)),
        ("log_mib", Field::Number(arguments.ycsb_log_mib as f64)),
        ("flash_ops_per_sec", Field::Number(flash_rate)),
        ("memory_ops_per_sec", Field::Number(memory_rate)),
        ("throughput_ratio", Field::Number(ratio)),
        ("dram_bytes_per_flash_record", Field::Number(sizes.dram_per_record)),
        ("per_dollar_ratio", Field::Number(per_dollar)),
        ("per_dollar_ratio_values_only", Field::Number(per_dollar_values_only)),
        ("memory_cpu_us_per_op", Field::Number(memory.cpu.system_us_per_op(memory.operations))),
    ];
    fields.extend(flash.cpu.fields(flash.operations));
    print_json(&fields);
}
