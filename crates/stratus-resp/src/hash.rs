//! Redis hashes, each stored as one Stratus object (byte layout: docs/design/resp-hash-format.md).
//!
//! A hash object's value starts with [`HASH_MARKER`]; every other value is a Redis string.
//! Fields keep the order they were first set in (as Redis's small hashes do), and a field set
//! again keeps its place. Every hash command reads the object, changes the decoded fields and
//! writes it back conditional on the version read, so concurrent commands on one hash are
//! atomic like Redis's.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};

/// The first bytes of every hash object: 0xFF (no UTF-8 text or decimal number starts with it),
/// "STRHSH", and the format's version, 1. Strings that start with these bytes are refused, so
/// that a value is a hash exactly when it starts with them.
pub const HASH_MARKER: [u8; 8] = [0xFF, b'S', b'T', b'R', b'H', b'S', b'H', 0x01];

/// Bytes of the field count after the marker.
const COUNT_BYTES: usize = 4;
/// Bytes of each length prefix (field name, field value).
const LENGTH_BYTES: usize = 4;

/// Whether `value` is a stored hash (starts with [`HASH_MARKER`]).
pub fn is_hash(value: &[u8]) -> bool {
    value.starts_with(&HASH_MARKER)
}

/// Why stored bytes that start with the marker are not a valid hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptHash(pub String);

impl std::fmt::Display for CorruptHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A decoded hash: its fields in order, with an index from name to position.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hash {
    fields: Vec<(Bytes, Bytes)>,
    positions: HashMap<Bytes, usize>,
}

impl Hash {
    /// An empty hash.
    pub fn new() -> Hash {
        Hash::default()
    }

    /// Decodes a stored hash. `value` must start with the marker; every length is checked
    /// against the bytes present before anything is sliced, and a field named twice, a count
    /// that does not match or bytes after the last field are corruption. Field names and values
    /// share `value`'s memory.
    pub fn decode(value: &Bytes) -> Result<Hash, CorruptHash> {
        let corrupt = |what: &str| CorruptHash(format!("stored hash is corrupt: {what}"));
        if !is_hash(value) {
            return Err(corrupt("no hash marker"));
        }
        let mut offset = HASH_MARKER.len();
        let count = read_u32(value, &mut offset).ok_or_else(|| corrupt("no field count"))?;
        // Each field takes at least its two length prefixes: a count the bytes cannot hold is
        // refused before anything is allocated for it.
        let room = (value.len() - offset) / (2 * LENGTH_BYTES);
        if count as usize > room {
            return Err(corrupt("field count larger than the bytes can hold"));
        }
        let mut hash = Hash {
            fields: Vec::with_capacity(count as usize),
            positions: HashMap::with_capacity(count as usize),
        };
        for _ in 0..count {
            let field = read_bytes(value, &mut offset).ok_or_else(|| corrupt("field name cut"))?;
            let content = read_bytes(value, &mut offset).ok_or_else(|| corrupt("value cut"))?;
            if hash.positions.insert(field.clone(), hash.fields.len()).is_some() {
                return Err(corrupt("a field appears twice"));
            }
            hash.fields.push((field, content));
        }
        if offset != value.len() {
            return Err(corrupt("bytes after the last field"));
        }
        Ok(hash)
    }

    /// The stored form: the marker, the field count, then each field's name and value, each
    /// with a 4-byte little-endian length.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_bytes());
        out.put_slice(&HASH_MARKER);
        out.put_u32_le(self.fields.len() as u32);
        for (field, content) in &self.fields {
            out.put_u32_le(field.len() as u32);
            out.put_slice(field);
            out.put_u32_le(content.len() as u32);
            out.put_slice(content);
        }
        out.freeze()
    }

    /// The length of [`Hash::encode`]'s result.
    pub fn encoded_bytes(&self) -> usize {
        HASH_MARKER.len()
            + COUNT_BYTES
            + self
                .fields
                .iter()
                .map(|(field, content)| 2 * LENGTH_BYTES + field.len() + content.len())
                .sum::<usize>()
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether the hash has no field (Redis then deletes the key).
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The value of `field`.
    pub fn get(&self, field: &[u8]) -> Option<&Bytes> {
        self.positions.get(field).map(|&position| &self.fields[position].1)
    }

    /// Sets `field` to `content`; returns true if the field is new.
    pub fn set(&mut self, field: Bytes, content: Bytes) -> bool {
        match self.positions.get(&field) {
            Some(&position) => {
                self.fields[position].1 = content;
                false
            }
            None => {
                self.positions.insert(field.clone(), self.fields.len());
                self.fields.push((field, content));
                true
            }
        }
    }

    /// Removes every field named in `names` (a name may appear twice); returns how many were
    /// there. The others keep their order. One pass over the hash, whatever the count.
    pub fn remove(&mut self, names: &[Bytes]) -> usize {
        let doomed: std::collections::HashSet<&[u8]> = names
            .iter()
            .map(|name| &name[..])
            .filter(|name| self.positions.contains_key(*name))
            .collect();
        if doomed.is_empty() {
            return 0;
        }
        self.fields.retain(|(field, _)| !doomed.contains(&field[..]));
        self.positions = self
            .fields
            .iter()
            .enumerate()
            .map(|(position, (field, _))| (field.clone(), position))
            .collect();
        doomed.len()
    }

    /// The fields and their values, in order.
    pub fn fields(&self) -> impl Iterator<Item = &(Bytes, Bytes)> {
        self.fields.iter()
    }
}

