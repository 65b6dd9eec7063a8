//! The data of the coordinator's status page (`GET /api/cluster`).
//!
//! A sampler task gathers the cluster's overview once a second through the ordinary RPCs
//! (server list, tables, tablet map, every server's statistics), keeps the last two minutes of
//! each server's request counter and memory, and renders the page's JSON once per sample. A
//! request for the data only copies the last rendering: however many pages are open, the
//! servers are asked once a second, and a page opened now shows the last two minutes at once.
//! The shape of the JSON is documented in docs/design/metrics.md.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use stratus_client::{dram_hit_ratio, Client, ClientConfig, ClusterOverview};
use stratus_ops::http::Reply;
use stratus_ops::json::JsonWriter;
use stratus_types::{TableId, TabletState};
use stratus_wire::{AutoTableFigures, BackupDurability, ServerStatus, TableEntry};

/// Time between two samples.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Samples kept: two minutes.
const HISTORY_SAMPLES: usize = 120;

/// Servers whose history is kept (the lowest ids): bounds the history's memory (about 4 MiB
/// at most).
const HISTORY_SERVERS_MAX: usize = 1_024;

/// Lines per chart: the busiest (throughput) or fullest (memory) servers.
const CHART_SERIES_MAX: usize = 16;

/// Rows of the server and tablet tables sent to the page; the rest are counted.
const SERVER_ROWS_MAX: usize = 1_000;
const TABLET_ROWS_MAX: usize = 1_000;

/// How long each server's statistics may take in one sample.
const SERVER_PATIENCE: Duration = Duration::from_millis(800);

/// One server's figures in one sample.
#[derive(Clone, Copy, Debug)]
struct ServerPoint {
    server_id: u64,
    requests_served: u64,
    log_bytes_allocated: u64,
    log_bytes_total: u64,
}

/// The figures of every tracked server at one time, sorted by server id, and of every auto
/// table (summed over its masters), sorted by table id.
#[derive(Debug)]
struct Sample {
    time_ms: u64,
    servers: Vec<ServerPoint>,
    auto_tables: Vec<AutoTableFigures>,
}

/// Auto tables shown (the largest by bytes); the rest are counted.
const AUTO_TABLE_ROWS_MAX: usize = 128;

impl Sample {
    fn point(&self, server_id: u64) -> Option<&ServerPoint> {
        let index = self.servers.binary_search_by_key(&server_id, |point| point.server_id).ok()?;
        Some(&self.servers[index])
    }
}

/// Requests per second of `server_id` between two samples (none if it is missing from either,
/// or its counter went backwards: it restarted).
fn rate(earlier: &Sample, later: &Sample, server_id: u64) -> Option<f64> {
    let (before, after) = (earlier.point(server_id)?, later.point(server_id)?);
    per_second(earlier, later, before.requests_served, after.requests_served)
}

/// What a counter that went from `before` to `after` between two samples did per second (none
/// if no time passed or it went backwards: a server restarted).
fn per_second(earlier: &Sample, later: &Sample, before: u64, after: u64) -> Option<f64> {
    let elapsed_ms = later.time_ms.checked_sub(earlier.time_ms).filter(|&ms| ms > 0)?;
    let change = after.checked_sub(before)?;
    Some(change as f64 * 1000.0 / elapsed_ms as f64)
}

fn memory_percent(point: &ServerPoint) -> Option<f64> {
    (point.log_bytes_total > 0)
        .then(|| 100.0 * point.log_bytes_allocated as f64 / point.log_bytes_total as f64)
}

/// The page's data: the last rendering, or why there is none.
#[derive(Debug)]
pub(crate) struct StatusPageData {
    latest: Mutex<Result<Bytes, String>>,
}

impl StatusPageData {
    /// Starts the sampler, asking the coordinator at `coordinator_address`.
    pub(crate) fn start(
        coordinator_address: &str,
        client_password: Option<&[u8]>,
        tls: Option<stratus_tls::ClientTls>,
    ) -> Arc<StatusPageData> {
        let data = Arc::new(StatusPageData {
            latest: Mutex::new(Err("no sample of the cluster yet".to_string())),
        });
        let mut config = ClientConfig::new(coordinator_address);
        config.operation_timeout = Duration::from_secs(3);
        if let Some(password) = client_password {
            // Checked at start (`security_from_flags`): a bad one never gets here.
            config = config.with_password(password).expect("a checked client password");
        }
        config.tls = tls;
        let client = Client::new(config);
        tokio::spawn(sample_forever(client, coordinator_address.to_string(), data.clone()));
        data
    }

