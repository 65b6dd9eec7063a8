//! Durable writes: every acknowledged write is in the replicas of its segment on R backups
//! other than its master, also after a backup is killed in the middle of the run.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use stratus_client::{Client, ClientConfig, TableId};
use stratus_env::TcpNetwork;
use stratus_log::{Certificate, Entry, SegmentIterator};
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_store::{ByteSink, ObjectStore, StoreConfig};
use stratus_types::{key_hash, RejectRules, SegmentId, ServerId, Version};
use stratus_wire::{
    BackupWriteFlags, ReplicaCertificate, Request, Response, ResponseBody, ServerEntry,
    ServiceMask, Status, TabletEntry,
};

/// What the test believes about each key after its acknowledged operations.
#[derive(Clone, Debug)]
enum Expected {
    Present { version: Version, value: Vec<u8> },
    Removed { last_version: Version },
}

/// (master, key, version) of an object found in replicas.
type ObjectKey = (ServerId, Vec<u8>, Version);

/// The replicas of one master's segment: backup → (certificate, bytes).
type SegmentReplicas = BTreeMap<ServerId, (Certificate, Bytes)>;

async fn servers(pool: &ChannelPool, coordinator: &str) -> Vec<ServerEntry> {
    match pool.call_coordinator(coordinator, &Request::GetServerList).await.unwrap() {
        (Status::Ok, ResponseBody::Operation(Response::GetServerList { servers })) => servers,
        other => panic!("server list: {other:?}"),
    }
}

/// Every replica every reachable backup holds, grouped by (master, segment).
async fn collect_replicas(
    pool: &ChannelPool,
    backups: &[ServerEntry],
) -> HashMap<(ServerId, u64), SegmentReplicas> {
    let mut all: HashMap<(ServerId, u64), SegmentReplicas> = HashMap::new();
    for backup in backups {
        let listed = pool
            .call(&backup.address, &Request::BackupListReplicas { master_id: ServerId(0) })
            .await;
        let replicas = match listed {
            Ok((
                Status::Ok,
                ResponseBody::Operation(Response::BackupListReplicas { replicas }),
            )) => replicas,
            other => panic!("listing replicas on {}: {other:?}", backup.address),
        };
        for replica in replicas {
            let request = Request::BackupReadReplica {
                master_id: replica.master_id,
                segment_id: replica.segment_id,
            };
            let read = pool.call(&backup.address, &request).await;
            let (certificate, data) = match read {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::BackupReadReplica {
                        certificate, data, ..
                    }),
                )) => (
                    Certificate {
                        segment_length: certificate.segment_length,
                        checksum: certificate.checksum,
                    },
                    data,
                ),
                other => panic!("reading a replica on {}: {other:?}", backup.address),
            };
            all.entry((replica.master_id, replica.segment_id.0))
                .or_default()
                .insert(backup.server_id, (certificate, data));
        }
    }
    all
}

/// Checks that every expected key state is in the replicas of its master, on at least
/// `replicas` backups other than the master, each copy verified by its certificate.
fn check_replicas(
    all: &HashMap<(ServerId, u64), SegmentReplicas>,
    expected: &BTreeMap<Vec<u8>, Expected>,
    owner_of: &dyn Fn(&[u8]) -> ServerId,
    replicas: usize,
) {
    // For each (master, key): the object versions and tombstoned versions seen in replicas,
    // counting on how many distinct backups each was found.
    let mut objects: HashMap<ObjectKey, (Vec<u8>, HashSet<ServerId>)> = HashMap::new();
    let mut tombstones: HashMap<(ServerId, Vec<u8>, Version), HashSet<ServerId>> = HashMap::new();
    for ((master, _segment), copies) in all {
        for (backup, (certificate, data)) in copies {
            assert_ne!(backup, master, "a master must not hold replicas of its own log");
            let iterator = SegmentIterator::new(data, certificate).unwrap_or_else(|error| {
                panic!("replica on {backup} fails its certificate: {error}")
            });
            for entry in iterator {
                let entry = entry.unwrap_or_else(|error| panic!("corrupt replica entry: {error}"));
                match entry.entry {
                    Entry::Object(object) => {
                        objects
                            .entry((*master, object.key.to_vec(), object.version))
                            .or_insert_with(|| (object.value.to_vec(), HashSet::new()))
                            .1
                            .insert(*backup);
                    }
                    Entry::Tombstone(tombstone) => {
                        tombstones
                            .entry((*master, tombstone.key.to_vec(), tombstone.object_version))
                            .or_default()
                            .insert(*backup);
                    }
                    _ => {}
                }
            }
        }
    }
    for (key, state) in expected {
        let master = owner_of(key);
        match state {
            Expected::Present { version, value } => {
                let (stored, holders) =
                    objects.get(&(master, key.clone(), *version)).unwrap_or_else(|| {
                        panic!("acknowledged write of {key:?} {version:?} is on no backup")
                    });
                assert_eq!(stored, value, "replicated value of {key:?}");
                assert!(
                    holders.len() >= replicas,
                    "{key:?} is on {} backups, expected {replicas}",
                    holders.len()
                );
            }
            Expected::Removed { last_version } => {
                let holders = tombstones
                    .get(&(master, key.clone(), *last_version))
                    .unwrap_or_else(|| panic!("acknowledged remove of {key:?} is on no backup"));
                assert!(holders.len() >= replicas, "tombstone of {key:?} on too few backups");
            }
        }
    }
}

