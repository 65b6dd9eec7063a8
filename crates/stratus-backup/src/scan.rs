//! Finding replicas again when a backup starts on existing storage.
//!
//! Both metadata slots of every frame are read and checked (magic, version, CRC32C); the newest
//! valid one is tried first, and its replica is kept only if its data passes the segment
//! certificate and every entry's own checksum (the log crate's validating iterator), and if the
//! segment's header names the same master and segment. Otherwise the older slot is tried (a
//! torn newer write leaves the older synced state). A frame with neither is free. Every
//! discarded slot is reported with its reason.

use std::collections::BTreeMap;

use stratus_log::{Certificate, Entry, SegmentIterator};
use stratus_types::{SegmentId, ServerId};

use crate::format::{Geometry, ReplicaMetadata, METADATA_BLOCK_BYTES};
use crate::io::FrameSlots;
use crate::storage::ReplicaStorage;

/// A replica found on storage.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FoundReplica {
    pub(crate) frame: u32,
    pub(crate) metadata: ReplicaMetadata,
}

/// What a scan found.
#[derive(Debug, Default)]
pub(crate) struct ScanResult {
    pub(crate) replicas: BTreeMap<(ServerId, SegmentId), FoundReplica>,
    pub(crate) frames: Vec<FrameSlots>,
    pub(crate) free_frames: Vec<u32>,
    pub(crate) discarded: Vec<String>,
    /// Frames holding a duplicate of a kept replica: cleared before the backup serves, so the
    /// duplicate cannot reappear after the kept one is freed.
    pub(crate) duplicate_frames: Vec<u32>,
}

/// Checks a replica's bytes: the certificate and every entry verify (through the log crate),
/// and the segment header (when any bytes are certified) names this master and segment.
pub fn validate_replica(
    data: &[u8],
    master_id: ServerId,
    segment_id: SegmentId,
    certificate: Certificate,
) -> Result<(), String> {
    let iterator = SegmentIterator::new(data, &certificate)
        .map_err(|error| format!("data fails the certificate: {error}"))?;
    for (index, entry) in iterator.enumerate() {
        let entry = entry.map_err(|error| format!("entry {index} is corrupt: {error}"))?;
        if index == 0 {
            match entry.entry {
                Entry::SegmentHeader(header)
                    if header.log_id == master_id && header.segment_id == segment_id => {}
                Entry::SegmentHeader(header) => {
                    return Err(format!(
                        "segment header names master {} segment {}, not master {master_id} \
                         segment {segment_id} (a stale frame)",
                        header.log_id, header.segment_id
                    ))
                }
                _ => return Err("the first entry is not a segment header".to_string()),
            }
        }
    }
    Ok(())
}

/// Scans every frame of `storage`.
pub(crate) fn scan(storage: &dyn ReplicaStorage, geometry: Geometry) -> Result<ScanResult, String> {
    let mut result = ScanResult {
        frames: vec![FrameSlots::default(); geometry.frame_count as usize],
        ..ScanResult::default()
    };
    for frame in 0..geometry.frame_count {
        let mut candidates: Vec<(u8, ReplicaMetadata)> = Vec::new();
        for slot in 0..2u8 {
            let mut block = [0u8; METADATA_BLOCK_BYTES];
            storage
                .read_at(geometry.slot_offset(frame, slot), &mut block)
                .map_err(|error| format!("reading frame {frame}: {error}"))?;
            match ReplicaMetadata::decode(&block) {
                Ok(Some(metadata)) => candidates.push((slot, metadata)),
                Ok(None) => {}
                Err(reason) => {
                    result.discarded.push(format!("frame {frame} metadata slot {slot}: {reason}"))
                }
            }
        }
        let sequence = candidates.iter().map(|(_, metadata)| metadata.sequence).max();
        result.frames[frame as usize].sequence = sequence.unwrap_or(0);
        candidates.sort_by_key(|(_, metadata)| std::cmp::Reverse(metadata.sequence));
        let longest = candidates
            .iter()
            .map(|(_, metadata)| metadata.certificate.segment_length)
            .filter(|&length| length <= geometry.segment_bytes)
            .max();
        let mut data = Vec::new();
        if let Some(longest) = longest {
            data = vec![0u8; longest as usize];
            storage
                .read_at(geometry.data_offset(frame), &mut data)
                .map_err(|error| format!("reading frame {frame}: {error}"))?;
        }
        let mut kept = None;
        for (slot, metadata) in candidates {
            let certificate = Certificate {
                segment_length: metadata.certificate.segment_length,
                checksum: metadata.certificate.checksum,
            };
            let outcome = if certificate.segment_length > geometry.segment_bytes {
                Err("the certified length exceeds the frame".to_string())
            } else {
                validate_replica(&data, metadata.master_id, metadata.segment_id, certificate)
            };
            match outcome {
                Ok(()) => {
                    kept = Some((slot, metadata));
                    break;
                }
                Err(reason) => result.discarded.push(format!(
                    "frame {frame} slot {slot} (master {} segment {}, {} bytes): {reason}",
                    metadata.master_id, metadata.segment_id, certificate.segment_length
                )),
            }
        }
        let Some((slot, metadata)) = kept else {
            result.free_frames.push(frame);
            continue;
        };
        result.frames[frame as usize].durable_slot = Some(slot);
        let key = (metadata.master_id, metadata.segment_id);
        let found = FoundReplica { frame, metadata };
        let Some(other) = result.replicas.get(&key).copied() else {
            result.replicas.insert(key, found);
            continue;
        };
        // Two frames hold the same replica: keep the newer epoch, then the longer.
        let rank = |replica: &FoundReplica| {
            (replica.metadata.epoch, replica.metadata.certificate.segment_length)
        };
        let (keep, discard) =
            if rank(&found) > rank(&other) { (found, other) } else { (other, found) };
        result.discarded.push(format!(
            "frame {} duplicates master {} segment {} of frame {}; keeping frame {}",
            discard.frame, key.0, key.1, keep.frame, keep.frame
        ));
        result.replicas.insert(key, keep);
        result.free_frames.push(discard.frame);
        result.duplicate_frames.push(discard.frame);
        result.frames[discard.frame as usize].durable_slot = None;
    }
    // Frames are taken from the end of the list: lowest first.
    result.free_frames.sort_unstable_by(|a, b| b.cmp(a));
    Ok(result)
}
