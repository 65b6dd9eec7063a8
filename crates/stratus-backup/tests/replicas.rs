//! The backup through its Rust API: the write rules, RAM buffers and frames, both durability
//! modes, restarts, torn and corrupt storage, group commit, and storage failure.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{segment, FailingStorage, GatedStorage, APPEND, CLOSE, OPEN, WHOLE};
use stratus_backup::format::METADATA_BLOCK_BYTES;
use stratus_backup::{
    BackupConfig, BackupService, Durability, MemoryStorage, ReplicaStorage, ReplicaWrite,
    STORAGE_FILE_NAME,
};
use stratus_types::{SegmentId, ServerId};
use stratus_wire::{ReplicaCertificate, Status};

fn config(durability: Durability) -> BackupConfig {
    let mut config = BackupConfig::new(1 << 20);
    config.frame_count = 16;
    config.buffer_count = 8;
    config.durability = durability;
    config
}

fn memory_backup(config: BackupConfig) -> (BackupService, Arc<MemoryStorage>) {
    let storage = Arc::new(MemoryStorage::new(config.geometry().total_bytes()));
    let (backup, report) = BackupService::open(config, storage.clone()).unwrap();
    assert_eq!(report.replicas_found, 0);
    (backup, storage)
}

/// Waits (bounded) until `condition` holds; buffered-mode flushes finish on the I/O thread.
async fn eventually(mut condition: impl FnMut() -> bool) {
    for _ in 0..1_000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("condition not reached in time");
}

#[tokio::test]
async fn open_append_close_list_read_free() {
    for durability in [Durability::Buffered, Durability::Fsync] {
        let (backup, _storage) = memory_backup(config(durability));
        let mut built = segment(2, 3, 0);
        backup.write(built.write_from(0, OPEN)).await.unwrap();
        let mut sent = built.length();
        for index in 0..10 {
            built.append_object(format!("k{index}").as_bytes(), 1_000);
            backup.write(built.write_from(sent, APPEND)).await.unwrap();
            sent = built.length();
        }
        let listed = backup.list(ServerId(2));
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].certificate, built.certificate());
        assert!(!listed[0].closed);
        let contents = backup.read(ServerId(2), SegmentId(3)).await.unwrap();
        assert_eq!(contents.data, built.bytes);
        // Close with no new bytes; the replica is then read from disk.
        backup.write(built.write_from(sent, CLOSE)).await.unwrap();
        let contents = backup.read(ServerId(2), SegmentId(3)).await.unwrap();
        assert_eq!(contents.data, built.bytes, "{durability}");
        assert!(contents.closed);
        assert!(backup.list(ServerId(0))[0].closed);
        assert!(backup.list(ServerId(9)).is_empty());
        backup.free(ServerId(2), SegmentId(3)).unwrap();
        backup.free(ServerId(2), SegmentId(3)).unwrap();
        assert!(backup.list(ServerId(0)).is_empty());
        let error = backup.read(ServerId(2), SegmentId(3)).await.unwrap_err();
        assert_eq!(error.status, Status::BackupBadSegmentId);
        eventually(|| backup.statistics().buffers_in_use == 0).await;
    }
}

