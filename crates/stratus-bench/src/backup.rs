//! `stratus bench backup`: how many objects per second one backup logs through the real RPC
//! path, for several object sizes, against the raw sequential write bandwidth of the same
//! disk measured in the same run (DXRAM's bar: saturate the disk from 512-byte objects up).
//!
//! The benchmark plays several masters: each builds real segments (segment header, then
//! objects, in the log format) and streams them to one backup in appends of about
//! `append_bytes`, opening a replica per segment and closing it when full, as a master's head
//! does. The backup keeps few RAM buffers (`--backup-buffers`), so after the first segments
//! its disk, not its memory, sets the pace.

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
    BackupWriteFlags, ReplicaCertificate, Request, Response, ResponseBody, ServiceMask, Status,
};

use crate::cluster::{free_loopback_address, start_stratus};
use crate::report::{print_json, Field};

/// `stratus bench backup`.
#[derive(Debug, Args)]
pub struct BackupArguments {
    /// Object sizes (value bytes), comma-separated.
    #[arg(long, default_value = "64,256,1024,4096", value_delimiter = ',')]
    pub object_bytes: Vec<usize>,
    /// Bytes logged per object size.
    #[arg(long, default_value_t = 256 << 20)]
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
    let coordinator = free_loopback_address()?;
    let directory_text = directory.path().join("cluster").display().to_string();
    let buffers = arguments.backup_buffers.to_string();
    let segment_mib = arguments.segment_mib.to_string();
    let (_cluster, _) = start_stratus(
        &[
            "--coordinator",
            &coordinator,
            "up",
            // The status page's once-a-second sampler would be load the reference does not have.
            "--no-metrics",
            "--dir",
            &directory_text,
            "--servers",
            "1",
            "--replicas",
            "0",
            "--segment-mib",
            &segment_mib,
            "--durability",
            &arguments.durability,
            "--backup-buffers",
            &buffers,
        ],
        "ready",
        Duration::from_secs(60),
    )?;
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
        for &object_bytes in &arguments.object_bytes {
            let started = Instant::now();
            let mut streams = tokio::task::JoinSet::new();
            for master in 0..arguments.masters {
                let pool = pool.clone();
                let backup = backup.clone();
                let share = arguments.total_bytes / arguments.masters;
                let segment_bytes = (arguments.segment_mib as usize) << 20;
                let append_bytes = arguments.append_bytes;
                // Distinct master ids per size, so replicas of earlier sizes do not collide.
                let master_id = ServerId(1_000 + object_bytes as u64 * 100 + master);
                streams.spawn(async move {
                    stream_segments(
                        &pool,
                        &backup,
                        master_id,
                        object_bytes,
                        share,
                        segment_bytes,
                        append_bytes,
                    )
                    .await
                });
            }
            let mut objects = 0u64;
            let mut bytes = 0u64;
            while let Some(joined) = streams.join_next().await {
                let (stream_objects, stream_bytes) =
                    joined.map_err(|error| error.to_string())??;
                objects += stream_objects;
                bytes += stream_bytes;
            }
            let seconds = started.elapsed().as_secs_f64();
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

/// Streams `share` bytes of objects as segments to the backup; returns (objects, bytes).
async fn stream_segments(
    pool: &ChannelPool,
    backup: &str,
    master_id: ServerId,
    object_bytes: usize,
    share: u64,
    segment_bytes: usize,
    append_bytes: usize,
) -> Result<(u64, u64), String> {
    let mut objects = 0u64;
    let mut sent = 0u64;
    let mut segment_id = 1u64;
    let value = vec![0x42u8; object_bytes];
    while sent < share {
        let mut segment = Vec::with_capacity(segment_bytes);
        let mut certificate = CertificateBuilder::default();
        let header = SegmentHeader {
            log_id: master_id,
            segment_id: SegmentId(segment_id),
            capacity_bytes: segment_bytes as u32,
        }
        .encode();
        append_entry(&mut segment, &mut certificate, EntryType::SegmentHeader, &header);
        let mut shipped = 0usize;
        let mut opened = false;
        loop {
            let key = format!("object-{objects}");
            let content =
                encode_object(TableId(1), Version(objects + 1), 0, key.as_bytes(), &value);
            let full = segment.len() + content.len() + 8 > segment_bytes;
            if !full {
                append_entry(&mut segment, &mut certificate, EntryType::Object, &content);
                objects += 1;
            }
            let batch_ready = segment.len() - shipped >= append_bytes;
            if batch_ready || full {
                let certified = certificate.certificate(segment.len() as u32);
                let request = Request::BackupWrite {
                    master_id,
                    segment_id: SegmentId(segment_id),
                    epoch: 1,
                    offset: shipped as u32,
                    flags: BackupWriteFlags { open: !opened, close: full, primary: true },
                    certificate: ReplicaCertificate {
                        segment_length: certified.segment_length,
                        checksum: certified.checksum,
                    },
                    data: Bytes::copy_from_slice(&segment[shipped..]),
                };
                write_with_retry(pool, backup, &request).await?;
                opened = true;
                sent += (segment.len() - shipped) as u64;
                shipped = segment.len();
            }
            if full {
                break;
            }
        }
        segment_id += 1;
    }
    Ok((objects, sent))
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
