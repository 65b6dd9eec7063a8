//! The roles' HTTP endpoints (`--metrics-listen`): `GET /metrics` on every storage server and
//! on the coordinator, and on the coordinator the status page (`GET /`) with its data
//! (`GET /api/cluster`). Every metric name, type and label is listed in
//! `docs/design/metrics.md`; this file is where they are written.
//!
//! A scrape gathers the figures when it arrives, from the statistics the services keep anyway
//! (the store's, the replica manager's, the backup's) and from the master's request metrics;
//! nothing here runs between scrapes.

use std::collections::BTreeSet;
use std::sync::Arc;

use stratus_backup::{BackupService, Durability};
use stratus_coordinator::Coordinator;
use stratus_master::{Master, Operation};
use stratus_ops::exposition::CONTENT_TYPE;
use stratus_ops::http::{HttpLimits, Reply, Routes};
use stratus_ops::{Exposition, MetricType};
use stratus_rpc::Membership;
use stratus_tls::ServerTls;
use stratus_types::{ServerId, TableId, Tier};
use tokio::net::TcpListener;

use super::status_page::StatusPageData;
use super::ProcessTls;

/// Binds the metrics address, if one was given: before the role joins the cluster, so a port
/// that is taken stops the process before it enlists.
pub(crate) async fn bind(address: Option<&str>) -> Result<Option<TcpListener>, String> {
    match address {
        Some(address) => stratus_ops::http::bind(address)
            .await
            .map(Some)
            .map_err(|error| format!("metrics: {error}")),
        None => Ok(None),
    }
}

/// The address `listener` is bound to, as printed.
fn bound_address(listener: &TcpListener) -> String {
    listener.local_addr().map_or_else(|error| format!("unknown ({error})"), |a| a.to_string())
}

/// What a storage server's scrape reads.
pub(crate) struct ServerFigures {
    pub(crate) server_id: ServerId,
    pub(crate) address: String,
    pub(crate) master: Arc<Master>,
    pub(crate) backup: Option<Arc<BackupService>>,
    /// The server's RESP front end, if it has one.
    pub(crate) resp: Option<Arc<stratus_resp::Gateway>>,
}

/// Who may read a role's endpoints, what its membership refused, the client password the
/// status page's own client proves, and the process's TLS (the endpoints speak it too).
pub(crate) struct MetricsAccess {
    /// With a cluster secret: what the process refused to non-members.
    pub(crate) membership: Option<Arc<Membership>>,
    /// The token every request must carry, if one was given.
    pub(crate) token: Option<String>,
    /// The cluster's client password, if it requires one.
    pub(crate) client_password: Option<Vec<u8>>,
    /// The process's TLS, if it speaks it.
    pub(crate) tls: Option<ProcessTls>,
}

impl MetricsAccess {
    pub(crate) fn new(
        membership: Option<Arc<Membership>>,
        client_password: Option<Vec<u8>>,
        tls: Option<ProcessTls>,
    ) -> MetricsAccess {
        MetricsAccess { membership, token: None, client_password, tls }
    }

    fn server_tls(&self) -> Option<Arc<ServerTls>> {
        self.tls.as_ref().map(|tls| tls.server.clone())
    }

    /// "http" or "https", for the addresses printed at start.
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    pub(crate) fn with_token(mut self, token: Option<String>) -> MetricsAccess {
        self.token = token;
        self
    }

    fn protect(&self, routes: Routes) -> Routes {
        match &self.token {
            Some(token) => routes.require_token(token),
            None => routes,
        }
    }
}

/// Serves a storage server's `GET /metrics` on `listener`.
pub(crate) fn serve_server(listener: TcpListener, figures: ServerFigures, access: MetricsAccess) {
    println!("metrics served at {}://{}/metrics", access.scheme(), bound_address(&listener));
    let figures = Arc::new(figures);
    let membership = access.membership.clone();
    let tls = access.server_tls();
    let routes = access.protect(Routes::new().get("/metrics", move || {
        let (figures, membership, tls) = (figures.clone(), membership.clone(), tls.clone());
        async move {
            let mut text = render_server(&figures);
            text.push_str(&render_security(membership.as_deref(), tls.as_deref()));
            Reply::ok(CONTENT_TYPE, text)
        }
    }));
    let tls = access.server_tls();
    tokio::spawn(stratus_ops::http::serve(listener, routes, HttpLimits::default(), tls));
}

