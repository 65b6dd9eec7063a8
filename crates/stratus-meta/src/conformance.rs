//! The behavioural suite every [`MetaStore`] implementation must pass.
//!
//! The coordinator is written against the trait, not an implementation, so each
//! implementation's tests call [`run_all`] with a factory that makes a fresh, empty store. The
//! checks panic (like `assert!`) with a message naming the broken rule. Each check is also
//! public, so a failing one can be run alone.

use crate::{MetaError, MetaOperation, MetaStore, KEY_BYTES_MAX, VALUE_BYTES_MAX};

/// A named check of the suite.
pub type Check<S> = fn(&S);

/// Every check, with its name.
pub fn checks<S: MetaStore>() -> Vec<(&'static str, Check<S>)> {
    vec![
        ("empty_store_is_empty", empty_store_is_empty::<S>),
        ("put_then_get", put_then_get::<S>),
        ("overwrite_replaces", overwrite_replaces::<S>),
        ("delete_removes", delete_removes::<S>),
        ("delete_of_absent_key_is_allowed", delete_of_absent_key_is_allowed::<S>),
        ("scan_is_ascending_by_key", scan_is_ascending_by_key::<S>),
        ("scan_respects_prefix_boundaries", scan_respects_prefix_boundaries::<S>),
        ("batch_applies_in_order", batch_applies_in_order::<S>),
        ("batch_is_atomic_for_readers", batch_is_atomic_for_readers::<S>),
        ("empty_batch_changes_nothing", empty_batch_changes_nothing::<S>),
        ("binary_and_empty_values_round_trip", binary_and_empty_values_round_trip::<S>),
        ("oversized_batches_are_rejected_whole", oversized_batches_are_rejected_whole::<S>),
    ]
}

/// Runs every check, each on a fresh store from `make`.
pub fn run_all<S: MetaStore>(make: &mut dyn FnMut() -> S) {
    for (name, check) in checks::<S>() {
        tracing::debug!(check = name, "metadata store conformance check");
        let store = make();
        check(&store);
    }
}

fn put(key: &str, value: &[u8]) -> MetaOperation {
    MetaOperation::Put { key: key.to_string(), value: value.to_vec() }
}

fn delete(key: &str) -> MetaOperation {
    MetaOperation::Delete { key: key.to_string() }
}

fn apply<S: MetaStore>(store: &S, batch: &[MetaOperation]) {
    if let Err(error) = store.apply(batch) {
        panic!("apply of {} operations failed: {error}", batch.len());
    }
}

fn get<S: MetaStore>(store: &S, key: &str) -> Option<Vec<u8>> {
    store.get(key).unwrap_or_else(|error| panic!("get {key:?} failed: {error}"))
}

fn scan<S: MetaStore>(store: &S, prefix: &str) -> Vec<(String, Vec<u8>)> {
    store.scan_prefix(prefix).unwrap_or_else(|error| panic!("scan {prefix:?} failed: {error}"))
}

fn keys<S: MetaStore>(store: &S, prefix: &str) -> Vec<String> {
    scan(store, prefix).into_iter().map(|(key, _)| key).collect()
}

/// A fresh store has no keys.
pub fn empty_store_is_empty<S: MetaStore>(store: &S) {
    assert_eq!(get(store, "anything"), None, "fresh store has a key");
    assert_eq!(scan(store, ""), Vec::new(), "fresh store scans non-empty");
}

/// A put is visible to get, and to nothing else.
pub fn put_then_get<S: MetaStore>(store: &S) {
    apply(store, &[put("alpha", b"one")]);
    assert_eq!(get(store, "alpha"), Some(b"one".to_vec()));
    assert_eq!(get(store, "alph"), None, "get matched a prefix of the key");
    assert_eq!(get(store, "alphab"), None, "get matched an extension of the key");
}

/// A second put of a key replaces its value.
pub fn overwrite_replaces<S: MetaStore>(store: &S) {
    apply(store, &[put("key", b"first")]);
    apply(store, &[put("key", b"second, longer")]);
    assert_eq!(get(store, "key"), Some(b"second, longer".to_vec()));
    apply(store, &[put("key", b"3")]);
    assert_eq!(get(store, "key"), Some(b"3".to_vec()));
    assert_eq!(scan(store, "").len(), 1, "overwrite created a second entry");
}

/// A delete removes the key from get and scan, and the key can be put again.
pub fn delete_removes<S: MetaStore>(store: &S) {
    apply(store, &[put("a", b"1"), put("b", b"2")]);
    apply(store, &[delete("a")]);
    assert_eq!(get(store, "a"), None);
    assert_eq!(keys(store, ""), vec!["b".to_string()]);
    apply(store, &[put("a", b"again")]);
    assert_eq!(get(store, "a"), Some(b"again".to_vec()));
}

/// Deleting a key that is not there succeeds and changes nothing.
pub fn delete_of_absent_key_is_allowed<S: MetaStore>(store: &S) {
    apply(store, &[put("present", b"x")]);
    apply(store, &[delete("absent")]);
    assert_eq!(scan(store, ""), vec![("present".to_string(), b"x".to_vec())]);
}

/// Scans return keys in ascending byte order of their UTF-8, whatever the insertion order.
pub fn scan_is_ascending_by_key<S: MetaStore>(store: &S) {
    // Inserted out of order; includes keys where byte order differs from "natural" order
    // (upper case before lower case, "10" before "9", multi-byte UTF-8 after ASCII).
    let inserted = ["m", "b", "Z", "table/9", "table/10", "é", "a", "", "table/"];
    for key in inserted {
        apply(store, &[put(key, key.as_bytes())]);
    }
    let mut expected: Vec<String> = inserted.iter().map(|key| key.to_string()).collect();
    expected.sort_by(|left, right| left.as_bytes().cmp(right.as_bytes()));
    let scanned = scan(store, "");
    assert_eq!(scanned.iter().map(|(key, _)| key.clone()).collect::<Vec<_>>(), expected);
    for (key, value) in scanned {
        assert_eq!(value, key.as_bytes(), "scan paired key {key:?} with another key's value");
    }
}

