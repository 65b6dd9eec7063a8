//! The operations surface against a real cluster: every server's and the coordinator's
//! `GET /metrics` scraped with a plain TCP client while the cluster works (requests, cleaning,
//! replication, a crash and its recovery), and the coordinator's status page loaded in a real
//! headless browser (chromium), whose rendered DOM and screenshot must show the live cluster.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Process, TestCluster};
use stratus_client::{Client, IncrementItem, KeyItem, RejectRules, TableId, Tier, WriteItem};
use stratus_ops::exposition::{parse, MetricType, ParsedExposition};

/// Bound on every wait.
const PATIENCE: Duration = Duration::from_secs(60);

/// Arguments that give a role a metrics endpoint on a free port.
const METRICS_ON_ANY_PORT: [&str; 2] = ["--metrics-listen", "127.0.0.1:0"];

/// The address of a role's metrics endpoint, from the line it prints once it serves.
fn metrics_address(process: &Process) -> String {
    let line = process.wait_for_line("metrics served at http://", Duration::from_secs(30));
    let url = line.split("http://").nth(1).expect("a URL");
    url.split('/').next().expect("an address").to_string()
}

/// A response: status, head (lower-cased), body.
struct Response {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// One HTTP/1.1 request on a fresh connection (closed after the response).
fn http(address: &str, request: &[u8]) -> Response {
    let mut stream = TcpStream::connect(address).expect("connect to the HTTP endpoint");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
    stream.write_all(request).expect("send the request");
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("read the response");
    let split = bytes.windows(4).position(|window| window == b"\r\n\r\n").expect("a whole head");
    let head = String::from_utf8_lossy(&bytes[..split]).to_ascii_lowercase();
    let body = bytes[split + 4..].to_vec();
    let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).expect("a status");
    if let Some(length) = head.lines().find_map(|line| line.strip_prefix("content-length: ")) {
        assert_eq!(length.trim().parse::<usize>().ok(), Some(body.len()), "{head}");
    }
    Response { status, head, body }
}

fn get(address: &str, path: &str) -> Response {
    let request = format!("GET {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n");
    http(address, request.as_bytes())
}

/// Scrapes `address`'s `/metrics` and parses it strictly (HELP and TYPE for every family,
/// escaping, cumulative histogram buckets with `+Inf` equal to `_count`).
fn scrape(address: &str) -> ParsedExposition {
    let response = get(address, "/metrics");
    assert_eq!(response.status, 200, "{}", response.head);
    assert!(
        response.head.contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
        "{}",
        response.head
    );
    let text = String::from_utf8(response.body).expect("UTF-8");
    let parsed = parse(&text).unwrap_or_else(|error| panic!("{error}\n{text}"));
    for family in parsed.types.keys() {
        assert!(parsed.help.contains_key(family), "{family} has no HELP");
    }
    parsed
}

/// The value of the one sample `name` with `labels`.
fn value(scrape: &ParsedExposition, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape.value(name, labels).unwrap_or_else(|error| panic!("{error}"))
}

/// The sum over every server of the sample `name` with `labels`.
fn total(scrapes: &[ParsedExposition], name: &str, labels: &[(&str, &str)]) -> f64 {
    scrapes.iter().map(|scrape| value(scrape, name, labels)).sum()
}

#[test]
fn stratus_up_gives_every_process_a_metrics_port_and_prints_them() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let up = Process::start(&[
        "--coordinator".to_string(),
        "127.0.0.1:0".to_string(),
        "up".to_string(),
        "--dir".to_string(),
        directory.path().join("data").display().to_string(),
        "--servers".to_string(),
        "2".to_string(),
        "--replicas".to_string(),
        "0".to_string(),
        "--log-mib".to_string(),
        "16".to_string(),
        "--segment-mib".to_string(),
        "1".to_string(),
    ]);
    let address_in = |line: String| {
        let url = line.split("http://").nth(1).expect("a URL").to_string();
        url.split('/').next().expect("an address").to_string()
    };
    let page = address_in(up.wait_for_line("status page: http://", PATIENCE));
    let servers: Vec<String> = (0..2)
        .map(|index| {
            address_in(up.wait_for_line(&format!("metrics: server-{index} http://"), PATIENCE))
        })
        .collect();
    up.wait_for_line("ready", PATIENCE);
    let coordinator = scrape(&page);
    assert_eq!(value(&coordinator, "stratus_coordinator_servers", &[("status", "up")]), 2.0);
    let mut ids = Vec::new();
    for server in &servers {
        let scrape = scrape(server);
        let info = scrape.find("stratus_server_info", &[]).next().expect("server info");
        ids.push(info.label("server_id").expect("a server id").to_string());
        assert_eq!(value(&scrape, "stratus_replication_replicas", &[]), 0.0);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "two different servers: {ids:?}");
    assert_eq!(get(&page, "/").status, 200);
}

