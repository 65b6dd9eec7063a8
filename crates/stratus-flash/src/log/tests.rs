use std::sync::Arc;

use super::*;
use crate::device::MemoryDevice;
use crate::format::EntryRef;
use crate::segments::SegmentState;

fn small_config() -> FlashConfig {
    FlashConfig {
        geometry: Geometry::new(64 << 10, 16 << 10).unwrap(),
        flush_buffers: 3,
        log_id: 7,
        cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
        cleaner_reserve_segments: 1,
    }
}

fn small_log(budget_bytes: u64) -> (FlashLog, MemoryDevice) {
    let device = MemoryDevice::new(64 << 10, budget_bytes);
    let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
    (log, device)
}

#[test]
fn an_entry_reads_back_from_its_buffer_and_from_the_device_at_the_same_address() {
    let (log, device) = small_log(1 << 20);
    let entry = EntryRef::object(1, b"key", b"value", 5);
    let address = log.append(&entry).unwrap();
    assert_eq!(address, FlashAddress((64 << 10) + 40), "segment 1, after its header");
    assert_eq!(log.read(address).unwrap().as_entry_ref(), entry);
    assert_eq!(device.writes(), 0, "read from DRAM");
    assert!(log.durable_end() <= address);
    log.sync().unwrap();
    assert!(log.durable_end().0 > address.0);
    assert_eq!(device.writes(), 1);
    assert_eq!(log.read(address).unwrap().as_entry_ref(), entry, "same address from the device");
}

#[test]
fn appends_fill_buffers_in_order_and_roll_into_new_segments() {
    let (log, _device) = small_log(1 << 20);
    let value = vec![3u8; 3000];
    let mut addresses = Vec::new();
    for version in 0..61u64 {
        let key = version.to_le_bytes();
        let entry = EntryRef::object(1, &key, &value, version);
        let address = loop {
            match log.append(&entry) {
                Err(FlashError::BuffersBusy) => {
                    log.flush_ready().unwrap();
                }
                other => break other.unwrap(),
            }
        };
        addresses.push(address);
    }
    assert!(addresses.windows(2).all(|pair| pair[0] < pair[1]), "addresses grow");
    log.sync().unwrap();
    for (version, &address) in addresses.iter().enumerate() {
        let entry = log.read(address).unwrap();
        assert_eq!(entry.version, version as u64);
        assert_eq!(entry.value, value);
    }
    let stats = log.segment_stats();
    assert_eq!(stats.len(), 4, "61 entries of ~3 KiB: five per 16 KiB slot, four slots a segment");
    assert!(stats[..3].iter().all(|segment| segment.state == SegmentState::Closed));
    assert_eq!(stats[3].state, SegmentState::Open);
}