/// Serves the coordinator's `GET /metrics`, the status page (`GET /`) and its data
/// (`GET /api/cluster`, see `status_page.rs`) on `listener`; `coordinator_address` is where
/// the coordinator serves RPCs (the page's data is gathered through them, like any client's).
pub(crate) fn serve_coordinator(
    listener: TcpListener,
    coordinator: Coordinator,
    coordinator_address: &str,
    access: MetricsAccess,
) {
    let membership = access.membership.clone();
    let tls = access.server_tls();
    let bound = bound_address(&listener);
    let scheme = access.scheme();
    println!("metrics served at {scheme}://{bound}/metrics");
    println!("status page served at {scheme}://{bound}/");
    let client_tls = access.tls.as_ref().map(|tls| tls.client.clone());
    let data =
        StatusPageData::start(coordinator_address, access.client_password.as_deref(), client_tls);
    let routes = Routes::new()
        .get("/metrics", move || {
            let (coordinator, membership) = (coordinator.clone(), membership.clone());
            let tls = tls.clone();
            async move {
                let mut text = render_coordinator(&coordinator).await;
                text.push_str(&render_security(membership.as_deref(), tls.as_deref()));
                Reply::ok(CONTENT_TYPE, text)
            }
        })
        .get("/", || async {
            Reply {
                extra_headers: &[(
                    "content-security-policy",
                    stratus_ops::STATUS_PAGE_CONTENT_SECURITY_POLICY,
                )],
                ..Reply::ok("text/html; charset=utf-8", stratus_ops::STATUS_PAGE_HTML)
            }
        })
        .get("/api/cluster", move || {
            let reply = data.reply();
            async move { reply }
        });
    let routes = access.protect(routes);
    let tls = access.server_tls();
    tokio::spawn(stratus_ops::http::serve(listener, routes, HttpLimits::default(), tls));
}

/// The RESP front end's counters (docs/design/metrics.md, "RESP").
fn render_resp(gateway: &stratus_resp::Gateway, out: &mut Exposition) {
    let statistics = gateway.statistics();
    out.family(
        "stratus_resp_connected_clients",
        "Connections open to the server's RESP front end.",
        MetricType::Gauge,
    )
    .sample(&[], statistics.connected_clients);
    out.family(
        "stratus_resp_connections_received_total",
        "Connections the RESP front end accepted.",
        MetricType::Counter,
    )
    .sample(&[], statistics.connections_received);
    out.family(
        "stratus_resp_commands_processed_total",
        "Commands the RESP front end executed.",
        MetricType::Counter,
    )
    .sample(&[], statistics.commands_processed);
    out.family(
        "stratus_resp_authentications_failed_total",
        "AUTH and HELLO ... AUTH attempts refused: a wrong user or password, or past the \
         gateway's 100 attempts a second.",
        MetricType::Counter,
    )
    .sample(&[], statistics.authentications_failed);
}

fn render_server(figures: &ServerFigures) -> String {
    let mut out = Exposition::new();
    if let Some(gateway) = &figures.resp {
        render_resp(gateway, &mut out);
    }
    let server_id = figures.server_id.to_string();
    out.family(
        "stratus_server_info",
        "The storage server's id, advertised address and version (value 1).",
        MetricType::Gauge,
    )
    .sample(
        &[
            ("server_id", &server_id),
            ("address", &figures.address),
            ("version", env!("CARGO_PKG_VERSION")),
        ],
        1u64,
    );
    render_master(&figures.master, &mut out);
    if let Some(backup) = &figures.backup {
        render_backup(backup, &mut out);
    }
    render_process(&mut out);
    out.into_text()
}