#[tokio::test]
async fn write_rules_are_enforced_and_rejected_writes_change_nothing() {
    let (backup, _storage) = memory_backup(config(Durability::Buffered));
    let mut built = segment(2, 3, 2);
    // Appending to a replica that was never opened.
    let error = backup.write(built.write_from(0, APPEND)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupBadSegmentId);
    // Opening at a non-zero offset.
    let error = backup.write(built.write_from(10, OPEN)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupOffsetMismatch);
    assert!(backup.list(ServerId(0)).is_empty(), "a refused open creates nothing");
    backup.write(built.write_from(0, OPEN)).await.unwrap();
    let held = built.length();
    // A re-send of the same bytes (even with the open flag again) is accepted.
    backup.write(built.write_from(0, OPEN)).await.unwrap();
    // A re-send with different bytes is refused.
    let mut different = built.write_from(0, APPEND);
    let mut changed = different.data.to_vec();
    changed[40] ^= 1;
    different.data = Bytes::from(changed);
    assert_eq!(backup.write(different).await.unwrap_err().status, Status::BackupOffsetMismatch);
    // A gap.
    built.append_object(b"more", 10);
    let error = backup.write(built.write_from(held + 1, APPEND)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupOffsetMismatch);
    assert!(error.message.contains(&held.to_string()), "{error}");
    // A certificate longer than the bytes held.
    let mut long = built.write_from(held, APPEND);
    long.data = long.data.slice(..1);
    assert_eq!(backup.write(long).await.unwrap_err().status, Status::InvalidParameter);
    // Past the capacity.
    let overflow = ReplicaWrite {
        offset: held,
        data: Bytes::from(vec![0u8; 1 << 20]),
        ..built.write_from(held, APPEND)
    };
    assert_eq!(backup.write(overflow).await.unwrap_err().status, Status::BackupSegmentOverflow);
    assert_eq!(backup.list(ServerId(2))[0].certificate.segment_length, held, "nothing changed");
    // The append itself, with a higher epoch; then a late duplicate of the first write, whose
    // older certificate must not shrink the certified prefix.
    let mut append = built.write_from(held, APPEND);
    append.epoch = 4;
    backup.write(append).await.unwrap();
    let stale = ReplicaWrite { epoch: 1, ..segment(2, 3, 2).write_from(0, APPEND) };
    backup.write(stale).await.unwrap();
    let listed = backup.list(ServerId(2));
    assert_eq!(listed[0].certificate, built.certificate());
    assert_eq!(listed[0].epoch, 4);
    // Closed: no new bytes, but a re-sent close is fine.
    backup.write(built.write_from(built.length(), CLOSE)).await.unwrap();
    backup.write(built.write_from(built.length(), CLOSE)).await.unwrap();
    built.append_object(b"late", 10);
    let error = backup.write(built.write_from(listed[0].certificate.segment_length, APPEND));
    assert_eq!(error.await.unwrap_err().status, Status::BackupReplicaClosed);
}

#[tokio::test]
async fn out_of_buffers_or_frames_refuses_new_replicas() {
    let mut small = config(Durability::Fsync);
    small.buffer_count = 2;
    let (backup, _storage) = memory_backup(small);
    let first = segment(2, 1, 3);
    let second = segment(2, 2, 3);
    backup.write(first.write_from(0, OPEN)).await.unwrap();
    backup.write(second.write_from(0, OPEN)).await.unwrap();
    let error = backup.write(segment(2, 3, 3).write_from(0, OPEN)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupOpenRejected);
    assert!(error.message.contains("buffers"), "{error}");
    assert_eq!(backup.list(ServerId(0)).len(), 2);
    // Closing a replica gives its buffer back.
    backup.write(first.write_from(first.length(), CLOSE)).await.unwrap();
    backup.write(segment(2, 3, 3).write_from(0, OPEN)).await.unwrap();
    assert_eq!(backup.statistics().buffers_in_use, 2);

    let mut few_frames = config(Durability::Buffered);
    few_frames.frame_count = 2;
    let (backup, _storage) = memory_backup(few_frames);
    backup.write(segment(2, 1, 1).write_from(0, WHOLE)).await.unwrap();
    backup.write(segment(2, 2, 1).write_from(0, WHOLE)).await.unwrap();
    let error = backup.write(segment(2, 3, 1).write_from(0, OPEN)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupOpenRejected);
    assert!(error.message.contains("frames"), "{error}");
    backup.free(ServerId(2), SegmentId(1)).unwrap();
    backup.write(segment(2, 3, 1).write_from(0, OPEN)).await.unwrap();
}

