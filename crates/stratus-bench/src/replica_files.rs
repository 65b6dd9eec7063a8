//! The physical bound of a recovery: how long reading one replica of every segment of a
//! master's log takes, read the way the backups read it for the recovery, split over the
//! backups in parallel as recovery reads them.
//!
//! Closed replicas are read from the backups' storage files; frames are located through the
//! storage file layout (docs/design/backup-format.md, parsed by `stratus_backup::format`): the
//! newest valid metadata slot of each frame names the master and segment whose replica it
//! holds. Backups started with `--backup-direct-io` read with O_DIRECT, so the bound does too;
//! the others read through the page cache, which holds the replicas they wrote moments before,
//! so the bound reads through it as well (a cold read would bound a recovery that does not
//! happen). A replica a backup listed but has not written to its file (in buffered mode, the
//! crashed master's open head) is in the backup's RAM: the bound copies that many bytes in
//! memory, as the backup serves it from there.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use stratus_backup::format::{
    Geometry, ReplicaMetadata, FILE_HEADER_BLOCK_BYTES, METADATA_SLOTS, METADATA_SLOT_BYTES,
};
use stratus_backup::storage::AlignedBuffer;
use stratus_backup::DIRECT_IO_BLOCK_BYTES;
use stratus_types::{SegmentId, ServerId};

/// How the backups read their storage files, and so how the bound reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMethod {
    /// With O_DIRECT (`--backup-direct-io`): from the disk.
    DirectIo,
    /// Through the page cache, as a backup without `--backup-direct-io` reads.
    PageCache,
}

impl ReadMethod {
    /// The name reported in results.
    pub fn name(self) -> &'static str {
        match self {
            ReadMethod::DirectIo => "o_direct",
            ReadMethod::PageCache => "page_cache",
        }
    }
}

/// What reading a master's replicas took.
#[derive(Clone, Copy, Debug)]
pub struct PhysicalRead {
    /// From the start of the parallel reads to the end of the last one.
    pub elapsed: Duration,
    /// Segment bytes read (each replica's certified length), from files and memory.
    pub segment_bytes_read: u64,
    /// Of those, the bytes copied in memory (replicas only in a backup's RAM).
    pub memory_bytes_read: u64,
    /// Segments read (one replica each).
    pub segments: usize,
    /// How the files were read.
    pub method: ReadMethod,
}

/// Where a backup holds a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Location {
    /// In this frame of its storage file.
    Frame(u32),
    /// In its RAM only (listed by the backup, not in its file).
    Memory,
}

/// A replica a backup holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredReplica {
    /// Index of the backup (of its file) in the list given.
    pub backup: usize,
    /// Where it is.
    pub location: Location,
    /// The segment.
    pub segment_id: SegmentId,
    /// Replica epoch.
    pub epoch: u64,
    /// Certified bytes of the segment.
    pub segment_length: u32,
}

/// Reads one replica of every segment of `master_id`, each backup's share on its own thread,
/// and returns the time the whole read took. `storage_files` holds one file per backup, and
/// `listed` the replicas of `master_id` the backups listed (their `backup` indexes the files).
/// Locating the frames is not timed (recovery learns where replicas are from the backups'
/// listings, which they keep in memory).
pub fn read_master_replicas(
    storage_files: &[PathBuf],
    listed: &[StoredReplica],
    master_id: ServerId,
    method: ReadMethod,
) -> Result<PhysicalRead, String> {
    let mut files = Vec::new();
    let mut replicas = Vec::new();
    for (backup, path) in storage_files.iter().enumerate() {
        let file = open_storage_file(path, method)?;
        let geometry = read_geometry(&file, path)?;
        replicas.extend(find_replicas(&file, path, geometry, master_id, backup)?);
        files.push((file, geometry));
    }
    replicas.extend(only_in_memory(listed, &replicas));
    let reads = assign_reads(&replicas, storage_files.len());
    let segments = reads.iter().map(Vec::len).sum();
    let bytes_where = |memory: bool| -> u64 {
        reads
            .iter()
            .flatten()
            .filter(|replica| (replica.location == Location::Memory) == memory)
            .map(|replica| u64::from(replica.segment_length))
            .sum()
    };
    let memory_bytes_read = bytes_where(true);
    let segment_bytes_read = memory_bytes_read + bytes_where(false);
    let elapsed = timed_parallel_reads(&files, &reads, storage_files, method)?;
    Ok(PhysicalRead { elapsed, segment_bytes_read, memory_bytes_read, segments, method })
}

/// The listed replicas that no frame of their backup's file holds at least as far: those the
/// backup has in RAM only.
fn only_in_memory(listed: &[StoredReplica], on_disk: &[StoredReplica]) -> Vec<StoredReplica> {
    listed
        .iter()
        .filter(|replica| {
            !on_disk.iter().any(|stored| {
                stored.backup == replica.backup
                    && stored.segment_id == replica.segment_id
                    && stored.epoch == replica.epoch
                    && stored.segment_length >= replica.segment_length
            })
        })
        .map(|replica| StoredReplica { location: Location::Memory, ..*replica })
        .collect()
}

