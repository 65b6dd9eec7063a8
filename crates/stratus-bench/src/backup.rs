//! `stratus bench backup`: how many objects per second one backup logs through the real RPC
//! path, for several object sizes, against the raw sequential write bandwidth of the same
//! disk measured in the same run (DXRAM's bar: saturate the disk from 512-byte objects up).
//!
//! The benchmark plays several masters: each builds real segments (segment header, then
//! objects, in the log format, with their certificates) and streams them to one backup in
//! appends of about `append_bytes`, opening a replica per segment and closing it when full, as
//! a master's head does. The segments are built before the clock starts: building entries is
//! the masters' work, and on a small machine it would take CPU from the backup under test. The
//! backup keeps few RAM buffers (`--backup-buffers`), so after the first segments its disk, not
//! its memory, sets the pace.
//!
//! The clock stops when every byte is on disk and synced, as the raw reference's does after
//! its final fdatasync: in buffered mode the last write is acknowledged with up to
//! `--backup-buffers` segments still in RAM, so after the last acknowledgement the bench polls
//! the backup's statistics until all the bytes were written, then reads one replica back. The
//! backup's one I/O thread serves that read only after the batch holding the last write and
//! its sync, so its answer means synced (it costs one segment's read from the page cache).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use stratus_env::TcpNetwork;
use stratus_log::format::{encode_object, CertificateBuilder, EntryHeader, SegmentHeader};
use stratus_log::EntryType;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::{SegmentId, ServerId, TableId, Version};
use stratus_wire::{
    BackupServiceStatistics, BackupWriteFlags, ReplicaCertificate, Request, Response, ResponseBody,
    ServiceMask, Status,
};

use crate::cluster::start_local_cluster;
use crate::report::{print_json, Field};

/// `stratus bench backup`.
#[derive(Debug, Args)]
pub struct BackupArguments {
    /// Object sizes (value bytes), comma-separated.
    #[arg(long, default_value = "64,256,512,1024,4096", value_delimiter = ',')]
    pub object_bytes: Vec<usize>,
    /// Bytes logged per object size (held in memory, prepared before the clock starts). A
    /// short run measures mostly its own start: at 256 MiB one size took about 0.2 s.
    #[arg(long, default_value_t = 1 << 30)]
    pub total_bytes: u64,
    /// Durability mode of the backup (buffered or fsync).
    #[arg(long, default_value = "buffered")]
    pub durability: String,
    /// Segment size in MiB.
    #[arg(long, default_value_t = 8)]
    pub segment_mib: u32,
    /// Bytes per BACKUP_WRITE (a master's group-commit batch).
    #[arg(long, default_value_t = 256 << 10)]
    pub append_bytes: usize,
    /// Masters streaming at once.
    #[arg(long, default_value_t = 4)]
    pub masters: u64,
    /// RAM buffers of the backup (few, so the disk is measured, not memory).
    #[arg(long, default_value_t = 4)]
    pub backup_buffers: u32,
}