/// Writes, overwrites and removes; returns the expected final state.
async fn workload(
    client: &Client,
    table: TableId,
    keys: usize,
    rounds: usize,
    expected: &mut BTreeMap<Vec<u8>, Expected>,
) {
    for round in 0..rounds {
        for index in 0..keys {
            let key = format!("key-{index:04}").into_bytes();
            if (index + round) % 7 == 3 {
                let version = client.remove(table, &key).await.unwrap();
                if version != Version(0) {
                    expected.insert(key, Expected::Removed { last_version: version });
                }
                continue;
            }
            // Sizes change across rounds so segments fill at different rates.
            let size = 200 + (index * 37 + round * 1_013) % 6_000;
            let value: Vec<u8> = (0..size).map(|byte| (byte + index + round) as u8).collect();
            let version = client.write(table, &key, &value).await.unwrap();
            expected.insert(key, Expected::Present { version, value });
        }
    }
}

fn owner_lookup(map: &[TabletEntry], table: TableId) -> impl Fn(&[u8]) -> ServerId {
    let map = map.to_vec();
    move |key: &[u8]| {
        let hash = key_hash(table, key);
        map.iter()
            .find(|tablet| tablet.range.start <= hash.0 && hash.0 <= tablet.range.end)
            .expect("a tablet covers every hash")
            .owner
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_are_on_every_replica() {
    let cluster = TestCluster::start_with_replicas(4, 2);
    let client = cluster.client();
    let table = client.create_table("durable", 2).await.unwrap();
    let mut expected = BTreeMap::new();
    workload(&client, table, 300, 4, &mut expected).await;

    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let servers = servers(&pool, &cluster.coordinator_address).await;
    assert!(servers.iter().all(|server| server.services.0 & ServiceMask::BACKUP != 0));
    let map = client.tablet_map(table).await.unwrap();
    let owner_of = owner_lookup(&map, table);
    let all = collect_replicas(&pool, &servers).await;
    assert!(all.len() >= 4, "the workload fills several segments: {}", all.len());
    check_replicas(&all, &expected, &owner_of, 2);
}

/// The segment ids of `master_id`'s replicas on the backup at `address`.
async fn replica_segments(
    pool: &ChannelPool,
    address: &str,
    master_id: ServerId,
) -> Vec<SegmentId> {
    match pool.call(address, &Request::BackupListReplicas { master_id }).await {
        Ok((Status::Ok, ResponseBody::Operation(Response::BackupListReplicas { replicas }))) => {
            replicas.iter().map(|replica| replica.segment_id).collect()
        }
        other => panic!("listing replicas on {address}: {other:?}"),
    }
}

/// A replica a live master no longer needs (here one it never wrote: a lost BACKUP_FREE, or an
/// abandoned side segment, leave the same trace) is freed by the backup's garbage collection
/// after the master says so; the master's own replicas stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_a_live_master_no_longer_needs_are_freed() {
    let cluster = TestCluster::start_with_replicas(3, 2);
    let client = cluster.client();
    let table = client.create_table("garbage", 3).await.unwrap();
    let mut expected = BTreeMap::new();
    workload(&client, table, 100, 2, &mut expected).await;
    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let servers = servers(&pool, &cluster.coordinator_address).await;
    let (master, backup) = (&servers[0], &servers[1]);
    let own = replica_segments(&pool, &backup.address, master.server_id).await;
    assert!(!own.is_empty(), "the master's segments have replicas on every other server");

    // A replica of a segment the master never had (ids are never reused; this one is far
    // beyond any it will reach in the test).
    let stray = SegmentId(1 << 40);
    let open = Request::BackupWrite {
        master_id: master.server_id,
        segment_id: stray,
        epoch: 1,
        offset: 0,
        flags: BackupWriteFlags { open: true, close: true, primary: false },
        certificate: ReplicaCertificate { segment_length: 0, checksum: 0 },
        data: Bytes::new(),
    };
    let opened = pool.call(&backup.address, &open).await.unwrap();
    assert_eq!(opened.0, Status::Ok, "{opened:?}");

    // The master's answer: the stray segment only; another server id is refused.
    let mut asked = own.clone();
    asked.push(stray);
    let question = Request::ReplicasNeeded { master_id: master.server_id, segment_ids: asked };
    match pool.call(&master.address, &question).await.unwrap() {
        (Status::Ok, ResponseBody::Operation(Response::ReplicasNeeded { not_needed })) => {
            assert_eq!(not_needed, vec![stray]);
        }
        other => panic!("REPLICAS_NEEDED: {other:?}"),
    }
    let misaddressed =
        Request::ReplicasNeeded { master_id: backup.server_id, segment_ids: vec![stray] };
    let refused = pool.call(&master.address, &misaddressed).await.unwrap();
    assert_eq!(refused.0, Status::WrongServer, "{refused:?}");

    // The backup's collection (every 5 s) frees the stray replica and keeps the others.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let held = replica_segments(&pool, &backup.address, master.server_id).await;
        if !held.contains(&stray) {
            for segment_id in &own {
                assert!(held.contains(segment_id), "replica of {segment_id} freed: {held:?}");
            }
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the stray replica is still held");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing acknowledged depends on what was freed.
    let map = client.tablet_map(table).await.unwrap();
    let all = collect_replicas(&pool, &servers).await;
    check_replicas(&all, &expected, &owner_lookup(&map, table), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_stay_durable_when_a_backup_is_killed() {
    backup_killed_mid_load(TestCluster::start_with_replicas(4, 2)).await;
}

/// Copyset placement with overlapping groups (5 backups, groups of 2: {1,2} {3,4} {4,5}): a
/// segment moved to a new group keeps the copies of members it shares with the old one, and
/// no live copy is freed by mistake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copyset_placement_stays_durable_when_a_backup_is_killed() {
    backup_killed_mid_load(TestCluster::start_with(5, 2, &["--placement", "copyset"])).await;
}

async fn backup_killed_mid_load(mut cluster: TestCluster) {
    let client = cluster.client();
    // One master: the other three servers are only its backups.
    let table = client.create_table("survivor", 1).await.unwrap();
    let mut expected = BTreeMap::new();
    workload(&client, table, 200, 2, &mut expected).await;

    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let servers = servers(&pool, &cluster.coordinator_address).await;
    let map = client.tablet_map(table).await.unwrap();
    let master_address = map[0].owner_address.clone();
    let victim = cluster
        .servers
        .iter()
        .position(|process| process.address.as_deref() != Some(master_address.as_str()))
        .expect("a server that is not the master");
    let victim_address = cluster.servers[victim].address.clone().expect("address");
    cluster.servers[victim].signal(libc::SIGKILL);
    assert!(cluster.servers[victim].wait_exit(Duration::from_secs(10)).is_some());

    // Every write after the kill is still acknowledged, and on 2 live backups.
    workload(&client, table, 200, 3, &mut expected).await;
    let live: Vec<ServerEntry> =
        servers.iter().filter(|server| server.address != victim_address).cloned().collect();
    let owner_of = owner_lookup(&map, table);
    let all = collect_replicas(&pool, &live).await;
    check_replicas(&all, &expected, &owner_of, 2);
}

/// Replays one master's replicas the way recovery will: for each segment the longest copy
/// that passes its certificate; per key, the newest object unless a tombstone names it.
/// Returns key → (version, value) and checks that every segment the newest digest lists is
/// present.
fn replay(
    all: &HashMap<(ServerId, u64), SegmentReplicas>,
    master: ServerId,
    table: TableId,
) -> HashMap<Vec<u8>, (Version, Vec<u8>)> {
    let mut segments: BTreeMap<u64, (Certificate, Bytes)> = BTreeMap::new();
    for ((owner, segment_id), copies) in all {
        if *owner != master {
            continue;
        }
        let longest = copies
            .values()
            .filter(|(certificate, data)| SegmentIterator::new(data, certificate).is_ok())
            .max_by_key(|(certificate, _)| certificate.segment_length)
            .expect("at least one copy passes its certificate")
            .clone();
        segments.insert(*segment_id, longest);
    }
    let mut objects: HashMap<Vec<u8>, (Version, Vec<u8>)> = HashMap::new();
    let mut dead: HashMap<Vec<u8>, Version> = HashMap::new();
    let mut newest_digest: Option<(u64, Vec<u64>)> = None;
    for (segment_id, (certificate, data)) in &segments {
        for entry in SegmentIterator::new(data, certificate).expect("checked above") {
            match entry.expect("entries of a certified replica verify").entry {
                Entry::Object(object) => {
                    let newer = objects
                        .get(object.key)
                        .is_none_or(|(version, _)| *version < object.version);
                    if newer {
                        objects
                            .insert(object.key.to_vec(), (object.version, object.value.to_vec()));
                    }
                }
                Entry::Tombstone(tombstone) => {
                    let killed = dead.entry(tombstone.key.to_vec()).or_insert(Version(0));
                    *killed = (*killed).max(tombstone.object_version);
                }
                Entry::LogDigest(listed)
                    if newest_digest.as_ref().is_none_or(|(newest, _)| *newest < *segment_id) =>
                {
                    newest_digest = Some((*segment_id, listed.iter().map(|id| id.0).collect()));
                }
                _ => {}
            }
        }
    }
    let (_, listed) = newest_digest.expect("the head replica holds a digest");
    for segment_id in listed {
        assert!(
            segments.contains_key(&segment_id),
            "segment {segment_id} of the digest is missing"
        );
    }
    objects.retain(|key, (version, _)| dead.get(key).is_none_or(|killed| *killed < *version));
    // The storage engine's own replay (what recovery uses), fed the same copies in reverse
    // order, must rebuild exactly the same objects.
    let mut config = StoreConfig::with_log_bytes(256 << 20);
    config.segment_bytes = 1 << 20;
    config.value_bytes_max = 128 << 10;
    let engine = ObjectStore::new(config, ServerId(999)).expect("store");
    let copies: Vec<(&[u8], Certificate)> =
        segments.values().rev().map(|(certificate, data)| (&data[..], *certificate)).collect();
    engine.replay(&copies, &|_, _| true, stratus_store::WallTime::from_seconds(0)).expect("replay");
    let mut keys: HashSet<Vec<u8>> = objects.keys().cloned().collect();
    keys.extend(dead.keys().cloned());
    for key in keys {
        let mut value = ValueSink(Vec::new());
        let hash = key_hash(table, &key);
        let replayed = engine
            .read(
                table,
                &key,
                hash,
                &RejectRules::NONE,
                stratus_store::WallTime::from_seconds(0),
                &mut value,
            )
            .ok()
            .map(|version| (version, value.0));
        assert_eq!(replayed.as_ref(), objects.get(&key), "engine replay of {key:?}");
    }
    objects
}

/// Collects a value read from a store.
struct ValueSink(Vec<u8>);

impl ByteSink for ValueSink {
    fn put_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_masters_replicas_hold_exactly_its_acknowledged_writes() {
    // Failure detection off: the replicas are examined as the crash left them (a recovery
    // would read them too, then have them freed as garbage).
    let mut cluster = TestCluster::start_with_coordinator(4, 2, &[], &["--probe-misses", "0"]);
    // Short operation timeout: writes that fail around the kill give up quickly.
    let mut config = stratus_client::ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = Duration::from_secs(3);
    let client = Client::new(config);
    let table = client.create_table("crash", 1).await.unwrap();
    let map = client.tablet_map(table).await.unwrap();
    let master_address = map[0].owner_address.clone();
    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let servers = servers(&pool, &cluster.coordinator_address).await;
    let master_id =
        servers.iter().find(|server| server.address == master_address).unwrap().server_id;

    // Writers record what was acknowledged; every value names its writer and sequence so a
    // replayed value can be traced to the write that produced it.
    let acknowledged =
        Arc::new(std::sync::Mutex::new(HashMap::<Vec<u8>, (Version, Vec<u8>)>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..4u32 {
        let client = client.clone();
        let acknowledged = acknowledged.clone();
        let stop = stop.clone();
        writers.spawn(async move {
            let mut sequence = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && sequence < 50_000 {
                let key = format!("w{writer}-k{}", sequence % 50).into_bytes();
                let mut value = format!("writer {writer} write {sequence} ").into_bytes();
                value.resize(64 + (sequence as usize * 131) % 3_000, b'.');
                match client.write(table, &key, &value).await {
                    Ok(version) => {
                        acknowledged.lock().unwrap().insert(key, (version, value));
                    }
                    Err(_) => break, // the master is gone: outcome unknown, stop writing
                }
                sequence += 1;
            }
        });
    }
    // Let the load run long enough to fill a few segments, then kill the master mid-load.
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if acknowledged.lock().unwrap().len() >= 200 {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let master = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(master_address.as_str()))
        .unwrap();
    master.signal(libc::SIGKILL);
    // What the killed master acknowledged: once it is dead, the coordinator recovers its
    // tablet onto another master and later acknowledgements come from there.
    let acknowledged_by_victim = acknowledged.lock().unwrap().clone();
    assert!(master.wait_exit(Duration::from_secs(10)).is_some());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    while writers.join_next().await.is_some() {}

    let live: Vec<ServerEntry> =
        servers.iter().filter(|server| server.server_id != master_id).cloned().collect();
    let all = collect_replicas(&pool, &live).await;
    let replayed = replay(&all, master_id, table);
    let acknowledged = acknowledged_by_victim;
    assert!(!acknowledged.is_empty());
    for (key, (version, value)) in &acknowledged {
        let (replayed_version, replayed_value) =
            replayed.get(key).unwrap_or_else(|| panic!("acknowledged write of {key:?} lost"));
        // A write in flight at the crash may have reached the backups after the last
        // acknowledged one: newer is allowed, older is a lost write.
        assert!(
            replayed_version >= version,
            "{key:?}: replayed {replayed_version:?} < {version:?}"
        );
        if replayed_version == version {
            assert_eq!(replayed_value, value, "{key:?}");
        }
    }
    for (key, (_, value)) in &replayed {
        let text = String::from_utf8_lossy(&value[..value.len().min(40)]).to_string();
        assert!(
            text.starts_with("writer ") && key.starts_with(b"w"),
            "a replayed object was never written: {key:?} {text:?}"
        );
    }
}

/// A backup that stops answering (SIGSTOP) while it holds the open head of a master's log holds
/// up that master's writes for about the replication timeout, not for its whole pause: the
/// master drops it from every replica set and opens the head on another backup. Every write
/// here must be acknowledged within an operation deadline far shorter than the pause (before
/// the replication timeout, each waited out a 2 s replica write, once per segment the paused
/// backup held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_around_a_paused_backup() {
    const PAUSE: Duration = Duration::from_secs(4);
    // Five servers, R = 3: one master and four backups, so a replacement is always at hand.
    let cluster = TestCluster::start_with_replicas(5, 3);
    let client = cluster.client();
    let table = client.create_table("around-a-pause", 1).await.unwrap();
    let mut expected = BTreeMap::new();
    workload(&client, table, 50, 2, &mut expected).await;
    let map = client.tablet_map(table).await.unwrap();
    let master = map[0].owner;

    // A backup holding the master's open head.
    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let servers = servers(&pool, &cluster.coordinator_address).await;
    let mut holder = None;
    for server in servers.iter().filter(|server| server.server_id != master) {
        let request = Request::BackupListReplicas { master_id: master };
        if let Ok((
            Status::Ok,
            ResponseBody::Operation(Response::BackupListReplicas { replicas }),
        )) = pool.call(&server.address, &request).await
        {
            if replicas.iter().any(|replica| !replica.closed) {
                holder = Some(server.address.clone());
                break;
            }
        }
    }
    let holder = holder.expect("a backup holds the open head");
    let paused = cluster
        .servers
        .iter()
        .position(|process| process.address.as_deref() == Some(holder.as_str()))
        .expect("the holder's process");
    cluster.servers[paused].signal(libc::SIGSTOP);

    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = Duration::from_millis(1_500);
    let impatient = Client::new(config);
    let started = tokio::time::Instant::now();
    let mut index = 0u64;
    let mut failures = Vec::new();
    while started.elapsed() < PAUSE {
        let key = format!("during-pause-{index}");
        if let Err(error) = impatient.write(table, key.as_bytes(), b"value").await {
            failures.push(format!("{key} after {:?}: {error}", started.elapsed()));
        }
        index += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.servers[paused].signal(libc::SIGCONT);
    assert!(failures.is_empty(), "{} of {index} writes failed: {failures:?}", failures.len());
    // Everything acknowledged before the pause is still readable.
    for (key, state) in &expected {
        if let Expected::Present { value, .. } = state {
            let (read, _) = client.read(table, key).await.unwrap();
            assert_eq!(&read[..], &value[..]);
        }
    }
}