/// The membership counters of a process that runs with a cluster secret (none without one).
fn render_security(membership: Option<&Membership>, tls: Option<&ServerTls>) -> String {
    let mut out = Exposition::new();
    if let Some(tls) = tls {
        out.family(
            "stratus_tls_handshakes_failed_total",
            "TLS handshakes that failed or took too long on this process's listeners (a client \
             without TLS, one that does not trust the certificate, or one without an accepted \
             certificate of its own).",
            MetricType::Counter,
        )
        .sample(&[], tls.handshakes_failed());
        out.family(
            "stratus_tls_reloads_total",
            "Times the certificate files changed and were loaded (new connections use them).",
            MetricType::Counter,
        )
        .sample(&[], tls.reloads());
        out.family(
            "stratus_tls_reloads_failed_total",
            "Times the certificate files changed and did not load (the previous certificate \
             stays in use).",
            MetricType::Counter,
        )
        .sample(&[], tls.reloads_failed());
    }
    if let Some(membership) = membership {
        out.family(
            "stratus_membership_handshakes_refused_total",
            "Connections that opened the membership preamble and did not prove the cluster \
             secret (a wrong secret, a replayed or malformed handshake).",
            MetricType::Counter,
        )
        .sample(&[], membership.handshakes_refused());
        out.family(
            "stratus_membership_requests_refused_total",
            "Server-to-server requests refused (PERMISSION_DENIED) on connections that did not \
             prove the cluster secret.",
            MetricType::Counter,
        )
        .sample(&[], membership.requests_refused());
        if let Some(users) = membership.users() {
            out.family(
                "stratus_users_authentications_failed_total",
                "Named users' preambles refused by this process: a wrong password, an unknown \
                 or disabled user, or a name refused unchecked after too many failures in a \
                 second.",
                MetricType::Counter,
            )
            .sample(&[], users.authentications_failed());
            out.family(
                "stratus_users_requests_denied_total",
                "Requests of named users refused (PERMISSION_DENIED) for want of a grant.",
                MetricType::Counter,
            )
            .sample(&[], users.requests_denied());
            out.family(
                "stratus_users",
                "Named users in the user directory this process checks against.",
                MetricType::Gauge,
            )
            .sample(&[], users.snapshot().users.len() as u64);
        }
    }
    out.into_text()
}