/// Runs the benchmark.
pub fn run(arguments: BackupArguments) -> Result<(), String> {
    if arguments.durability != "buffered" && arguments.durability != "fsync" {
        return Err(format!("unknown durability mode {:?}", arguments.durability));
    }
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let raw_mb_per_sec = raw_disk_bandwidth(
        directory.path(),
        arguments.total_bytes,
        (arguments.segment_mib as usize) << 20,
    )?;
    let buffers = arguments.backup_buffers.to_string();
    let segment_mib = arguments.segment_mib.to_string();
    let cluster = start_local_cluster(
        &directory.path().join("cluster"),
        1,
        &[
            "--replicas",
            "0",
            "--segment-mib",
            &segment_mib,
            "--durability",
            &arguments.durability,
            "--backup-buffers",
            &buffers,
        ],
        None,
    )?;
    let coordinator = cluster.coordinator.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    println!(
        "{:>11} {:>10} {:>15} {:>11} {:>19} {:>7}",
        "object_size",
        "durability",
        "objects_per_sec",
        "mb_per_sec",
        "raw_disk_mb_per_sec",
        "ratio"
    );
    runtime.block_on(async {
        let pool = Arc::new(ChannelPool::new(
            Arc::new(TcpNetwork),
            RpcConfig { request_timeout: Duration::from_secs(30), ..RpcConfig::default() },
        ));
        let backup = backup_address(&pool, &coordinator).await?;
        // One untimed pass first: the first pass of a fresh backup is slower (its storage
        // file and the page cache are touched for the first time), which would count against
        // whichever size came first. The raw reference's best pattern is warm too.
        if let Some(&first) = arguments.object_bytes.first() {
            stream_timed(&pool, &backup, &arguments, first, 0).await?;
            free_all(&pool, &backup).await?;
        }
        for &object_bytes in &arguments.object_bytes {
            let (objects, bytes, seconds) =
                stream_timed(&pool, &backup, &arguments, object_bytes, 1).await?;
            let objects_per_sec = objects as f64 / seconds;
            let mb_per_sec = bytes as f64 / seconds / 1e6;
            let ratio = mb_per_sec / raw_mb_per_sec;
            println!(
                "{object_bytes:>11} {:>10} {objects_per_sec:>15.0} {mb_per_sec:>11.1} {raw_mb_per_sec:>19.1} {ratio:>7.2}",
                arguments.durability
            );
            print_json(&[
                ("bench", Field::Text("backup".into())),
                ("object_size", Field::Number(object_bytes as f64)),
                ("durability", Field::Text(arguments.durability.clone())),
                ("objects_per_sec", Field::Number(objects_per_sec)),
                ("mb_per_sec", Field::Number(mb_per_sec)),
                ("raw_disk_mb_per_sec", Field::Number(raw_mb_per_sec)),
                ("ratio", Field::Number(ratio)),
            ]);
            free_all(&pool, &backup).await?;
        }
        Ok::<_, String>(())
    })
}

/// The raw reference: the best of three ways of writing `total_bytes` sequentially into a
/// preallocated file with plain writes of `chunk_bytes` — fdatasync after every chunk, after
/// every 4 chunks, and once at the end. The best is the disk's limit on this machine (on
/// virtual disks the cost of a sync, not the bandwidth, often dominates, so the pattern
/// matters).
fn raw_disk_bandwidth(
    directory: &std::path::Path,
    total_bytes: u64,
    chunk_bytes: usize,
) -> Result<f64, String> {
    let mut best: f64 = 0.0;
    for chunks_per_sync in [1u64, 4, u64::MAX] {
        let path = directory.join("raw-disk-reference");
        let chunk = vec![0xa5u8; chunk_bytes];
        let mut file = std::fs::File::create(&path).map_err(|error| error.to_string())?;
        file.set_len(total_bytes).map_err(|error| error.to_string())?;
        let started = Instant::now();
        let mut written = 0u64;
        let mut chunks = 0u64;
        while written < total_bytes {
            file.write_all(&chunk).map_err(|error| error.to_string())?;
            written += chunk.len() as u64;
            chunks += 1;
            if chunks.is_multiple_of(chunks_per_sync) {
                file.sync_data().map_err(|error| error.to_string())?;
            }
        }
        file.sync_data().map_err(|error| error.to_string())?;
        let seconds = started.elapsed().as_secs_f64();
        drop(file);
        let _ = std::fs::remove_file(&path);
        best = best.max(written as f64 / seconds / 1e6);
    }
    Ok(best)
}

async fn backup_address(pool: &ChannelPool, coordinator: &str) -> Result<String, String> {
    match pool.call_coordinator(coordinator, &Request::GetServerList).await {
        Ok((Status::Ok, ResponseBody::Operation(Response::GetServerList { servers }))) => servers
            .into_iter()
            .find(|server| server.services.0 & ServiceMask::BACKUP != 0)
            .map(|server| server.address)
            .ok_or_else(|| "the cluster has no backup".to_string()),
        other => Err(format!("server list: {other:?}")),
    }
}

