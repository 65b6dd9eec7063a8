//! Expiry: objects with a time to live are served until it passes and never after, every
//! operation treats an expired object as missing, versions keep increasing over it, and the
//! cleaner drops expired objects — and counts a segment whose objects all expired as free
//! space, so a log full of expired objects is written again.

use stratus_log::{Entry, SegmentIterator};
use stratus_types::{key_hash, ExpiresAt, HashRange, RejectReason, RejectRules, ServerId};
use stratus_types::{TableId, Version};

use crate::{CleanOutcome, Expiry, ObjectError, ObjectStore, StoreConfig, WallTime};

const TABLE: TableId = TableId(7);
/// A wall-clock reading in milliseconds (2023-11-14).
const NOW_MILLIS: u64 = 1_700_000_000_000;

fn at(millis_after_now: u64) -> WallTime {
    WallTime::from_millis(NOW_MILLIS + millis_after_now)
}

fn store() -> ObjectStore {
    ObjectStore::new(StoreConfig::for_testing(), ServerId(1)).unwrap()
}

fn write(
    store: &ObjectStore,
    key: &[u8],
    value: &[u8],
    expiry: Expiry,
    now: WallTime,
) -> Result<Version, ObjectError> {
    store.write(TABLE, key, key_hash(TABLE, key), value, &RejectRules::NONE, expiry, now)
}

fn read(store: &ObjectStore, key: &[u8], now: WallTime) -> Result<(Vec<u8>, Version), ObjectError> {
    let mut value = Vec::new();
    let found = store.read_located(
        TABLE,
        key,
        key_hash(TABLE, key),
        &RejectRules::NONE,
        now,
        &mut value,
    )?;
    Ok((value, found.version))
}

fn expires_at(store: &ObjectStore, key: &[u8], now: WallTime) -> Option<ExpiresAt> {
    let hash = key_hash(TABLE, key);
    let found = store.read_located(TABLE, key, hash, &RejectRules::NONE, now, &mut Vec::new());
    found.expect("the object is live").expires_at
}

fn missing() -> ObjectError {
    ObjectError::Rejected { reason: RejectReason::ObjectDoesntExist, current: Version(0) }
}

#[test]
fn an_expiring_object_is_served_until_its_time_and_then_missing_to_every_operation() {
    let store = store();
    let version = write(&store, b"k", b"v", Expiry::AfterMillis(1_000), at(0)).unwrap();
    assert_eq!(read(&store, b"k", at(999)), Ok((b"v".to_vec(), version)));
    assert_eq!(expires_at(&store, b"k", at(0)), Some(ExpiresAt(NOW_MILLIS + 1_000)));
    // From its expiry time on, it is missing: to reads, and to reject rules.
    assert_eq!(read(&store, b"k", at(1_000)), Err(missing()));
    let hash = key_hash(TABLE, b"k");
    let only_if_present = RejectRules { doesnt_exist: true, ..RejectRules::NONE };
    let refused = store.write(TABLE, b"k", hash, b"w", &only_if_present, Expiry::Never, at(1_000));
    assert_eq!(refused, Err(missing()));
    let only_if_missing = RejectRules { exists: true, ..RejectRules::NONE };
    let created = store.write(TABLE, b"k", hash, b"w", &only_if_missing, Expiry::Never, at(1_000));
    // Its bytes are still overwritten: the new version is above the expired one.
    assert_eq!(created, Ok(Version(version.0 + 1)));
    assert_eq!(read(&store, b"k", at(1_000_000)), Ok((b"w".to_vec(), Version(version.0 + 1))));
}