fn render_master(master: &Master, out: &mut Exposition) {
    let metrics = master.metrics();
    let latencies = Operation::ALL.map(|operation| (operation, metrics.latency(operation)));
    let mut requests = out.family(
        "stratus_master_requests_total",
        "Requests the master answered, by operation (control: ping, statistics, tablet \
         ownership, and opcodes a master does not serve).",
        MetricType::Counter,
    );
    for (operation, latency) in &latencies {
        requests.sample(&[("operation", operation.name())], latency.count());
    }
    let mut durations = out.family(
        "stratus_master_request_duration_seconds",
        "Time from a request's arrival at the master to its answer, replication to the \
         backups included, by operation.",
        MetricType::Histogram,
    );
    for (operation, latency) in &latencies {
        durations.histogram(&[("operation", operation.name())], latency);
    }
    let mut items = out.family(
        "stratus_master_multi_op_objects_total",
        "Objects named by the master's multi-operations, by operation.",
        MetricType::Counter,
    );
    for operation in Operation::ALL.into_iter().filter(|operation| operation.is_multi()) {
        items.sample(&[("operation", operation.name())], metrics.items(operation));
    }
    out.gauge(
        "stratus_master_lease_valid",
        "1 while the master holds a lease from the coordinator (it serves only then).",
        master.may_serve(),
    );
    out.gauge("stratus_master_tablets", "Tablets the master owns.", master.ownership().count());

    let store = master.store().statistics();
    out.gauge("stratus_master_objects", "Live objects in the master's store.", store.objects_live);
    render_tables(master, out);
    out.gauge(
        "stratus_log_capacity_bytes",
        "Bytes of the log's memory region.",
        store.log_bytes_total,
    );
    out.gauge(
        "stratus_log_allocated_bytes",
        "Bytes of log memory in seglets allocated to segments (memory in use).",
        store.log_bytes_allocated,
    );
    out.gauge(
        "stratus_log_resident_bytes",
        "Bytes of the log region whose pages are resident, at most: allocated seglets, those \
         waiting for readers, and free seglets not given back to the system.",
        store.log_bytes_resident,
    );
    out.gauge(
        "stratus_log_target_bytes",
        "What the memory target asks the resident log to stay near (live / target percentage \
         plus a segment); 0 without a target.",
        store.log_bytes_target,
    );
    out.gauge(
        "stratus_log_live_bytes",
        "Bytes of log entries not yet dead; live / allocated is the log's utilization.",
        store.log_bytes_live,
    );
    out.gauge(
        "stratus_log_live_object_bytes",
        "Bytes of live objects in the log, entry headers included.",
        store.log_bytes_live_objects,
    );
    out.gauge(
        "stratus_log_tombstone_bytes",
        "Bytes of tombstones in the log (counted live until the cleaner drops them).",
        store.log_bytes_tombstones,
    );
    out.gauge("stratus_log_seglets", "Seglets in the log's region.", store.seglets_total);
    out.gauge(
        "stratus_log_free_seglets",
        "Seglets not allocated to any segment.",
        store.seglets_free,
    );
    out.gauge(
        "stratus_log_seglets_awaiting_readers",
        "Seglets of cleaned segments waiting for readers to leave before reuse.",
        store.seglets_waiting_for_readers,
    );
    out.gauge("stratus_log_segments", "Segments in the log, head included.", store.segments_in_log);
    out.gauge(
        "stratus_log_unfused_survivor_segments",
        "Survivor segments the cleaner wrote that are not yet part of the log.",
        store.segments_side,
    );
    out.gauge(
        "stratus_hash_table_buckets",
        "Buckets of the master's hash table.",
        store.hash_table_buckets,
    );
    out.gauge(
        "stratus_hash_table_bytes",
        "Bytes of the hash table's buckets in use (main buckets of its current size and the \
         overflow buckets allocated); with a memory target the table follows the objects.",
        store.hash_table_bytes,
    );
    let completions = master.store().completion_statistics();
    out.gauge(
        "stratus_master_client_leases",
        "Client leases the master holds exactly-once results or an acknowledged mark of.",
        completions.leases,
    );
    out.gauge(
        "stratus_master_unacknowledged_results",
        "Results of exactly-once mutations kept until their clients acknowledge them.",
        completions.records,
    );
    out.gauge(
        "stratus_master_unacknowledged_result_bytes",
        "Bytes of their COMPLETION entries in the log.",
        completions.record_bytes,
    );
    let flash = master.store().flash_statistics();
    out.gauge(
        "stratus_flash_images",
        "Segments whose objects of flash tables are on flash (one image each).",
        flash.images,
    );
    out.gauge("stratus_flash_image_bytes", "Bytes of those images.", flash.image_bytes);
    out.counter(
        "stratus_flash_demotions_total",
        "Segments demoted: imaged on flash and compacted with their flash objects.",
        flash.totals.demotions,
    );
    out.counter(
        "stratus_flash_objects_demoted_total",
        "Objects that left memory for flash by those demotions.",
        flash.totals.objects_demoted,
    );
    out.counter(
        "stratus_flash_image_bytes_written_total",
        "Bytes of images written to flash.",
        flash.totals.image_bytes_written,
    );
    out.counter(
        "stratus_flash_images_refused_total",
        "Images flash refused (full or failing); their objects stayed in memory.",
        flash.totals.images_refused,
    );
    out.counter(
        "stratus_flash_images_deleted_total",
        "Images deleted because the cleaner cleaned their segments.",
        flash.totals.images_deleted,
    );
    render_auto_tier(master, out);
    out.counter(
        "stratus_master_retries_answered_total",
        "Exactly-once mutations that arrived again and were answered from their record.",
        completions.retries_answered,
    );
    out.counter(
        "stratus_master_stale_rpcs_total",
        "Mutations refused because their client had acknowledged them already.",
        completions.stale_refused,
    );

    let cleaner = store.cleaner;
    let seglet_bytes = store.log_bytes_total.checked_div(store.seglets_total).unwrap_or(0);
    out.counter(
        "stratus_cleaner_compactions_total",
        "Segments compacted in memory (the cleaner's first level).",
        cleaner.compactions,
    );
    out.counter(
        "stratus_cleaner_fruitless_compactions_total",
        "Compactions that freed nothing (the next unit of work is then combined cleaning).",
        cleaner.compactions_failed,
    );
    out.counter(
        "stratus_cleaner_compacted_bytes_total",
        "Bytes moved by compaction.",
        cleaner.bytes_compacted,
    );
    out.counter(
        "stratus_cleaner_compaction_freed_bytes_total",
        "Bytes of memory (whole seglets) compaction gave back to the log.",
        cleaner.seglets_freed_by_compaction.saturating_mul(seglet_bytes),
    );
    out.counter(
        "stratus_cleaner_released_bytes_total",
        "Bytes of free seglets whose pages the memory target gave back to the system.",
        cleaner.seglets_released.saturating_mul(seglet_bytes),
    );
    out.counter(
        "stratus_cleaner_combined_passes_total",
        "Combined cleaning passes (the second level: segments rewritten into survivors, on \
         the backups too).",
        cleaner.combined_passes,
    );
    out.counter(
        "stratus_cleaner_segments_cleaned_total",
        "Segments combined cleaning dropped from the log.",
        cleaner.segments_cleaned,
    );
    out.counter(
        "stratus_cleaner_cleaned_segment_bytes_total",
        "Bytes of memory (seglets) of the segments combined cleaning dropped; the survivor \
         segments holding what was relocated take part of it back.",
        cleaner.seglets_cleaned.saturating_mul(seglet_bytes),
    );
    out.counter(
        "stratus_cleaner_survivor_segments_total",
        "Survivor segments combined cleaning wrote.",
        cleaner.survivor_segments_written,
    );
    out.family(
        "stratus_cleaner_relocated_bytes_total",
        "Bytes combined cleaning moved into survivor segments, by entry type.",
        MetricType::Counter,
    )
    .sample(&[("entry", "object")], cleaner.object_bytes_relocated)
    .sample(&[("entry", "tombstone")], cleaner.tombstone_bytes_relocated);
    out.counter(
        "stratus_cleaner_tombstones_dropped_total",
        "Tombstones dropped because the segment they name left the log.",
        cleaner.tombstones_dropped,
    );
    out.counter(
        "stratus_cleaner_nothing_to_clean_total",
        "Times the cleaner found memory short but nothing worth cleaning.",
        cleaner.nothing_to_clean,
    );

    let replication = master.replication();
    let statistics = replication.map(|replication| replication.statistics()).unwrap_or_default();
    out.gauge(
        "stratus_replication_replicas",
        "Copies of every log segment on other servers' backups (0: memory-only).",
        replication.map_or(0, |replication| replication.replicas()),
    );
    out.counter(
        "stratus_replication_rounds_total",
        "Replication rounds (each carries every write that arrived meanwhile).",
        statistics.rounds,
    );
    out.counter(
        "stratus_replication_backup_writes_total",
        "BACKUP_WRITE requests sent to backups.",
        statistics.backup_writes,
    );
    out.counter(
        "stratus_replication_sent_bytes_total",
        "Log bytes sent to backups, each copy counted.",
        statistics.bytes_replicated,
    );
    out.counter(
        "stratus_replication_cleaner_sent_bytes_total",
        "Of those, bytes of the cleaner's survivor segments.",
        statistics.cleaner_bytes_replicated,
    );
    out.counter(
        "stratus_replication_replicas_replaced_total",
        "Replicas re-created elsewhere after a backup failed or refused.",
        statistics.replicas_replaced,
    );
    out.counter(
        "stratus_replication_replicas_freed_total",
        "Replicas freed on backups after their segment left the log.",
        statistics.replicas_freed,
    );
    if let Some(replication) = replication {
        // Unknown (usize::MAX) until the first server list arrives: then there is no sample.
        if let Ok(available) = u32::try_from(replication.backups_available()) {
            out.gauge(
                "stratus_replication_backups_available",
                "Backups other than this server in the last server list.",
                available,
            );
        }
        out.gauge(
            "stratus_replication_fenced",
            "1 once a backup refused a write because this master was declared crashed.",
            replication.is_fenced(),
        );
    }

    let recovery = metrics.recovery();
    out.counter(
        "stratus_recovery_partitions_started_total",
        "Partitions of crashed masters' tablets this master accepted to recover.",
        recovery.partitions_started,
    );
    out.family(
        "stratus_recovery_partitions_finished_total",
        "Partitions recovered here, by outcome (failed ones are retried by the coordinator).",
        MetricType::Counter,
    )
    .sample(&[("outcome", "succeeded")], recovery.partitions_succeeded)
    .sample(&[("outcome", "failed")], recovery.partitions_failed);
    out.gauge(
        "stratus_recovery_tablets_in_progress",
        "Tablets (parts) of crashed masters being recovered here now.",
        master.tablets_recovering(),
    );
    out.counter(
        "stratus_recovery_segments_read_total",
        "Segments (this partition's share of each) read from backups, as they arrive.",
        recovery.segments_read,
    );
    out.counter(
        "stratus_recovery_read_bytes_total",
        "Bytes of those reads.",
        recovery.replica_bytes_read,
    );
    out.counter(
        "stratus_recovery_segments_replayed_total",
        "Segments replayed into this master's log.",
        recovery.segments_replayed,
    );
    out.counter(
        "stratus_recovery_objects_replayed_total",
        "Objects replayed into this master's log (a partition that then fails drops them).",
        recovery.objects_replayed,
    );
}

