//! Flash tier tests: demotion moves flash tables' objects out of memory and leaves everything an
//! operation needs; values read back verified; combined cleaning reads them back whole and
//! deletes images; what a backup would hold never contains a FLASH_OBJECT; failures of flash
//! are errors, never wrong answers.

use std::sync::Arc;

use stratus_log::{EntryType, SegmentIterator};
use stratus_types::{key_hash, RejectReason, RejectRules, ServerId, TableId, Tier};
use stratus_types::{HashRange, Version};

use crate::cleaner_tests::small_config;
use crate::tests::replay;
use crate::{CleanOutcome, Expiry, FlashImages, MemoryImages, ObjectError, ObjectStore};
use crate::{Mutation, StoreConfig, WallTime};

/// The table the shared test helpers (`replay`) expect; on flash here.
const FLASH_TABLE: TableId = TableId(7);
const MEMORY_TABLE: TableId = TableId(8);
const NOW: u32 = 1_700_000_000;

fn flash_store(config: StoreConfig) -> (ObjectStore, Arc<MemoryImages>) {
    let mut store = ObjectStore::new(config, ServerId(1)).unwrap();
    let images = Arc::new(MemoryImages::default());
    store.attach_flash(images.clone());
    store.set_table_tier(FLASH_TABLE, Tier::Flash);
    (store, images)
}

fn value_for(key: u32, generation: u32, length: usize) -> Vec<u8> {
    let seed = key.wrapping_mul(31).wrapping_add(generation.wrapping_mul(17));
    (0..length).map(|index| (seed as usize + index) as u8).collect()
}

fn key_of(key: u32) -> Vec<u8> {
    format!("key-{key}").into_bytes()
}

fn write(store: &ObjectStore, table: TableId, key: u32, value: &[u8]) -> Version {
    let key = key_of(key);
    let hash = key_hash(table, &key);
    let now = WallTime::from_seconds(NOW);
    store.write(table, &key, hash, value, &RejectRules::NONE, Expiry::Never, now).unwrap()
}

fn read(store: &ObjectStore, table: TableId, key: u32) -> Result<(Vec<u8>, Version), ObjectError> {
    let key = key_of(key);
    let mut value = Vec::new();
    let now = WallTime::from_seconds(NOW);
    let rules = RejectRules::NONE;
    let version = store.read(table, &key, key_hash(table, &key), &rules, now, &mut value)?;
    Ok((value, version))
}

/// Demotes until no segment has flash objects left in memory; returns the objects moved.
fn demote_all(store: &ObjectStore) -> u64 {
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let mut objects = 0;
    for _ in 0..1_000 {
        match store.demote_once(WallTime::from_seconds(NOW)).unwrap() {
            Some(demoted) => objects += demoted.objects,
            None => return objects,
        }
    }
    panic!("demotion never finishes");
}

fn flash_object_entries(store: &ObjectStore) -> usize {
    let log = store.log();
    let epoch = log.pin();
    log.segment_ids()
        .into_iter()
        .filter_map(|segment| log.segment_entries(&epoch, segment))
        .flatten()
        .filter(|(_, entry_type)| *entry_type == EntryType::FlashObject)
        .count()
}

#[test]
fn demotion_moves_flash_objects_out_of_memory_and_every_value_reads_back() {
    let (store, images) = flash_store(small_config());
    let mut versions = Vec::new();
    for key in 0..300u32 {
        versions.push(write(&store, FLASH_TABLE, key, &value_for(key, 0, 900)));
        write(&store, MEMORY_TABLE, key, &value_for(key, 1, 900));
    }
    let tallies_before = store.log().table_tallies().of(FLASH_TABLE);
    let before = store.statistics();
    let demoted = demote_all(&store);
    assert_eq!(demoted, 300, "every flash object left memory once");
    assert_eq!(flash_object_entries(&store), 300);
    assert!(images.image_count() > 0);
    let after = store.statistics();
    assert!(
        after.log_bytes_allocated + 200 * 900 < before.log_bytes_allocated,
        "memory kept the values: {} → {}",
        before.log_bytes_allocated,
        after.log_bytes_allocated
    );
    // The per-table tallies still count each object at its size.
    assert_eq!(store.log().table_tallies().of(FLASH_TABLE), tallies_before);
    for key in 0..300u32 {
        assert_eq!(
            read(&store, FLASH_TABLE, key).unwrap(),
            (value_for(key, 0, 900), versions[key as usize])
        );
        assert_eq!(read(&store, MEMORY_TABLE, key).unwrap().0, value_for(key, 1, 900));
    }
    // A second round finds nothing left to move.
    assert_eq!(demote_all(&store), 0);
    let statistics = store.flash_statistics();
    assert_eq!(statistics.images as usize, images.image_count());
}

