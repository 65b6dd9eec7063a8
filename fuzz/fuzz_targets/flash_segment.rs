//! The flash log's segment files after bit rot, torn writes or another program's scribbles:
//! restarting on them must either refuse with an error or rebuild an index, never panic; every
//! object the restart lists must then read back as the entry it says it is (same table, key and
//! version), or fail with an error.
//!
//! The fuzzer's bytes are patches to a valid image (segments written by a real log): each three
//! bytes flip the bits of one byte (a 16-bit offset into the image, then the bits to flip), and
//! a last lone byte, if any, cuts the image short. Random bytes alone would almost never carry
//! a segment header with a valid checksum, so the decoders behind it would go untested.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use stratus_flash::aligned::AlignedBuffer;
use stratus_flash::{
    recover, CostBenefit, EntryRef, FlashConfig, FlashDevice, FlashError, FlashLog, Geometry,
    MemoryDevice, SegmentNumber,
};

/// Appends `entry`, flushing while every buffer is busy.
fn append(log: &FlashLog, entry: &EntryRef<'_>) -> stratus_flash::FlashAddress {
    loop {
        match log.append(entry) {
            Ok(address) => return address,
            Err(FlashError::BuffersBusy) => {
                log.flush_ready().expect("a flush");
            }
            Err(other) => panic!("building the base image: {other:?}"),
        }
    }
}

const SEGMENT_BYTES: usize = 16 << 10;
const SEGMENTS: usize = 3;

fn config() -> FlashConfig {
    FlashConfig {
        geometry: Geometry::new(SEGMENT_BYTES, 4 << 10).expect("a valid geometry"),
        flush_buffers: 2,
        log_id: 0xF1A5,
        cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
        cleaner_reserve_segments: 1,
    }
}

/// Segments 1..=SEGMENTS of a log holding objects, overwrites and a tombstone, end to end.
fn base_image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let device = MemoryDevice::new(SEGMENT_BYTES as u64, SEGMENT_BYTES as u64 * 16);
        let log = FlashLog::create(Arc::new(device.clone()), config()).expect("a log");
        let mut killed = None;
        for version in 1..=60u64 {
            let key = format!("key-{}", version % 9);
            let value = vec![version as u8; (version as usize * 37) % 900];
            let address = append(&log, &EntryRef::object(7, key.as_bytes(), &value, version));
            if version == 5 {
                killed = Some((key, address));
            }
        }
        if let Some((key, address)) = killed {
            append(&log, &EntryRef::tombstone(7, key.as_bytes(), 61, address));
        }
        log.sync().expect("a sync");
        // The device takes only aligned I/O (as O_DIRECT does): whole segments, aligned memory.
        let mut image = Vec::with_capacity(SEGMENT_BYTES * SEGMENTS);
        let mut segment = AlignedBuffer::zeroed(SEGMENT_BYTES);
        for index in 0..SEGMENTS {
            let number = SegmentNumber(index as u64 + 1);
            segment.as_mut_slice().fill(0);
            let _ = device.read_at(number, 0, segment.as_mut_slice());
            image.extend_from_slice(segment.as_slice());
        }
        image
    })
}

fuzz_target!(|data: &[u8]| {
    let mut image = base_image().to_vec();
    for patch in data.chunks_exact(3) {
        let offset = usize::from(u16::from_le_bytes([patch[0], patch[1]])) % image.len();
        image[offset] ^= patch[2];
    }
    if data.len() % 3 == 1 {
        let cut = usize::from(data[data.len() - 1]) * 256;
        image.truncate(cut.min(image.len()));
    }
    let device = MemoryDevice::new(SEGMENT_BYTES as u64, SEGMENT_BYTES as u64 * 16);
    // Whole aligned blocks (the device takes nothing else); a cut image's tail reads as zeros.
    let mut block = AlignedBuffer::zeroed(SEGMENT_BYTES);
    for (index, segment) in image.chunks(SEGMENT_BYTES).enumerate() {
        let number = SegmentNumber(index as u64 + 1);
        block.as_mut_slice().fill(0);
        block.as_mut_slice()[..segment.len()].copy_from_slice(segment);
        let written = segment.len().div_ceil(4096) * 4096;
        device.allocate(number).expect("room for the segment");
        if written > 0 {
            device.write_at(number, 0, &block.as_slice()[..written]).expect("a write");
        }
        device.sync(number).expect("a sync");
    }
    let Ok((log, recovery)) = recover(Arc::new(device), config()) else { return };
    for ((table_id, key), object) in &recovery.objects {
        if let Ok(entry) = log.read(object.address) {
            assert_eq!(entry.table_id, *table_id, "{object:?}");
            assert_eq!(&entry.key, key, "{object:?}");
            assert_eq!(entry.version, object.version, "{object:?}");
        }
    }
});