fn operation(name: &str) -> [(&str, &str); 1] {
    [("operation", name)]
}

fn client(cluster: &TestCluster) -> Client {
    let mut config = stratus_client::ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = PATIENCE;
    Client::new(config)
}

/// Waits (bounded) until `done` holds for a scrape of `address`.
fn wait_for_scrape(address: &str, what: &str, done: impl Fn(&ParsedExposition) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if done(&scrape(address)) {
            return;
        }
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn servers_and_coordinator_export_what_they_do_through_a_crash_and_its_recovery() {
    let cluster =
        TestCluster::start_with_coordinator(3, 1, &METRICS_ON_ANY_PORT, &METRICS_ON_ANY_PORT);
    let coordinator = metrics_address(&cluster.coordinator);
    let servers: Vec<String> = cluster.servers.iter().map(metrics_address).collect();
    let before: Vec<ParsedExposition> = servers.iter().map(|address| scrape(address)).collect();

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = {
        let _guard = runtime.enter();
        client(&cluster)
    };
    const WRITES: u64 = 300;
    const READS: u64 = 200;
    const REMOVES: u64 = 10;
    const MULTI_ITEMS: u64 = 20;
    const INCREMENTS: u64 = 5;
    let live_objects = runtime.block_on(async {
        let table = client.create_table("metrics", 3).await.expect("create the table");
        for index in 0..WRITES {
            let value = vec![b'v'; 100 + (index as usize % 50)];
            client.write(table, format!("k{index}").as_bytes(), &value).await.expect("write");
        }
        for index in 0..READS {
            client.read(table, format!("k{index}").as_bytes()).await.expect("read");
        }
        let keys: Vec<Bytes> = (0..MULTI_ITEMS).map(|i| Bytes::from(format!("m{i}"))).collect();
        let rules = RejectRules::default();
        let writes: Vec<WriteItem> = keys
            .iter()
            .map(|key| WriteItem {
                table_id: table,
                key: key.clone(),
                value: key.clone(),
                rules,
                expiry: stratus_client::Expiry::Never,
                rpc: None,
            })
            .collect();
        assert!(client.multi_write(&writes).await.iter().all(Result::is_ok));
        let reads: Vec<KeyItem> =
            keys.iter().map(|key| KeyItem { table_id: table, key: key.clone(), rules }).collect();
        assert!(client.multi_read(&reads).await.iter().all(Result::is_ok));
        let increment = IncrementItem {
            table_id: table,
            key: Bytes::from("counter"),
            delta: 1,
            rules,
            rpc: None,
        };
        for _ in 0..INCREMENTS {
            client.increment(table, b"counter", 1).await.expect("increment");
        }
        assert!(client.multi_increment(&[increment]).await.iter().all(Result::is_ok));
        for index in 0..REMOVES {
            client.remove(table, format!("k{index}").as_bytes()).await.expect("remove");
        }
        count_objects(&client, table).await
    });
    assert_eq!(live_objects, WRITES - REMOVES + MULTI_ITEMS + 1);

    let after: Vec<ParsedExposition> = servers.iter().map(|address| scrape(address)).collect();
    let moved = |name: &str, labels: &[(&str, &str)]| {
        total(&after, name, labels) - total(&before, name, labels)
    };
    let requests = "stratus_master_requests_total";
    // At least: a retried request would be counted twice.
    assert!(moved(requests, &operation("write")) >= WRITES as f64);
    assert!(moved(requests, &operation("read")) >= READS as f64);
    assert!(moved(requests, &operation("remove")) >= REMOVES as f64);
    assert!(moved(requests, &operation("increment")) >= INCREMENTS as f64);
    assert!(moved(requests, &operation("multi_write")) >= 1.0);
    assert!(moved(requests, &operation("multi_read")) >= 1.0);
    assert!(moved(requests, &operation("multi_increment")) >= 1.0);
    assert!(moved(requests, &operation("enumerate")) >= 1.0);
    let items = "stratus_master_multi_op_objects_total";
    assert!(moved(items, &operation("multi_write")) >= MULTI_ITEMS as f64);
    assert!(moved(items, &operation("multi_read")) >= MULTI_ITEMS as f64);
    for scrape in &after {
        // Each operation's histogram counts exactly its requests, and took time.
        for sample in scrape.find(requests, &[]) {
            let name = sample.label("operation").expect("an operation label");
            let count =
                value(scrape, "stratus_master_request_duration_seconds_count", &operation(name));
            assert_eq!(count, sample.value, "{name}");
        }
        assert_eq!(scrape.types["stratus_master_request_duration_seconds"], MetricType::Histogram);
        assert_eq!(value(scrape, "stratus_master_lease_valid", &[]), 1.0);
        assert_eq!(value(scrape, "stratus_master_tablets", &[]), 1.0);
        let allocated = value(scrape, "stratus_log_allocated_bytes", &[]);
        assert!(allocated > 0.0 && allocated <= value(scrape, "stratus_log_capacity_bytes", &[]));
        assert!(value(scrape, "stratus_log_live_bytes", &[]) <= allocated);
        assert_eq!(value(scrape, "stratus_replication_replicas", &[]), 1.0);
        assert!(
            value(scrape, "stratus_backup_buffers_in_use", &[])
                <= value(scrape, "stratus_backup_buffers", &[])
        );
        assert!(value(scrape, "process_resident_memory_bytes", &[]) > 0.0);
    }
    assert!(
        total(&after, "stratus_master_request_duration_seconds_sum", &operation("write")) > 0.0
    );
    assert_eq!(total(&after, "stratus_master_objects", &[]), live_objects as f64);
    assert!(moved("stratus_replication_sent_bytes_total", &[]) > 0.0);
    assert!(moved("stratus_replication_backup_writes_total", &[]) > 0.0);
    assert!(total(&after, "stratus_backup_open_replicas", &[]) >= 3.0, "every head is open");
    assert!(total(&after, "stratus_backup_frames_in_use", &[]) >= 3.0);

    let coordinator_scrape = scrape(&coordinator);
    let servers_in = |scrape: &ParsedExposition, status| {
        value(scrape, "stratus_coordinator_servers", &[("status", status)])
    };
    assert_eq!(servers_in(&coordinator_scrape, "up"), 3.0);
    assert_eq!(value(&coordinator_scrape, "stratus_coordinator_tables", &[]), 1.0);
    let normal = [("state", "normal")];
    assert_eq!(value(&coordinator_scrape, "stratus_coordinator_tablets", &normal), 3.0);
    assert_eq!(value(&coordinator_scrape, "stratus_coordinator_enlistments_total", &[]), 3.0);
    let granted = [("outcome", "granted")];
    assert!(value(&coordinator_scrape, "stratus_coordinator_lease_renewals_total", &granted) > 0.0);

    // The endpoints' bounds, on a real server's port.
    let server = &servers[0];
    assert_eq!(get(server, "/nowhere").status, 404);
    let mut oversized = b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-filler: ".to_vec();
    oversized.extend(std::iter::repeat_n(b'a', 12 << 10));
    oversized.extend_from_slice(b"\r\n\r\n");
    assert_eq!(http(server, &oversized).status, 431);
    let with_body = b"GET /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc";
    assert_eq!(http(server, with_body).status, 413);

    // A master crashes: the coordinator counts the declaration and the recovery, and the
    // survivors count the partitions, segments and objects they replayed.
    cluster.servers[2].signal(libc::SIGKILL);
    let survivors = &servers[..2];
    wait_for_scrape(&coordinator, "the recovery completed", |scrape| {
        value(scrape, "stratus_coordinator_recoveries_completed_total", &[]) >= 1.0
            && servers_in(scrape, "removed") == 1.0
    });
    let coordinator_scrape = scrape(&coordinator);
    assert_eq!(servers_in(&coordinator_scrape, "up"), 2.0);
    assert_eq!(
        value(&coordinator_scrape, "stratus_coordinator_tablets", &[("state", "recovering")]),
        0.0
    );
    assert!(value(&coordinator_scrape, "stratus_coordinator_recoveries_started_total", &[]) >= 1.0);
    assert_eq!(value(&coordinator_scrape, "stratus_coordinator_recoveries_in_flight", &[]), 0.0);
    assert!(
        value(&coordinator_scrape, "stratus_coordinator_servers_declared_crashed_total", &[])
            >= 1.0
    );
    let recovered: Vec<ParsedExposition> =
        survivors.iter().map(|address| scrape(address)).collect();
    let succeeded = [("outcome", "succeeded")];
    assert!(total(&recovered, "stratus_recovery_partitions_finished_total", &succeeded) >= 1.0);
    assert!(total(&recovered, requests, &operation("recover_tablets")) >= 1.0);
    assert!(total(&recovered, "stratus_recovery_segments_read_total", &[]) >= 1.0);
    assert!(total(&recovered, "stratus_recovery_segments_replayed_total", &[]) >= 1.0);
    assert!(total(&recovered, "stratus_recovery_read_bytes_total", &[]) > 0.0);
    assert!(total(&recovered, "stratus_recovery_objects_replayed_total", &[]) >= 1.0);
    assert_eq!(total(&recovered, "stratus_recovery_tablets_in_progress", &[]), 0.0);
    // Every object lives on the survivors now, and their gauges say so, per table too (the
    // tallies recovery sizes partitions by).
    assert_eq!(total(&recovered, "stratus_master_objects", &[]), live_objects as f64);
    let per_table: f64 = recovered
        .iter()
        .flat_map(|scrape| scrape.find("stratus_master_table_objects", &[]))
        .map(|sample| sample.value)
        .sum();
    assert_eq!(per_table, live_objects as f64);
    // Recovery may split the crashed master's tablet in parts: the masters own what the
    // coordinator's map holds.
    let tablets = value(&scrape(&coordinator), "stratus_coordinator_tablets", &normal);
    assert!(tablets >= 3.0);
    assert_eq!(total(&recovered, "stratus_master_tablets", &[]), tablets);
}

async fn count_objects(client: &Client, table: TableId) -> u64 {
    let mut enumeration = client.enumerate(table);
    let mut count = 0;
    while let Some(batch) = enumeration.next_batch().await.expect("enumerate") {
        count += batch.len() as u64;
    }
    count
}

/// The headless browser: `STRATUS_CHROMIUM`, or chromium from the `PATH`.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("STRATUS_CHROMIUM") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for directory in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let candidate = directory.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "the status page test needs a headless browser, `chromium`, which is not on PATH: run \
         the tests with scripts/test (README.md), which installs it, or set STRATUS_CHROMIUM"
    );
}

