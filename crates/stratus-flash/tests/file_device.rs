//! The log on real files: append, flush with fdatasync, read back through the device (direct
//! I/O when the file system takes it), restart from the directory, clean and free a segment.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{assert_matches_model, delete, index_from, put, small_config, RacingIndex};
use stratus_flash::{recover, FileDevice, FlashLog};

#[test]
fn a_log_on_files_survives_a_restart_and_cleaning_frees_segment_files() {
    let directory = tempfile::tempdir().unwrap();
    let open = || FileDevice::open(directory.path(), 64 << 10, 64 * (64 << 10)).unwrap();
    let log = FlashLog::create(Arc::new(open()), small_config()).unwrap();
    let (mut index, mut model) = (HashMap::new(), HashMap::new());
    for round in 0..3u64 {
        for number in 0..80u64 {
            let key = format!("k{number}").into_bytes();
            let value = vec![(number + round) as u8; 700];
            put(&log, &mut index, &key, &value, round * 1000 + number + 1).unwrap();
            model.insert(key, value);
        }
    }
    for number in (0..80u64).step_by(3) {
        let key = format!("k{number}").into_bytes();
        delete(&log, &mut index, &key).unwrap();
        model.remove(&key);
    }
    log.sync().unwrap();
    assert_matches_model(&log, &index, &model);
    drop(log);

    let (log, recovery) = recover(Arc::new(open()), small_config()).unwrap();
    assert!(recovery.tears.is_empty());
    let mut index = index_from(&recovery);
    assert_matches_model(&log, &index, &model);

    let segment = log.segments_to_clean()[0];
    let files_before = std::fs::read_dir(directory.path()).unwrap().count();
    let mut next_version = recovery.version_max + 1;
    let mut cleaner_index = RacingIndex {
        log: &log,
        index: &mut index,
        racing: Default::default(),
        locked: Default::default(),
        failing: Default::default(),
        next_version: &mut next_version,
        raced: Vec::new(),
    };
    let outcome = log.clean_segment(segment, &mut cleaner_index).unwrap();
    assert!(!outcome.gave_up_on_lock);
    log.sync().unwrap();
    let segment_file = directory.path().join(format!("{:016x}.segment", segment.0));
    assert!(!segment_file.exists(), "the cleaned segment's file is removed");
    assert!(std::fs::read_dir(directory.path()).unwrap().count() <= files_before);
    assert_matches_model(&log, &index, &model);
}