/// Prepares every master's stream of `object_bytes` objects, then sends them all at once and
/// returns (objects, bytes, seconds the sending took). `pass` keeps master ids distinct
/// between passes of the same size.
async fn stream_timed(
    pool: &Arc<ChannelPool>,
    backup: &str,
    arguments: &BackupArguments,
    object_bytes: usize,
    pass: u64,
) -> Result<(u64, u64, f64), String> {
    let segment_bytes = (arguments.segment_mib as usize) << 20;
    let share = arguments.total_bytes / arguments.masters;
    // Distinct master ids per size and pass, so replicas of earlier runs do not collide.
    let streams: Vec<(ServerId, PreparedStream)> = (0..arguments.masters)
        .map(|master| {
            let master_id = ServerId(1_000_000 * (pass + 1) + object_bytes as u64 * 100 + master);
            let stream = prepare_stream(
                master_id,
                object_bytes,
                share,
                segment_bytes,
                arguments.append_bytes,
            );
            (master_id, stream)
        })
        .collect();
    let objects: u64 = streams.iter().map(|(_, stream)| stream.objects).sum();
    let bytes: u64 = streams.iter().map(|(_, stream)| stream.bytes).sum();
    let last_replica = streams
        .last()
        .and_then(|(master, stream)| stream.writes.last().map(|write| (*master, write.segment_id)))
        .ok_or("nothing to send")?;
    let written_before = backup_statistics(pool, backup).await?.disk_data_bytes_written;
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for (master_id, stream) in streams {
        let pool = pool.clone();
        let backup = backup.to_string();
        senders.spawn(async move { send_stream(&pool, &backup, master_id, stream.writes).await });
    }
    while let Some(joined) = senders.join_next().await {
        joined.map_err(|error| error.to_string())??;
    }
    wait_until_synced(pool, backup, written_before + bytes, last_replica).await?;
    Ok((objects, bytes, started.elapsed().as_secs_f64()))
}

/// How long the backup may take to write what it holds in RAM once the last write was
/// acknowledged.
const DISK_CATCH_UP_PATIENCE: Duration = Duration::from_secs(120);