#[test]
fn with_every_buffer_waiting_for_the_device_an_append_is_told_to_wait() {
    let (log, _device) = small_log(1 << 20);
    let value = vec![0u8; 8000];
    let mut busy = false;
    for version in 0..10 {
        match log.append(&EntryRef::object(1, b"k", &value, version)) {
            Ok(_) => {}
            Err(FlashError::BuffersBusy) => {
                busy = true;
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(busy, "three 16 KiB buffers hold six 8 KiB entries, then all three are sealed");
    assert_eq!(log.flush_ready().unwrap().buffers_written, 3);
    assert!(log.append(&EntryRef::object(1, b"k", &value, 11)).is_ok());
}

#[test]
fn entries_too_large_for_a_buffer_and_keys_too_long_are_refused() {
    let (log, _device) = small_log(1 << 20);
    let value = vec![0u8; 16 << 10];
    assert!(matches!(
        log.append(&EntryRef::object(1, b"k", &value, 1)),
        Err(FlashError::EntryTooLarge { entry_bytes_max: 16344, .. })
    ));
    let key = vec![0u8; 70_000];
    assert_eq!(
        log.append(&EntryRef::object(1, &key, b"", 1)),
        Err(FlashError::KeyTooLarge { key_bytes: 70_000 })
    );
}

#[test]
fn reads_of_addresses_never_written_are_refused() {
    let (log, _device) = small_log(1 << 20);
    let address = log.append(&EntryRef::object(1, b"k", b"v", 1)).unwrap();
    assert_eq!(
        log.read(FlashAddress(address.0 + 4096)),
        Err(FlashError::NotWritten { address: FlashAddress(address.0 + 4096) })
    );
    assert_eq!(
        log.read(FlashAddress(10 << 20)),
        Err(FlashError::NotWritten { address: FlashAddress(10 << 20) })
    );
    log.sync().unwrap();
    let beyond = FlashAddress(address.0 + 4096);
    assert_eq!(log.read(beyond), Err(FlashError::NotWritten { address: beyond }));
}

#[test]
fn an_append_batch_is_contiguous_and_in_the_callers_order() {
    let (log, _device) = small_log(1 << 20);
    let old = log.append(&EntryRef::object(1, b"k", b"one", 1)).unwrap();
    let object = EntryRef::object(1, b"k", b"two", 2);
    let tombstone = EntryRef::tombstone(1, b"k", 1, old);
    let addresses = log.append_all(&[object, tombstone]).unwrap();
    assert_eq!(addresses[1].0, addresses[0].0 + object.encoded_bytes() as u64);
    assert_eq!(log.read(addresses[0]).unwrap().as_entry_ref(), object);
    assert_eq!(log.read(addresses[1]).unwrap().as_entry_ref(), tombstone);
}

#[test]
fn a_size_hint_too_small_or_too_large_still_reads_the_right_entry() {
    let (log, _device) = small_log(1 << 20);
    let value = vec![5u8; 9000];
    let small = log.append(&EntryRef::object(1, b"s", b"tiny", 1)).unwrap();
    let large = log.append(&EntryRef::object(1, b"l", &value, 2)).unwrap();
    log.sync().unwrap();
    for hint in [0, 40, 4096, 9048, 20_000] {
        assert_eq!(log.read_sized(large, hint).unwrap().value, value, "hint {hint}");
        assert_eq!(log.read_sized(small, hint).unwrap().value, b"tiny", "hint {hint}");
    }
}

#[test]
fn a_closed_segments_entries_are_walked_in_log_order() {
    let (log, _device) = small_log(1 << 20);
    let value = vec![1u8; 2000];
    let mut addresses = Vec::new();
    while log.segment_stats().len() < 2 {
        let version = addresses.len() as u64;
        let key = version.to_le_bytes();
        let address = loop {
            match log.append(&EntryRef::object(1, &key, &value, version)) {
                Err(FlashError::BuffersBusy) => {
                    log.flush_ready().unwrap();
                }
                other => break other.unwrap(),
            }
        };
        addresses.push(address);
    }
    log.sync().unwrap();
    let image = log.read_segment(SegmentNumber(1)).unwrap();
    let mut walk = image.entries();
    let walked: Vec<FlashAddress> = walk.by_ref().map(|item| item.address).collect();
    assert!(walk.report().tears.is_empty());
    let in_first: Vec<FlashAddress> = addresses
        .into_iter()
        .filter(|&address| small_config().geometry.segment_of(address) == SegmentNumber(1))
        .collect();
    assert_eq!(walked, in_first);
}

/// Moves every object the index points at.
struct MoveAll(std::collections::HashMap<FlashAddress, FlashAddress>);

impl crate::RelocationIndex for MoveAll {
    fn is_live(&mut self, entry: &EntryRef<'_>, _address: FlashAddress) -> bool {
        entry.key != b"dead"
    }

    fn relocate(
        &mut self,
        _entry: &EntryRef<'_>,
        old: FlashAddress,
        copy: &mut dyn FnMut() -> Result<FlashAddress, FlashError>,
    ) -> Result<crate::Relocation, FlashError> {
        self.0.insert(old, copy()?);
        Ok(crate::Relocation::Moved)
    }
}

#[test]
fn a_cleaned_segment_is_freed_only_once_its_relocated_copies_are_durable() {
    let (log, device) = small_log(1 << 20);
    let value = vec![4u8; 3000];
    let live = log.append(&EntryRef::object(1, b"live", b"kept", 1)).unwrap();
    // Fill segment 1 with dead objects so it closes, then flush it.
    while log.segment_stats().len() < 2 {
        match log.append(&EntryRef::object(1, b"dead", &value, 2)) {
            Err(FlashError::BuffersBusy) => {
                log.flush_ready().unwrap();
            }
            other => {
                let address = other.unwrap();
                log.note_dead(address, EntryRef::object(1, b"dead", &value, 2).encoded_bytes());
            }
        }
    }
    log.flush_ready().unwrap();
    assert_eq!(log.segments_to_clean(), vec![SegmentNumber(1)]);
    let mut index = MoveAll(Default::default());
    let outcome = log.clean_segment(SegmentNumber(1), &mut index).unwrap();
    assert_eq!(outcome.objects_relocated, 1);
    let copy = index.0[&live];
    assert!(copy >= log.durable_end(), "the copy is still in a buffer");
    assert!(matches!(log.segment_stats()[0].state, SegmentState::Cleaned { .. }));
    log.flush_ready().unwrap();
    assert!(device.segments_present().contains(&SegmentNumber(1)), "copy not yet durable");
    assert_eq!(log.read(live).unwrap().value, b"kept", "the original still reads");
    log.sync().unwrap();
    assert!(!device.segments_present().contains(&SegmentNumber(1)));
    assert_eq!(log.read(live), Err(FlashError::SegmentFreed { address: live }));
    assert_eq!(log.read(copy).unwrap().value, b"kept");
}

#[test]
fn a_segment_whose_free_fails_stays_counted_and_is_freed_by_a_later_reclaim() {
    let (log, device) = small_log(1 << 20);
    let value = vec![4u8; 3000];
    while log.segment_stats().len() < 2 {
        match log.append(&EntryRef::object(1, b"dead", &value, 2)) {
            Err(FlashError::BuffersBusy) => {
                log.flush_ready().unwrap();
            }
            other => {
                let address = other.unwrap();
                log.note_dead(address, EntryRef::object(1, b"dead", &value, 2).encoded_bytes());
            }
        }
    }
    log.flush_ready().unwrap();
    log.clean_segment(SegmentNumber(1), &mut MoveAll(Default::default())).unwrap();
    device.fail_next_frees(1);
    assert!(matches!(log.sync(), Err(FlashError::Io { operation: crate::IoOperation::Free, .. })));
    assert!(device.segments_present().contains(&SegmentNumber(1)));
    assert!(
        matches!(log.segment_stats()[0].state, SegmentState::Freeing { .. }),
        "still counted against the budget"
    );
    assert_eq!(log.reclaim(), Ok(1), "retried");
    assert!(!device.segments_present().contains(&SegmentNumber(1)));
    assert_eq!(log.segment_stats()[0].segment, SegmentNumber(2));
    assert_eq!(
        log.read_segment(SegmentNumber(1)).err(),
        Some(FlashError::SegmentFreed { address: FlashAddress(64 << 10) }),
        "read_segment registers its read like read does"
    );
}

#[test]
fn cleaning_a_segment_that_is_not_closed_is_a_typed_error() {
    let (log, _device) = small_log(1 << 20);
    log.append(&EntryRef::object(1, b"k", b"v", 1)).unwrap();
    assert_eq!(
        log.clean_segment(SegmentNumber(1), &mut MoveAll(Default::default())).err(),
        Some(FlashError::SegmentNotClosed {
            segment: SegmentNumber(1),
            state: Some(SegmentState::Open)
        })
    );
    assert_eq!(
        log.clean_segment(SegmentNumber(9), &mut MoveAll(Default::default())).err(),
        Some(FlashError::SegmentNotClosed { segment: SegmentNumber(9), state: None })
    );
}
