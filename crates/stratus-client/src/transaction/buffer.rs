//! What a transaction read and wrote before its commit, and its limits.
//!
//! Invariants:
//! 1. `objects` counts the objects in `reads`, `expected` or `changes` (any of them), and never
//!    exceeds [`TRANSACTION_OBJECTS_MAX`]. `reads` and `expected` never share an object.
//! 2. `bytes` is the sum of the keys of those objects and the values of the buffered writes,
//!    and never exceeds [`TRANSACTION_BYTES_MAX`].
//! 3. A read is recorded once per object: the first read is what the transaction saw, and
//!    its version is what the commit checks.
//! 4. Once `taken` (committed), the buffer refuses everything.
//! 5. An object in `expected` was given a version by the caller (`expect_version`), not read:
//!    its first read moves it to `reads` at the expected version, and marks the transaction
//!    `stale` if the master had another one (versions only grow, so the commit could only
//!    abort; it aborts without asking, and no read value that contradicts the expected version
//!    can ever be part of a committed transaction).

use std::collections::BTreeMap;

use bytes::Bytes;
use stratus_types::limits::{TRANSACTION_BYTES_MAX, TRANSACTION_OBJECTS_MAX};
use stratus_types::{TableId, TxOpKind, Version};
use stratus_wire::Status;

use crate::error::{Error, Result};

/// An object, named by its table and key.
pub(super) type ObjectKey = (TableId, Bytes);

/// A buffered change of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    Write(Bytes),
    Remove,
}

/// What the transaction's first read of an object found.
#[derive(Clone, Debug)]
struct FirstRead {
    /// The value (`None`: absent).
    value: Option<Bytes>,
    /// Its version (0: absent).
    version: Version,
}

/// What a transaction already knows of an object.
#[derive(Debug)]
pub(super) enum Seen {
    /// Its own change, or its first read: the value it sees (`None`: absent).
    Known(Option<Bytes>),
    /// Nothing yet: the object must be read from its master (and there is room for it).
    Unknown,
}

/// An op of the transaction as its commit plans it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PlannedOp {
    pub(super) table_id: TableId,
    pub(super) key: Bytes,
    pub(super) kind: TxOpKind,
    /// The version the transaction read; `None` for an object written without being read
    /// (the commit reads its version first).
    pub(super) version_read: Option<Version>,
    /// A write's value; empty for other kinds.
    pub(super) value: Bytes,
    /// The version read was given by the caller ([`TxBuffer::expect_version`]) and never
    /// compared with the master's: a commit must check it even where a read it made itself
    /// would need no check (a transaction reading one object).
    pub(super) version_given: bool,
}

/// The reads and buffered changes of one transaction (see the invariants above).
#[derive(Debug, Default)]
pub(super) struct TxBuffer {
    reads: BTreeMap<ObjectKey, FirstRead>,
    /// Versions the caller expects of objects not read yet (invariant 5).
    expected: BTreeMap<ObjectKey, Version>,
    changes: BTreeMap<ObjectKey, Change>,
    /// The first object read at another version than the one expected (invariant 5).
    stale: Option<ObjectKey>,
    objects: usize,
    bytes: usize,
    taken: bool,
}

/// The error for a transaction used after its commit started.
fn committed_already() -> Error {
    Error::new(
        Status::InvalidParameter,
        "the transaction was committed already: start another one to go on",
    )
}

impl TxBuffer {
    fn check_open(&self) -> Result<()> {
        if self.taken {
            return Err(committed_already());
        }
        Ok(())
    }

    fn is_known(&self, object: &ObjectKey) -> bool {
        self.reads.contains_key(object)
            || self.expected.contains_key(object)
            || self.changes.contains_key(object)
    }