/// Waits until the backup wrote `data_bytes` of segment data to its disk in all, then reads
/// `replica` back: the read is queued behind the batch of that last write, whose sync comes
/// first, so its answer means every byte is synced.
async fn wait_until_synced(
    pool: &ChannelPool,
    backup: &str,
    data_bytes: u64,
    (master_id, segment_id): (ServerId, SegmentId),
) -> Result<(), String> {
    let deadline = Instant::now() + DISK_CATCH_UP_PATIENCE;
    loop {
        let statistics = backup_statistics(pool, backup).await?;
        if let Some(failure) = statistics.storage_failure {
            return Err(format!("the backup's storage failed: {failure}"));
        }
        if statistics.disk_data_bytes_written >= data_bytes {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the backup wrote {} of {data_bytes} bytes within {} s of the last write",
                statistics.disk_data_bytes_written,
                DISK_CATCH_UP_PATIENCE.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    match pool.call(backup, &Request::BackupReadReplica { master_id, segment_id }).await {
        Ok((Status::Ok, _)) => Ok(()),
        other => Err(format!("reading replica {segment_id} of {master_id} back: {other:?}")),
    }
}

async fn backup_statistics(
    pool: &ChannelPool,
    backup: &str,
) -> Result<BackupServiceStatistics, String> {
    match pool.call(backup, &Request::BackupGetStatistics).await {
        Ok((Status::Ok, ResponseBody::Operation(Response::BackupGetStatistics { statistics }))) => {
            Ok(statistics)
        }
        other => Err(format!("backup statistics: {other:?}")),
    }
}

/// One BACKUP_WRITE of a prepared stream.
struct PreparedWrite {
    segment_id: SegmentId,
    offset: u32,
    flags: BackupWriteFlags,
    certificate: ReplicaCertificate,
    data: Bytes,
}

/// A master's stream, built before the clock starts: its objects, bytes and writes.
struct PreparedStream {
    objects: u64,
    bytes: u64,
    writes: Vec<PreparedWrite>,
}

/// Builds `share` bytes of objects as segments (header, entries, certificates) and cuts them
/// into the appends a master's head would send: a new append once `append_bytes` accumulated,
/// the last one closing the segment. Building entries and their checksums is the master's
/// work, done as clients write, not the backup's, so it happens before the measurement (on a
/// small machine it would otherwise take CPU from the backup under test).
fn prepare_stream(
    master_id: ServerId,
    object_bytes: usize,
    share: u64,
    segment_bytes: usize,
    append_bytes: usize,
) -> PreparedStream {
    let mut stream = PreparedStream { objects: 0, bytes: 0, writes: Vec::new() };
    let mut segment_id = 1u64;
    let value = vec![0x42u8; object_bytes];
    while stream.bytes < share {
        let mut segment = Vec::with_capacity(segment_bytes);
        let mut certificate = CertificateBuilder::default();
        let header = SegmentHeader {
            log_id: master_id,
            segment_id: SegmentId(segment_id),
            capacity_bytes: segment_bytes as u32,
        }
        .encode();
        append_entry(&mut segment, &mut certificate, EntryType::SegmentHeader, &header);
        // (start, end, flags, certificate) of each append, sliced from the finished segment.
        let mut appends = Vec::new();
        let mut shipped = 0usize;
        loop {
            let key = format!("object-{}", stream.objects);
            let content = encode_object(
                TableId(1),
                Version(stream.objects + 1),
                0,
                None,
                key.as_bytes(),
                &value,
            );
            let full = segment.len() + content.len() + 8 > segment_bytes;
            if !full {
                append_entry(&mut segment, &mut certificate, EntryType::Object, &content);
                stream.objects += 1;
            }
            if segment.len() - shipped >= append_bytes || full {
                let certified = certificate.certificate(segment.len() as u32);
                let flags = BackupWriteFlags { open: shipped == 0, close: full, primary: true };
                let certificate = ReplicaCertificate {
                    segment_length: certified.segment_length,
                    checksum: certified.checksum,
                };
                appends.push((shipped, segment.len(), flags, certificate));
                stream.bytes += (segment.len() - shipped) as u64;
                shipped = segment.len();
            }
            if full {
                break;
            }
        }
        let segment = Bytes::from(segment);
        for (start, end, flags, certificate) in appends {
            stream.writes.push(PreparedWrite {
                segment_id: SegmentId(segment_id),
                offset: start as u32,
                flags,
                certificate,
                data: segment.slice(start..end),
            });
        }
        segment_id += 1;
    }
    stream
}

/// Sends a prepared stream to the backup, one write at a time as a master's head does.
async fn send_stream(
    pool: &ChannelPool,
    backup: &str,
    master_id: ServerId,
    writes: Vec<PreparedWrite>,
) -> Result<(), String> {
    for write in writes {
        let request = Request::BackupWrite {
            master_id,
            segment_id: write.segment_id,
            epoch: 1,
            offset: write.offset,
            flags: write.flags,
            certificate: write.certificate,
            data: write.data,
        };
        write_with_retry(pool, backup, &request).await?;
    }
    Ok(())
}

fn append_entry(
    segment: &mut Vec<u8>,
    certificate: &mut CertificateBuilder,
    entry_type: EntryType,
    content: &[u8],
) {
    let header = EntryHeader::new(entry_type, content.len() as u32);
    certificate.add_header(header.as_bytes());
    segment.extend_from_slice(header.as_bytes());
    segment.extend_from_slice(content);
}

/// A backup out of buffers refuses to open a replica until its disk catches up: wait and
/// try again (bounded), as a master would try another backup.
async fn write_with_retry(
    pool: &ChannelPool,
    backup: &str,
    request: &Request,
) -> Result<(), String> {
    for _attempt in 0..6_000 {
        match pool.call(backup, request).await {
            Ok((Status::Ok, _)) => return Ok(()),
            Ok((Status::BackupOpenRejected, _)) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok((status, body)) => return Err(format!("backup write: {status} {body:?}")),
            Err(error) => return Err(format!("backup write: {error}")),
        }
    }
    Err("the backup refused to open a replica for 30 s".to_string())
}

/// Frees every replica the backup holds, so the next object size starts from an empty backup.
async fn free_all(pool: &ChannelPool, backup: &str) -> Result<(), String> {
    let listed = pool.call(backup, &Request::BackupListReplicas { master_id: ServerId(0) }).await;
    let replicas = match listed {
        Ok((Status::Ok, ResponseBody::Operation(Response::BackupListReplicas { replicas }))) => {
            replicas
        }
        other => return Err(format!("listing replicas: {other:?}")),
    };
    for replica in replicas {
        let request =
            Request::BackupFree { master_id: replica.master_id, segment_id: replica.segment_id };
        pool.call(backup, &request).await.map_err(|error| error.to_string())?;
    }
    Ok(())
}
