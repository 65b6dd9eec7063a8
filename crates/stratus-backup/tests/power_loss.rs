//! Power loss at arbitrary moments of an fsync-mode backup under load: after a restart on what
//! the disk holds (unsynced writes lost, applied or torn), every acknowledged append is there,
//! and nothing that was not written is reported.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{segment, CrashingStorage, SegmentBuilder, APPEND, OPEN};
use stratus_backup::{BackupConfig, BackupService, Durability};
use stratus_types::ServerId;

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) % bound.max(1)
    }
}

#[tokio::test]
async fn acknowledged_appends_survive_power_loss_at_any_moment() {
    let mut config = BackupConfig::new(64 << 10);
    config.frame_count = 6;
    config.durability = Durability::Fsync;
    let capacity = config.geometry().total_bytes();
    let storage = Arc::new(CrashingStorage::new(capacity, None));
    let (backup, _) = BackupService::open(config, storage.clone()).unwrap();
    let mut random = Lcg(7);
    let mut segments: Vec<SegmentBuilder> = (1..=4).map(|id| segment(11, id, 0)).collect();
    // Acknowledged certified length per segment.
    let mut acknowledged: BTreeMap<u64, u32> = BTreeMap::new();
    for built in &segments {
        backup.write(built.write_from(0, OPEN)).await.unwrap();
        acknowledged.insert(built.segment_id.0, built.length());
    }
    let mut images: Vec<(BTreeMap<u64, u32>, Vec<u8>)> = Vec::new();
    let mut unsynced_writes_at_power_loss = 0;
    for round in 0..30 {
        let mut pending = Vec::new();
        for built in segments.iter_mut() {
            let sent = built.length();
            for index in 0..=random.below(3) {
                built.append_object(
                    format!("r{round}-{index}").as_bytes(),
                    50 + random.below(700) as usize,
                );
            }
            pending.push((
                built.segment_id.0,
                built.length(),
                backup.begin_write(built.write_from(sent, APPEND)),
            ));
        }
        let cut = random.below(pending.len() as u64 + 1) as usize;
        for (index, (segment_id, length, write)) in pending.into_iter().enumerate() {
            if index == cut {
                let (image, unsynced) = storage.image_after_power_loss(|bound| random.below(bound));
                unsynced_writes_at_power_loss += unsynced;
                images.push((acknowledged.clone(), image));
            }
            write.wait().await.unwrap();
            acknowledged.insert(segment_id, length);
        }
    }
    drop(backup);
    assert!(images.len() >= 20);
    println!(
        "{} power losses, {unsynced_writes_at_power_loss} unsynced writes lost or torn",
        images.len()
    );
    assert!(unsynced_writes_at_power_loss > 0, "some power losses must catch unsynced writes");
    for (trial, (acknowledged, image)) in images.into_iter().enumerate() {
        let storage = Arc::new(CrashingStorage::new(capacity, Some(image)));
        let (backup, _) = BackupService::open(config, storage).unwrap();
        let listed = backup.list(ServerId(11));
        for (segment_id, acknowledged_length) in &acknowledged {
            let entry = listed
                .iter()
                .find(|entry| entry.segment_id.0 == *segment_id)
                .unwrap_or_else(|| panic!("trial {trial}: segment {segment_id} lost"));
            let length = entry.certificate.segment_length;
            assert!(
                length >= *acknowledged_length,
                "trial {trial}: segment {segment_id} lost acknowledged bytes"
            );
            let contents = backup.read(entry.master_id, entry.segment_id).await.unwrap();
            let built = &segments[(*segment_id - 1) as usize];
            assert_eq!(&contents.data[..], &built.bytes[..length as usize], "trial {trial}");
        }
    }
}