#[test]
fn versions_rules_and_expiry_of_flash_objects_need_no_flash_read() {
    let (store, images) = flash_store(small_config());
    let version = write(&store, FLASH_TABLE, 1, &value_for(1, 0, 500));
    demote_all(&store);
    // Break every image: only an operation that needs the value may notice.
    for segment in store.log().segment_ids() {
        if store.replication_image(segment).is_some() {
            images.delete_image(segment);
        }
    }
    let key = key_of(1);
    let hash = key_hash(FLASH_TABLE, &key);
    let now = WallTime::from_seconds(NOW);
    let stale = RejectRules {
        version_ne_given: true,
        given_version: Version(version.0 + 5),
        ..RejectRules::NONE
    };
    let refused = store.write(FLASH_TABLE, &key, hash, b"new", &stale, Expiry::Never, now);
    assert_eq!(
        refused,
        Err(ObjectError::Rejected { reason: RejectReason::WrongVersion, current: version })
    );
    assert!(matches!(read(&store, FLASH_TABLE, 1), Err(ObjectError::FlashRead(_))));
    // Overwriting and removing need only the index entry.
    let exact = RejectRules { version_ne_given: true, given_version: version, ..RejectRules::NONE };
    let newer = store.write(FLASH_TABLE, &key, hash, b"new", &exact, Expiry::Never, now).unwrap();
    assert!(newer > version);
    assert_eq!(read(&store, FLASH_TABLE, 1).unwrap(), (b"new".to_vec(), newer));
}

#[test]
fn a_corrupt_image_is_an_error_never_a_wrong_value() {
    let (store, images) = flash_store(small_config());
    write(&store, FLASH_TABLE, 1, &value_for(1, 0, 500));
    demote_all(&store);
    let segment = store
        .log()
        .segment_ids()
        .into_iter()
        .find(|segment| store.replication_image(*segment).is_some())
        .unwrap();
    let (bytes, _) = store.replication_image(segment).unwrap().unwrap();
    // Flip a byte of the object's value (its last bytes are in the image).
    let object_end = bytes.len() - 1;
    images.corrupt(segment, object_end);
    let corrupt_reads = (0..1).map(|_| read(&store, FLASH_TABLE, 1)).collect::<Vec<_>>();
    assert!(
        corrupt_reads.iter().all(|result| *result == Err(ObjectError::FlashCorrupt)),
        "{corrupt_reads:?}"
    );
}

#[test]
fn increments_enumeration_and_transactions_reads_see_values_on_flash() {
    let (store, _images) = flash_store(small_config());
    write(&store, FLASH_TABLE, 1, &40i64.to_le_bytes());
    for key in 2..50u32 {
        write(&store, FLASH_TABLE, key, &value_for(key, 0, 300));
    }
    demote_all(&store);
    let key = key_of(1);
    let hash = key_hash(FLASH_TABLE, &key);
    let now = WallTime::from_seconds(NOW);
    let incremented = store
        .mutate(
            (FLASH_TABLE, &key, hash),
            &RejectRules::NONE,
            Mutation::Increment { delta: 2 },
            None,
            now,
        )
        .unwrap();
    assert_eq!(incremented.integer, Some(42));
    let mut seen = std::collections::BTreeMap::new();
    let mut cursor = (0u64, None::<Vec<u8>>);
    loop {
        let next = store
            .enumerate(
                FLASH_TABLE,
                HashRange::FULL,
                (cursor.0, cursor.1.as_deref()),
                1 << 20,
                now,
                &mut |key, value, _, _| {
                    seen.insert(key.to_vec(), value.to_vec());
                },
            )
            .unwrap();
        match next {
            Some((reversed, key)) => cursor = (reversed, key),
            None => break,
        }
    }
    assert_eq!(seen.len(), 49);
    assert_eq!(seen[&key_of(1)], 42i64.to_le_bytes().to_vec());
    for key in 2..50u32 {
        assert_eq!(seen[&key_of(key)], value_for(key, 0, 300));
    }
}