/// Live data per table, as the next new head's TABLE_STATS will record it: the largest tables
/// one by one, the rest (if any) under `table="others"`, so the label's values stay bounded
/// however many tables a master holds.
fn render_tables(master: &Master, out: &mut Exposition) {
    // At most TABLE_STATS_TABLES_MAX tables, whatever is asked for.
    let statistics = master.store().log().table_tallies().snapshot(usize::MAX);
    let others = statistics.others;
    let tables: Vec<(String, u64, u64)> = statistics
        .tables
        .iter()
        .map(|(table, tally)| (table.0.to_string(), tally.bytes, tally.objects))
        .chain((others.objects > 0).then(|| ("others".to_string(), others.bytes, others.objects)))
        .collect();
    let mut bytes = out.family(
        "stratus_master_table_live_bytes",
        "Bytes of live objects per table, entry headers included (the 128 largest tables; the \
         rest summed under table=\"others\").",
        MetricType::Gauge,
    );
    for (table, live_bytes, _) in &tables {
        bytes.sample(&[("table", table)], *live_bytes);
    }
    let mut objects = out.family(
        "stratus_master_table_objects",
        "Live objects per table (the 128 largest tables by bytes; the rest summed under \
         table=\"others\").",
        MetricType::Gauge,
    );
    for (table, _, live_objects) in &tables {
        objects.sample(&[("table", table)], *live_objects);
    }
    // The tier of each of those tables, as the store holds it: an info metric to join with
    // them (`* on (table) group_left (tier)`), rather than a label on them, so that their
    // series stay as they were.
    let mut tiers = out.family(
        "stratus_master_table_tier_info",
        "The storage tier of each table of stratus_master_table_live_bytes, as this master \
         stores it (value 1).",
        MetricType::Gauge,
    );
    for (table, _) in &statistics.tables {
        let tier = master.store().table_tier(*table);
        tiers.sample(&[("table", &table.0.to_string()), ("tier", tier.name())], 1u64);
    }
    render_tables_by_tier(master, out);
}