    /// Checks that the transaction may hold `object` with a buffered value of `value_bytes`
    /// (0 for none), within its limits (invariants 1 and 2); returns its objects and bytes
    /// after.
    fn room_for(&self, object: &ObjectKey, value_bytes: usize) -> Result<(usize, usize)> {
        let new = !self.is_known(object);
        let objects = self.objects + usize::from(new);
        if objects > TRANSACTION_OBJECTS_MAX {
            return Err(Error::new(
                Status::InvalidParameter,
                format!(
                    "a transaction holds at most {TRANSACTION_OBJECTS_MAX} objects \
                     (TRANSACTION_OBJECTS_MAX); this one would hold more"
                ),
            ));
        }
        let replaced = match self.changes.get(object) {
            Some(Change::Write(value)) => value.len(),
            Some(Change::Remove) | None => 0,
        };
        let key_bytes = if new { object.1.len() } else { 0 };
        let bytes = self.bytes - replaced + key_bytes + value_bytes;
        if bytes > TRANSACTION_BYTES_MAX {
            return Err(Error::new(
                Status::InvalidParameter,
                format!(
                    "a transaction holds at most {TRANSACTION_BYTES_MAX} bytes of keys and \
                     buffered values (TRANSACTION_BYTES_MAX); this one would hold {bytes}"
                ),
            ));
        }
        Ok((objects, bytes))
    }

    /// What the transaction sees of `object` without asking its master; [`Seen::Unknown`]
    /// only if there is room to read it.
    pub(super) fn seen(&self, object: &ObjectKey) -> Result<Seen> {
        self.check_open()?;
        if let Some(change) = self.changes.get(object) {
            return Ok(Seen::Known(match change {
                Change::Write(value) => Some(value.clone()),
                Change::Remove => None,
            }));
        }
        if let Some(read) = self.reads.get(object) {
            return Ok(Seen::Known(read.value.clone()));
        }
        self.room_for(object, 0)?;
        Ok(Seen::Unknown)
    }

    /// Records what a read of `object` found, and returns what the transaction sees of it:
    /// another handle's change or first read, if one came meanwhile (invariant 3), else this
    /// read.
    pub(super) fn record_read(
        &mut self,
        object: ObjectKey,
        value: Option<Bytes>,
        version: Version,
    ) -> Result<Option<Bytes>> {
        if let Seen::Known(seen) = self.seen(&object)? {
            return Ok(seen);
        }
        let (objects, bytes) = self.room_for(&object, 0)?;
        let version = match self.expected.remove(&object) {
            Some(expected) => {
                if expected != version && self.stale.is_none() {
                    self.stale = Some(object.clone());
                }
                expected
            }
            None => version,
        };
        self.reads.insert(object, FirstRead { value: value.clone(), version });
        (self.objects, self.bytes) = (objects, bytes);
        Ok(value)
    }

    /// Records that the transaction saw `object` at `version` (0: absent) without reading it
    /// (invariant 5): its commit checks that version, even if the transaction writes the
    /// object. An object read (or expected) already at another version makes the transaction
    /// stale.
    pub(super) fn expect_version(&mut self, object: ObjectKey, version: Version) -> Result<()> {
        self.check_open()?;
        let known = self.reads.get(&object).map(|read| read.version);
        if let Some(seen) = known.or_else(|| self.expected.get(&object).copied()) {
            if seen != version && self.stale.is_none() {
                self.stale = Some(object);
            }
            return Ok(());
        }
        let (objects, bytes) = self.room_for(&object, 0)?;
        self.expected.insert(object, version);
        (self.objects, self.bytes) = (objects, bytes);
        Ok(())
    }

    /// The first object the transaction read at another version than it expected: its commit
    /// can only abort, in a conflict on that object.
    pub(super) fn stale(&self) -> Option<ObjectKey> {
        self.stale.clone()
    }

    /// Buffers a write.
    pub(super) fn write(&mut self, object: ObjectKey, value: Bytes) -> Result<()> {
        self.change(object, Change::Write(value))
    }

    /// Buffers a removal.
    pub(super) fn remove(&mut self, object: ObjectKey) -> Result<()> {
        self.change(object, Change::Remove)
    }

    fn change(&mut self, object: ObjectKey, change: Change) -> Result<()> {
        self.check_open()?;
        let value_bytes = match &change {
            Change::Write(value) => value.len(),
            Change::Remove => 0,
        };
        let (objects, bytes) = self.room_for(&object, value_bytes)?;
        self.changes.insert(object, change);
        (self.objects, self.bytes) = (objects, bytes);
        Ok(())
    }

