//! A backup's storage file of arbitrary bytes (what a disk may hold after torn writes, bit rot or
//! another program's scribbles): opening it must either refuse with an error or find replicas,
//! never panic; every replica it then lists must read back and pass the same verification a
//! recovery master applies, or be refused with an error.
//!
//! The input is the file's contents from offset 0 (the rest of the file is zero), laid over a
//! small geometry so that the fuzzer reaches the frames' metadata slots and data quickly.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use stratus_backup::{BackupConfig, BackupService, Durability, MemoryStorage, ReplicaStorage};
use stratus_types::ServerId;

/// One runtime for every input (reads are async).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let mut config = BackupConfig::new(4096);
    config.frame_count = 4;
    config.buffer_count = 2;
    config.durability = Durability::Fsync;
    // The disk jobs run on the runtime: no thread per input.
    config.io_on_runtime = true;
    let capacity = config.geometry().total_bytes();
    let storage = Arc::new(MemoryStorage::new(capacity));
    let length = data.len().min(capacity as usize);
    storage.write_at(0, &data[..length]).expect("within capacity");
    runtime().block_on(async move {
        let Ok((backup, _report)) = BackupService::open(config, storage) else { return };
        for entry in backup.list(ServerId(0)) {
            let Ok(contents) = backup.read(entry.master_id, entry.segment_id).await else {
                continue;
            };
            let certificate = stratus_log::Certificate {
                segment_length: entry.certificate.segment_length,
                checksum: entry.certificate.checksum,
            };
            // What a recovery master checks; an error is fine, a panic is not.
            let _ = stratus_backup::validate_replica(
                &contents.data,
                entry.master_id,
                entry.segment_id,
                certificate,
            );
        }
    });
});