/// Automatic tiering: where auto tables' objects are, how reads were served, and what moved
/// (docs/design/flash-tier.md, "Automatic tiering").
fn render_auto_tier(master: &Master, out: &mut Exposition) {
    let auto = master.store().auto_statistics();
    let mut objects = out.family(
        "stratus_tier_auto_objects",
        "Objects of auto tables, by where they are (dram, flash).",
        MetricType::Gauge,
    );
    objects.sample(&[("place", "dram")], auto.dram_objects);
    objects.sample(&[("place", "flash")], auto.flash_objects);
    let mut bytes = out.family(
        "stratus_tier_auto_bytes",
        "Bytes of objects of auto tables (whole entries), by where they are (dram, flash).",
        MetricType::Gauge,
    );
    bytes.sample(&[("place", "dram")], auto.dram_bytes);
    bytes.sample(&[("place", "flash")], auto.flash_bytes);
    out.gauge(
        "stratus_tier_auto_dram_bytes_max",
        "DRAM auto tables' objects may hold before the cleaner demotes them (--auto-dram-mib).",
        auto.dram_bytes_max,
    );
    let mut reads = out.family(
        "stratus_tier_auto_reads_total",
        "Reads of auto tables' objects, by where they were served from (dram, flash).",
        MetricType::Counter,
    );
    reads.sample(&[("from", "dram")], auto.reads_from_dram);
    reads.sample(&[("from", "flash")], auto.reads_from_flash);
    out.counter(
        "stratus_tier_auto_promotions_total",
        "Objects of auto tables a read brought back from flash into DRAM.",
        auto.promotions,
    );
    out.counter(
        "stratus_tier_auto_promoted_bytes_total",
        "Bytes of those promotions.",
        auto.promoted_bytes,
    );
    out.counter(
        "stratus_tier_auto_promotions_refused_total",
        "Promotions drawn but not done: over the byte rate, or no memory for the copy.",
        auto.promotions_refused,
    );
    out.counter(
        "stratus_tier_auto_demotions_total",
        "Segments demoted because auto tables were over their DRAM budget.",
        auto.demotions,
    );
    out.counter(
        "stratus_tier_auto_objects_demoted_total",
        "Objects of auto tables moved to flash.",
        auto.objects_demoted,
    );
    render_auto_tables(master, out);
}