    /// Ends the transaction's buffering (invariant 4) and plans its ops: one per object,
    /// changed objects with their change and the version read if they were read, the others
    /// as reads.
    pub(super) fn take(&mut self) -> Result<Vec<PlannedOp>> {
        self.check_open()?;
        self.taken = true;
        let reads = std::mem::take(&mut self.reads);
        let expected = std::mem::take(&mut self.expected);
        let changes = std::mem::take(&mut self.changes);
        let mut ops = Vec::with_capacity(self.objects);
        for ((table_id, key), change) in changes.iter() {
            let (kind, value) = match change {
                Change::Write(value) => (TxOpKind::Write, value.clone()),
                Change::Remove => (TxOpKind::Remove, Bytes::new()),
            };
            let object = (*table_id, key.clone());
            let given = expected.get(&object).copied();
            let version_read = reads.get(&object).map(|read| read.version).or(given);
            ops.push(PlannedOp {
                table_id: *table_id,
                key: key.clone(),
                kind,
                version_read,
                value,
                version_given: given.is_some(),
            });
        }
        let unchanged_reads = reads.into_iter().map(|(object, read)| (object, read.version, false));
        let unchanged_given = expected.into_iter().map(|(object, version)| (object, version, true));
        for ((table_id, key), version, version_given) in unchanged_reads.chain(unchanged_given) {
            if !changes.contains_key(&(table_id, key.clone())) {
                ops.push(PlannedOp {
                    table_id,
                    key,
                    kind: TxOpKind::Read,
                    version_read: Some(version),
                    value: Bytes::new(),
                    version_given,
                });
            }
        }
        debug_assert_eq!(ops.len(), self.objects, "invariant 1");
        Ok(ops)
    }
}

