//! The mixed workload that history tests drive: reads, blind writes, conditional writes,
//! creates, removes and increments on a few shared keys, chosen from a seeded generator, every
//! call recorded. Shared by the real-process tests, `stratus workload` and the deterministic
//! simulation, so the history they check is the same kind of history.

use bytes::Bytes;
use stratus_client::{RejectRules, TableId, Version};

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
}
