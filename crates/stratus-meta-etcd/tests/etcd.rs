//! The etcd store and leadership against a real etcd process (the `etcd` binary, Debian
//! package etcd-server). Without etcd these tests fail, naming it: no test skips itself for
//! want of a program (`scripts/test`, the README's test command, installs every one).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stratus_meta::{conformance, MetaError, MetaOperation, MetaStore};
use stratus_meta_etcd::local::LocalEtcd;
use stratus_meta_etcd::{EtcdClient, EtcdMetaStore, Leadership, LeadershipConfig};

/// etcd's smallest lease TTL with its default election timeout (it raises smaller ones).
const TEST_LEASE_TTL: Duration = Duration::from_secs(2);

/// A fresh etcd.
fn start_etcd(directory: &tempfile::TempDir) -> LocalEtcd {
    LocalEtcd::start(&directory.path().join("etcd")).unwrap_or_else(|error| {
        panic!(
            "this test needs `etcd` (Debian: etcd-server), which cannot start ({error}): run the \
             tests with scripts/test (README.md), which installs every program they need"
        )
    })
}

fn client(etcd: &LocalEtcd) -> Arc<EtcdClient> {
    Arc::new(EtcdClient::new(&[etcd.client_url().to_string()], Duration::from_secs(2)).unwrap())
}

fn config() -> LeadershipConfig {
    LeadershipConfig {
        lease_ttl: TEST_LEASE_TTL,
        standby_poll_interval: Duration::from_millis(50),
        takeover_delay: Duration::ZERO,
    }
}

fn put(key: &str, value: &[u8]) -> MetaOperation {
    MetaOperation::Put { key: key.to_string(), value: value.to_vec() }
}

#[test]
fn etcd_store_conforms() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    // A fresh, empty store per check: a namespace of its own in the same etcd.
    let next = AtomicU64::new(0);
    conformance::run_all(&mut || {
        let namespace = format!("/conformance/{}/", next.fetch_add(1, Ordering::Relaxed));
        EtcdMetaStore::new(client.clone(), &namespace, None)
    });
}

#[test]
fn etcd_store_conforms_while_fenced_by_a_held_leadership() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    let next = AtomicU64::new(0);
    let mut leaderships = Vec::new();
    conformance::run_all(&mut || {
        let namespace = format!("/fenced/{}/", next.fetch_add(1, Ordering::Relaxed));
        let leadership =
            Leadership::campaign(client.clone(), &namespace, "only", config(), &|| false).unwrap();
        let store =
            EtcdMetaStore::new(client.clone(), &namespace, Some(leadership.identity().to_vec()));
        leaderships.push(leadership);
        store
    });
}

#[test]
fn namespaces_do_not_see_each_other() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    let first = EtcdMetaStore::new(client.clone(), "/a/", None);
    let second = EtcdMetaStore::new(client.clone(), "/a/b/", None);
    first.apply(&[put("x", b"1")]).unwrap();
    second.apply(&[put("x", b"2")]).unwrap();
    // "/a/data/x" and "/a/b/data/x": neither store's scan reaches into the other's keys.
    assert_eq!(first.scan_prefix("").unwrap(), vec![("x".to_string(), b"1".to_vec())]);
    assert_eq!(second.scan_prefix("").unwrap(), vec![("x".to_string(), b"2".to_vec())]);
}

#[test]
fn scans_longer_than_a_page_are_whole_and_ordered() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let store = EtcdMetaStore::new(client(&etcd), "/paged/", None);
    let count = stratus_meta_etcd::SCAN_PAGE_KEYS * 3 + 5;
    let batch: Vec<MetaOperation> =
        (0..count).map(|index| put(&format!("k/{index:05}"), &[index as u8])).collect();
    store.apply(&batch).unwrap();
    store.apply(&[put("l", b"after the prefix")]).unwrap();
    let scanned = store.scan_prefix("k/").unwrap();
    assert_eq!(scanned.len(), count);
    for (index, (key, value)) in scanned.iter().enumerate() {
        assert_eq!(key, &format!("k/{index:05}"));
        assert_eq!(value, &vec![index as u8]);
    }
}

#[test]
fn a_deposed_coordinator_can_write_nothing_and_its_successor_takes_over() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    let first = Leadership::campaign(client.clone(), "/c/", "first", config(), &|| false).unwrap();
    let first_store = EtcdMetaStore::new(client.clone(), "/c/", Some(first.identity().to_vec()));
    first_store.apply(&[put("table/t", b"by first")]).unwrap();
    assert!(first.holds());

    // A standby waits while the first holds the leadership.
    let standby = {
        let client = client.clone();
        std::thread::spawn(move || {
            Leadership::campaign(client, "/c/", "second", config(), &|| false).unwrap()
        })
    };
    std::thread::sleep(TEST_LEASE_TTL / 2);
    assert!(!standby.is_finished(), "the standby took a held leadership");

    // The first stops renewing without resigning (a paused or partitioned coordinator): once
    // its lease runs out the standby takes over.
    drop(first);
    let second = standby.join().unwrap();
    assert!(second.holds());
    let second_store = EtcdMetaStore::new(client.clone(), "/c/", Some(second.identity().to_vec()));

    // The deposed one's writes are refused, and its store stays refused from then on.
    let refused = first_store.apply(&[put("table/t", b"by the deposed first")]);
    assert!(matches!(refused, Err(MetaError::Fenced { .. })), "{refused:?}");
    assert!(matches!(first_store.get("table/t"), Err(MetaError::Poisoned { .. })));
    second_store.apply(&[put("table/u", b"by second")]).unwrap();
    assert_eq!(second_store.get("table/t").unwrap(), Some(b"by first".to_vec()));
    assert_eq!(second_store.get("table/u").unwrap(), Some(b"by second".to_vec()));
}