#[tokio::test]
async fn restart_finds_closed_replicas_and_fsynced_open_ones() {
    let directory = tempfile::tempdir().unwrap();
    let segments: Vec<_> = (1..=4).map(|id| segment(7, id, 20 * id as usize)).collect();
    let open_segment = segment(7, 9, 5);
    {
        let (backup, _) =
            BackupService::open_directory(config(Durability::Buffered), directory.path()).unwrap();
        for built in &segments {
            backup.write(built.write_from(0, WHOLE)).await.unwrap();
        }
        // Buffered and never closed: in RAM only, so not found after the restart.
        backup.write(open_segment.write_from(0, OPEN)).await.unwrap();
        backup.free(ServerId(7), SegmentId(2)).unwrap();
    }
    let expected: Vec<_> =
        segments.iter().filter(|built| built.segment_id != SegmentId(2)).collect();
    let (backup, report) =
        BackupService::open_directory(config(Durability::Fsync), directory.path()).unwrap();
    assert_eq!(report.replicas_found, expected.len(), "{report:?}");
    let listed = backup.list(ServerId(7));
    assert_eq!(listed.len(), expected.len());
    for (entry, built) in listed.iter().zip(&expected) {
        assert_eq!(entry.segment_id, built.segment_id);
        assert_eq!(entry.certificate, built.certificate());
        assert!(entry.closed && entry.primary);
        let contents = backup.read(ServerId(7), built.segment_id).await.unwrap();
        assert_eq!(contents.data, built.bytes);
    }
    // Restored replicas are read-only; new replicas go to free frames.
    let more = segment(7, 1, 1).write_from(0, APPEND);
    let error = backup.write(ReplicaWrite { offset: expected[0].length(), ..more }).await;
    assert_eq!(error.unwrap_err().status, Status::BackupReplicaClosed);
    // In fsync mode an open replica is on disk as soon as the write is acknowledged.
    backup.write(open_segment.write_from(0, OPEN)).await.unwrap();
    drop(backup);
    let (backup, report) =
        BackupService::open_directory(config(Durability::Fsync), directory.path()).unwrap();
    assert_eq!(report.replicas_found, expected.len() + 1);
    let contents = backup.read(ServerId(7), SegmentId(9)).await.unwrap();
    assert_eq!(contents.data, open_segment.bytes);
    assert!(!contents.closed);
}

/// A master replacing a lost backup raises the epoch of every segment that backup held, closed
/// ones too, and may record a head at that epoch with the coordinator. In buffered mode a
/// closed replica's bytes are on disk only, so its raised epoch must reach the disk before the
/// write is acknowledged: after a whole-cluster restart, recovery looks for the head at the
/// recorded epoch (CI once waited forever for one that existed only in a stopped backup's RAM).
#[tokio::test]
async fn a_raised_epoch_and_a_stop_flush_survive_a_restart_in_buffered_mode() {
    let directory = tempfile::tempdir().unwrap();
    let closed = segment(7, 1, 20);
    let open = segment(7, 2, 5);
    {
        let (backup, _) =
            BackupService::open_directory(config(Durability::Buffered), directory.path()).unwrap();
        backup.write(closed.write_from(0, WHOLE)).await.unwrap();
        backup.write(open.write_from(0, OPEN)).await.unwrap();
        for built in [&closed, &open] {
            let raise = ReplicaWrite { epoch: 2, ..built.write_from(built.length(), APPEND) };
            assert!(raise.data.is_empty());
            backup.write(raise).await.unwrap();
        }
        // What a stopping server does; the open replica is written with its raised epoch.
        assert_eq!(backup.flush_open_replicas(Duration::from_secs(10)).await, 1);
        // A stopping backup takes no more writes (the master replaces it).
        let refused = backup.write(open.write_from(0, APPEND)).await.unwrap_err();
        assert_eq!(refused.status, Status::Retry);
    }
    let (backup, report) =
        BackupService::open_directory(config(Durability::Buffered), directory.path()).unwrap();
    assert_eq!(report.replicas_found, 2, "{report:?}");
    for (built, closed) in [(&closed, true), (&open, false)] {
        let contents = backup.read(ServerId(7), built.segment_id).await.unwrap();
        assert_eq!(contents.epoch, 2, "segment {}", built.segment_id);
        assert_eq!(contents.closed, closed);
        assert_eq!(contents.data, built.bytes);
    }
}

/// Byte offsets of a frame's metadata slots and data, for corrupting them.
fn frame_offsets(config: &BackupConfig, frame: u32) -> (u64, u64, u64) {
    let geometry = config.geometry();
    (geometry.slot_offset(frame, 0), geometry.slot_offset(frame, 1), geometry.data_offset(frame))
}

fn corrupt(path: &std::path::Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, offset).unwrap();
    byte[0] ^= 0x5a;
    file.write_all_at(&byte, offset).unwrap();
}

