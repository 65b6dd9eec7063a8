//! Restart: rebuild the index from the flash log. Every segment on the device is read in log
//! order (one segment in memory at a time); for each key the object with the highest version
//! wins, unless a tombstone kills that version or a later one. The live-byte counts are rebuilt
//! from the same walk, and the new head starts in a fresh segment after the highest found
//! (appending never resumes inside an old segment, so its tail needs no repair).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::address::{FlashAddress, Geometry, SegmentNumber, SEGMENT_NUMBER_FIRST};
use crate::aligned::AlignedBuffer;
use crate::device::FlashDevice;
use crate::error::{FlashError, FormatError};
use crate::format::{EntryKind, SegmentHeader};
use crate::log::{FlashConfig, FlashLog};
use crate::scan::{SegmentEntries, SegmentItem, Tear};
use crate::segments::{key_hash, SegmentTable};

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
    key_hash: u64,
}

/// What the walk found of one key besides its best object: every tombstone (version, segment
/// of its dead address) and every object version found dead (version, segment).
#[derive(Default)]
struct KeyHistory {
    tombstones: Vec<(u64, SegmentNumber)>,
    dead_objects: Vec<(u64, SegmentNumber)>,
}

impl KeyHistory {
    fn tombstone_version(&self) -> Option<u64> {
        self.tombstones.iter().map(|&(version, _)| version).max()
    }
}

/// The index and the live-byte counts being rebuilt, one segment at a time.
struct Rebuild {
    geometry: Geometry,
    recovery: Recovery,
    /// Segments whose header verified, in order.
    kept: Vec<SegmentNumber>,
    appended: HashMap<SegmentNumber, u64>,
    dead: HashMap<SegmentNumber, u64>,
    /// Tombstones and dead object versions per key.
    history: HashMap<(u64, Vec<u8>), KeyHistory>,
    tombstones: Vec<TombstoneSeen>,
    /// Where each segment's walk met bytes that do not verify.
    tears: HashMap<SegmentNumber, Vec<FlashAddress>>,
}

impl Rebuild {
    fn note_dead(&mut self, address: FlashAddress, entry_bytes: usize) {
        *self.dead.entry(self.geometry.segment_of(address)).or_insert(0) += entry_bytes as u64;
    }

    /// Walks one segment's verified entries into the index.
    fn add_segment(&mut self, segment: SegmentNumber, bytes: &[u8]) {
        self.kept.push(segment);
        self.recovery.segments += 1;
        let mut walk = SegmentEntries::new(bytes, segment, self.geometry);
        for item in walk.by_ref() {
            *self.appended.entry(segment).or_insert(0) += item.entry_bytes as u64;
            self.add_entry(item);
        }
        let report = walk.into_report();
        self.recovery.entries += report.entries;
        self.recovery.unreadable_bytes += report.unreadable_bytes;
        if !report.tears.is_empty() {
            self.tears.insert(segment, report.tears.iter().map(|tear| tear.address).collect());
        }
        self.recovery.tears.extend(report.tears);
    }

    fn add_entry(&mut self, item: SegmentItem<'_>) {
        let entry = item.entry;
        self.recovery.version_max = self.recovery.version_max.max(entry.version);
        let key = (entry.table_id, entry.key.to_vec());
        if entry.kind == EntryKind::Tombstone {
            let dead_segment = self.geometry.segment_of(entry.dead_address);
            self.history.entry(key).or_default().tombstones.push((entry.version, dead_segment));
            self.tombstones.push(TombstoneSeen {
                address: item.address,
                entry_bytes: item.entry_bytes,
                dead_segment,
                key_hash: key_hash(entry.table_id, entry.key),
            });
            return;
        }
        let found = RecoveredObject {
            address: item.address,
            version: entry.version,
            entry_bytes: item.entry_bytes,
        };
        // Of two copies of one version (the cleaner copied it and the original's segment was
        // not freed yet), the later one wins: it is the one the index pointed at (a copy is
        // always appended after its original), so the one a delete's tombstone may name.
        let loser = match self.recovery.objects.get_mut(&key) {
            None => {
                self.recovery.objects.insert(key, found);
                return;
            }
            Some(best) if best.version > found.version => found,
            Some(best) => std::mem::replace(best, found),
        };
        self.add_dead_object(key, loser);
    }

    fn add_dead_object(&mut self, key: (u64, Vec<u8>), object: RecoveredObject) {
        self.note_dead(object.address, object.entry_bytes);
        let segment = self.geometry.segment_of(object.address);
        self.history.entry(key).or_default().dead_objects.push((object.version, segment));
    }