/// A prefix scan returns exactly the keys that start with the prefix: not neighbours just
/// before or after it, and the key equal to the prefix itself.
pub fn scan_respects_prefix_boundaries<S: MetaStore>(store: &S) {
    let all = [
        "serve",
        "server",
        "server/",
        "server/1",
        "server/2",
        "server/2/x",
        "server0",
        "server\u{7f}",
        "server/\u{10ffff}",
        "servex",
        "table/a",
    ];
    for key in all {
        apply(store, &[put(key, b"v")]);
    }
    for prefix in
        ["", "server", "server/", "server/2", "serve", "t", "table/a", "zzz", "server/\u{10ffff}"]
    {
        let mut expected: Vec<String> =
            all.iter().filter(|key| key.starts_with(prefix)).map(|key| key.to_string()).collect();
        expected.sort();
        assert_eq!(keys(store, prefix), expected, "scan of prefix {prefix:?}");
    }
}

/// Operations of a batch apply in order: put then delete of a key leaves it absent, delete then
/// put leaves it present, and the last of several puts wins.
pub fn batch_applies_in_order<S: MetaStore>(store: &S) {
    apply(store, &[put("gone", b"old"), put("back", b"old")]);
    apply(
        store,
        &[
            put("gone", b"new"),
            delete("gone"),
            delete("back"),
            put("back", b"new"),
            put("twice", b"first"),
            put("twice", b"second"),
            put("fresh", b"x"),
            delete("fresh"),
        ],
    );
    assert_eq!(get(store, "gone"), None, "put then delete left the key");
    assert_eq!(get(store, "back"), Some(b"new".to_vec()), "delete then put lost the key");
    assert_eq!(get(store, "twice"), Some(b"second".to_vec()), "last put did not win");
    assert_eq!(get(store, "fresh"), None);
    assert_eq!(keys(store, ""), vec!["back".to_string(), "twice".to_string()]);
}

/// A batch touching many keys is seen whole by readers afterwards.
pub fn batch_is_atomic_for_readers<S: MetaStore>(store: &S) {
    let batch: Vec<MetaOperation> =
        (0..100).map(|index| put(&format!("item/{index:03}"), &[index as u8])).collect();
    apply(store, &batch);
    let scanned = scan(store, "item/");
    assert_eq!(scanned.len(), 100);
    for (index, (key, value)) in scanned.iter().enumerate() {
        assert_eq!(key, &format!("item/{index:03}"));
        assert_eq!(value, &vec![index as u8]);
    }
    let deletes: Vec<MetaOperation> =
        (0..100).map(|index| delete(&format!("item/{index:03}"))).collect();
    apply(store, &deletes);
    assert_eq!(scan(store, "item/"), Vec::new());
}

/// An empty batch succeeds and changes nothing.
pub fn empty_batch_changes_nothing<S: MetaStore>(store: &S) {
    apply(store, &[]);
    assert_eq!(scan(store, ""), Vec::new());
    apply(store, &[put("k", b"v")]);
    apply(store, &[]);
    assert_eq!(scan(store, ""), vec![("k".to_string(), b"v".to_vec())]);
}

/// Values are bytes, not text: every byte value and the empty value survive, as does the empty
/// key.
pub fn binary_and_empty_values_round_trip<S: MetaStore>(store: &S) {
    let every_byte: Vec<u8> = (0..=255u8).collect();
    apply(store, &[put("bytes", &every_byte), put("empty", b""), put("", b"empty key")]);
    assert_eq!(get(store, "bytes"), Some(every_byte));
    assert_eq!(get(store, "empty"), Some(Vec::new()), "empty value read back as absent");
    assert_eq!(get(store, ""), Some(b"empty key".to_vec()));
}

/// A batch with an over-limit key, value or total size fails with `TooLarge` and applies
/// nothing, including its valid operations; limits themselves are allowed.
pub fn oversized_batches_are_rejected_whole<S: MetaStore>(store: &S) {
    apply(store, &[put("keep", b"original")]);
    let long_key = "k".repeat(KEY_BYTES_MAX + 1);
    let result = store.apply(&[put("keep", b"changed"), put(&long_key, b"v")]);
    assert!(
        matches!(result, Err(MetaError::TooLarge { what: "key", .. })),
        "over-long key: {result:?}"
    );
    let result = store.apply(&[put("keep", b"changed"), put("big", &vec![0; VALUE_BYTES_MAX + 1])]);
    assert!(
        matches!(result, Err(MetaError::TooLarge { what: "value", .. })),
        "over-long value: {result:?}"
    );
    // Four maximal values exceed the batch limit only through their encoding overhead.
    let big = vec![7u8; VALUE_BYTES_MAX];
    let batch: Vec<MetaOperation> =
        (0..4).map(|index| put(&format!("big/{index}"), &big)).collect();
    let result = store.apply(&batch);
    assert!(
        matches!(result, Err(MetaError::TooLarge { what: "batch", .. })),
        "over-large batch: {result:?}"
    );
    assert_eq!(get(store, "keep"), Some(b"original".to_vec()), "rejected batch was applied");
    assert_eq!(keys(store, ""), vec!["keep".to_string()], "rejected batch was applied");

    let longest_key = "k".repeat(KEY_BYTES_MAX);
    apply(store, &[put(&longest_key, b"at the limit")]);
    assert_eq!(get(store, &longest_key), Some(b"at the limit".to_vec()));
}