#[test]
fn backups_get_images_whole_and_never_a_flash_object() {
    let (store, _images) = flash_store(small_config());
    for key in 0..200u32 {
        write(&store, FLASH_TABLE, key, &value_for(key, 0, 700));
    }
    demote_all(&store);
    let mut imaged = 0;
    for segment in store.log().segment_ids() {
        let Some(image) = store.replication_image(segment) else { continue };
        imaged += 1;
        let (bytes, certificate) = image.unwrap();
        for entry in SegmentIterator::new(&bytes, &certificate).unwrap() {
            assert_ne!(entry.unwrap().entry_type, EntryType::FlashObject);
        }
        // The compacted memory holds FLASH_OBJECT entries: the log never hands it out as a
        // replica's bytes.
        assert!(store.log().segment_contents(segment).is_none());
    }
    assert!(imaged > 0);
    // Replaying what backups hold gives every object back.
    let replayed = replay(&store);
    assert_eq!(replayed.len(), 200);
    for key in 0..200u32 {
        assert_eq!(replayed[&key_of(key)].0, value_for(key, 0, 700));
    }
}

#[test]
fn combined_cleaning_reads_survivors_back_and_deletes_the_images_of_cleaned_segments() {
    let config = StoreConfig { flash_image_bytes: 4 << 20, ..small_config() };
    let (store, images) = flash_store(config);
    for generation in 0..4u32 {
        for key in 0..150u32 {
            write(&store, FLASH_TABLE, key, &value_for(key, generation, 800));
        }
        demote_all(&store);
    }
    let images_before = images.image_count();
    assert!(images_before >= 3, "{images_before} images");
    let mut passes = 0;
    while let CleanOutcome::Combined { .. } =
        store.clean_for_segments_now(WallTime::from_seconds(NOW + 100))
    {
        passes += 1;
        assert!(passes < 100, "cleaning never finishes");
    }
    assert!(passes > 0);
    assert!(images.image_count() < images_before, "no image was deleted");
    assert_eq!(store.flash_statistics().images as usize, images.image_count());
    for key in 0..150u32 {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, value_for(key, 3, 800));
    }
    // Survivors hold whole objects; demoting them again works, and backups still have all.
    demote_all(&store);
    let replayed = replay(&store);
    assert_eq!(replayed.len(), 150);
    for key in 0..150u32 {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, value_for(key, 3, 800));
        assert_eq!(replayed[&key_of(key)].0, value_for(key, 3, 800));
    }
}

#[test]
fn a_full_flash_keeps_objects_in_memory_and_loses_nothing() {
    let mut store = ObjectStore::new(small_config(), ServerId(1)).unwrap();
    let images = Arc::new(MemoryImages::with_images_max(1));
    store.attach_flash(images.clone());
    store.set_table_tier(FLASH_TABLE, Tier::Flash);
    for key in 0..400u32 {
        write(&store, FLASH_TABLE, key, &value_for(key, 0, 900));
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let first = store.demote_once(WallTime::from_seconds(NOW)).unwrap();
    assert!(first.is_some_and(|demoted| demoted.objects > 0));
    let second = store.demote_once(WallTime::from_seconds(NOW));
    assert_eq!(second, Err(crate::FlashImageError::Full));
    assert_eq!(images.image_count(), 1);
    for key in 0..400u32 {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, value_for(key, 0, 900));
    }
    // Until an image is deleted there is no room: demotion does not try again (no segment is
    // compacted for nothing).
    let refused = store.flash_statistics().totals.images_refused;
    assert_eq!(store.demote_once(WallTime::from_seconds(NOW)), Err(crate::FlashImageError::Full));
    assert_eq!(store.flash_statistics().totals.images_refused, refused);
    // Every object overwritten: cleaning drops the imaged segment and deletes its image, so
    // demotion has room again.
    for key in 0..400u32 {
        write(&store, FLASH_TABLE, key, &value_for(key, 1, 900));
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let mut passes = 0;
    while store.flash_statistics().totals.images_deleted == 0 {
        let outcome = store.clean_for_segments_now(WallTime::from_seconds(NOW + 100));
        // Images go once their segments have left the log (each demotion checks first).
        store.retire_images();
        passes += 1;
        assert!(passes < 100, "the imaged segment is never cleaned ({outcome:?})");
    }
    let again = store.demote_once(WallTime::from_seconds(NOW + 100)).unwrap();
    assert!(again.is_some_and(|demoted| demoted.objects > 0));
    for key in 0..400u32 {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, value_for(key, 1, 900));
    }
}