    /// Applies the tombstones, finds the stale copies, counts the dead entries, and builds the
    /// segment table.
    fn finish(mut self) -> (SegmentTable, Recovery) {
        let objects = std::mem::take(&mut self.recovery.objects);
        let mut live = HashMap::with_capacity(objects.len());
        for (key, object) in objects {
            let killed = self
                .history
                .get(&key)
                .and_then(KeyHistory::tombstone_version)
                .is_some_and(|version| version >= object.version);
            if killed {
                self.add_dead_object(key, object);
            } else {
                live.insert(key, object);
            }
        }
        self.recovery.objects = live;
        // A dead object version stays dead across later restarts only while a tombstone that
        // kills it is on the device. The cleaner keeps a tombstone while the segment its dead
        // address names holds entries; a dead version in any other segment (a stale copy left
        // by cleaning, or one whose tombstone names a copy that never reached the disk) is
        // recorded as a stale key of its segment, which keeps every tombstone of that key.
        let mut stale: HashMap<SegmentNumber, HashSet<u64>> = HashMap::new();
        for ((table_id, key), history) in &self.history {
            if history.dead_objects.is_empty() {
                continue;
            }
            // The highest version a tombstone of this key kills, per segment it names: linear in
            // the key's entries, however often it was overwritten.
            let mut named: HashMap<SegmentNumber, u64> = HashMap::new();
            for &(killed, dead_segment) in &history.tombstones {
                let version = named.entry(dead_segment).or_insert(killed);
                *version = (*version).max(killed);
            }
            for &(version, segment) in &history.dead_objects {
                if named.get(&segment).is_none_or(|&killed| killed < version) {
                    stale.entry(segment).or_default().insert(key_hash(*table_id, key));
                }
            }
        }
        let present: HashSet<SegmentNumber> = self.kept.iter().copied().collect();
        let stale_segments_of = |key_hash: u64, except: SegmentNumber| {
            stale.iter().any(|(&segment, keys)| segment != except && keys.contains(&key_hash))
        };
        // A tombstone that protects nothing (its killed version's segment is gone, and no stale
        // copy of its key remains elsewhere) is dead.
        for tombstone in std::mem::take(&mut self.tombstones) {
            let own_segment = self.geometry.segment_of(tombstone.address);
            if !present.contains(&tombstone.dead_segment)
                && !stale_segments_of(tombstone.key_hash, own_segment)
            {
                self.note_dead(tombstone.address, tombstone.entry_bytes);
            }
        }
        let mut table = SegmentTable::new(self.geometry.segment_bytes());
        for &segment in &self.kept {
            let appended_bytes = self.appended.get(&segment).copied().unwrap_or(0);
            let dead_bytes = self.dead.get(&segment).copied().unwrap_or(0);
            let stale_keys = stale.remove(&segment).unwrap_or_default();
            let tears = self.tears.remove(&segment).unwrap_or_default();
            table.adopt(segment, appended_bytes, dead_bytes, stale_keys, tears);
        }
        (table, self.recovery)
    }
}

/// What a segment's header says about it.
enum HeaderCheck {
    /// This log's, with this geometry: walk it.
    Valid,
    /// Does not verify, in the highest segment, and no entry past it does: torn at the crash;
    /// discard it.
    TornHead(FormatError),
}

/// Checks a segment's header against the log.
fn check_header(
    bytes: &[u8],
    segment: SegmentNumber,
    highest: bool,
    config: &FlashConfig,
) -> Result<HeaderCheck, FlashError> {
    let header = match SegmentHeader::decode(bytes) {
        Ok(header) => header,
        // A torn first write leaves no entry that verifies past the header (the header and the
        // slot's entries are one write). If any does, the header rotted on a segment that may
        // hold acknowledged entries: refuse rather than delete them.
        Err(error)
            if highest && SegmentEntries::new(bytes, segment, config.geometry).next().is_none() =>
        {
            return Ok(HeaderCheck::TornHead(error));
        }
        Err(error) => {
            let address = config.geometry.segment_start(segment);
            return Err(FlashError::Format { address, error });
        }
    };
    if header.log_id != config.log_id || header.segment != segment {
        return Err(FlashError::ForeignSegment { segment });
    }
    if header.geometry != config.geometry {
        return Err(FlashError::GeometryMismatch { segment });
    }
    Ok(HeaderCheck::Valid)
}

/// Opens the log on `device` and rebuilds its index; see the module documentation. A segment
/// header that does not verify is refused (`FlashError::Format`): that is corruption, not a
/// crash, and guessing would lose data. The one exception is the highest segment when nothing
/// past its header verifies either: a crash during its first write, which held nothing
/// acknowledged; it is discarded and reported.
pub fn recover(
    device: Arc<dyn FlashDevice>,
    config: FlashConfig,
) -> Result<(FlashLog, Recovery), FlashError> {
    config.check()?;
    let geometry = config.geometry;
    let segments = device.segments()?;
    let highest = segments.last().copied();
    let mut rebuild = Rebuild {
        geometry,
        recovery: Recovery::default(),
        kept: Vec::new(),
        appended: HashMap::new(),
        dead: HashMap::new(),
        history: HashMap::new(),
        tombstones: Vec::new(),
        tears: HashMap::new(),
    };
    // Every address of a segment and of the one after it (the next head) must fit 64 bits: a
    // number past that is no segment this log could have written.
    let addressable = |segment: SegmentNumber| {
        segment.0.checked_add(2).and_then(|end| end.checked_mul(geometry.segment_bytes())).is_some()
    };
    if let Some(&segment) = segments.iter().find(|&&segment| !addressable(segment)) {
        return Err(FlashError::ForeignSegment { segment });
    }
    let mut buffer = AlignedBuffer::zeroed(geometry.segment_bytes() as usize);
    for &segment in &segments {
        let present = device.read_at(segment, 0, buffer.as_mut_slice())?;
        let bytes = &buffer.as_slice()[..present];
        match check_header(bytes, segment, Some(segment) == highest, &config)? {
            HeaderCheck::Valid => rebuild.add_segment(segment, bytes),
            HeaderCheck::TornHead(error) => {
                rebuild.recovery.discarded_segment = Some((segment, error));
            }
        }
    }
    if let Some((segment, _)) = rebuild.recovery.discarded_segment {
        device.free(segment)?;
    }
    // Numbers are never reused, not even a discarded segment's: addresses stay unique.
    let next = SegmentNumber(highest.map_or(0, |segment| segment.0) + 1).max(SEGMENT_NUMBER_FIRST);
    let (table, recovery) = rebuild.finish();
    Ok((FlashLog::with_table(device, config, table, next), recovery))
}