/// The same figures per auto table (the 128 with the most bytes, as GET_SERVER_STATISTICS
/// reports them): the label's values stay bounded however many tables a master holds.
fn render_auto_tables(master: &Master, out: &mut Exposition) {
    let tables = master.store().auto_table_statistics(stratus_wire::AUTO_TABLES_REPORTED_MAX);
    if tables.is_empty() {
        return;
    }
    let ids: Vec<String> = tables.iter().map(|table| table.table.0.to_string()).collect();
    let rows = || ids.iter().map(String::as_str).zip(&tables);
    let mut objects = out.family(
        "stratus_tier_auto_table_objects",
        "Objects of each auto table, by where they are (dram, flash).",
        MetricType::Gauge,
    );
    for (id, table) in rows() {
        objects.sample(&[("table", id), ("place", "dram")], table.dram_objects);
        objects.sample(&[("table", id), ("place", "flash")], table.counts.flash_objects);
    }
    let mut bytes = out.family(
        "stratus_tier_auto_table_bytes",
        "Bytes of each auto table's objects (whole entries), by where they are (dram, flash).",
        MetricType::Gauge,
    );
    for (id, table) in rows() {
        bytes.sample(&[("table", id), ("place", "dram")], table.dram_bytes);
        bytes.sample(&[("table", id), ("place", "flash")], table.counts.flash_bytes);
    }
    let mut reads = out.family(
        "stratus_tier_auto_table_reads_total",
        "Reads of each auto table's objects, by where they were served from (dram, flash).",
        MetricType::Counter,
    );
    for (id, table) in rows() {
        reads.sample(&[("table", id), ("from", "dram")], table.counts.reads_from_dram);
        reads.sample(&[("table", id), ("from", "flash")], table.counts.reads_from_flash);
    }
    let mut promotions = out.family(
        "stratus_tier_auto_table_promotions_total",
        "Objects of each auto table a read brought back from flash into DRAM.",
        MetricType::Counter,
    );
    for (id, table) in rows() {
        promotions.sample(&[("table", id)], table.counts.promotions);
    }
    let mut demoted = out.family(
        "stratus_tier_auto_table_objects_demoted_total",
        "Objects of each auto table moved to flash.",
        MetricType::Counter,
    );
    for (id, table) in rows() {
        demoted.sample(&[("table", id)], table.counts.objects_demoted);
    }
}

/// The tables this master serves a tablet of, by the tier its store holds each in (every tier
/// present, 0 included): what a master was told with its tablets, whatever their size.
fn render_tables_by_tier(master: &Master, out: &mut Exposition) {
    let served: BTreeSet<TableId> =
        master.ownership().tablets().into_iter().map(|(table, _)| table).collect();
    let mut counts = [0u64; Tier::ALL.len()];
    for table in served {
        counts[usize::from(master.store().table_tier(table).code())] += 1;
    }
    let mut family = out.family(
        "stratus_master_tables",
        "Tables this master serves a tablet of, by storage tier.",
        MetricType::Gauge,
    );
    for tier in Tier::ALL {
        family.sample(&[("tier", tier.name())], counts[usize::from(tier.code())]);
    }
}

fn render_backup(backup: &BackupService, out: &mut Exposition) {
    let statistics = backup.statistics();
    let durability = match statistics.durability {
        Durability::Buffered => "buffered",
        Durability::Fsync => "fsync",
    };
    out.family("stratus_backup_info", "The backup's durability mode (value 1).", MetricType::Gauge)
        .sample(&[("durability", durability)], 1u64);
    out.counter(
        "stratus_backup_requests_total",
        "Requests the backup answered.",
        backup.requests_served(),
    );
    out.gauge("stratus_backup_replicas", "Replicas the backup holds.", statistics.replicas);
    out.gauge(
        "stratus_backup_open_replicas",
        "Replicas not closed yet (each holds a RAM buffer).",
        statistics.replicas_open,
    );
    out.gauge(
        "stratus_backup_buffers",
        "RAM buffers (one segment each): the most replicas open at once.",
        statistics.buffer_count,
    );
    out.gauge("stratus_backup_buffers_in_use", "RAM buffers in use.", statistics.buffers_in_use);
    out.gauge(
        "stratus_backup_frames",
        "Storage frames (one segment each): the most replicas stored.",
        statistics.frame_count,
    );
    out.gauge(
        "stratus_backup_frames_in_use",
        "Storage frames holding a replica.",
        (statistics.frame_count as usize).saturating_sub(statistics.frames_free),
    );
    out.counter(
        "stratus_backup_disk_syncs_total",
        "Disk syncs (each a group commit of the writes in its batch).",
        statistics.disk_syncs,
    );
    out.counter(
        "stratus_backup_disk_write_jobs_total",
        "Disk write jobs completed.",
        statistics.disk_write_jobs,
    );
    out.counter(
        "stratus_backup_disk_written_bytes_total",
        "Segment bytes written to disk.",
        statistics.disk_data_bytes_written,
    );
    out.counter(
        "stratus_backup_disk_metadata_blocks_written_total",
        "Replica metadata blocks written to disk.",
        statistics.disk_metadata_blocks_written,
    );
    out.counter(
        "stratus_backup_recovery_replicas_partitioned_total",
        "Replicas of crashed masters read once and cut into every recovery partition.",
        statistics.recovery_replicas_partitioned,
    );
    out.counter(
        "stratus_backup_recovery_parts_fetched_total",
        "Recovery-data requests answered with a part cut ahead.",
        statistics.recovery_parts_fetched,
    );
    out.counter(
        "stratus_backup_recovery_parts_filtered_on_demand_total",
        "Recovery-data requests that read and filtered the replica on demand.",
        statistics.recovery_parts_filtered_on_demand,
    );
    out.gauge(
        "stratus_backup_storage_failed",
        "1 once a disk write or sync failed: the backup refuses writes until restarted.",
        statistics.storage_failure.is_some(),
    );
}

