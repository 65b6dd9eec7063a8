//! Enumeration of a tablet's objects in a stable order, resumable by a cursor.
//!
//! Order: ascending (hash.reverse_bits(), key). Bucket `b` holds exactly the hashes whose low
//! `log2(bucket_count)` bits equal `b`, so the top bits of a reversed hash are those bits
//! reversed: visiting `i = 0..bucket_count` with `b = reverse(i)` visits reversed-hash ranges
//! in ascending order, and sorting within a bucket completes the order. Because an object's
//! (hash, key) never changes, an object present during a whole enumeration is returned exactly
//! once across calls, whatever else is written meanwhile.

use stratus_log::format::decode_object_unverified;
use stratus_log::Reference;
use stratus_types::{key_hash, ExpiresAt, HashRange, TableId, Version};

use crate::{ObjectError, ObjectStore, WallTime};

/// Buckets one call scans at most before returning a cursor, so a call on a sparse table takes
/// bounded time (RAMCloud answers with a partial result the same way).
pub const ENUMERATE_BUCKETS_PER_CALL_MAX: u64 = 16_384;

/// Where the next enumeration call starts: (reversed hash, key after which to continue).
pub type EnumerationCursor = (u64, Option<Vec<u8>>);

/// An object copied out of a bucket, so `emit` runs without the bucket lock.
struct Found {
    reversed_hash: u64,
    key: Vec<u8>,
    value: Vec<u8>,
    version: Version,
    expires_at: Option<ExpiresAt>,
}

impl ObjectStore {
    /// Emits objects of `table` with key hash in `range`, in ascending (reversed hash, key)
    /// order, starting after the cursor `(cursor_reversed_hash, cursor_after_key)`: objects
    /// with reversed hash < `cursor_reversed_hash` are skipped, and with `cursor_after_key =
    /// Some(k)` so are those with reversed hash equal to it and key <= k. Stops once the emitted key + value bytes would pass `bytes_max` (at
    /// least one object is emitted if any remains) or after scanning
    /// [`ENUMERATE_BUCKETS_PER_CALL_MAX`] buckets. Objects expired at `now` are skipped.
    /// Returns the cursor to continue from, or `None` when the range is exhausted; an error
    /// when a value on flash could not be read (nothing of that call is emitted).
    // The signature is the one the master calls; an alias for `emit` would only hide it.
    #[allow(clippy::type_complexity)]
    pub fn enumerate(
        &self,
        table: TableId,
        range: HashRange,
        (cursor_reversed_hash, cursor_after_key): (u64, Option<&[u8]>),
        bytes_max: usize,
        now: WallTime,
        emit: &mut dyn FnMut(&[u8], &[u8], Version, Option<ExpiresAt>),
    ) -> Result<Option<EnumerationCursor>, ObjectError> {
        let bucket_count = self.index.bucket_count();
        let bucket_bits = bucket_count.trailing_zeros();
        // Position i covers reversed hashes whose top `bucket_bits` bits equal i.
        let position_of =
            |reversed: u64| if bucket_bits == 0 { 0 } else { reversed >> (64 - bucket_bits) };
        let first_reversed_of =
            |position: u64| if bucket_bits == 0 { 0 } else { position << (64 - bucket_bits) };
        let bucket_of = |position: u64| {
            if bucket_bits == 0 {
                0
            } else {
                position.reverse_bits() >> (64 - bucket_bits)
            }
        };

        let mut emitted_bytes = 0usize;
        let mut last_emitted: Option<(u64, Vec<u8>)> = None;
        let mut position = position_of(cursor_reversed_hash);
        let mut scanned = 0u64;
        while position < bucket_count {
            if scanned == ENUMERATE_BUCKETS_PER_CALL_MAX {
                return Ok(Some(match last_emitted {
                    Some((reversed, key)) => (reversed, Some(key)),
                    None => (first_reversed_of(position), None),
                }));
            }
            scanned += 1;
            let bucket_index = bucket_of(position);
            debug_assert_eq!(
                first_reversed_of(position).reverse_bits() & (bucket_count - 1),
                bucket_index
            );
            let class_mask = if bucket_bits == 0 { 0 } else { u64::MAX >> (64 - bucket_bits) };
            let in_class = |hash: u64| hash & class_mask == bucket_index;
            let mut found = Vec::new();
            let mut flash_failure = None;
            let epoch = self.log.pin();
            // Every bucket that may hold hashes whose low `bucket_bits` bits are
            // `bucket_index`, whatever the table's size is now (it may resize meanwhile).
            self.index.for_each_in_hash_class(bucket_index, bucket_bits, |reference| {
                let (entry_type, content) = self.log.entry(&epoch, Reference(reference));
                let object = decode_object_unverified(&content).expect("corrupt object in the log");
                if object.table != table || now.has_passed(object.expires_at) {
                    return;
                }
                let hash = key_hash(table, object.key);
                if !range.contains(hash) || !in_class(hash.0) {
                    return;
                }
                let reversed_hash = hash.0.reverse_bits();
                let after_cursor = reversed_hash > cursor_reversed_hash
                    || (reversed_hash == cursor_reversed_hash
                        && cursor_after_key.is_none_or(|after| object.key > after));
                if after_cursor {
                    // The visit holds the bucket's lock, as a value on flash must be read.
                    let value = match self.object_value(Reference(reference), entry_type, &content)
                    {
                        Ok(value) => value.into_owned(),
                        Err(error) => {
                            flash_failure = Some(error);
                            return;
                        }
                    };
                    found.push(Found {
                        reversed_hash,
                        key: object.key.to_vec(),
                        value,
                        version: object.version,
                        expires_at: object.expires_at,
                    });
                }
            });
            drop(epoch);
            if let Some(error) = flash_failure {
                return Err(error);
            }
            found.sort_by(|a, b| (a.reversed_hash, &a.key).cmp(&(b.reversed_hash, &b.key)));
            for object in found {
                let object_bytes = object.key.len() + object.value.len();
                if let Some((reversed, key)) = &last_emitted {
                    if emitted_bytes + object_bytes > bytes_max {
                        return Ok(Some((*reversed, Some(key.clone()))));
                    }
                }
                emit(&object.key, &object.value, object.version, object.expires_at);
                emitted_bytes += object_bytes;
                last_emitted = Some((object.reversed_hash, object.key));
            }
            position += 1;
        }
        Ok(None)
    }
}
