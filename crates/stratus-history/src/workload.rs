//! The mixed workload that history tests drive: reads, blind writes, conditional writes,
//! creates, removes and increments on a few shared keys, one key at a time or several in one
//! multi-operation, chosen from a seeded generator, every call recorded. Shared by the
//! real-process tests, `stratus workload` and the deterministic simulation, so the history they
//! check is the same kind of history.

use bytes::Bytes;
use stratus_client::{IncrementItem, KeyItem, RejectRules, TableId, Version, WriteItem};

use crate::recorder::RecordingClient;

/// SplitMix64: a client's deterministic choices.
#[derive(Clone, Debug)]
pub struct Choices(u64);

impl Choices {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Choices {
        Choices(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

/// The value client `client_id` writes as its `sequence`-th operation: unique per write, and
/// an 8-byte integer so that increments apply to it.
pub fn unique_value(client_id: u32, sequence: u32) -> Bytes {
    Bytes::copy_from_slice(&((i64::from(client_id) << 32) | i64::from(sequence)).to_le_bytes())
}

/// The value client `client_id` writes as item `item` of the multi-operation it issues as its
/// `sequence`-th operation: unique per write (bit 31 set, which no [`unique_value`] has below
/// 2^31 operations), and an 8-byte integer so that increments apply to it.
pub fn unique_item_value(client_id: u32, sequence: u32, item: usize) -> Bytes {
    assert!(sequence < 1 << 27 && item < 16, "operation {sequence} item {item} out of range");
    let low = (1 << 31) | (i64::from(sequence) << 4) | item as i64;
    Bytes::copy_from_slice(&((i64::from(client_id) << 32) | low).to_le_bytes())
}

/// Percent of [`mixed_step`]'s steps that are multi-operations.
pub const MULTI_OPERATION_PERCENT: u64 = 20;

/// Most keys one multi-operation of [`mixed_step`] touches.
pub const MULTI_OPERATION_KEYS_MAX: usize = 3;

/// One step of the mixed workload on the shared keys `keys`: a multi-operation on 2 to
/// [`MULTI_OPERATION_KEYS_MAX`] distinct keys ([`MULTI_OPERATION_PERCENT`] of the steps, when
/// there are two keys or more; see [`multi_operation`]), otherwise one operation on one key
/// (see [`mixed_operation`]). `last_seen[i]` is the version this client last saw of `keys[i]`;
/// it is updated from every item that succeeded. Client `client_id`'s `sequence`-th step.
pub async fn mixed_step(
    client: &RecordingClient,
    table: TableId,
    keys: &[Bytes],
    last_seen: &mut [Version],
    client_id: u32,
    sequence: u32,
    choices: &mut Choices,
) {
    assert_eq!(keys.len(), last_seen.len(), "one last-seen version per key");
    if keys.len() >= 2 && choices.below(100) < MULTI_OPERATION_PERCENT {
        let wanted = 2 + choices.below(MULTI_OPERATION_KEYS_MAX as u64 - 1) as usize;
        let mut chosen: Vec<usize> = Vec::with_capacity(wanted);
        while chosen.len() < wanted.min(keys.len()) {
            let index = choices.below(keys.len() as u64) as usize;
            if !chosen.contains(&index) {
                chosen.push(index);
            }
        }
        let items: Vec<(Bytes, Version)> =
            chosen.iter().map(|&index| (keys[index].clone(), last_seen[index])).collect();
        let seen = multi_operation(client, table, &items, client_id, sequence, choices).await;
        for (&index, seen) in chosen.iter().zip(seen) {
            if let Some(version) = seen {
                last_seen[index] = version;
            }
        }
        return;
    }
    let index = choices.below(keys.len() as u64) as usize;
    let value = unique_value(client_id, sequence);
    let seen = mixed_operation(client, table, &keys[index], value, last_seen[index], choices).await;
    if let Some(version) = seen {
        last_seen[index] = version;
    }
}

/// One multi-operation on `items` (distinct keys, each with the version this client last saw
/// of it), drawn from `choices`: 35 % multi-reads, 25 % multi-writes (each item blind or
/// conditional on its last-seen version, drawn per item), 15 % multi-removes, 25 %
/// multi-increments by -9..=9. Returns, per item, the version it saw or created (0 after a
/// remove) when it succeeded. Client `client_id`'s `sequence`-th operation.
pub async fn multi_operation(
    client: &RecordingClient,
    table: TableId,
    items: &[(Bytes, Version)],
    client_id: u32,
    sequence: u32,
    choices: &mut Choices,
) -> Vec<Option<Version>> {
    let key_item =
        |key: &Bytes| KeyItem { table_id: table, key: key.clone(), rules: RejectRules::NONE };
    match choices.below(100) {
        0..=34 => {
            let reads: Vec<KeyItem> = items.iter().map(|(key, _)| key_item(key)).collect();
            let results = client.multi_read(&reads).await;
            results.into_iter().map(|result| result.ok().map(|(_, version)| version)).collect()
        }
        35..=59 => {
            let mut writes = Vec::with_capacity(items.len());
            for (item, (key, last_seen)) in items.iter().enumerate() {
                let rules = match choices.below(2) {
                    0 => RejectRules::NONE,
                    _ => RejectRules::version_equals(*last_seen),
                };
                let value = unique_item_value(client_id, sequence, item);
                writes.push(WriteItem {
                    table_id: table,
                    key: key.clone(),
                    value,
                    rules,
                    expiry: stratus_client::Expiry::Never,
                });
            }
            client.multi_write(&writes).await.into_iter().map(Result::ok).collect()
        }
        60..=74 => {
            let removes: Vec<KeyItem> = items.iter().map(|(key, _)| key_item(key)).collect();
            let results = client.multi_remove(&removes).await;
            results.into_iter().map(|result| result.ok().map(|_| Version(0))).collect()
        }
        _ => {
            let mut increments = Vec::with_capacity(items.len());
            for (key, _) in items {
                let delta = choices.below(19) as i64 - 9;
                let rules = RejectRules::NONE;
                increments.push(IncrementItem { table_id: table, key: key.clone(), delta, rules });
            }
            let results = client.multi_increment(&increments).await;
            results.into_iter().map(|result| result.ok().map(|(_, version)| version)).collect()
        }
    }
}

/// One operation on `key`, drawn from `choices`: 35 % reads, 20 % blind writes, 10 % writes
/// conditional on `last_seen` (the version this client last saw of the key), 5 % creates,
/// 10 % removes, 20 % increments by -9..=9. Returns the version the operation saw or created
/// (0 after a remove) when it succeeded, for the caller's `last_seen`. Failures are part of the
/// history, never a reason to stop.
pub async fn mixed_operation(
    client: &RecordingClient,
    table: TableId,
    key: &[u8],
    value: Bytes,
    last_seen: Version,
    choices: &mut Choices,
) -> Option<Version> {
    match choices.below(100) {
        0..=34 => client.read(table, key).await.ok().map(|(_, version)| version),
        35..=54 => client.write_with(table, key, value, RejectRules::NONE).await.ok(),
        55..=64 => {
            let rules = RejectRules::version_equals(last_seen);
            client.write_with(table, key, value, rules).await.ok()
        }
        65..=69 => client.write_with(table, key, value, RejectRules::create_only()).await.ok(),
        70..=79 => client.remove(table, key).await.ok().map(|_| Version(0)),
        _ => {
            let delta = choices.below(19) as i64 - 9;
            client.increment(table, key, delta).await.ok().map(|(_, version)| version)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_a_function_of_the_seed_and_stay_in_bounds() {
        let mut first = Choices::new(42);
        let mut second = Choices::new(42);
        for bound in 1..500 {
            let value = first.below(bound);
            assert_eq!(value, second.below(bound));
            assert!(value < bound);
        }
        assert_eq!(Choices::new(1).below(0), 0);
        assert_eq!(unique_value(1, 2).as_ref(), &((1i64 << 32) | 2).to_le_bytes());
    }

    #[test]
    fn item_values_differ_from_each_other_and_from_single_values() {
        let mut seen = std::collections::BTreeSet::new();
        for client in 0..3 {
            for sequence in 0..200 {
                assert!(seen.insert(unique_value(client, sequence)));
                for item in 0..MULTI_OPERATION_KEYS_MAX {
                    assert!(seen.insert(unique_item_value(client, sequence, item)));
                }
            }
        }
    }
}