#[tokio::test]
async fn torn_metadata_and_corrupt_data_are_detected() {
    let directory = tempfile::tempdir().unwrap();
    let config = config(Durability::Fsync);
    // Frame 0: two synced writes (slots 0 then 1). Frames 1, 2, 3: one whole write each.
    let mut first = segment(5, 1, 3);
    let first_certificate = first.certificate();
    let first_length = first.length();
    let others: Vec<_> = (2..=4).map(|id| segment(5, id, 3)).collect();
    {
        let (backup, _) = BackupService::open_directory(config, directory.path()).unwrap();
        backup.write(first.write_from(0, OPEN)).await.unwrap();
        first.append_object(b"second write", 50);
        backup.write(first.write_from(first_length, CLOSE)).await.unwrap();
        for built in &others {
            backup.write(built.write_from(0, WHOLE)).await.unwrap();
        }
    }
    let path = directory.path().join(STORAGE_FILE_NAME);
    // Frame 0: tear the newest metadata block (slot 1): the older, synced one is used.
    let (_, slot_1, _) = frame_offsets(&config, 0);
    corrupt(&path, slot_1 + 44);
    // Frame 1 (segment 2): corrupt a byte of an object's value, inside the certified range.
    let (_, _, data) = frame_offsets(&config, 1);
    corrupt(&path, data + 100);
    // Frame 2 (segment 3): tear its only metadata block.
    let (slot_0, _, _) = frame_offsets(&config, 2);
    corrupt(&path, slot_0 + METADATA_BLOCK_BYTES as u64 - 1);
    // Frame 3 (segment 4): untouched.
    let (backup, report) = BackupService::open_directory(config, directory.path()).unwrap();
    assert_eq!(report.replicas_found, 2, "{report:?}");
    assert!(report.discarded.iter().any(|reason| reason.contains("checksum")), "{report:?}");
    assert!(report.discarded.iter().any(|reason| reason.contains("corrupt")), "{report:?}");
    let listed = backup.list(ServerId(5));
    let segments: Vec<u64> = listed.iter().map(|entry| entry.segment_id.0).collect();
    assert_eq!(segments, vec![1, 4]);
    // Segment 1 fell back to its first write: the certificate of the first append, not closed.
    assert_eq!(listed[0].certificate, first_certificate);
    assert!(!listed[0].closed);
    let contents = backup.read(ServerId(5), SegmentId(1)).await.unwrap();
    assert_eq!(&contents.data[..], &first.bytes[..first_length as usize]);
    let contents = backup.read(ServerId(5), SegmentId(4)).await.unwrap();
    assert_eq!(contents.data, others[2].bytes);
    // The discarded frames are free again.
    assert_eq!(backup.statistics().frames_free, config.frame_count as usize - 2);
}

#[tokio::test]
async fn a_frame_holding_another_segment_is_stale_and_refused() {
    // Metadata that names segment 2 over data whose header names segment 1 (a frame reused
    // without its metadata being rewritten) must not be reported.
    let config = config(Durability::Fsync);
    let storage = Arc::new(MemoryStorage::new(config.geometry().total_bytes()));
    let built = segment(5, 1, 3);
    {
        let (backup, _) = BackupService::open(config, storage.clone()).unwrap();
        backup.write(built.write_from(0, WHOLE)).await.unwrap();
    }
    let geometry = config.geometry();
    let mut block = [0u8; METADATA_BLOCK_BYTES];
    storage.read_at(geometry.slot_offset(0, 0), &mut block).unwrap();
    let mut metadata = stratus_backup::format::ReplicaMetadata::decode(&block).unwrap().unwrap();
    metadata.segment_id = SegmentId(2);
    storage.write_at(geometry.slot_offset(0, 0), &metadata.encode()).unwrap();
    let (backup, report) = BackupService::open(config, storage).unwrap();
    assert!(backup.list(ServerId(0)).is_empty());
    assert!(report.discarded.iter().any(|reason| reason.contains("stale")), "{report:?}");
}