#[test]
fn increment_and_remove_see_an_expired_object_as_missing() {
    let store = store();
    let hash = key_hash(TABLE, b"n");
    let rules = RejectRules::NONE;
    store.increment(TABLE, b"n", hash, 5, &rules, at(0)).unwrap();
    let expiry = Expiry::AfterMillis(100);
    store.set_expiry(TABLE, b"n", hash, expiry, &rules, at(0)).unwrap();
    // An increment keeps the expiry, as Redis's INCR keeps a key's.
    let (_, value) = store.increment(TABLE, b"n", hash, 1, &rules, at(10)).unwrap();
    assert_eq!(value, 6);
    assert_eq!(expires_at(&store, b"n", at(10)), Some(ExpiresAt(NOW_MILLIS + 100)));
    // Expired, it counts as 0, and the new counter has no expiry.
    let (version, value) = store.increment(TABLE, b"n", hash, 1, &rules, at(100)).unwrap();
    assert_eq!(value, 1);
    assert_eq!(expires_at(&store, b"n", at(100)), None);
    store
        .set_expiry(TABLE, b"n", hash, Expiry::AtMillis(NOW_MILLIS + 200), &rules, at(100))
        .unwrap();
    // A remove of an expired object removes nothing anyone could see: version 0, and no
    // object under a rule that wants one.
    let only_if_present = RejectRules { doesnt_exist: true, ..RejectRules::NONE };
    assert_eq!(store.remove(TABLE, b"n", hash, &only_if_present, at(200)), Err(missing()));
    assert_eq!(store.remove(TABLE, b"n", hash, &rules, at(200)), Ok(Version(0)));
    assert_eq!(store.statistics().objects_live, 0, "its bytes were removed all the same");
    // Versions stay above everything the key had.
    let again = write(&store, b"n", b"x", Expiry::Never, at(300)).unwrap();
    assert!(again.0 > version.0 + 1, "{again:?} after {version:?}");
}

#[test]
fn a_write_keeps_replaces_or_clears_the_expiry_as_asked() {
    let store = store();
    write(&store, b"k", b"1", Expiry::AfterMillis(5_000), at(0)).unwrap();
    write(&store, b"k", b"2", Expiry::Keep, at(1_000)).unwrap();
    assert_eq!(expires_at(&store, b"k", at(1_000)), Some(ExpiresAt(NOW_MILLIS + 5_000)));
    write(&store, b"k", b"3", Expiry::AtMillis(NOW_MILLIS + 9_000), at(1_000)).unwrap();
    assert_eq!(expires_at(&store, b"k", at(1_000)), Some(ExpiresAt(NOW_MILLIS + 9_000)));
    write(&store, b"k", b"4", Expiry::Never, at(2_000)).unwrap();
    assert_eq!(expires_at(&store, b"k", at(2_000)), None);
    assert_eq!(read(&store, b"k", at(u64::MAX - NOW_MILLIS)).unwrap().0, b"4");
    // Keep over an expired object keeps nothing.
    write(&store, b"j", b"1", Expiry::AfterMillis(10), at(0)).unwrap();
    write(&store, b"j", b"2", Expiry::Keep, at(10)).unwrap();
    assert_eq!(expires_at(&store, b"j", at(10)), None);
    // set_expiry keeps the value, makes a new version, and needs a live object.
    let hash = key_hash(TABLE, b"k");
    let before = read(&store, b"k", at(2_000)).unwrap().1;
    let after = store
        .set_expiry(TABLE, b"k", hash, Expiry::AfterMillis(1), &RejectRules::NONE, at(2_000))
        .unwrap();
    assert!(after > before);
    assert_eq!(read(&store, b"k", at(2_000)), Ok((b"4".to_vec(), after)));
    let gone = store.set_expiry(TABLE, b"k", hash, Expiry::Never, &RejectRules::NONE, at(2_001));
    assert_eq!(gone, Err(missing()));
}

#[test]
fn enumeration_skips_expired_objects() {
    let store = store();
    for index in 0..50u64 {
        let expiry = if index % 2 == 0 { Expiry::AfterMillis(100) } else { Expiry::Never };
        write(&store, format!("k{index}").as_bytes(), b"v", expiry, at(0)).unwrap();
    }
    let count_at = |now: WallTime| {
        let mut count = 0;
        let mut emit = |_: &[u8], _: &[u8], _: Version, _| count += 1;
        let next = store.enumerate(TABLE, HashRange::FULL, (0, None), usize::MAX, now, &mut emit);
        assert!(next.unwrap().is_none());
        count
    };
    assert_eq!(count_at(at(99)), 50);
    assert_eq!(count_at(at(100)), 25);
}