/// The value an increment of `current` (an 8-byte little-endian integer, `None` for an
/// absent object: 0) by `delta` gives.
pub(super) fn incremented(current: Option<&[u8]>, delta: i64) -> Result<i64> {
    let current = match current {
        None => 0,
        Some(bytes) => i64::from_le_bytes(bytes.try_into().map_err(|_| {
            Error::new(
                Status::InvalidObject,
                format!("the object is {} bytes long, not an 8-byte integer", bytes.len()),
            )
        })?),
    };
    current.checked_add(delta).ok_or_else(|| {
        Error::new(Status::InvalidObject, format!("{current} + {delta} overflows an i64"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(key: &'static [u8]) -> ObjectKey {
        (TableId(1), Bytes::from_static(key))
    }

    fn value(bytes: &'static [u8]) -> Bytes {
        Bytes::from_static(bytes)
    }

    fn known(buffer: &TxBuffer, key: &'static [u8]) -> Option<Bytes> {
        match buffer.seen(&object(key)).unwrap() {
            Seen::Known(seen) => seen,
            Seen::Unknown => panic!("{key:?} is unknown"),
        }
    }

    #[test]
    fn a_transaction_reads_its_own_writes_and_removals() {
        let mut buffer = TxBuffer::default();
        assert!(matches!(buffer.seen(&object(b"a")).unwrap(), Seen::Unknown));
        buffer.write(object(b"a"), value(b"1")).unwrap();
        assert_eq!(known(&buffer, b"a"), Some(value(b"1")));
        buffer.write(object(b"a"), value(b"2")).unwrap();
        assert_eq!(known(&buffer, b"a"), Some(value(b"2")), "the last write wins");
        buffer.remove(object(b"a")).unwrap();
        assert_eq!(known(&buffer, b"a"), None);
        // Its own write hides what it read, and a read arriving after a write changes nothing.
        buffer.write(object(b"b"), value(b"mine")).unwrap();
        let seen = buffer.record_read(object(b"b"), Some(value(b"theirs")), Version(4)).unwrap();
        assert_eq!(seen, Some(value(b"mine")));
        assert_eq!(buffer.objects, 2);
    }

    #[test]
    fn the_first_read_of_an_object_is_the_one_the_transaction_sees() {
        let mut buffer = TxBuffer::default();
        let first = buffer.record_read(object(b"a"), Some(value(b"old")), Version(3)).unwrap();
        assert_eq!(first, Some(value(b"old")));
        // A second read (another handle's, racing) finds the first one.
        let second = buffer.record_read(object(b"a"), Some(value(b"new")), Version(5)).unwrap();
        assert_eq!(second, Some(value(b"old")));
        assert_eq!(known(&buffer, b"a"), Some(value(b"old")));
        buffer.record_read(object(b"absent"), None, Version::NONEXISTENT).unwrap();
        assert_eq!(known(&buffer, b"absent"), None);
        let ops = buffer.take().unwrap();
        let versions: Vec<_> = ops.iter().map(|op| (op.key.clone(), op.version_read)).collect();
        assert_eq!(
            versions,
            [(value(b"a"), Some(Version(3))), (value(b"absent"), Some(Version::NONEXISTENT))]
        );
    }

    #[test]
    fn the_plan_has_one_op_per_object_with_the_version_read() {
        let mut buffer = TxBuffer::default();
        buffer.record_read(object(b"read"), Some(value(b"x")), Version(7)).unwrap();
        buffer.record_read(object(b"read-then-written"), None, Version::NONEXISTENT).unwrap();
        buffer.write(object(b"read-then-written"), value(b"new")).unwrap();
        buffer.record_read(object(b"read-then-removed"), Some(value(b"y")), Version(2)).unwrap();
        buffer.remove(object(b"read-then-removed")).unwrap();
        buffer.write(object(b"blind"), value(b"z")).unwrap();
        let mut ops = buffer.take().unwrap();
        ops.sort_by(|a, b| a.key.cmp(&b.key));
        let plan: Vec<_> =
            ops.iter().map(|op| (&op.key[..], op.kind, op.version_read, &op.value[..])).collect();
        assert_eq!(
            plan,
            [
                (&b"blind"[..], TxOpKind::Write, None, &b"z"[..]),
                (b"read", TxOpKind::Read, Some(Version(7)), b""),
                (b"read-then-removed", TxOpKind::Remove, Some(Version(2)), b""),
                (b"read-then-written", TxOpKind::Write, Some(Version(0)), b"new"),
            ]
        );
    }

    #[test]
    fn an_expected_version_is_the_version_read_and_a_read_at_another_one_makes_it_stale() {
        let mut buffer = TxBuffer::default();
        buffer.expect_version(object(b"watched"), Version(3)).unwrap();
        buffer.expect_version(object(b"watched-written"), Version(0)).unwrap();
        buffer.write(object(b"watched-written"), value(b"new")).unwrap();
        buffer.expect_version(object(b"read-same"), Version(5)).unwrap();
        assert!(matches!(buffer.seen(&object(b"read-same")).unwrap(), Seen::Unknown));
        buffer.record_read(object(b"read-same"), Some(value(b"x")), Version(5)).unwrap();
        assert_eq!(buffer.objects, 3, "an expected object counts once, read or not");
        assert_eq!(buffer.stale(), None);
        let seen = buffer.record_read(object(b"watched"), Some(value(b"y")), Version(4)).unwrap();
        assert_eq!(seen, Some(value(b"y")));
        assert_eq!(buffer.stale(), Some(object(b"watched")), "version 4 is not the one expected");
        let mut ops = buffer.take().unwrap();
        ops.sort_by(|a, b| a.key.cmp(&b.key));
        let plan: Vec<_> = ops
            .iter()
            .map(|op| (&op.key[..], op.kind, op.version_read, op.version_given))
            .collect();
        assert_eq!(
            plan,
            [
                (&b"read-same"[..], TxOpKind::Read, Some(Version(5)), false),
                (b"watched", TxOpKind::Read, Some(Version(3)), false),
                (b"watched-written", TxOpKind::Write, Some(Version(0)), true),
            ]
        );
        let mut buffer = TxBuffer::default();
        buffer.record_read(object(b"a"), None, Version(0)).unwrap();
        buffer.expect_version(object(b"a"), Version(0)).unwrap();
        assert_eq!(buffer.stale(), None);
        buffer.expect_version(object(b"a"), Version(2)).unwrap();
        assert_eq!(buffer.stale(), Some(object(b"a")), "read at 0, expected at 2");
    }

    #[test]
    fn a_committed_transaction_refuses_everything() {
        let mut buffer = TxBuffer::default();
        buffer.write(object(b"a"), value(b"1")).unwrap();
        buffer.take().unwrap();
        let refused = [
            buffer.take().map(|_| ()),
            buffer.write(object(b"a"), value(b"2")),
            buffer.remove(object(b"a")),
            buffer.seen(&object(b"a")).map(|_| ()),
            buffer.record_read(object(b"b"), None, Version(0)).map(|_| ()),
        ];
        for outcome in refused {
            assert_eq!(outcome.unwrap_err().status, Status::InvalidParameter);
        }
    }

    #[test]
    fn objects_past_the_limit_are_refused_before_anything_is_sent() {
        let mut buffer = TxBuffer::default();
        for index in 0..TRANSACTION_OBJECTS_MAX {
            let key = Bytes::from(format!("k{index}"));
            if index % 2 == 0 {
                buffer.write((TableId(1), key), value(b"v")).unwrap();
            } else {
                buffer.record_read((TableId(1), key), None, Version(0)).unwrap();
            }
        }
        let one_more = object(b"one more");
        assert_eq!(
            buffer.write(one_more.clone(), value(b"v")).unwrap_err().status,
            Status::InvalidParameter
        );
        assert!(buffer.seen(&one_more).is_err(), "no read of a new object either");
        assert!(buffer.record_read(one_more, None, Version(0)).is_err());
        // Objects it holds may still change.
        buffer.write(object(b"k1"), value(b"read, now written")).unwrap();
        buffer.remove(object(b"k0")).unwrap();
        assert_eq!(buffer.take().unwrap().len(), TRANSACTION_OBJECTS_MAX);
    }

    #[test]
    fn bytes_past_the_limit_are_refused_and_replaced_values_are_given_back() {
        let mut buffer = TxBuffer::default();
        let half = Bytes::from(vec![0u8; TRANSACTION_BYTES_MAX / 2]);
        buffer.write(object(b"a"), half.clone()).unwrap();
        // Keys count too: "a" and "b" take two bytes beside the values.
        let error = buffer.write(object(b"b"), half.clone()).unwrap_err();
        assert_eq!(error.status, Status::InvalidParameter);
        assert!(error.message.contains("TRANSACTION_BYTES_MAX"), "{error}");
        buffer.write(object(b"b"), Bytes::from(vec![0u8; TRANSACTION_BYTES_MAX / 2 - 2])).unwrap();
        assert_eq!(buffer.bytes, TRANSACTION_BYTES_MAX);
        // Replacing a value (or removing the object) gives its bytes back.
        buffer.remove(object(b"a")).unwrap();
        assert_eq!(buffer.bytes, TRANSACTION_BYTES_MAX - TRANSACTION_BYTES_MAX / 2);
        buffer.write(object(b"a"), half).unwrap();
        assert!(buffer.record_read(object(b"c"), None, Version(0)).is_err(), "no room for its key");
    }

    #[test]
    fn increments_are_eight_byte_little_endian_sums() {
        assert_eq!(incremented(None, 5).unwrap(), 5, "an absent object counts as 0");
        assert_eq!(incremented(Some(&7i64.to_le_bytes()), -10).unwrap(), -3);
        assert_eq!(incremented(Some(&(-3i64).to_le_bytes()), 3).unwrap(), 0);
        for wrong in [&b""[..], b"1234567", b"123456789"] {
            assert_eq!(incremented(Some(wrong), 1).unwrap_err().status, Status::InvalidObject);
        }
        assert_eq!(
            incremented(Some(&i64::MAX.to_le_bytes()), 1).unwrap_err().status,
            Status::InvalidObject
        );
    }
}