/// Images refused as full until `room` is set (a flash whose space another user freed).
#[derive(Debug, Default)]
struct FullUntilRoom {
    images: MemoryImages,
    room: std::sync::atomic::AtomicBool,
}

impl FlashImages for FullUntilRoom {
    fn write_image(
        &self,
        segment: stratus_types::SegmentId,
        bytes: &[u8],
    ) -> Result<(), crate::FlashImageError> {
        if !self.room.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(crate::FlashImageError::Full);
        }
        self.images.write_image(segment, bytes)
    }

    fn read(
        &self,
        segment: stratus_types::SegmentId,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, crate::FlashImageError> {
        self.images.read(segment, offset, length)
    }

    fn delete_image(&self, segment: stratus_types::SegmentId) {
        self.images.delete_image(segment)
    }
}

#[test]
fn a_flash_full_before_the_store_had_an_image_is_tried_again() {
    let mut store = ObjectStore::new(small_config(), ServerId(1)).unwrap();
    let images = Arc::new(FullUntilRoom::default());
    store.attach_flash(images.clone());
    store.set_table_tier(FLASH_TABLE, Tier::Flash);
    for key in 0..400u32 {
        write(&store, FLASH_TABLE, key, &value_for(key, 0, 900));
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let now = WallTime::from_seconds(NOW);
    assert_eq!(store.demote_once(now), Err(crate::FlashImageError::Full));
    // The store holds no image, so no deletion can ever give room back: the refusal must not
    // stop demotion for good.
    images.room.store(true, std::sync::atomic::Ordering::Relaxed);
    let demoted = store.demote_once(now).unwrap();
    assert!(demoted.is_some_and(|demoted| demoted.objects > 0), "{demoted:?}");
    for key in 0..400u32 {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, value_for(key, 0, 900));
    }
}

#[test]
fn memory_tables_are_never_demoted() {
    let (store, images) = flash_store(small_config());
    for key in 0..300u32 {
        write(&store, MEMORY_TABLE, key, &value_for(key, 0, 900));
    }
    assert_eq!(demote_all(&store), 0);
    assert_eq!(images.image_count(), 0);
    assert_eq!(flash_object_entries(&store), 0);
}

/// One step of the flash model test.
#[derive(Clone, Debug)]
enum Step {
    Write { key: u8, length: usize },
    Remove { key: u8 },
    Read { key: u8 },
    Demote,
    Compact,
    CleanForMemory,
    CleanForSegments,
}

