//! The physical bound of a recovery: how long reading one replica of every segment of a
//! master's log takes when the backups' storage files are read straight from the disk, split
//! over the backups in parallel as recovery reads them.
//!
//! Frames are located through the storage file layout (docs/design/backup-format.md, parsed by
//! `stratus_backup::format`): the newest valid metadata slot of each frame names the master and
//! segment whose replica it holds. The page cache is bypassed with O_DIRECT where the file
//! system supports it; elsewhere (tmpfs, for one) the file's cached pages are dropped with
//! posix_fadvise(DONTNEED) before it is read, which is as close as an unprivileged process
//! gets. Only replicas on disk count: in buffered durability an open replica (the crashed
//! master's last head) is in the backups' RAM only.

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

/// How the page cache was kept out of the measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheBypass {
    /// The files were opened with O_DIRECT.
    DirectIo,
    /// The files' cached pages were dropped with posix_fadvise(POSIX_FADV_DONTNEED) first.
    DropCachedPages,
}

impl CacheBypass {
    /// The name reported in results.
    pub fn name(self) -> &'static str {
        match self {
            CacheBypass::DirectIo => "o_direct",
            CacheBypass::DropCachedPages => "posix_fadvise_dontneed",
        }
    }
}

/// What reading a master's replicas from disk took.
#[derive(Clone, Copy, Debug)]
pub struct PhysicalRead {
    /// From the start of the parallel reads to the end of the last one.
    pub elapsed: Duration,
    /// Segment bytes read (each replica's certified length).
    pub segment_bytes_read: u64,
    /// Segments read (one replica each).
    pub segments: usize,
    /// How the page cache was bypassed.
    pub cache_bypass: CacheBypass,
}

/// A replica found in a backup's storage file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredReplica {
    /// Index of the backup (of its file) in the list given.
    pub backup: usize,
    /// Frame holding it.
    pub frame: u32,
    /// The segment.
    pub segment_id: SegmentId,
    /// Replica epoch.
    pub epoch: u64,
    /// Certified bytes of the segment in the frame.
    pub segment_length: u32,
}

/// Reads one replica of every segment of `master_id` found in `storage_files` (one per backup)
/// with the page cache bypassed, each backup's share on its own thread; returns the time the
/// whole read took. Locating the frames is not timed (recovery learns where replicas are from
/// the backups' listings, which they keep in memory).
pub fn read_master_replicas(
    storage_files: &[PathBuf],
    master_id: ServerId,
) -> Result<PhysicalRead, String> {
    let cache_bypass = if storage_files.iter().all(|path| supports_direct_io(path)) {
        CacheBypass::DirectIo
    } else {
        CacheBypass::DropCachedPages
    };
    let mut files = Vec::new();
    let mut replicas = Vec::new();
    for (backup, path) in storage_files.iter().enumerate() {
        let file = open_storage_file(path, cache_bypass)?;
        let geometry = read_geometry(&file, path)?;
        replicas.extend(find_replicas(&file, path, geometry, master_id, backup)?);
        files.push((file, geometry));
    }
    let reads = assign_reads(&replicas, storage_files.len());
    let segments = reads.iter().map(Vec::len).sum();
    let segment_bytes_read =
        reads.iter().flatten().map(|replica| u64::from(replica.segment_length)).sum();
    if cache_bypass == CacheBypass::DropCachedPages {
        for ((file, _), path) in files.iter().zip(storage_files) {
            drop_cached_pages(file).map_err(|error| format!("{}: {error}", path.display()))?;
        }
    }
    let start = Barrier::new(files.len() + 1);
    let elapsed = std::thread::scope(|scope| {
        let readers: Vec<_> = files
            .iter()
            .zip(&reads)
            .zip(storage_files)
            .map(|(((file, geometry), replicas), path)| {
                let start = &start;
                scope.spawn(move || {
                    // The buffer is allocated before the clock starts: not part of the disk.
                    let mut buffer = AlignedBuffer::new(geometry.data_area_bytes() as usize);
                    start.wait();
                    for replica in replicas {
                        let length = round_up_to_block(replica.segment_length as usize);
                        file.read_exact_at(
                            &mut buffer.as_mut_slice()[..length],
                            geometry.data_offset(replica.frame),
                        )
                        .map_err(|error| {
                            format!("{} frame {}: {error}", path.display(), replica.frame)
                        })?;
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
    })?;
    Ok(PhysicalRead { elapsed, segment_bytes_read, segments, cache_bypass })
}

/// One replica per segment, chosen as recovery chooses (newest epoch, then longest), and among
/// equally good replicas the one on the backup with the fewest bytes to read so far, so the
/// backups share the work evenly; per backup, its replicas in frame order (sequential reads).
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
        backup_reads.sort_by_key(|replica| replica.frame);
    }
    reads
}

/// True if `path` can be opened and read with O_DIRECT (some file systems refuse the open,
/// others the first read).
fn supports_direct_io(path: &Path) -> bool {
    let Ok(file) = open_storage_file(path, CacheBypass::DirectIo) else { return false };
    let mut block = AlignedBuffer::new(DIRECT_IO_BLOCK_BYTES);
    file.read_exact_at(block.as_mut_slice(), 0).is_ok()
}

fn open_storage_file(path: &Path, cache_bypass: CacheBypass) -> Result<File, String> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if cache_bypass == CacheBypass::DirectIo {
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
                frame,
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

/// Drops the file's pages from the page cache, so the next read comes from the disk.
#[allow(unsafe_code)]
fn drop_cached_pages(file: &File) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the
    // whole call because `file` is borrowed. It is the only way to drop one file's cached pages
    // without privileges, and std has no wrapper for it.
    let status = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if status == 0 {
        Ok(())
    } else {
        Err(format!("posix_fadvise: {}", std::io::Error::from_raw_os_error(status)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_wire::ReplicaCertificate;

    fn replica(backup: usize, frame: u32, segment: u64, epoch: u64, length: u32) -> StoredReplica {
        StoredReplica {
            backup,
            frame,
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
            assert!(backup_reads.windows(2).all(|pair| pair[0].frame < pair[1].frame));
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

        let read = read_master_replicas(std::slice::from_ref(&path), ServerId(7)).unwrap();
        assert_eq!((read.segments, read.segment_bytes_read), (2, 10_000));
    }
}