#[tokio::test]
async fn storage_of_another_geometry_or_format_is_refused() {
    let directory = tempfile::tempdir().unwrap();
    let config = config(Durability::Buffered);
    drop(BackupService::open_directory(config, directory.path()).unwrap());
    let mut other = config;
    other.segment_bytes = 1 << 19;
    let error = BackupService::open_directory(other, directory.path()).unwrap_err();
    assert!(error.contains("made for"), "{error}");
    std::fs::write(directory.path().join(STORAGE_FILE_NAME), b"GIF89a not a backup").unwrap();
    let error = BackupService::open_directory(config, directory.path()).unwrap_err();
    assert!(error.contains("not a Stratus backup file"), "{error}");
    let mut invalid = config;
    invalid.segment_bytes = 64 << 20;
    assert!(BackupService::open_directory(invalid, directory.path()).is_err());
}

#[tokio::test]
async fn fsync_group_commit_shares_one_sync_among_queued_writes() {
    let config = config(Durability::Fsync);
    let (storage, sync_entered, release) = GatedStorage::new(config.geometry().total_bytes());
    let (backup, _) = BackupService::open(config, storage.clone()).unwrap();
    storage.arm();
    let built = segment(3, 1, 0);
    // The first write's sync blocks inside the storage ...
    let first = backup.begin_write(built.write_from(0, OPEN));
    sync_entered.recv_timeout(Duration::from_secs(30)).unwrap();
    // ... while 99 appends queue behind it.
    let mut growing = built.clone();
    let mut pending = Vec::new();
    let mut sent = growing.length();
    for index in 0..99 {
        growing.append_object(format!("object {index}").as_bytes(), 64);
        pending.push(backup.begin_write(growing.write_from(sent, APPEND)));
        sent = growing.length();
    }
    release.send(()).unwrap();
    first.wait().await.unwrap();
    for write in pending {
        write.wait().await.unwrap();
    }
    let statistics = backup.statistics();
    assert_eq!(statistics.disk_write_jobs, 100);
    assert_eq!(statistics.disk_syncs, 2, "99 queued appends share one sync");
    // One metadata block per sync (the newest certificate), not one per append.
    assert_eq!(statistics.disk_metadata_blocks_written, 2);
    drop(backup);
    let (backup, report) = BackupService::open(config, storage).unwrap();
    assert_eq!(report.replicas_found, 1);
    let contents = backup.read(ServerId(3), SegmentId(1)).await.unwrap();
    assert_eq!(contents.data, growing.bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_concurrent_appends_on_a_real_file_are_all_durable() {
    let directory = tempfile::tempdir().unwrap();
    let mut config = config(Durability::Fsync);
    config.buffer_count = 16;
    let (backup, _) = BackupService::open_directory(config, directory.path()).unwrap();
    let backup = Arc::new(backup);
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..16u64 {
        let backup = backup.clone();
        tasks.spawn(async move {
            let mut built = segment(4, writer + 1, 0);
            backup.write(built.write_from(0, OPEN)).await.unwrap();
            let mut sent = built.length();
            for index in 0..25 {
                built.append_object(format!("w{writer}-{index}").as_bytes(), 100);
                backup.write(built.write_from(sent, APPEND)).await.unwrap();
                sent = built.length();
            }
            built
        });
    }
    let mut written = Vec::new();
    while let Some(built) = tasks.join_next().await {
        written.push(built.unwrap());
    }
    let statistics = backup.statistics();
    println!(
        "fsync group commit: {} acknowledged writes, {} syncs ({:.1} writes per sync)",
        statistics.disk_write_jobs,
        statistics.disk_syncs,
        statistics.disk_write_jobs as f64 / statistics.disk_syncs.max(1) as f64
    );
    assert_eq!(statistics.disk_write_jobs, 16 * 26);
    assert!(statistics.disk_syncs <= statistics.disk_write_jobs);
    drop(tasks);
    let backup = Arc::into_inner(backup).expect("no other owner");
    drop(backup);
    let (backup, report) = BackupService::open_directory(config, directory.path()).unwrap();
    assert_eq!(report.replicas_found, 16);
    for built in written {
        let contents = backup.read(built.master_id, built.segment_id).await.unwrap();
        assert_eq!(contents.data, built.bytes, "segment {}", built.segment_id);
    }
}

#[tokio::test]
async fn a_failed_sync_poisons_the_backup() {
    let config = config(Durability::Fsync);
    let storage = Arc::new(FailingStorage {
        inner: MemoryStorage::new(config.geometry().total_bytes()),
        failing: AtomicBool::new(false),
    });
    let (backup, _) = BackupService::open(config, storage.clone()).unwrap();
    let mut built = segment(6, 1, 1);
    backup.write(built.write_from(0, OPEN)).await.unwrap();
    storage.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let sent = built.length();
    built.append_object(b"lost", 10);
    let error = backup.write(built.write_from(sent, APPEND)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupStorageFailed);
    assert!(error.message.contains("injected"), "{error}");
    // Poisoned: even a new replica is refused, at once, until the backup restarts.
    let error = backup.write(segment(6, 2, 1).write_from(0, OPEN)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupStorageFailed);
    assert!(backup.statistics().storage_failure.is_some());
    // Reads of what it holds still work.
    assert!(backup.read(ServerId(6), SegmentId(1)).await.is_ok());

    // Buffered mode: the failure shows at the close's flush, and later writes are refused.
    let mut buffered = config;
    buffered.durability = Durability::Buffered;
    let storage = Arc::new(FailingStorage {
        inner: MemoryStorage::new(config.geometry().total_bytes()),
        failing: AtomicBool::new(false),
    });
    let (backup, _) = BackupService::open(buffered, storage.clone()).unwrap();
    storage.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    backup.write(segment(6, 1, 1).write_from(0, WHOLE)).await.unwrap();
    eventually(|| backup.statistics().storage_failure.is_some()).await;
    let error = backup.write(segment(6, 2, 1).write_from(0, OPEN)).await.unwrap_err();
    assert_eq!(error.status, Status::BackupStorageFailed);
}

#[tokio::test]
async fn empty_replica_survives_a_restart() {
    // An open with no bytes yet: the certificate of zero bytes is the CRC32C of the 4 length
    // bytes alone.
    let config = config(Durability::Fsync);
    let storage = Arc::new(MemoryStorage::new(config.geometry().total_bytes()));
    let empty = ReplicaWrite {
        data: Bytes::new(),
        certificate: ReplicaCertificate {
            segment_length: 0,
            checksum: crc32c::crc32c(&0u32.to_le_bytes()),
        },
        ..segment(8, 1, 0).write_from(0, OPEN)
    };
    {
        let (backup, _) = BackupService::open(config, storage.clone()).unwrap();
        backup.write(empty).await.unwrap();
    }
    let (backup, _) = BackupService::open(config, storage).unwrap();
    assert_eq!(backup.list(ServerId(8)).len(), 1);
    assert!(backup.read(ServerId(8), SegmentId(1)).await.unwrap().data.is_empty());
}

/// A master declared crashed can complete no write: once fenced, its writes are refused (new
/// replicas and appends alike), while what it wrote before stays readable for its recovery and
/// other masters are unaffected.
#[tokio::test]
async fn a_fenced_master_writes_nothing_more_and_its_replicas_stay_readable() {
    let (backup, _storage) = memory_backup(config(Durability::Buffered));
    let mut built = segment(2, 3, 0);
    backup.write(built.write_from(0, OPEN)).await.unwrap();
    let sent = built.length();
    built.append_object(b"before", 100);
    backup.write(built.write_from(sent, APPEND)).await.unwrap();
    let certified = built.certificate();

    backup.fence_master(ServerId(2));
    backup.fence_master(ServerId(2)); // idempotent
    let sent = built.length();
    built.append_object(b"after", 100);
    let error = backup.write(built.write_from(sent, APPEND)).await.unwrap_err();
    assert_eq!(error.status, Status::ServerCrashed);
    let error = backup.write(segment(2, 4, 0).write_from(0, OPEN)).await.unwrap_err();
    assert_eq!(error.status, Status::ServerCrashed);

    // Recovery still reads exactly what was written before the fence.
    assert_eq!(backup.list(ServerId(2))[0].certificate, certified);
    let contents = backup.read(ServerId(2), SegmentId(3)).await.unwrap();
    assert_eq!(contents.certificate, certified);
    // Another master writes as before.
    backup.write(segment(5, 1, 0).write_from(0, OPEN)).await.unwrap();
}