#[test]
fn the_cleaner_drops_expired_objects_and_keeps_the_rest() {
    let store = store();
    for index in 0..2_000u64 {
        let expiry = if index % 4 == 0 { Expiry::Never } else { Expiry::AfterMillis(60_000) };
        write(&store, format!("key-{index}").as_bytes(), &[7u8; 200], expiry, at(0)).unwrap();
    }
    // The head is never cleaned: close it.
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    // Before the expiry nothing is dropped; after it every expired object a pass meets is.
    store.clean_combined_now(at(1_000));
    assert_eq!(store.cleaner_statistics().expired_objects_dropped, 0);
    let mut passes = 0;
    while let CleanOutcome::Combined { .. } = store.clean_combined_now(at(60_000)) {
        passes += 1;
        assert!(passes < 100, "cleaning never finishes");
    }
    let statistics = store.statistics();
    assert_eq!(statistics.cleaner.expired_objects_dropped, 1_500, "{statistics:?}");
    assert_eq!(statistics.objects_live, 500);
    for index in 0..2_000u64 {
        let kept = read(&store, format!("key-{index}").as_bytes(), at(60_000));
        assert_eq!(kept.is_ok(), index % 4 == 0, "key-{index}: {kept:?}");
    }
}

#[test]
fn a_log_full_of_expired_objects_takes_writes_again_once_the_cleaner_runs() {
    let store = store();
    let value = vec![3u8; 1 << 10];
    let mut written = 0u64;
    loop {
        let key = format!("session-{written}");
        match write(&store, key.as_bytes(), &value, Expiry::AfterMillis(1_000), at(0)) {
            Ok(_) => written += 1,
            Err(ObjectError::LogFull) => break,
            Err(other) => panic!("unexpected {other:?}"),
        }
        assert!(written < 1_000_000, "the log never filled");
    }
    // Still full while they live: nothing is free to clean.
    assert_eq!(
        write(&store, b"more", &value, Expiry::Never, at(500)),
        Err(ObjectError::LogFull),
        "nothing expired yet"
    );
    for _ in 0..1_000 {
        if let CleanOutcome::Idle = store.clean_once(at(1_000)) {
            break;
        }
    }
    // Expired, they are free space: the cleaner frees their segments without being told which.
    for index in 0..written {
        let key = format!("fresh-{index}");
        write(&store, key.as_bytes(), &value, Expiry::Never, at(1_000))
            .unwrap_or_else(|error| panic!("write {index} of {written} after expiry: {error:?}"));
        if index % 64 == 0 {
            store.clean_once(at(1_000));
        }
    }
    assert!(store.cleaner_statistics().expired_objects_dropped >= written / 2);
}

#[test]
fn replay_and_migration_keep_expiry_times() {
    let source = store();
    write(&source, b"short", b"s", Expiry::AfterMillis(100), at(0)).unwrap();
    write(&source, b"long", b"l", Expiry::AfterMillis(1_000_000), at(0)).unwrap();
    write(&source, b"never", b"n", Expiry::Never, at(0)).unwrap();
    source.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let segments: Vec<_> = source
        .log()
        .segment_ids()
        .into_iter()
        .map(|id| source.log().segment_contents(id).expect("a segment"))
        .collect();
    let target = store();
    let borrowed: Vec<(&[u8], _)> =
        segments.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
    target.replay(&borrowed, &|_, _| true, at(50)).unwrap();
    assert!(read(&target, b"short", at(99)).is_ok());
    assert_eq!(read(&target, b"short", at(100)), Err(missing()));
    assert_eq!(expires_at(&target, b"long", at(100)), Some(ExpiresAt(NOW_MILLIS + 1_000_000)));
    assert_eq!(expires_at(&target, b"never", at(100)), None);
    // Every replayed segment verifies, expiry fields included.
    let mut expiring_found = 0;
    for (bytes, certificate) in &segments {
        for entry in SegmentIterator::new(bytes, certificate).unwrap() {
            if let Entry::Object(object) = entry.unwrap().entry {
                expiring_found += usize::from(object.expires_at.is_some());
            }
        }
    }
    assert_eq!(expiring_found, 2);
    // A migrated object keeps its absolute expiry.
    let migrated = store();
    let expiry = Some(ExpiresAt(NOW_MILLIS + 500));
    migrated.insert_migrated(TABLE, b"moved", b"m", Version(9), expiry, at(0)).unwrap();
    assert!(read(&migrated, b"moved", at(499)).is_ok());
    assert_eq!(read(&migrated, b"moved", at(500)), Err(missing()));
}