fn render_process(out: &mut Exposition) {
    if let Some(bytes) = stratus_ops::process::resident_memory_bytes() {
        out.gauge(
            "process_resident_memory_bytes",
            "Bytes of this process's memory resident in RAM (a server's log region becomes \
             resident as it is used).",
            bytes,
        );
    }
}

async fn render_coordinator(coordinator: &Coordinator) -> String {
    let metrics = coordinator.metrics().await;
    let mut out = Exposition::new();
    out.family(
        "stratus_coordinator_servers",
        "Servers the coordinator knows, by status.",
        MetricType::Gauge,
    )
    .sample(&[("status", "up")], metrics.servers_up)
    .sample(&[("status", "crashed")], metrics.servers_crashed)
    .sample(&[("status", "removed")], metrics.servers_removed)
    .sample(&[("status", "stopped")], metrics.servers_stopped);
    out.gauge("stratus_coordinator_tables", "Tables.", metrics.tables);
    out.family(
        "stratus_coordinator_tablets",
        "Tablets, by state (recovering: the owner is not up).",
        MetricType::Gauge,
    )
    .sample(&[("state", "normal")], metrics.tablets_normal)
    .sample(&[("state", "recovering")], metrics.tablets_recovering);
    out.gauge(
        "stratus_coordinator_tablets_unavailable",
        "Tablets whose crashed master's log cannot be recovered, waiting for an operator to \
         accept the loss (stratus recovery accept-loss); counted among the recovering too.",
        metrics.tablets_unavailable,
    );
    out.gauge(
        "stratus_coordinator_recoveries_in_flight",
        "Crashed masters being recovered now.",
        metrics.recoveries_in_flight,
    );
    out.counter(
        "stratus_coordinator_recoveries_started_total",
        "Recoveries of crashed masters started.",
        metrics.recoveries_started,
    );
    out.counter(
        "stratus_coordinator_recoveries_completed_total",
        "Recoveries finished: every tablet of the crashed master has a new owner.",
        metrics.recoveries_completed,
    );
    out.counter(
        "stratus_coordinator_recovery_attempts_incomplete_total",
        "Recovery attempts that left work to do (retried after a backoff).",
        metrics.recovery_attempts_incomplete,
    );
    out.counter(
        "stratus_coordinator_recoveries_abandoned_total",
        "Recoveries given up after every attempt (tablets unavailable until a restart).",
        metrics.recoveries_abandoned,
    );
    out.counter(
        "stratus_coordinator_servers_declared_crashed_total",
        "Servers declared crashed (missed pings, gone at a restart, or replaced at their \
         address).",
        metrics.servers_declared_crashed,
    );
    out.counter(
        "stratus_coordinator_servers_stopped_in_order_total",
        "Servers that announced they were stopping (SERVER_STOPPING) while up.",
        metrics.servers_stopped_in_order,
    );
    out.family(
        "stratus_coordinator_crash_hints_total",
        "HINT_SERVER_CRASHED reports of peers that missed a ping, by outcome (dropped: too many \
         suspects were being checked).",
        MetricType::Counter,
    )
    .sample(&[("outcome", "received")], metrics.crash_hints_received)
    .sample(&[("outcome", "dropped")], metrics.crash_hints_dropped);
    out.counter("stratus_coordinator_enlistments_total", "Servers enlisted.", metrics.enlistments);
    out.counter(
        "stratus_coordinator_client_leases_opened_total",
        "Client leases opened (exactly-once operations).",
        metrics.client_leases_opened,
    );
    out.gauge(
        "stratus_coordinator_client_leases",
        "Client leases live now (granted or renewed within a term).",
        metrics.client_leases_live,
    );
    out.family(
        "stratus_coordinator_lease_renewals_total",
        "RENEW_LEASE requests, by outcome.",
        MetricType::Counter,
    )
    .sample(&[("outcome", "granted")], metrics.lease_renewals_granted)
    .sample(&[("outcome", "refused")], metrics.lease_renewals_refused);
    render_process(&mut out);
    out.into_text()
}
