//! Restart: rebuild the index from the flash log. Every segment on the device is read in log
//! order (one segment in memory at a time); for each key the object with the highest version
//! wins, unless a tombstone kills that version or a later one. The live-byte counts are rebuilt
//! from the same walk, and the new head starts in a fresh segment after the highest found
//! (appending never resumes inside an old segment, so its tail needs no repair).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::address::{FlashAddress, SegmentNumber};
use crate::aligned::AlignedBuffer;
use crate::device::FlashDevice;
use crate::error::{FlashError, FormatError};
use crate::format::{EntryKind, SegmentHeader};
use crate::log::{FlashConfig, FlashLog};
use crate::scan::{SegmentEntries, Tear};
use crate::segments::SegmentTable;

/// Where a recovered object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveredObject {
    /// Its address.
    pub address: FlashAddress,
    /// Its version.
    pub version: u64,
    /// Bytes its entry occupies (what `note_dead` takes when it is overwritten).
    pub entry_bytes: usize,
}

/// What a restart found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Every live object, by (table id, key).
    pub objects: HashMap<(u64, Vec<u8>), RecoveredObject>,
    /// The highest version of any entry, object or tombstone: the next write must use a larger
    /// one.
    pub version_max: u64,
    /// Segments read.
    pub segments: usize,
    /// Entries that verified.
    pub entries: u64,
    /// Every place bytes did not verify (torn tails, corruption).
    pub tears: Vec<Tear>,
    /// Bytes not read past a tear.
    pub unreadable_bytes: u64,
    /// The head segment at the crash, discarded because its header never reached the device
    /// whole (nothing in it was ever acknowledged).
    pub discarded_segment: Option<(SegmentNumber, FormatError)>,
}

struct TombstoneSeen {
    address: FlashAddress,
    entry_bytes: usize,
    dead_segment: SegmentNumber,
}

/// Opens the log on `device` and rebuilds its index; see the module documentation. A segment
/// header that does not verify anywhere but in the highest segment is refused
/// (`FlashError::Format`): that is corruption, not a crash, and guessing would lose data.
pub fn recover(
    device: Arc<dyn FlashDevice>,
    config: FlashConfig,
) -> Result<(FlashLog, Recovery), FlashError> {
    let geometry = config.geometry;
    let segments = device.segments()?;
    let mut recovery = Recovery::default();
    let mut appended: BTreeMap<SegmentNumber, u64> = BTreeMap::new();
    let mut dead: HashMap<SegmentNumber, u64> = HashMap::new();
    let mut tombstone_versions: HashMap<(u64, Vec<u8>), u64> = HashMap::new();
    let mut tombstones: Vec<TombstoneSeen> = Vec::new();
    let mut bytes = AlignedBuffer::zeroed(geometry.segment_bytes() as usize);
    let highest = segments.last().copied();
    let mut kept: Vec<SegmentNumber> = Vec::new();
    for &segment in &segments {
        let present = device.read_at(segment, 0, bytes.as_mut_slice())?;
        let bytes = &bytes.as_slice()[..present];
        let header = match SegmentHeader::decode(bytes) {
            Ok(header) => header,
            Err(error) if Some(segment) == highest => {
                recovery.discarded_segment = Some((segment, error));
                break;
            }
            Err(error) => {
                return Err(FlashError::Format { address: geometry.segment_start(segment), error });
            }
        };
        if header.log_id != config.log_id || header.segment != segment {
            return Err(FlashError::ForeignSegment { segment });
        }
        if header.geometry != geometry {
            return Err(FlashError::GeometryMismatch { segment });
        }
        kept.push(segment);
        recovery.segments += 1;
        let mut walk = SegmentEntries::new(bytes, segment, geometry);
        for item in walk.by_ref() {
            let entry = item.entry;
            *appended.entry(segment).or_insert(0) += item.entry_bytes as u64;
            recovery.version_max = recovery.version_max.max(entry.version);
            let key = (entry.table_id, entry.key.to_vec());
            match entry.kind {
                EntryKind::Tombstone => {
                    let version = tombstone_versions.entry(key).or_insert(0);
                    *version = (*version).max(entry.version);
                    tombstones.push(TombstoneSeen {
                        address: item.address,
                        entry_bytes: item.entry_bytes,
                        dead_segment: geometry.segment_of(entry.dead_address),
                    });
                }
                EntryKind::Object => {
                    let found = RecoveredObject {
                        address: item.address,
                        version: entry.version,
                        entry_bytes: item.entry_bytes,
                    };
                    let loser = match recovery.objects.get_mut(&key) {
                        Some(best) if best.version >= found.version => found,
                        Some(best) => std::mem::replace(best, found),
                        None => {
                            recovery.objects.insert(key, found);
                            continue;
                        }
                    };
                    *dead.entry(geometry.segment_of(loser.address)).or_insert(0) +=
                        loser.entry_bytes as u64;
                }
            }
        }
        let report = walk.into_report();
        recovery.entries += report.entries;
        recovery.unreadable_bytes += report.unreadable_bytes;
        recovery.tears.extend(report.tears);
    }
    // Numbers are never reused, not even a discarded segment's: addresses stay unique.
    let next = SegmentNumber(highest.map_or(0, |segment| segment.0) + 1)
        .max(crate::address::SEGMENT_NUMBER_FIRST);
    if let Some((segment, _)) = recovery.discarded_segment {
        device.free(segment)?;
    }
    recovery.objects.retain(|key, object| {
        let killed = tombstone_versions.get(key).is_some_and(|&version| version >= object.version);
        if killed {
            *dead.entry(geometry.segment_of(object.address)).or_insert(0) +=
                object.entry_bytes as u64;
        }
        !killed
    });
    let present: HashSet<SegmentNumber> = kept.iter().copied().collect();
    for tombstone in &tombstones {
        if !present.contains(&tombstone.dead_segment) {
            *dead.entry(geometry.segment_of(tombstone.address)).or_insert(0) +=
                tombstone.entry_bytes as u64;
        }
    }
    let mut table = SegmentTable::new(geometry.segment_bytes());
    for &segment in &kept {
        let appended_bytes = appended.get(&segment).copied().unwrap_or(0);
        table.adopt(segment, appended_bytes, dead.get(&segment).copied().unwrap_or(0));
    }
    Ok((FlashLog::with_table(device, config, table, next), recovery))
}