    /// `GET /api/cluster`.
    pub(crate) fn reply(&self) -> Reply {
        match &*self.latest.lock().unwrap_or_else(|poison| poison.into_inner()) {
            Ok(json) => Reply::ok("application/json", json.clone()),
            Err(problem) => Reply::error(503, problem),
        }
    }
}

async fn sample_forever(client: Client, coordinator_address: String, data: Arc<StatusPageData>) {
    let mut interval = tokio::time::interval(SAMPLE_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut history: VecDeque<Sample> = VecDeque::with_capacity(HISTORY_SAMPLES);
    loop {
        interval.tick().await;
        let latest = match client.cluster_overview(SERVER_PATIENCE).await {
            Ok(overview) => {
                let mut servers: Vec<ServerPoint> = overview
                    .servers
                    .iter()
                    .filter_map(|server| {
                        let statistics = server.statistics.as_ref()?;
                        Some(ServerPoint {
                            server_id: server.entry.server_id.0,
                            requests_served: statistics.requests_served,
                            log_bytes_allocated: statistics.log_bytes_allocated,
                            log_bytes_total: statistics.log_bytes_total,
                        })
                    })
                    .collect();
                servers.sort_by_key(|point| point.server_id);
                servers.truncate(HISTORY_SERVERS_MAX);
                if history.len() == HISTORY_SAMPLES {
                    history.pop_front();
                }
                let auto_tables = overview.auto_tables().into_values().collect();
                history.push_back(Sample { time_ms: now_ms(), servers, auto_tables });
                Ok(Bytes::from(render(&overview, &history, &coordinator_address)))
            }
            Err(error) => Err(format!("the coordinator did not answer: {error}")),
        };
        *data.latest.lock().unwrap_or_else(|poison| poison.into_inner()) = latest;
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

fn status_name(status: ServerStatus) -> &'static str {
    match status {
        ServerStatus::Up => "up",
        ServerStatus::Crashed => "crashed",
        ServerStatus::Stopped => "stopped",
        ServerStatus::Removed => "removed",
    }
}

/// The page's JSON from the newest overview and the history (whose last sample is the
/// overview's).
fn render(overview: &ClusterOverview, history: &VecDeque<Sample>, coordinator: &str) -> String {
    let newest = history.back();
    let previous = history.len().checked_sub(2).and_then(|index| history.get(index));
    let current_rate = |server_id: u64| match (previous, newest) {
        (Some(previous), Some(newest)) => rate(previous, newest, server_id),
        _ => None,
    };
    let mut json = JsonWriter::new();
    json.begin_object();
    json.key("time_ms").unsigned(newest.map_or(0, |sample| sample.time_ms));
    json.key("coordinator").string(coordinator);
    json.key("sample_interval_ms").unsigned(SAMPLE_INTERVAL.as_millis() as u64);
    json.key("history_samples").unsigned(HISTORY_SAMPLES as u64);

    let count = |status| overview.servers.iter().filter(|s| s.entry.status == status).count();
    let statistics = || overview.servers.iter().filter_map(|server| server.statistics.as_ref());
    let rates: Vec<f64> =
        overview.servers.iter().filter_map(|s| current_rate(s.entry.server_id.0)).collect();
    json.key("summary").begin_object();
    json.key("servers_up").unsigned(count(ServerStatus::Up) as u64);
    json.key("servers_crashed").unsigned(count(ServerStatus::Crashed) as u64);
    json.key("servers_removed").unsigned(count(ServerStatus::Removed) as u64);
    json.key("servers_stopped").unsigned(count(ServerStatus::Stopped) as u64);
    json.key("tables").unsigned(overview.tables.len() as u64);
    json.key("tablets").unsigned(overview.tablets.len() as u64);
    json.key("objects").unsigned(statistics().map(|s| s.objects_live).sum());
    json.key("requests_per_second");
    match rates.is_empty() {
        true => json.null(),
        false => json.number(rates.iter().sum()),
    };
    json.key("log_bytes_allocated").unsigned(statistics().map(|s| s.log_bytes_allocated).sum());
    json.key("log_bytes_total").unsigned(statistics().map(|s| s.log_bytes_total).sum());
    json.end_object();

    json.key("servers").begin_array();
    for server in overview.servers.iter().take(SERVER_ROWS_MAX) {
        let entry = &server.entry;
        json.begin_object();
        json.key("id").unsigned(entry.server_id.0);
        json.key("address").string(&entry.address);
        json.key("status").string(status_name(entry.status));
        json.key("master").boolean(entry.services.has_master());
        json.key("backup").boolean(entry.services.has_backup());
        json.key("requests_per_second");
        match current_rate(entry.server_id.0) {
            Some(rate) => json.number(rate),
            None => json.null(),
        };
        json.key("statistics");
        match &server.statistics {
            None => {
                json.null();
            }
            Some(statistics) => {
                json.begin_object();
                let figures = [
                    ("objects_live", statistics.objects_live),
                    ("tablets_owned", u64::from(statistics.tablets_owned)),
                    ("requests_served", statistics.requests_served),
                    ("log_bytes_total", statistics.log_bytes_total),
                    ("log_bytes_allocated", statistics.log_bytes_allocated),
                    ("log_bytes_live", statistics.log_bytes_live),
                    ("segments_in_log", statistics.segments_in_log),
                    ("replicas", u64::from(statistics.replicas)),
                    ("bytes_replicated", statistics.bytes_replicated),
                    ("segments_cleaned", statistics.segments_cleaned),
                    ("compactions", statistics.compactions),
                    ("process_resident_bytes", statistics.process_resident_bytes),
                    ("log_bytes_resident", statistics.log_bytes_resident),
                    ("log_bytes_target", statistics.log_bytes_target),
                    ("hash_table_bytes", statistics.hash_table_bytes),
                ];
                for (name, value) in figures {
                    json.key(name).unsigned(value);
                }
                json.end_object();
            }
        }
        json.key("backup_statistics");
        match &server.backup {
            None => {
                json.null();
            }
            Some(backup) => {
                json.begin_object();
                json.key("durability").string(match backup.durability {
                    BackupDurability::Buffered => "buffered",
                    BackupDurability::Fsync => "fsync",
                });
                let figures = [
                    ("replicas", backup.replicas),
                    ("replicas_open", backup.replicas_open),
                    ("buffers_in_use", backup.buffers_in_use),
                    ("buffer_count", backup.buffer_count),
                    ("frames_free", backup.frames_free),
                    ("frame_count", backup.frame_count),
                ];
                for (name, value) in figures {
                    json.key(name).unsigned(u64::from(value));
                }
                json.key("storage_failure").optional_string(backup.storage_failure.as_deref());
                json.end_object();
            }
        }
        json.key("problem").optional_string(server.problem.as_deref());
        json.end_object();
    }
    json.end_array();
    json.key("servers_omitted")
        .unsigned(overview.servers.len().saturating_sub(SERVER_ROWS_MAX) as u64);

    let tables: BTreeMap<_, &TableEntry> =
        overview.tables.iter().map(|table| (table.table_id, table)).collect();
    json.key("tablets").begin_array();
    for tablet in overview.tablets.iter().take(TABLET_ROWS_MAX) {
        json.begin_object();
        json.key("table_id").unsigned(tablet.table_id.0);
        // A table dropped between the gathering's requests has no name (nor tier) any more.
        let table = tables.get(&tablet.table_id);
        json.key("table").string(table.map_or("?", |table| table.name.as_str()));
        json.key("tier").string(table.map_or("?", |table| table.tier.name()));
        json.key("start").string(&format!("{:#018x}", tablet.range.start));
        json.key("end").string(&format!("{:#018x}", tablet.range.end));
        json.key("owner").unsigned(tablet.owner.0);
        json.key("owner_address").string(&tablet.owner_address);
        json.key("state").string(match tablet.state {
            TabletState::Normal => "normal",
            TabletState::Recovering => "recovering",
            TabletState::Unavailable => "unavailable",
        });
        json.end_object();
    }
    json.end_array();
    json.key("tablets_omitted")
        .unsigned(overview.tablets.len().saturating_sub(TABLET_ROWS_MAX) as u64);

    render_auto_tables(&mut json, &tables, previous, newest);
    render_history(&mut json, overview, history);
    json.end_object();
    json.finish()
}

/// Each auto table (the largest by bytes): where its objects are, its DRAM hit ratio since its
/// masters started and over the last sample, and its promotions and demotions per second.
fn render_auto_tables(
    json: &mut JsonWriter,
    tables: &BTreeMap<TableId, &TableEntry>,
    previous: Option<&Sample>,
    newest: Option<&Sample>,
) {
    let mut shown: Vec<&AutoTableFigures> =
        newest.map_or(Vec::new(), |sample| sample.auto_tables.iter().collect());
    let omitted = shown.len().saturating_sub(AUTO_TABLE_ROWS_MAX);
    if omitted > 0 {
        let bytes = |table: &AutoTableFigures| table.dram_bytes.saturating_add(table.flash_bytes);
        shown.sort_by(|a, b| bytes(b).cmp(&bytes(a)).then(a.table_id.cmp(&b.table_id)));
        shown.truncate(AUTO_TABLE_ROWS_MAX);
        shown.sort_by_key(|table| table.table_id);
    }
    let optional = |json: &mut JsonWriter, value: Option<f64>| {
        match value {
            Some(value) => json.number(value),
            None => json.null(),
        };
    };
    json.key("auto_tables").begin_array();
    for figures in shown {
        json.begin_object();
        json.key("table_id").unsigned(figures.table_id.0);
        let name = tables.get(&figures.table_id).map_or("?", |table| table.name.as_str());
        json.key("table").string(name);
        json.key("dram_objects").unsigned(figures.dram_objects);
        json.key("dram_bytes").unsigned(figures.dram_bytes);
        json.key("flash_objects").unsigned(figures.flash_objects);
        json.key("flash_bytes").unsigned(figures.flash_bytes);
        json.key("dram_hit_ratio");
        optional(json, dram_hit_ratio(figures));
        // Over the last sample: from the two samples' counters (none without reads between).
        let before = previous.zip(newest).and_then(|(previous, newest)| {
            let index = previous
                .auto_tables
                .binary_search_by_key(&figures.table_id, |table| table.table_id)
                .ok()?;
            Some((previous, newest, &previous.auto_tables[index]))
        });
        let change = |counter: fn(&AutoTableFigures) -> u64| {
            before.and_then(|(previous, newest, earlier)| {
                per_second(previous, newest, counter(earlier), counter(figures))
            })
        };
        let from_dram = change(|table| table.reads_from_dram);
        let from_flash = change(|table| table.reads_from_flash);
        json.key("dram_hit_ratio_now");
        optional(
            json,
            from_dram
                .zip(from_flash)
                .filter(|(dram, flash)| dram + flash > 0.0)
                .map(|(dram, flash)| dram / (dram + flash)),
        );
        json.key("promotions_per_second");
        optional(json, change(|table| table.promotions));
        json.key("demotions_per_second");
        optional(json, change(|table| table.objects_demoted));
        json.end_object();
    }
    json.end_array();
    json.key("auto_tables_omitted").unsigned(omitted as u64);
}

/// The charts' series: per sample, the requests per second of the busiest servers and the
/// memory in use of the fullest (by their newest figures).
fn render_history(json: &mut JsonWriter, overview: &ClusterOverview, history: &VecDeque<Sample>) {
    let addresses: BTreeMap<u64, &str> = overview
        .servers
        .iter()
        .map(|server| (server.entry.server_id.0, server.entry.address.as_str()))
        .collect();
    let samples: Vec<&Sample> = history.iter().collect();
    let pairs = || samples.windows(2).map(|pair| (pair[0], pair[1]));
    let newest = samples.last().map_or(&[][..], |sample| &sample.servers[..]);
    let newest_rate = |server_id: u64| pairs().next_back().and_then(|(a, b)| rate(a, b, server_id));

    let mut busiest: Vec<(f64, u64)> = newest
        .iter()
        .map(|point| (newest_rate(point.server_id).unwrap_or(0.0), point.server_id))
        .collect();
    busiest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut fullest: Vec<(f64, u64)> = newest
        .iter()
        .map(|point| (memory_percent(point).unwrap_or(0.0), point.server_id))
        .collect();
    fullest.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));

    json.key("history").begin_object();
    json.key("time_ms").begin_array();
    for sample in &samples {
        json.unsigned(sample.time_ms);
    }
    json.end_array();
    json.key("servers_tracked").unsigned(newest.len() as u64);
    let series =
        |json: &mut JsonWriter, server_id: u64, values: &mut dyn Iterator<Item = Option<f64>>| {
            json.begin_object();
            json.key("id").unsigned(server_id);
            json.key("address").string(addresses.get(&server_id).copied().unwrap_or("?"));
            json.key("values").begin_array();
            for value in values {
                match value {
                    Some(value) => json.number(value),
                    None => json.null(),
                };
            }
            json.end_array();
            json.end_object();
        };
    // Requests per second between each sample and the one before (none for the first).
    json.key("throughput").begin_array();
    for &(_, server_id) in busiest.iter().take(CHART_SERIES_MAX) {
        let mut values = std::iter::once(None)
            .chain(pairs().map(|(earlier, later)| rate(earlier, later, server_id)))
            .take(samples.len());
        series(json, server_id, &mut values);
    }
    json.end_array();
    json.key("memory").begin_array();
    for &(_, server_id) in fullest.iter().take(CHART_SERIES_MAX) {
        let mut values =
            samples.iter().map(|sample| sample.point(server_id).and_then(memory_percent));
        series(json, server_id, &mut values);
    }
    json.end_array();
    json.end_object();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time_ms: u64, points: &[(u64, u64)]) -> Sample {
        Sample {
            time_ms,
            servers: points
                .iter()
                .map(|&(server_id, requests_served)| ServerPoint {
                    server_id,
                    requests_served,
                    log_bytes_allocated: 1 << 20,
                    log_bytes_total: 4 << 20,
                })
                .collect(),
            auto_tables: Vec::new(),
        }
    }

    #[test]
    fn rates_come_from_two_samples_of_the_same_server() {
        let earlier = sample(1_000, &[(1, 100), (2, 50)]);
        let later = sample(1_500, &[(1, 600), (3, 7)]);
        assert_eq!(rate(&earlier, &later, 1), Some(1_000.0), "500 requests in 0.5 s");
        assert_eq!(rate(&earlier, &later, 2), None, "gone from the later sample");
        assert_eq!(rate(&earlier, &later, 3), None, "new in the later sample");
        let restarted = sample(2_000, &[(1, 10)]);
        assert_eq!(rate(&later, &restarted, 1), None, "a counter that went back: restarted");
        assert_eq!(rate(&later, &later, 1), None, "no time passed");
        assert_eq!(memory_percent(&later.servers[0]), Some(25.0));
    }

    #[test]
    fn auto_tables_show_where_their_objects_are_and_their_moves_per_second() {
        let figures =
            |reads_from_dram, reads_from_flash, promotions, objects_demoted| AutoTableFigures {
                table_id: TableId(4),
                dram_objects: 10,
                dram_bytes: 1_000,
                flash_objects: 40,
                flash_bytes: 4_000,
                reads_from_dram,
                reads_from_flash,
                promotions,
                objects_demoted,
            };
        let mut earlier = sample(1_000, &[]);
        earlier.auto_tables = vec![figures(100, 100, 5, 50)];
        let mut later = sample(3_000, &[]);
        later.auto_tables = vec![figures(190, 110, 25, 54)];
        let table = TableEntry {
            name: "sessions".to_string(),
            table_id: TableId(4),
            tablet_count: 1,
            tier: stratus_types::Tier::Auto,
        };
        let tables: BTreeMap<TableId, &TableEntry> = [(TableId(4), &table)].into_iter().collect();
        let mut json = JsonWriter::new();
        json.begin_object();
        render_auto_tables(&mut json, &tables, Some(&earlier), Some(&later));
        json.end_object();
        let json = json.finish();
        assert!(json.contains(r#""table":"sessions""#), "{json}");
        assert!(json.contains(r#""flash_bytes":4000"#), "{json}");
        // 300 reads since start, 190 from DRAM; over the last 2 s, 90 of 100.
        assert!(json.contains(r#""dram_hit_ratio":0.6333"#), "{json}");
        assert!(json.contains(r#""dram_hit_ratio_now":0.9"#), "{json}");
        assert!(json.contains(r#""promotions_per_second":10"#), "{json}");
        assert!(json.contains(r#""demotions_per_second":2"#), "{json}");
        // The first sample has no rates.
        let mut json = JsonWriter::new();
        json.begin_object();
        render_auto_tables(&mut json, &tables, None, Some(&earlier));
        json.end_object();
        let json = json.finish();
        assert!(json.contains(r#""promotions_per_second":null"#), "{json}");
        assert!(json.contains(r#""auto_tables_omitted":0"#), "{json}");
    }

    #[test]
    fn the_history_json_has_one_value_per_sample_and_the_busiest_first() {
        let overview =
            ClusterOverview { servers: Vec::new(), tables: Vec::new(), tablets: Vec::new() };
        let history: VecDeque<Sample> = [
            sample(0, &[(1, 0), (2, 0)]),
            sample(1_000, &[(1, 10), (2, 500)]),
            sample(2_000, &[(1, 30), (2, 1_500)]),
        ]
        .into_iter()
        .collect();
        let json = render(&overview, &history, "127.0.0.1:7400");
        assert!(json.contains(r#""time_ms":[0,1000,2000]"#), "{json}");
        assert!(
            json.contains(
                r#""throughput":[{"id":2,"address":"?","values":[null,500,1000]},{"id":1,"address":"?","values":[null,10,20]}]"#
            ),
            "{json}"
        );
        assert!(json.contains(r#""values":[25,25,25]"#), "{json}");
    }
}