/// Runs headless `browser` on `url` with `arguments`, bounded; returns its standard output.
fn run_chromium(browser: &Path, profile: &Path, arguments: &[String], url: &str) -> String {
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--disable-gpu",
            // The test may run as root (in CI containers), where the sandbox cannot start.
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(arguments)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "chromium failed: {status}");
    reader.join().expect("chromium's output")
}

/// The number after `"key":` in `json`, searching from the first occurrence of `after`.
fn json_number(json: &str, after: &str, key: &str) -> Option<f64> {
    let from = json.find(after)?;
    let at = json[from..].find(&format!("\"{key}\":"))? + from + key.len() + 3;
    let end = json[at..].find([',', '}', ']']).map_or(json.len(), |end| at + end);
    json[at..end].parse().ok()
}

/// The text of the element with `id` (up to its first child tag).
fn element_text<'a>(dom: &'a str, id: &str) -> &'a str {
    let marker = format!("id=\"{id}\">");
    let start = dom.find(&marker).unwrap_or_else(|| panic!("no #{id}")) + marker.len();
    let end = dom[start..].find('<').map_or(dom.len(), |end| start + end);
    &dom[start..end]
}

#[test]
fn the_status_page_shows_the_live_cluster_in_a_headless_browser() {
    // Found first: without a browser the test fails at once, saying what to install.
    let browser = chromium();
    let cluster = TestCluster::start_with_coordinator(2, 1, &[], &METRICS_ON_ANY_PORT);
    let page = metrics_address(&cluster.coordinator);
    let url = format!("http://{page}/");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = {
        let _guard = runtime.enter();
        client(&cluster)
    };
    let (table, server_ids) = runtime.block_on(async {
        // On flash: the page shows each tablet's tier as the coordinator's record holds it.
        let table = client.create_table_with_tier("pages", 2, Tier::Flash).await.expect("create");
        let servers = client.server_list().await.expect("server list");
        (table, servers.iter().map(|server| server.server_id.0).collect::<Vec<u64>>())
    });
    assert_eq!(server_ids.len(), 2);

    // The page itself is served, self-contained (no external script, style or image).
    let response = get(&page, "/");
    assert_eq!(response.status, 200);
    assert!(response.head.contains("content-type: text/html; charset=utf-8"));
    assert!(response.head.contains("content-security-policy: default-src 'none'"));
    let html = String::from_utf8(response.body).expect("UTF-8");
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"), "external asset");

    // A steady write load, so the page has throughput to draw.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (client, stop, written) = (client.clone(), stop.clone(), written.clone());
        let handle = runtime.handle().clone();
        std::thread::spawn(move || {
            handle.block_on(async {
                while !stop.load(Ordering::SeqCst) {
                    let index = written.load(Ordering::SeqCst);
                    let key = format!("page-key-{index}");
                    client.write(table, key.as_bytes(), b"a value").await.expect("write");
                    written.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
    };

    // Wait until the coordinator's samples show the load (two minutes of history are kept;
    // three samples give two rates).
    let deadline = Instant::now() + PATIENCE;
    let objects_sampled = loop {
        let response = get(&page, "/api/cluster");
        let json = String::from_utf8_lossy(&response.body).into_owned();
        if response.status == 200 {
            assert!(response.head.contains("content-type: application/json"));
            let rate = json_number(&json, "\"summary\":", "requests_per_second");
            let samples = json.find("\"history\":{\"time_ms\":[").and_then(|at| {
                json[at..].find(']').map(|end| json[at..at + end].matches(',').count() + 1)
            });
            if rate.is_some_and(|rate| rate > 0.0) && samples.is_some_and(|samples| samples >= 3) {
                break json_number(&json, "\"summary\":", "objects").expect("objects");
            }
        }
        assert!(Instant::now() < deadline, "the samples never showed the load: {json}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(objects_sampled > 0.0);

    // The DOM after the page's scripts ran (3 s of virtual time: several polls).
    let profile = tempfile::tempdir().expect("profile directory");
    let budget = "--virtual-time-budget=3000".to_string();
    let dom =
        run_chromium(&browser, profile.path(), &[budget.clone(), "--dump-dom".to_string()], &url);
    let updates = dom
        .split("data-updates=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|count| count.parse::<u32>().ok())
        .expect("the page counts its updates");
    assert!(updates >= 1, "the page never drew the cluster's data");
    assert!(dom.contains("class=\"connection ok\""), "the page reports a failed poll");
    for id in &server_ids {
        let row = format!("<tr data-server-id=\"{id}\" data-state=\"up\">");
        assert!(dom.contains(&row), "no row for server {id}");
        // Its resident memory, split into log, index and the rest.
        let after_row = &dom[dom.find(&row).expect("found above")..];
        let resident = after_row.split("class=\"memory-resident\">").nth(1).expect("a memory cell");
        let resident = &resident[..resident.find('<').expect("the cell ends")];
        assert!(
            resident.contains(": log ")
                && resident.contains(", index ")
                && resident.contains(", other "),
            "server {id}'s resident memory reads {resident:?}"
        );
    }
    assert_eq!(dom.matches(&format!("<tr data-table-id=\"{}\">", table.0)).count(), 2);
    assert!(dom.contains(&format!("pages (id {})", table.0)));
    assert_eq!(dom.matches("<td class=\"tier-flash\">flash</td>").count(), 2);
    assert_eq!(element_text(&dom, "summary-servers-up"), "2");
    assert_eq!(element_text(&dom, "summary-tables"), "1 / 2");
    let objects: f64 = element_text(&dom, "summary-objects").parse().expect("a count of objects");
    assert!(
        objects >= objects_sampled,
        "{objects} objects shown, {objects_sampled} sampled before"
    );
    let throughput = element_text(&dom, "summary-throughput");
    assert!(throughput.starts_with(|c: char| c.is_ascii_digit()), "throughput {throughput:?}");
    // The throughput chart has a line with points above its zero line (y = 198 in the
    // chart's 600 × 220 coordinates).
    let chart_start = dom.find("id=\"throughput-chart\"").expect("the throughput chart");
    let chart = &dom[chart_start..chart_start + dom[chart_start..].find("</svg>").expect("end")];
    let points: Vec<(f64, f64)> = chart
        .split("<polyline points=\"")
        .skip(1)
        .flat_map(|rest| rest.split('"').next().unwrap_or("").split(' '))
        .filter_map(|pair| {
            let (x, y) = pair.split_once(',')?;
            Some((x.parse().ok()?, y.parse().ok()?))
        })
        .collect();
    assert!(points.len() >= 2, "no line drawn: {chart}");
    assert!(points.iter().any(|&(_, y)| y < 197.0), "no throughput above zero: {chart}");

    // A screenshot at 1280 × 900: the right size, not blank, styled, with the servers' colours
    // (chart lines and legend, drawn by the script from the live data).
    let screenshot = profile.path().join("status-page.png");
    let arguments = [
        budget,
        "--window-size=1280,900".to_string(),
        format!("--screenshot={}", screenshot.display()),
    ];
    run_chromium(&browser, profile.path(), &arguments, &url);
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
    let png = std::fs::read(&screenshot).expect("the screenshot was written");
    let image = decode_png(&png).unwrap_or_else(|error| panic!("screenshot: {error}"));
    assert_eq!((image.width, image.height), (1280, 900));
    let mut colours = std::collections::HashMap::new();
    for pixel in &image.pixels {
        *colours.entry(*pixel).or_insert(0u32) += 1;
    }
    let (_, background) = colours.iter().max_by_key(|(_, count)| **count).expect("pixels");
    let not_background = image.pixels.len() - *background as usize;
    assert!(colours.len() > 50, "only {} colours: a blank page", colours.len());
    assert!(not_background * 20 > image.pixels.len(), "almost all one colour: a blank page");
    assert_eq!(image.pixel(5, 5), [0x22, 0x30, 0x4a], "the header's colour: the style applied");
    // The script's palette, by server id.
    let palette: [[u8; 3]; 8] = [
        [0x1f, 0x77, 0xb4],
        [0xd6, 0x27, 0x28],
        [0x2c, 0xa0, 0x2c],
        [0xff, 0x7f, 0x0e],
        [0x94, 0x67, 0xbd],
        [0x8c, 0x56, 0x4b],
        [0xe3, 0x77, 0xc2],
        [0x17, 0xbe, 0xcf],
    ];
    for id in &server_ids {
        let colour = palette[(*id % 8) as usize];
        let near = |pixel: &[u8; 3]| {
            pixel.iter().zip(colour).all(|(a, b)| (i16::from(*a) - i16::from(b)).abs() <= 8)
        };
        let count = image.pixels.iter().filter(|pixel| near(pixel)).count();
        assert!(count >= 100, "server {id}'s colour in only {count} pixels");
    }
}

/// A decoded image: 8-bit RGB pixels, row by row.
struct Image {
    width: usize,
    height: usize,
    pixels: Vec<[u8; 3]>,
}

impl Image {
    fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        self.pixels[y * self.width + x]
    }
}

/// Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what chromium writes): chunks, zlib,
/// scanline filters. Alpha is dropped.
fn decode_png(bytes: &[u8]) -> Result<Image, String> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    let mut rest = bytes.strip_prefix(SIGNATURE).ok_or("not a PNG")?;
    let (mut width, mut height, mut channels) = (0usize, 0usize, 0usize);
    let mut compressed = Vec::new();
    while rest.len() >= 12 {
        let length = network_u32(&rest[..4]);
        let kind = &rest[4..8];
        let data = rest.get(8..8 + length).ok_or("truncated chunk")?;
        let after = rest.get(12 + length..).ok_or("chunk without its CRC")?;
        match kind {
            b"IHDR" if data.len() < 13 => return Err("short IHDR".to_string()),
            b"IHDR" => {
                width = network_u32(&data[..4]);
                height = network_u32(&data[4..8]);
                let (depth, colour_type, interlace) = (data[8], data[9], data[12]);
                channels = match (depth, colour_type, interlace) {
                    (8, 2, 0) => 3,
                    (8, 6, 0) => 4,
                    other => return Err(format!("unsupported depth/type/interlace {other:?}")),
                };
            }
            b"IDAT" => compressed.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        rest = after;
    }
    if channels == 0 {
        return Err("no IHDR".to_string());
    }
    let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&compressed)
        .map_err(|error| format!("inflate: {error:?}"))?;
    let stride = width * channels;
    if raw.len() != height * (stride + 1) {
        return Err(format!("{} bytes of pixels for {width} × {height}", raw.len()));
    }
    let mut previous = vec![0u8; stride];
    let mut pixels = Vec::with_capacity(width * height);
    for row in raw.chunks_exact(stride + 1) {
        let (filter, data) = (row[0], &row[1..]);
        let mut current = vec![0u8; stride];
        for index in 0..stride {
            let left = if index >= channels { current[index - channels] } else { 0 };
            let up = previous[index];
            let up_left = if index >= channels { previous[index - channels] } else { 0 };
            let predictor = match filter {
                0 => 0,
                1 => left,
                2 => up,
                3 => ((u16::from(left) + u16::from(up)) / 2) as u8,
                4 => paeth(left, up, up_left),
                other => return Err(format!("filter type {other}")),
            };
            current[index] = data[index].wrapping_add(predictor);
        }
        pixels.extend(current.chunks_exact(channels).map(|pixel| [pixel[0], pixel[1], pixel[2]]));
        previous = current;
    }
    Ok(Image { width, height, pixels })
}

/// A PNG integer: 4 bytes, most significant first (the format's order, not this project's).
fn network_u32(bytes: &[u8]) -> usize {
    bytes[..4].iter().fold(0, |value, &byte| (value << 8) | usize::from(byte))
}

fn paeth(left: u8, up: u8, up_left: u8) -> u8 {
    let estimate = i16::from(left) + i16::from(up) - i16::from(up_left);
    let distance = |value: u8| (estimate - i16::from(value)).abs();
    if distance(left) <= distance(up) && distance(left) <= distance(up_left) {
        left
    } else if distance(up) <= distance(up_left) {
        up
    } else {
        up_left
    }
}

#[test]
fn the_png_decoder_reads_what_it_must() {
    // A 2 × 2 RGB image with a Sub-filtered and an Up-filtered row, built by hand.
    let raw: Vec<u8> = vec![1, 10, 20, 30, 5, 5, 5, 2, 1, 1, 1, 0, 0, 0];
    let compressed = miniz_oxide::deflate::compress_to_vec_zlib(&raw, 6);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        let length = data.len();
        png.extend_from_slice(&[
            (length >> 24) as u8,
            (length >> 16) as u8,
            (length >> 8) as u8,
            length as u8,
        ]);
        png.extend_from_slice(kind);
        png.extend_from_slice(data);
        png.extend_from_slice(&[0, 0, 0, 0]); // CRC, not checked by the decoder
    };
    chunk(b"IHDR", &[0, 0, 0, 2, 0, 0, 0, 2, 8, 2, 0, 0, 0]);
    chunk(b"IDAT", &compressed);
    chunk(b"IEND", &[]);
    let image = decode_png(&png).expect("decodes");
    assert_eq!((image.width, image.height), (2, 2));
    assert_eq!(image.pixels, vec![[10, 20, 30], [15, 25, 35], [11, 21, 31], [15, 25, 35]]);
    assert_eq!(paeth(10, 20, 15), 15);
    assert!(decode_png(b"GIF89a").is_err());
}
