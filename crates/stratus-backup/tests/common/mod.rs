//! Helpers shared by the backup's integration tests: real log segments built with the log
//! crate's format functions, and storages that misbehave on purpose.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use stratus_backup::{MemoryStorage, ReplicaStorage, ReplicaWrite};
use stratus_log::format::{
    encode_object, CertificateBuilder, EntryHeader, SegmentHeader, SEGMENT_HEADER_CONTENT_BYTES,
};
use stratus_log::EntryType;
use stratus_types::{SegmentId, ServerId, TableId, Version};
use stratus_wire::{BackupWriteFlags, ReplicaCertificate};

/// A segment of a master's log, built entry by entry as a master would.
#[derive(Clone, Debug)]
pub struct SegmentBuilder {
    pub master_id: ServerId,
    pub segment_id: SegmentId,
    pub bytes: Vec<u8>,
    certificate: CertificateBuilder,
    next_version: u64,
}

impl SegmentBuilder {
    /// A segment holding only its header entry.
    pub fn new(master_id: ServerId, segment_id: SegmentId, capacity_bytes: u32) -> SegmentBuilder {
        let mut builder = SegmentBuilder {
            master_id,
            segment_id,
            bytes: Vec::new(),
            certificate: CertificateBuilder::default(),
            next_version: 1,
        };
        let header = SegmentHeader { log_id: master_id, segment_id, capacity_bytes };
        builder.append_entry(EntryType::SegmentHeader, &header.encode());
        assert_eq!(builder.bytes.len(), 2 + SEGMENT_HEADER_CONTENT_BYTES);
        builder
    }

    fn append_entry(&mut self, entry_type: EntryType, content: &[u8]) {
        let header = EntryHeader::new(entry_type, content.len() as u32);
        self.certificate.add_header(header.as_bytes());
        self.bytes.extend_from_slice(header.as_bytes());
        self.bytes.extend_from_slice(content);
    }

    /// Appends one object with a value of `value_bytes` bytes.
    pub fn append_object(&mut self, key: &[u8], value_bytes: usize) {
        let value: Vec<u8> = (0..value_bytes).map(|index| (index % 251) as u8).collect();
        let content = encode_object(TableId(1), Version(self.next_version), 0, None, key, &value);
        self.next_version += 1;
        self.append_entry(EntryType::Object, &content);
    }

    /// The certificate of everything appended so far.
    pub fn certificate(&self) -> ReplicaCertificate {
        let certificate = self.certificate.certificate(self.bytes.len() as u32);
        ReplicaCertificate {
            segment_length: certificate.segment_length,
            checksum: certificate.checksum,
        }
    }

    pub fn length(&self) -> u32 {
        self.bytes.len() as u32
    }

    /// The write that sends bytes `[from, now)` with the current certificate.
    pub fn write_from(&self, from: u32, flags: BackupWriteFlags) -> ReplicaWrite {
        ReplicaWrite {
            master_id: self.master_id,
            segment_id: self.segment_id,
            epoch: 1,
            offset: from,
            flags,
            certificate: self.certificate(),
            data: Bytes::copy_from_slice(&self.bytes[from as usize..]),
        }
    }
}

pub const OPEN: BackupWriteFlags = BackupWriteFlags { open: true, close: false, primary: false };
pub const APPEND: BackupWriteFlags = BackupWriteFlags { open: false, close: false, primary: false };
pub const CLOSE: BackupWriteFlags = BackupWriteFlags { open: false, close: true, primary: false };
pub const WHOLE: BackupWriteFlags = BackupWriteFlags { open: true, close: true, primary: true };

/// A segment of `objects` objects of 100-byte values.
pub fn segment(master: u64, segment: u64, objects: usize) -> SegmentBuilder {
    let mut builder = SegmentBuilder::new(ServerId(master), SegmentId(segment), 1 << 20);
    for index in 0..objects {
        builder.append_object(format!("key-{master}-{segment}-{index}").as_bytes(), 100);
    }
    builder
}

/// Memory storage whose first `sync` after [`GatedStorage::arm`] blocks until the test lets
/// it go, and says when it started: a deterministic way to make writes pile up behind one sync.
#[derive(Debug)]
pub struct GatedStorage {
    pub inner: MemoryStorage,
    armed: std::sync::atomic::AtomicBool,
    entered: Mutex<Option<mpsc::Sender<()>>>,
    gate: Mutex<Option<mpsc::Receiver<()>>>,
}