#[test]
fn a_resigning_coordinator_hands_over_without_waiting_for_its_lease() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    // A lease far longer than the test may wait: only the resignation can hand over.
    let long = LeadershipConfig { lease_ttl: Duration::from_secs(600), ..config() };
    let first = Leadership::campaign(client.clone(), "/r/", "first", long, &|| false).unwrap();
    let standby = {
        let client = client.clone();
        std::thread::spawn(move || Leadership::campaign(client, "/r/", "second", long, &|| false))
    };
    first.resign();
    let second = standby.join().unwrap().unwrap();
    assert!(second.holds());
}

#[test]
fn a_standby_that_judges_the_holder_gone_takes_over_at_once_and_the_holder_learns_it() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    // The holder's lease is far longer than the test may wait, and longer than the standby's:
    // only the revocation can hand over, and the successor learns the holder's TTL.
    let holder_config = LeadershipConfig { lease_ttl: Duration::from_secs(600), ..config() };
    let standby_config = LeadershipConfig { lease_ttl: Duration::from_secs(60), ..config() };
    let first =
        Leadership::campaign(client.clone(), "/g/", "10.0.0.1:5000 first", holder_config, &|| {
            false
        })
        .unwrap();
    assert!(first.predecessor_grace().is_none());
    let probed = std::sync::Mutex::new(Vec::new());
    let gone = |holder: &[u8]| {
        probed.lock().unwrap().push(String::from_utf8_lossy(holder).to_string());
        true
    };
    let second = Leadership::campaign_probing(
        client.clone(),
        "/g/",
        "10.0.0.2:5000 second",
        standby_config,
        &|| false,
        &gone,
    )
    .unwrap();
    assert!(second.holds());
    assert_eq!(probed.lock().unwrap().as_slice(), ["10.0.0.1:5000 first"]);
    // The deposed holder's TTL (600 s, not the standby's 60 s), from a marker on a fresh
    // lease: whole seconds, plus one.
    let grace = second.predecessor_grace().expect("the deposed holder's grace");
    assert!(grace > Duration::from_secs(590) && grace <= Duration::from_secs(602), "{grace:?}");
    // Were the first still running, it would learn of it at its next renewal (every TTL/4:
    // 150 s here), or from a fenced write at once.
    let first_store = EtcdMetaStore::new(client.clone(), "/g/", Some(first.identity().to_vec()));
    let refused = first_store.apply(&[put("table/t", b"by the revoked first")]);
    assert!(matches!(refused, Err(MetaError::Fenced { .. })), "{refused:?}");

    // A standby whose probe says the holder lives waits for it.
    let attempts = AtomicU64::new(0);
    let stop = || attempts.fetch_add(1, Ordering::Relaxed) >= 5;
    let outcome = Leadership::campaign_probing(
        client.clone(),
        "/g/",
        "10.0.0.3:5000 third",
        config(),
        &stop,
        &|_| false,
    );
    assert!(outcome.is_err(), "took a leadership whose holder lives");

    // Whoever wins next, while the deposed holder could still act, learns it too (here after
    // a resignation; a standby racing the deposer is the same case). A shared holder may
    // resign.
    let shared = Arc::new(second);
    shared.resign();
    assert!(!shared.holds());
    let fourth =
        Leadership::campaign(client, "/g/", "10.0.0.4:5000 fourth", config(), &|| false).unwrap();
    let grace = fourth.predecessor_grace().expect("the deposed holder's grace");
    assert!(grace > Duration::from_secs(590), "{grace:?}");
}

#[test]
fn a_coordinator_that_cannot_reach_etcd_stops_holding_the_leadership() {
    let directory = tempfile::tempdir().unwrap();
    let mut etcd = start_etcd(&directory);
    let client = client(&etcd);
    let leadership =
        Leadership::campaign(client.clone(), "/k/", "lonely", config(), &|| false).unwrap();
    assert!(leadership.holds());
    etcd.kill();
    // Renewals fail from now on; within the TTL the holder must give the leadership up.
    let patience = std::time::Instant::now() + TEST_LEASE_TTL * 10;
    while leadership.holds() {
        assert!(std::time::Instant::now() < patience, "still holding without etcd");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(leadership.lost().is_some());
    // A store cannot write either: nothing is reachable, and nothing was applied.
    let store = EtcdMetaStore::new(client, "/k/", Some(leadership.identity().to_vec()));
    assert!(matches!(store.apply(&[put("x", b"y")]), Err(MetaError::Unavailable { .. })));
}

#[test]
fn a_standby_gives_up_when_asked_to_stop() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    let _first = Leadership::campaign(client.clone(), "/s/", "first", config(), &|| false).unwrap();
    let attempts = AtomicU64::new(0);
    let stop = || attempts.fetch_add(1, Ordering::Relaxed) >= 3;
    let outcome = Leadership::campaign(client, "/s/", "second", config(), &stop);
    assert!(outcome.is_err());
}

/// The etcd `stratus up` starts is one member (so a standby coordinator takes over without
/// the delay that guards against a stale etcd leader) and grants leases as short as 1 s.
#[test]
fn a_local_etcd_is_one_member_and_grants_one_second_leases() {
    let directory = tempfile::tempdir().unwrap();
    let etcd = start_etcd(&directory);
    let client = client(&etcd);
    assert_eq!(client.member_count().unwrap(), 1);
    let (_, ttl) = client.lease_grant(1).unwrap();
    assert_eq!(ttl, 1, "etcd raised the TTL to its minimum");
}
