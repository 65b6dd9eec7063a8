//! A real crash: a child process applies batches and reports each acknowledged one on stdout;
//! the parent kills it with SIGKILL at an arbitrary moment (mid-append, mid-fsync or
//! mid-compaction), reopens the store and checks that every reported batch is there and that
//! the state is exactly some prefix of the batch sequence.
//!
//! The child is this same test binary, re-run with an environment variable naming the store's
//! directory; without that variable the child "test" does nothing.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use stratus_meta::{FileMetaStore, MetaOperation, MetaStore};

/// Set (to a directory) only in the child process.
const CHILD_DIRECTORY_VARIABLE: &str = "STRATUS_META_CRASH_CHILD_DIRECTORY";

/// The child stops by itself after this many batches, so it cannot run forever if the parent
/// dies without killing it.
const CHILD_BATCHES_MAX: u32 = 20_000;

/// Slots overwritten round-robin with 4 KiB values, so the log outgrows the state and the
/// child compacts every few hundred batches.
const SLOTS: u32 = 16;

/// Batch number `index`: its own key, a slot overwrite and the "last" counter, all in one
/// batch so that atomicity is checked too.
fn batch(index: u32) -> Vec<MetaOperation> {
    vec![
        MetaOperation::Put {
            key: format!("batch/{index:08}"),
            value: index.to_le_bytes().to_vec(),
        },
        MetaOperation::Put { key: format!("slot/{}", index % SLOTS), value: slot_value(index) },
        MetaOperation::Put { key: "last".to_string(), value: index.to_le_bytes().to_vec() },
    ]
}

fn slot_value(index: u32) -> Vec<u8> {
    let mut value = vec![(index % 251) as u8; 4096];
    value[..4].copy_from_slice(&index.to_le_bytes());
    value
}

fn last_applied(store: &FileMetaStore) -> Option<u32> {
    store
        .get("last")
        .expect("get last")
        .map(|bytes| u32::from_le_bytes(bytes.try_into().expect("last is 4 bytes")))
}

/// The child's body: continue the batch sequence where the store left off, printing
/// "applied N" after each batch is acknowledged.
#[test]
fn crash_child() {
    let Some(directory) = std::env::var_os(CHILD_DIRECTORY_VARIABLE) else {
        return;
    };
    let (store, _) = FileMetaStore::open(Path::new(&directory)).expect("child open");
    let first = last_applied(&store).map_or(0, |last| last + 1);
    let mut stdout = std::io::stdout().lock();
    for index in first..first + CHILD_BATCHES_MAX {
        store.apply(&batch(index)).expect("child apply");
        writeln!(stdout, "applied {index}").expect("child stdout");
        stdout.flush().expect("child stdout");
    }
}

/// Checks that the store holds exactly batches 0..=last for some last >= `acknowledged`, with
/// every slot holding its newest write at or before `last`; returns `last`.
fn check_prefix(store: &FileMetaStore, acknowledged: u32) -> u32 {
    let last = last_applied(store).expect("no batch survived");
    assert!(last >= acknowledged, "batch {acknowledged} was acknowledged but only {last} survived");
    // No upper bound beyond that: the child keeps applying (into the pipe buffer) between the
    // parent's last read and the kill, so later batches may legitimately have survived.
    let batches = store.scan_prefix("batch/").expect("scan");
    assert_eq!(batches.len() as u32, last + 1, "batches missing below {last}");
    for (index, (key, value)) in batches.iter().enumerate() {
        assert_eq!(key, &format!("batch/{index:08}"));
        assert_eq!(value, &(index as u32).to_le_bytes().to_vec());
    }
    let slots: BTreeMap<String, Vec<u8>> =
        store.scan_prefix("slot/").expect("scan").into_iter().collect();
    for slot in 0..SLOTS.min(last + 1) {
        // The newest write to this slot at or before `last`.
        let newest = last - ((last + SLOTS - slot) % SLOTS);
        assert_eq!(slots.get(&format!("slot/{slot}")), Some(&slot_value(newest)), "slot {slot}");
    }
    last
}

#[test]
fn killed_process_keeps_every_acknowledged_batch() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let executable = std::env::current_exe().expect("test executable");
    let mut acknowledged_total: Option<u32> = None;
    // Several crashes on the same directory, so recovery from a crash is itself crash-tested;
    // kill points vary so that some land near a compaction.
    for (round, wanted) in [150u32, 437, 311].into_iter().enumerate() {
        let mut child = Command::new(&executable)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIRECTORY_VARIABLE, directory.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let mut acknowledged = None;
        let mut count = 0;
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("read child stdout");
            if let Some(index) = line.strip_prefix("applied ") {
                acknowledged = Some(index.parse::<u32>().expect("batch number"));
                count += 1;
                if count == wanted {
                    break;
                }
            }
        }
        // SIGKILL: no destructors, no flushing, exactly like a crash of the process.
        child.kill().expect("kill child");
        child.wait().expect("reap child");
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        assert_eq!(count, wanted, "round {round}: child stopped early; stderr:\n{stderr}");
        let acknowledged = acknowledged.expect("child acknowledged nothing");
        if let Some(previous) = acknowledged_total {
            assert!(acknowledged > previous, "child did not continue the sequence");
        }
        acknowledged_total = Some(acknowledged);

        let (store, _) = FileMetaStore::open(directory.path()).expect("reopen after kill");
        check_prefix(&store, acknowledged);
    }
}