fn step_strategy() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0u8..40, 1usize..3_000).prop_map(|(key, length)| Step::Write { key, length }),
        2 => (0u8..40).prop_map(|key| Step::Remove { key }),
        3 => (0u8..40).prop_map(|key| Step::Read { key }),
        2 => Just(Step::Demote),
        1 => Just(Step::Compact),
        1 => Just(Step::CleanForMemory),
        1 => Just(Step::CleanForSegments),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

    /// Writes, removes, demotions, compactions and both kinds of combined cleaning, in any
    /// order: every read matches a model, and what backups would hold (images for segments
    /// whose objects are on flash) replays to the model.
    #[test]
    fn flash_tier_matches_a_model_and_backups_replay_to_it(
        steps in proptest::collection::vec(step_strategy(), 1..300),
    ) {
        let config = StoreConfig { flash_image_bytes: 2 << 20, ..small_config() };
        let (store, images) = flash_store(config);
        let mut model: std::collections::BTreeMap<Vec<u8>, (Vec<u8>, Version)> = Default::default();
        let mut now = NOW;
        for (index, step) in steps.into_iter().enumerate() {
            now += (index % 3) as u32;
            let at = WallTime::from_seconds(now);
            match step {
                Step::Write { key, length } => {
                    let name = key_of(u32::from(key));
                    let value = value_for(u32::from(key), index as u32, length);
                    let hash = key_hash(FLASH_TABLE, &name);
                    match store.write(FLASH_TABLE, &name, hash, &value, &RejectRules::NONE, Expiry::Never, at) {
                        Ok(version) => {
                            if let Some((_, old)) = model.get(&name) {
                                proptest::prop_assert!(version > *old);
                            }
                            model.insert(name, (value, version));
                        }
                        Err(ObjectError::LogFull) => {
                            store.clean_combined_now(at);
                            let _ = store.demote_once(at);
                        }
                        Err(other) => proptest::prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                Step::Remove { key } => {
                    let name = key_of(u32::from(key));
                    let hash = key_hash(FLASH_TABLE, &name);
                    match store.remove(FLASH_TABLE, &name, hash, &RejectRules::NONE, at) {
                        Ok(_) => {
                            model.remove(&name);
                        }
                        Err(ObjectError::LogFull) => {
                            store.clean_combined_now(at);
                        }
                        Err(other) => proptest::prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                Step::Read { key } => {
                    let found = read(&store, FLASH_TABLE, u32::from(key)).ok();
                    proptest::prop_assert_eq!(found.as_ref(), model.get(&key_of(u32::from(key))));
                }
                Step::Demote => {
                    let _ = store.log().roll_head(stratus_log::AppendPriority::Normal);
                    match store.demote_once(at) {
                        Ok(_) | Err(crate::FlashImageError::Full) => {}
                        Err(other) => proptest::prop_assert!(false, "demotion failed: {:?}", other),
                    }
                }
                Step::Compact => {
                    store.compact_now(at);
                }
                Step::CleanForMemory => {
                    store.clean_combined_now(at);
                }
                Step::CleanForSegments => {
                    store.clean_for_segments_now(at);
                }
            }
        }
        for (key, expected) in &model {
            let mut value = Vec::new();
            let version = store
                .read(FLASH_TABLE, key, key_hash(FLASH_TABLE, key), &RejectRules::NONE, WallTime::from_seconds(now), &mut value)
                .unwrap();
            proptest::prop_assert_eq!(&(value, version), expected);
        }
        proptest::prop_assert_eq!(store.flash_statistics().images as usize, images.image_count());
        let replayed = replay(&store);
        proptest::prop_assert_eq!(replayed, model);
    }
}

/// Writers overwrite flash objects and read them back while one thread demotes and cleans and
/// another compacts, all at once: every read sees the writer's latest value, and what backups
/// would hold replays to the final values.
#[test]
fn writers_readers_demotion_and_cleaning_run_concurrently() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    let config = StoreConfig { flash_image_bytes: 3 << 20, ..small_config() };
    let (store, _images) = flash_store(config);
    let writers = 3u32;
    let iterations = 4_000u32;
    let keys_per_writer = 40u32;
    let done = AtomicBool::new(false);
    let final_values: Mutex<HashMap<u32, (u32, usize)>> = Mutex::new(HashMap::new());
    let at = WallTime::from_seconds(NOW);
    std::thread::scope(|scope| {
        let store = &store;
        let done = &done;
        let demoter = scope.spawn(move || {
            while !done.load(Ordering::Acquire) {
                let _ = store.log().roll_head(stratus_log::AppendPriority::Normal);
                let demoted = matches!(store.demote_once(at), Ok(Some(_)));
                let cleaned = !matches!(
                    store.clean_once(at),
                    CleanOutcome::Idle | CleanOutcome::NothingToClean
                );
                if !demoted && !cleaned {
                    store.clean_for_segments_now(at);
                    std::thread::yield_now();
                }
            }
        });
        let compactor = scope.spawn(move || {
            while !done.load(Ordering::Acquire) {
                store.compact_now(at);
                std::thread::yield_now();
            }
        });
        let mut handles = Vec::new();
        for writer in 0..writers {
            let final_values = &final_values;
            handles.push(scope.spawn(move || {
                let mut mine: HashMap<u32, (u32, usize)> = HashMap::new();
                for iteration in 0..iterations {
                    let key = writer * 1000 + iteration % keys_per_writer;
                    let name = key_of(key);
                    let length = 200 + ((iteration as usize * 97) % 2500);
                    let value = value_for(key, iteration, length);
                    let hash = key_hash(FLASH_TABLE, &name);
                    let mut attempts = 0;
                    loop {
                        let rules = RejectRules::NONE;
                        match store.write(
                            FLASH_TABLE,
                            &name,
                            hash,
                            &value,
                            &rules,
                            Expiry::Never,
                            at,
                        ) {
                            Ok(_) => break,
                            Err(ObjectError::LogFull) => {
                                attempts += 1;
                                assert!(attempts < 200_000, "the cleaner never caught up");
                                std::thread::yield_now();
                            }
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    mine.insert(key, (iteration, length));
                    let probe = writer * 1000 + (iteration * 7) % keys_per_writer;
                    if let Some(&(generation, length)) = mine.get(&probe) {
                        let (found, _) = read(store, FLASH_TABLE, probe).unwrap();
                        assert_eq!(found, value_for(probe, generation, length));
                    }
                }
                final_values.lock().unwrap().extend(mine);
            }));
        }
        let results: Vec<_> = handles.into_iter().map(|handle| handle.join()).collect();
        done.store(true, Ordering::Release);
        demoter.join().unwrap();
        compactor.join().unwrap();
        for result in results {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let flash = store.flash_statistics();
    assert!(flash.totals.objects_demoted > 100, "too little was demoted: {flash:?}");
    assert!(flash.totals.images_deleted > 0, "no image was cleaned away: {flash:?}");
    assert_eq!(flash.totals.demotions, flash.images + flash.totals.images_deleted);
    let final_values = final_values.into_inner().unwrap();
    for (&key, &(generation, length)) in &final_values {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, value_for(key, generation, length));
    }
    let replayed = replay(&store);
    assert_eq!(replayed.len(), final_values.len());
    for (&key, &(generation, length)) in &final_values {
        assert_eq!(replayed[&key_of(key)].0, value_for(key, generation, length));
    }
}

/// DRAM per flash object after demotion, for 100-byte and 1 KB values with 16-byte keys: the
/// FLASH_OBJECT entries' bytes in the compacted segments plus one 8-byte hash-table slot each
/// (the arithmetic of docs/design/flash-tier.md: 48 bytes for these sizes).
#[test]
fn dram_per_flash_object_is_the_stub_and_its_slot() {
    for value_bytes in [100usize, 1_000] {
        let config =
            StoreConfig { flash_image_bytes: 64 << 20, log_bytes: 32 << 20, ..small_config() };
        let (store, _images) = flash_store(config);
        let objects = 20_000u32;
        for key in 0..objects {
            let name = format!("user:{key:011}").into_bytes();
            assert_eq!(name.len(), 16);
            let hash = key_hash(FLASH_TABLE, &name);
            let at = WallTime::from_seconds(NOW);
            let value = value_for(key, 0, value_bytes);
            store
                .write(FLASH_TABLE, &name, hash, &value, &RejectRules::NONE, Expiry::Never, at)
                .unwrap();
        }
        demote_all(&store);
        let log = store.log();
        let stub_bytes: u64 = log
            .all_segment_statistics()
            .iter()
            .map(|(_, statistics)| statistics.live_bytes_of(EntryType::FlashObject))
            .sum();
        let demoted = store.flash_statistics().totals.objects_demoted;
        assert!(demoted >= u64::from(objects) * 9 / 10, "{demoted} of {objects} demoted");
        let per_object = stub_bytes as f64 / demoted as f64 + 8.0;
        // 2 + 4 + 4 + 1 + 2 (table) + 3 (version) + 1 + 16 + 8 = 41 bytes of entry (a version up
        // to 2^24 and a 2-byte table id here), plus the slot.
        assert!(per_object <= 50.0, "{per_object:.1} bytes of DRAM per flash object");
        assert!(per_object >= 40.0, "{per_object:.1}: the stub lost fields?");
    }
}

// ---------------------------------------------------------------------------------------------
// Short values (found in review): a FLASH_OBJECT would be larger than the object.
// ---------------------------------------------------------------------------------------------

/// A FLASH_OBJECT is the object's prefix and key plus an 8-byte locator: for a value of at most
/// 8 bytes (an empty value is legal) it would not be smaller than the OBJECT it replaces, and
/// the compacted copy is sized from the segment's movable bytes: such objects stay in memory.
/// (Before, a client writing many short values to a flash table made the demoting cleaner
/// thread panic, "compaction copy outgrew the seglets set aside for it".)
#[test]
fn demoting_empty_values_keeps_them_in_memory_and_fits_the_copy() {
    let (store, _images) = flash_store(small_config());
    let mut keys = 0u32;
    // Two closed segments' worth of empty-value objects of a flash table.
    while store.log().segment_ids().len() < 3 {
        write(&store, FLASH_TABLE, keys, b"");
        keys += 1;
    }
    assert_eq!(demote_all(&store), 0);
    for key in 0..keys {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, Vec::<u8>::new());
    }
}

/// Same, with a handful of 1-byte values: the growth per object is 7 bytes, so it takes only
/// (slack of ~1 seglet + 2 %) / 7 such objects in one segment.
#[test]
fn demoting_one_byte_values_keeps_them_in_memory_and_fits_the_copy() {
    let (store, _images) = flash_store(small_config());
    for key in 0..2_000u32 {
        write(&store, FLASH_TABLE, key, &[key as u8]);
    }
    assert_eq!(demote_all(&store), 0);
    for key in 0..2_000u32 {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, vec![key as u8]);
    }
}

/// What the master's first cleaner thread does between requests: one demotion (a refusal
/// keeps objects in memory), then one unit of cleaning.
fn cleaner_round(store: &ObjectStore, now: WallTime) {
    let _ = store.demote_once(now);
    store.clean_once(now);
}

/// Live data at 80 % of the flash budget and every object overwritten again and again: the
/// tier must clean its images before it fills, or the objects waiting for demotion take the
/// memory cleaning needs and writes stop for good (`stratus bench flash` found it so).
#[test]
fn overwrites_at_80_percent_of_the_flash_budget_never_stall() {
    let images_max = 12usize;
    let config = StoreConfig {
        log_bytes: 1 << 20,
        auto_dram_bytes_max: 1 << 19,
        flash_image_bytes: images_max as u64 * u64::from(small_config().segment_bytes),
        ..small_config()
    };
    let segment_bytes = u64::from(config.segment_bytes);
    let mut store = ObjectStore::new(config, ServerId(1)).unwrap();
    let images = Arc::new(MemoryImages::with_images_max(images_max));
    store.attach_flash(images.clone());
    store.set_table_tier(FLASH_TABLE, Tier::Flash);
    let value_bytes = 900usize;
    // 80 % of the budget in live objects (each a little over its value).
    let keys = (images_max as u64 * segment_bytes * 8 / 10 / (value_bytes as u64 + 40)) as u32;
    let now = WallTime::from_seconds(NOW);
    let mut generation = vec![0u32; keys as usize];
    let write_through = |store: &ObjectStore, key: u32, generation: u32| {
        let value = value_for(key, generation, value_bytes);
        let name = key_of(key);
        let hash = key_hash(FLASH_TABLE, &name);
        for attempt in 0.. {
            let rules = &RejectRules::NONE;
            match store.write(FLASH_TABLE, &name, hash, &value, rules, Expiry::Never, now) {
                Ok(_) => return,
                Err(ObjectError::LogFull) => {
                    assert!(
                        attempt < 200,
                        "writes stalled: {:?} {:?}",
                        store.flash_statistics(),
                        store.log().statistics()
                    );
                    cleaner_round(store, now);
                }
                Err(error) => panic!("write of {key}: {error:?}"),
            }
        }
    };
    for key in 0..keys {
        write_through(&store, key, 0);
        if key % 16 == 0 {
            cleaner_round(&store, now);
        }
    }
    // Overwrites, in a fixed pseudo-random order, three times the live data.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for step in 0..keys * 3 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = (x % u64::from(keys)) as u32;
        generation[key as usize] += 1;
        write_through(&store, key, generation[key as usize]);
        if step % 16 == 0 {
            cleaner_round(&store, now);
        }
    }
    let statistics = store.flash_statistics();
    assert!(statistics.totals.images_deleted > 0, "{statistics:?}");
    assert!(images.image_count() <= images_max);
    for key in 0..keys {
        assert_eq!(
            read(&store, FLASH_TABLE, key).unwrap().0,
            value_for(key, generation[key as usize], value_bytes)
        );
    }
}

/// A segment whose flash objects have all expired, beside objects that stay whole: the
/// expired ones save nothing (the compaction drops them), so the copy's seglets must be sized
/// for the rest. Counting their savings set aside too little and the compaction outgrew it
/// (a panic under the log's lock).
#[test]
fn demoting_a_segment_of_expired_flash_objects_sizes_its_copy_for_what_stays() {
    let config = StoreConfig { log_bytes: 8 << 20, ..small_config() };
    let (store, _images) = flash_store(config);
    let written = WallTime::from_seconds(NOW);
    for key in 0..120u32 {
        let name = key_of(key);
        let value = value_for(key, 0, 900);
        let hash = key_hash(FLASH_TABLE, &name);
        let expiry = Expiry::AfterMillis(1_000);
        store.write(FLASH_TABLE, &name, hash, &value, &RejectRules::NONE, expiry, written).unwrap();
        // Memory-table objects stay whole in the copy.
        write(&store, MEMORY_TABLE, key, &value_for(key, 1, 400));
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    let later = WallTime::from_seconds(NOW + 10);
    for _ in 0..100 {
        if store.demote_once(later).unwrap().is_none() {
            break;
        }
    }
    for key in 0..120u32 {
        assert!(
            matches!(
                read_at(&store, FLASH_TABLE, key, later),
                Err(ObjectError::Rejected { reason: RejectReason::ObjectDoesntExist, .. })
            ),
            "object {key} outlived its expiry"
        );
        assert_eq!(read(&store, MEMORY_TABLE, key).unwrap().0, value_for(key, 1, 400));
    }
}

fn read_at(
    store: &ObjectStore,
    table: TableId,
    key: u32,
    now: WallTime,
) -> Result<(Vec<u8>, Version), ObjectError> {
    let key = key_of(key);
    let mut value = Vec::new();
    let rules = RejectRules::NONE;
    let version = store.read(table, &key, key_hash(table, &key), &rules, now, &mut value)?;
    Ok((value, version))
}

/// Flash at its budget with nothing dead in its images (no pass for flash is worth running)
/// must not stop memory's own cleaning: overwrites of a memory table go on.
#[test]
fn a_full_flash_with_nothing_to_clean_leaves_memory_cleaning_running() {
    let images_max = 4usize;
    let config = StoreConfig {
        log_bytes: 2 << 20,
        auto_dram_bytes_max: 1 << 20,
        flash_image_bytes: images_max as u64 * u64::from(small_config().segment_bytes),
        ..small_config()
    };
    let mut store = ObjectStore::new(config, ServerId(1)).unwrap();
    let images = Arc::new(MemoryImages::with_images_max(images_max));
    store.attach_flash(images.clone());
    store.set_table_tier(FLASH_TABLE, Tier::Flash);
    let now = WallTime::from_seconds(NOW);
    // Flash tables' objects enough to fill every image, never overwritten.
    for key in 0..900u32 {
        write(&store, FLASH_TABLE, key, &value_for(key, 0, 900));
    }
    store.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
    while let Ok(Some(_)) = store.demote_once(now) {}
    assert_eq!(images.image_count(), images_max);
    // Memory-table overwrites: ten times the log in all, cleaned as a server would.
    for round in 0..40u32 {
        for key in 0..50u32 {
            let name = key_of(key);
            let hash = key_hash(MEMORY_TABLE, &name);
            let value = value_for(key, round, 1_000);
            let rules = &RejectRules::NONE;
            let mut attempts = 0;
            while let Err(error) =
                store.write(MEMORY_TABLE, &name, hash, &value, rules, Expiry::Never, now)
            {
                assert_eq!(error, ObjectError::LogFull);
                attempts += 1;
                assert!(attempts < 200, "memory cleaning stopped: {:?}", store.log().statistics());
                let _ = store.demote_once(now);
                store.clean_once(now);
            }
        }
        let _ = store.demote_once(now);
        store.clean_once(now);
    }
    for key in 0..50u32 {
        assert_eq!(read(&store, MEMORY_TABLE, key).unwrap().0, value_for(key, 39, 1_000));
    }
    for key in 0..900u32 {
        assert_eq!(read(&store, FLASH_TABLE, key).unwrap().0, value_for(key, 0, 900));
    }
}