impl GatedStorage {
    /// The storage, a receiver told when the first sync starts, and a sender that releases it.
    pub fn new(capacity_bytes: u64) -> (Arc<GatedStorage>, mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (entered_sender, entered_receiver) = mpsc::channel();
        let (gate_sender, gate_receiver) = mpsc::channel();
        let storage = GatedStorage {
            inner: MemoryStorage::new(capacity_bytes),
            armed: std::sync::atomic::AtomicBool::new(false),
            entered: Mutex::new(Some(entered_sender)),
            gate: Mutex::new(Some(gate_receiver)),
        };
        (Arc::new(storage), entered_receiver, gate_sender)
    }

    /// The next sync blocks.
    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl ReplicaStorage for GatedStorage {
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, bytes)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buffer)
    }

    fn sync(&self) -> io::Result<()> {
        if !self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return self.inner.sync();
        }
        if let Some(entered) = self.entered.lock().unwrap().take() {
            let _ = entered.send(());
            if let Some(gate) = self.gate.lock().unwrap().take() {
                let _ = gate.recv_timeout(std::time::Duration::from_secs(30));
            }
        }
        self.inner.sync()
    }
}

/// Memory storage whose syncs fail once `failing` is set (an injected disk error).
#[derive(Debug)]
pub struct FailingStorage {
    pub inner: MemoryStorage,
    pub failing: std::sync::atomic::AtomicBool,
}

impl ReplicaStorage for FailingStorage {
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, bytes)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buffer)
    }

    fn sync(&self) -> io::Result<()> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(io::Error::other("injected fdatasync failure (EIO)"));
        }
        self.inner.sync()
    }
}

/// A disk that can lose power: it remembers which writes were synced, and
/// [`CrashingStorage::image_after_power_loss`] returns what the disk could hold if power failed
/// now — every synced write, and each unsynced write lost, applied whole, or torn (a random
/// subset of its 512-byte sectors applied).
#[derive(Debug)]
pub struct CrashingStorage {
    state: Mutex<CrashingState>,
    capacity_bytes: u64,
}

#[derive(Debug)]
struct CrashingState {
    /// What reads see: every write so far.
    current: Vec<u8>,
    /// What survived the last sync.
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    unsynced: Vec<(usize, Vec<u8>)>,
}

impl CrashingStorage {
    /// A zeroed disk, or one holding `image`.
    pub fn new(capacity_bytes: u64, image: Option<Vec<u8>>) -> CrashingStorage {
        let image = image.unwrap_or_else(|| vec![0u8; capacity_bytes as usize]);
        CrashingStorage {
            state: Mutex::new(CrashingState {
                current: image.clone(),
                durable: image,
                unsynced: Vec::new(),
            }),
            capacity_bytes,
        }
    }

    /// The disk after a power loss now (the running backup is not affected), and how many
    /// unsynced writes there were to lose or tear.
    pub fn image_after_power_loss(&self, mut random: impl FnMut(u64) -> u64) -> (Vec<u8>, usize) {
        let state = self.state.lock().unwrap();
        let mut image = state.durable.clone();
        for (offset, bytes) in &state.unsynced {
            match random(3) {
                0 => {}
                1 => image[*offset..*offset + bytes.len()].copy_from_slice(bytes),
                _ => {
                    for (index, sector) in bytes.chunks(512).enumerate() {
                        if random(2) == 0 {
                            let start = offset + index * 512;
                            image[start..start + sector.len()].copy_from_slice(sector);
                        }
                    }
                }
            }
        }
        (image, state.unsynced.len())
    }
}

impl ReplicaStorage for CrashingStorage {
    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let end = offset as usize + bytes.len();
        if end as u64 > self.capacity_bytes {
            return Err(io::Error::other("write past the end"));
        }
        let mut state = self.state.lock().unwrap();
        state.current[offset as usize..end].copy_from_slice(bytes);
        state.unsynced.push((offset as usize, bytes.to_vec()));
        Ok(())
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        let end = offset as usize + buffer.len();
        if end as u64 > self.capacity_bytes {
            return Err(io::Error::other("read past the end"));
        }
        let state = self.state.lock().unwrap();
        buffer.copy_from_slice(&state.current[offset as usize..end]);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        // A slow disk: the batch's writes stay unsynced for a moment, where a power loss can
        // catch them.
        std::thread::sleep(std::time::Duration::from_millis(1));
        let mut state = self.state.lock().unwrap();
        state.durable = state.current.clone();
        state.unsynced.clear();
        Ok(())
    }
}