fn read_u32(value: &[u8], offset: &mut usize) -> Option<u32> {
    let bytes: [u8; 4] = value.get(*offset..*offset + 4)?.try_into().ok()?;
    *offset += 4;
    Some(u32::from_le_bytes(bytes))
}

fn read_bytes(value: &Bytes, offset: &mut usize) -> Option<Bytes> {
    let length = read_u32(value, offset)? as usize;
    let end = offset.checked_add(length)?;
    if end > value.len() {
        return None;
    }
    let bytes = value.slice(*offset..end);
    *offset = end;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn bytes(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    #[test]
    fn the_specification_example_encodes_byte_for_byte() {
        // docs/design/resp-hash-format.md, "Example".
        let mut hash = Hash::new();
        assert!(hash.set(bytes("f"), bytes("v1")));
        assert!(hash.set(bytes("name"), bytes("")));
        let expected: Vec<u8> = [
            &HASH_MARKER[..],
            &[2, 0, 0, 0],
            &[1, 0, 0, 0],
            b"f",
            &[2, 0, 0, 0],
            b"v1",
            &[4, 0, 0, 0],
            b"name",
            &[0, 0, 0, 0],
        ]
        .concat();
        assert_eq!(hash.encode().to_vec(), expected);
        assert_eq!(hash.encoded_bytes(), expected.len());
        assert_eq!(Hash::decode(&Bytes::from(expected)).unwrap(), hash);
    }

    #[test]
    fn fields_keep_their_first_place_and_removal_keeps_the_rest_in_order() {
        let mut hash = Hash::new();
        for name in ["a", "b", "c", "d"] {
            assert!(hash.set(bytes(name), bytes(name)));
        }
        assert!(!hash.set(bytes("b"), bytes("B")), "an existing field is not new");
        assert_eq!(hash.remove(&[bytes("a"), bytes("a"), bytes("nosuch")]), 1);
        assert_eq!(hash.remove(&[bytes("a")]), 0);
        let names: Vec<&[u8]> = hash.fields().map(|(field, _)| &field[..]).collect();
        assert_eq!(names, [&b"b"[..], b"c", b"d"]);
        assert_eq!(hash.get(b"b"), Some(&bytes("B")));
        assert_eq!(hash.get(b"d"), Some(&bytes("d")));
        assert_eq!(hash.len(), 3);
        assert_eq!(Hash::decode(&hash.encode()).unwrap(), hash);
    }

    #[test]
    fn corrupt_hashes_are_refused() {
        let valid = {
            let mut hash = Hash::new();
            hash.set(bytes("field"), bytes("value"));
            hash.encode().to_vec()
        };
        let refused = |bytes: Vec<u8>| Hash::decode(&Bytes::from(bytes)).unwrap_err();
        assert!(refused(b"plain string".to_vec()).0.contains("no hash marker"));
        assert!(refused(HASH_MARKER.to_vec()).0.contains("no field count"));
        // Cut anywhere inside the field: a length runs past the end.
        for cut in HASH_MARKER.len() + 4..valid.len() {
            assert!(Hash::decode(&Bytes::from(valid[..cut].to_vec())).is_err(), "cut at {cut}");
        }
        let mut trailing = valid.clone();
        trailing.push(0);
        assert!(refused(trailing).0.contains("after the last field"));
        let mut huge_count = valid.clone();
        huge_count[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(refused(huge_count).0.contains("count"));
        let mut twice = Hash::new();
        twice.set(bytes("x"), bytes("1"));
        let mut twice = twice.encode().to_vec();
        let field = twice[12..].to_vec();
        twice.extend_from_slice(&field);
        twice[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert!(refused(twice).0.contains("twice"));
    }

    proptest! {
        /// Any sequence of sets and removes gives the same fields as a model (a list of pairs),
        /// and the encoding decodes back to the same hash.
        #[test]
        fn hash_matches_a_list_model(operations in proptest::collection::vec(
            (any::<bool>(), 0u8..6, proptest::collection::vec(any::<u8>(), 0..8)), 0..40)
        ) {
            let mut hash = Hash::new();
            let mut model: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for (set, name, content) in operations {
                let field = vec![b'f', name];
                if set {
                    let new = hash.set(Bytes::from(field.clone()), Bytes::from(content.clone()));
                    match model.iter_mut().find(|(existing, _)| *existing == field) {
                        Some(entry) => { prop_assert!(!new); entry.1 = content; }
                        None => { prop_assert!(new); model.push((field, content)); }
                    }
                } else {
                    let was = model.iter().position(|(existing, _)| *existing == field);
                    prop_assert_eq!(hash.remove(&[Bytes::from(field.clone())]), usize::from(was.is_some()));
                    if let Some(position) = was { model.remove(position); }
                }
            }
            let fields: Vec<(Vec<u8>, Vec<u8>)> =
                hash.fields().map(|(field, content)| (field.to_vec(), content.to_vec())).collect();
            prop_assert_eq!(fields, model);
            prop_assert_eq!(Hash::decode(&hash.encode()).unwrap(), hash);
        }

        /// Decoding arbitrary bytes after the marker never panics, and what decodes re-encodes
        /// to the same bytes (the format has one encoding per hash).
        #[test]
        fn arbitrary_bytes_decode_or_are_refused(tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let stored = Bytes::from([&HASH_MARKER[..], &tail].concat());
            if let Ok(hash) = Hash::decode(&stored) {
                prop_assert_eq!(hash.encode(), stored);
            }
        }
    }
}
