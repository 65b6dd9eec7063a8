//! Random corruption of a backup file never panics the backup and never makes it report bytes
//! that were not written: every replica it lists after a restart reads back as an exact prefix
//! of what the master sent, certified and intact.

mod common;

use common::{segment, SegmentBuilder, APPEND, CLOSE, OPEN, WHOLE};
use stratus_backup::{BackupConfig, BackupService, Durability, STORAGE_FILE_NAME};
use stratus_log::Certificate;
use stratus_types::ServerId;

/// A small deterministic generator (no test should depend on the seed of another run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 11
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

#[tokio::test]
async fn random_corruption_is_never_reported_as_a_replica() {
    let directory = tempfile::tempdir().unwrap();
    let original = directory.path().join("original");
    let mut config = BackupConfig::new(64 << 10);
    config.frame_count = 6;
    config.durability = Durability::Fsync;
    // Six replicas: some closed, some open, each written in several synced appends.
    let mut written: Vec<SegmentBuilder> = Vec::new();
    {
        let (backup, _) = BackupService::open_directory(config, &original).unwrap();
        for id in 1..=6u64 {
            let mut built = segment(9, id, 0);
            backup.write(built.write_from(0, OPEN)).await.unwrap();
            for round in 0..id {
                let sent = built.length();
                for index in 0..5 {
                    built.append_object(format!("{id}-{round}-{index}").as_bytes(), 200);
                }
                let flags = if id % 2 == 0 && round + 1 == id { CLOSE } else { APPEND };
                backup.write(built.write_from(sent, flags)).await.unwrap();
            }
            written.push(built);
        }
    }
    let geometry = config.geometry();
    let file_bytes = std::fs::read(original.join(STORAGE_FILE_NAME)).unwrap();
    let mut random = Lcg(0x5eed);
    let mut replicas_seen = 0usize;
    let mut slots_discarded = 0usize;
    for trial in 0..150 {
        let mut corrupted = file_bytes.clone();
        // 1 to 6 damaged places, each a byte flip or a zeroed run (a lost or torn write).
        for _ in 0..=random.below(6) {
            let frame = random.below(u64::from(config.frame_count)) as u32;
            let offset = if random.below(3) == 0 {
                geometry.slot_offset(frame, random.below(2) as u8) + random.below(56)
            } else {
                geometry.data_offset(frame) + random.below(4_000)
            } as usize;
            if random.below(2) == 0 {
                corrupted[offset] ^= 1 << random.below(8);
            } else {
                let end = (offset + 1 + random.below(512) as usize).min(corrupted.len());
                corrupted[offset..end].fill(0);
            }
        }
        let trial_directory = directory.path().join(format!("trial-{trial}"));
        std::fs::create_dir_all(&trial_directory).unwrap();
        std::fs::write(trial_directory.join(STORAGE_FILE_NAME), &corrupted).unwrap();
        let (backup, report) = BackupService::open_directory(config, &trial_directory).unwrap();
        slots_discarded += report.discarded.len();
        for entry in backup.list(ServerId(0)) {
            replicas_seen += 1;
            let built = written
                .iter()
                .find(|built| built.segment_id == entry.segment_id)
                .expect("a listed replica was written");
            let contents = backup.read(entry.master_id, entry.segment_id).await.unwrap();
            let length = entry.certificate.segment_length as usize;
            assert_eq!(&contents.data[..], &built.bytes[..length], "trial {trial}");
            let certificate = Certificate {
                segment_length: entry.certificate.segment_length,
                checksum: entry.certificate.checksum,
            };
            stratus_backup::validate_replica(
                &contents.data,
                entry.master_id,
                entry.segment_id,
                certificate,
            )
            .unwrap();
        }
        drop(backup);
        std::fs::remove_dir_all(&trial_directory).unwrap();
    }
    println!("{replicas_seen} replicas found and {slots_discarded} slots discarded in 150 trials");
    assert!(slots_discarded >= 150, "the corruption must be detected, not missed");
    // Most damage hits one or two frames: the rest must still be found.
    assert!(replicas_seen > 150 * 3, "only {replicas_seen} replicas survived 150 trials");
}

/// A bad sector in the file header (one flipped bit, or a torn first write) does not take the
/// backup's good replicas offline: the header is rewritten from the configuration and every
/// replica is found. A foreign file (a magic that is not nearly ours) is still refused.
#[tokio::test]
async fn a_damaged_header_is_rewritten_and_a_foreign_file_refused() {
    let directory = tempfile::tempdir().unwrap();
    let mut config = BackupConfig::new(64 << 10);
    config.frame_count = 4;
    config.durability = Durability::Fsync;
    {
        let (backup, _) = BackupService::open_directory(config, directory.path()).unwrap();
        for id in 1..=3u64 {
            let mut built = segment(9, id, 0);
            built.append_object(format!("object-{id}").as_bytes(), 300);
            backup.write(built.write_from(0, WHOLE)).await.unwrap();
        }
    }
    let path = directory.path().join(STORAGE_FILE_NAME);
    let pristine = std::fs::read(&path).unwrap();
    for (place, bit) in [(0usize, 0u8), (3, 5), (13, 2), (24, 7)] {
        let mut damaged = pristine.clone();
        damaged[place] ^= 1 << bit;
        std::fs::write(&path, &damaged).unwrap();
        let (backup, report) = BackupService::open_directory(config, directory.path())
            .unwrap_or_else(|error| panic!("byte {place} bit {bit}: {error}"));
        assert_eq!(report.replicas_found, 3, "byte {place} bit {bit}");
        assert_eq!(backup.list(ServerId(9)).len(), 3);
        drop(backup);
        // The header was rewritten: the file opens cleanly again.
        let header_now = std::fs::read(&path).unwrap();
        assert_eq!(header_now[..28], pristine[..28], "byte {place} bit {bit}");
    }
    let mut foreign = pristine.clone();
    foreign[..8].copy_from_slice(b"SQLite f");
    std::fs::write(&path, &foreign).unwrap();
    let refused = BackupService::open_directory(config, directory.path()).err().unwrap();
    assert!(refused.contains("bad magic"), "{refused}");
}