/// Each backup's reads on a thread of its own, started together; the time from the start to
/// the end of the last. Buffers are allocated before the clock starts: not part of the read.
fn timed_parallel_reads(
    files: &[(File, Geometry)],
    reads: &[Vec<StoredReplica>],
    paths: &[PathBuf],
    method: ReadMethod,
) -> Result<Duration, String> {
    let start = Barrier::new(files.len() + 1);
    std::thread::scope(|scope| {
        let readers: Vec<_> = files
            .iter()
            .zip(reads)
            .zip(paths)
            .map(|(((file, geometry), replicas), path)| {
                let start = &start;
                scope.spawn(move || {
                    let bytes = geometry.data_area_bytes() as usize;
                    let mut buffer = AlignedBuffer::new(bytes);
                    // What a backup's RAM holds, for the replicas only there.
                    let in_memory = vec![0xa5_u8; bytes];
                    start.wait();
                    for replica in replicas {
                        let length = replica.segment_length as usize;
                        match replica.location {
                            Location::Memory => {
                                buffer.as_mut_slice()[..length]
                                    .copy_from_slice(&in_memory[..length]);
                                std::hint::black_box(buffer.as_slice());
                            }
                            Location::Frame(frame) => {
                                let length = match method {
                                    ReadMethod::DirectIo => round_up_to_block(length),
                                    ReadMethod::PageCache => length,
                                };
                                file.read_exact_at(
                                    &mut buffer.as_mut_slice()[..length],
                                    geometry.data_offset(frame),
                                )
                                .map_err(|error| {
                                    format!("{} frame {frame}: {error}", path.display())
                                })?;
                            }
                        }
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        start.wait();
        let started = Instant::now();
        let mut outcome = Ok(());
        for reader in readers {
            let result = reader.join().unwrap_or_else(|_| Err("a reader panicked".to_string()));
            if outcome.is_ok() {
                outcome = result;
            }
        }
        outcome.map(|()| started.elapsed())
    })
}

/// One replica per segment, chosen as recovery chooses (newest epoch, then longest), and among
/// equally good replicas the one on the backup with the fewest bytes to read so far, so the
/// backups share the work evenly; per backup, its replicas in frame order (sequential reads),
/// those in memory last.
pub fn assign_reads(replicas: &[StoredReplica], backups: usize) -> Vec<Vec<StoredReplica>> {
    let mut best_per_segment: BTreeMap<SegmentId, Vec<StoredReplica>> = BTreeMap::new();
    for replica in replicas {
        let candidates = best_per_segment.entry(replica.segment_id).or_default();
        let rank = |candidate: &StoredReplica| (candidate.epoch, candidate.segment_length);
        match candidates.first().map(rank) {
            Some(best) if rank(replica) < best => {}
            Some(best) if rank(replica) > best => *candidates = vec![*replica],
            _ => candidates.push(*replica),
        }
    }
    // Longest first, so the last, short segments even out the shares (the classic greedy).
    let mut segments: Vec<Vec<StoredReplica>> = best_per_segment.into_values().collect();
    segments.sort_by_key(|candidates| std::cmp::Reverse(candidates[0].segment_length));
    let mut assigned_bytes = vec![0u64; backups];
    let mut reads = vec![Vec::new(); backups];
    for candidates in segments {
        let Some(chosen) = candidates
            .iter()
            .filter(|candidate| candidate.backup < backups)
            .min_by_key(|candidate| (assigned_bytes[candidate.backup], candidate.backup))
        else {
            continue;
        };
        assigned_bytes[chosen.backup] += u64::from(chosen.segment_length);
        reads[chosen.backup].push(*chosen);
    }
    for backup_reads in &mut reads {
        backup_reads.sort_by_key(|replica| replica.location);
    }
    reads
}

fn open_storage_file(path: &Path, method: ReadMethod) -> Result<File, String> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if method == ReadMethod::DirectIo {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path).map_err(|error| format!("{}: {error}", path.display()))
}

fn read_geometry(file: &File, path: &Path) -> Result<Geometry, String> {
    let mut header = AlignedBuffer::new(FILE_HEADER_BLOCK_BYTES as usize);
    file.read_exact_at(header.as_mut_slice(), 0)
        .map_err(|error| format!("{}: reading the header: {error}", path.display()))?;
    Geometry::decode_header(header.as_slice())
        .map_err(|error| format!("{}: {error}", path.display()))?
        .ok_or_else(|| format!("{}: the backup file has no header yet", path.display()))
}

/// The replicas of `master_id` in one storage file: per frame, the valid metadata slot with
/// the highest sequence (a torn or cleared slot is skipped, as a restart would).
fn find_replicas(
    file: &File,
    path: &Path,
    geometry: Geometry,
    master_id: ServerId,
    backup: usize,
) -> Result<Vec<StoredReplica>, String> {
    let slots_bytes = (METADATA_SLOTS * METADATA_SLOT_BYTES) as usize;
    let mut slots = AlignedBuffer::new(slots_bytes);
    let mut found = Vec::new();
    for frame in 0..geometry.frame_count {
        file.read_exact_at(slots.as_mut_slice(), geometry.frame_offset(frame))
            .map_err(|error| format!("{} frame {frame}: {error}", path.display()))?;
        let newest = slots
            .as_slice()
            .chunks(METADATA_SLOT_BYTES as usize)
            .filter_map(|slot| ReplicaMetadata::decode(slot).ok().flatten())
            .max_by_key(|metadata| metadata.sequence);
        if let Some(metadata) = newest.filter(|metadata| metadata.master_id == master_id) {
            found.push(StoredReplica {
                backup,
                location: Location::Frame(frame),
                segment_id: metadata.segment_id,
                epoch: metadata.epoch,
                segment_length: metadata.certificate.segment_length,
            });
        }
    }
    Ok(found)
}

fn round_up_to_block(bytes: usize) -> usize {
    bytes.div_ceil(DIRECT_IO_BLOCK_BYTES) * DIRECT_IO_BLOCK_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_wire::ReplicaCertificate;

    fn replica(backup: usize, frame: u32, segment: u64, epoch: u64, length: u32) -> StoredReplica {
        StoredReplica {
            backup,
            location: Location::Frame(frame),
            segment_id: SegmentId(segment),
            epoch,
            segment_length: length,
        }
    }

    #[test]
    fn each_segment_is_read_once_from_its_best_replica() {
        let replicas = [
            replica(0, 3, 1, 1, 100),
            replica(1, 0, 1, 1, 100),
            // An older epoch and a shorter prefix lose whatever the load.
            replica(0, 4, 2, 1, 100),
            replica(1, 1, 2, 2, 50),
            replica(0, 5, 3, 1, 80),
            replica(1, 2, 3, 1, 90),
        ];
        let reads = assign_reads(&replicas, 2);
        let all: Vec<_> = reads.iter().flatten().copied().collect();
        assert_eq!(all.len(), 3);
        assert!(all.contains(&replica(1, 1, 2, 2, 50)));
        assert!(all.contains(&replica(1, 2, 3, 1, 90)));
        assert!(all.iter().any(|read| read.segment_id == SegmentId(1)));
    }

    #[test]
    fn reads_are_spread_evenly_over_backups_holding_copies() {
        let mut replicas = Vec::new();
        for segment in 0..12u64 {
            for backup in 0..3 {
                replicas.push(replica(backup, segment as u32, segment, 1, 1_000));
            }
        }
        let reads = assign_reads(&replicas, 3);
        assert_eq!(reads.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4, 4]);
        for backup_reads in &reads {
            assert!(backup_reads.windows(2).all(|pair| pair[0].location < pair[1].location));
        }
    }

    #[test]
    fn finds_only_the_masters_replicas_in_a_storage_file() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("replicas");
        let geometry = Geometry { segment_bytes: 8_192, frame_count: 4 };
        let mut bytes = vec![0u8; geometry.total_bytes() as usize];
        bytes[..28].copy_from_slice(&geometry.encode_header());
        let metadata = |master: u64, segment: u64, sequence: u64| ReplicaMetadata {
            sequence,
            master_id: ServerId(master),
            segment_id: SegmentId(segment),
            epoch: 1,
            certificate: ReplicaCertificate { segment_length: 5_000, checksum: 0 },
            closed: true,
            primary: false,
        };
        let mut put_slot = |frame: u32, slot: u8, block: [u8; 56]| {
            let offset = geometry.slot_offset(frame, slot) as usize;
            bytes[offset..offset + 56].copy_from_slice(&block);
        };
        put_slot(0, 0, metadata(7, 1, 1).encode());
        put_slot(1, 0, metadata(8, 1, 1).encode());
        // Frame 2 was reused: the newer slot names another master.
        put_slot(2, 0, metadata(7, 2, 1).encode());
        put_slot(2, 1, metadata(9, 5, 2).encode());
        // Frame 3: the newer slot is torn, the older one counts.
        put_slot(3, 0, metadata(7, 3, 1).encode());
        let mut torn = metadata(7, 4, 2).encode();
        torn[10] ^= 0xff;
        put_slot(3, 1, torn);
        std::fs::write(&path, &bytes).unwrap();

        let file = File::open(&path).unwrap();
        let found =
            find_replicas(&file, &path, read_geometry(&file, &path).unwrap(), ServerId(7), 0)
                .unwrap();
        assert_eq!(found, vec![replica(0, 0, 1, 1, 5_000), replica(0, 3, 3, 1, 5_000)]);

        // The backup also lists the open head (segment 5), which it holds in RAM only, and
        // segment 3, which its file holds.
        let listed = [replica(0, 0, 5, 1, 700), replica(0, 0, 3, 1, 5_000)];
        let read = read_master_replicas(
            std::slice::from_ref(&path),
            &listed,
            ServerId(7),
            ReadMethod::PageCache,
        )
        .unwrap();
        assert_eq!(read.segments, 3);
        assert_eq!((read.segment_bytes_read, read.memory_bytes_read), (10_700, 700));
        assert_eq!(read.method.name(), "page_cache");
    }
}
