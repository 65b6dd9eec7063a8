//! Appenders polling the sealed current buffer (after `BuffersBusy`) race the flusher recycling
//! it. The flusher must neither panic nor hand an appender space in a recycled buffer at an
//! address of the old slot. Bounded by a count of appends, not by time; what they check holds
//! whatever the interleaving.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stratus_flash::io::BackgroundFlusher;
use stratus_flash::{
    CostBenefit, EntryRef, FlashAddress, FlashConfig, FlashDevice, FlashError, FlashLog, Geometry,
    MemoryDevice, SegmentNumber,
};

/// A device whose fdatasync sleeps about as long as a real one, so appenders pile up on
/// `BuffersBusy` while the flusher is between its writers check and its recycle.
#[derive(Debug)]
struct SlowSync(MemoryDevice);

impl FlashDevice for SlowSync {
    fn allocate(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        self.0.allocate(segment)
    }
    fn write_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FlashError> {
        self.0.write_at(segment, offset, bytes)
    }
    fn read_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FlashError> {
        self.0.read_at(segment, offset, out)
    }
    fn sync(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        std::thread::sleep(Duration::from_micros(500));
        self.0.sync(segment)
    }
    fn free(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        self.0.free(segment)
    }
    fn segments(&self) -> Result<Vec<SegmentNumber>, FlashError> {
        self.0.segments()
    }
    fn budget_bytes(&self) -> u64 {
        self.0.budget_bytes()
    }
}

#[test]
fn every_returned_address_reads_back_its_own_entry_while_sync_recycles_buffers() {
    const APPENDERS: u64 = 3;
    const APPENDS_EACH: u64 = 2_000;
    let config = FlashConfig {
        geometry: Geometry::new(64 << 10, 4 << 10).unwrap(),
        flush_buffers: 2,
        log_id: 1,
        cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
        cleaner_reserve_segments: 0,
    };
    let device = MemoryDevice::new(64 << 10, 1 << 40);
    let log = Arc::new(FlashLog::create(Arc::new(SlowSync(device)), config).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (log, stop) = (Arc::clone(&log), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                log.sync().unwrap();
            }
        })
    };
    let appenders: Vec<_> = (0..APPENDERS)
        .map(|thread| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut done: Vec<(FlashAddress, Vec<u8>)> = Vec::new();
                while (done.len() as u64) < APPENDS_EACH {
                    let version = done.len() as u64;
                    let key = format!("t{thread}-{version}").into_bytes();
                    match log.append(&EntryRef::object(1, &key, &[thread as u8; 96], version)) {
                        Ok(address) => done.push((address, key)),
                        Err(FlashError::BuffersBusy) => std::thread::yield_now(),
                        Err(other) => panic!("{other:?}"),
                    }
                }
                done
            })
        })
        .collect();
    let mut all = Vec::new();
    for appender in appenders {
        all.extend(appender.join().expect("an appender panicked"));
    }
    stop.store(true, Ordering::SeqCst);
    syncer.join().expect("the syncing thread (the flusher) panicked");
    log.sync().unwrap();
    let wrong: Vec<_> = all
        .iter()
        .filter(|(address, key)| !matches!(log.read(*address), Ok(entry) if &entry.key == key))
        .collect();
    assert!(wrong.is_empty(), "appends whose address does not hold their entry: {wrong:?}");
}

#[test]
fn the_background_flusher_survives_appenders_polling_busy_buffers_and_stop_reports_no_error() {
    const APPENDERS: u64 = 4;
    const APPENDS_EACH: u64 = 600;
    let device = MemoryDevice::new(8 << 20, 1 << 40);
    let log = Arc::new(FlashLog::create(Arc::new(SlowSync(device)), FlashConfig::new(1)).unwrap());
    let flusher = BackgroundFlusher::spawn(Arc::clone(&log), Duration::from_micros(50));
    let flusher_ended = std::thread::scope(|scope| {
        let appenders: Vec<_> = (0..APPENDERS)
            .map(|thread| {
                let (log, flusher) = (&log, &flusher);
                scope.spawn(move || {
                    let mut appended = 0u64;
                    while appended < APPENDS_EACH {
                        let key = format!("t{thread}-{appended}").into_bytes();
                        match log.append(&EntryRef::object(1, &key, &[1u8; 4000], appended)) {
                            Ok(_) => appended += 1,
                            // Only a running flusher frees buffers: without it, give up.
                            Err(FlashError::BuffersBusy) if flusher.has_ended() => return true,
                            Err(FlashError::BuffersBusy) => std::thread::yield_now(),
                            Err(other) => panic!("{other:?}"),
                        }
                    }
                    false
                })
            })
            .collect();
        appenders.into_iter().any(|appender| appender.join().expect("an appender panicked"))
    });
    assert!(!flusher_ended, "the flusher thread ended while appenders waited for it");
    assert_eq!(flusher.stop(), None);
}
