//! YCSB's generators, bit for bit where YCSB is deterministic: key names, the zipfian and
//! latest request distributions, the operation mix of each core workload, and record fields.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use stratus_env::SplitMix64;

const FNV_OFFSET_BASIS_64: i64 = 0xCBF2_9CE4_8422_2325_u64 as i64;
const FNV_PRIME_64: i64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes of `value` (shifted
/// arithmetically, as Java's `>>`), then `Math.abs` (which leaves `i64::MIN` negative).
pub fn fnv_hash64(mut value: i64) -> i64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = value & 0xff;
        value >>= 8;
        hash ^= octet;
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    hash.wrapping_abs()
}

/// YCSB's `buildKeyName` with insertorder=hashed and zeropadding=1.
pub fn key_name(keynum: u64) -> String {
    format!("user{}", fnv_hash64(keynum as i64))
}

/// Java's `String.hashCode` (the score of a key in the Redis binding's `_indices` set).
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16()
        .fold(0_i32, |hash, unit| hash.wrapping_mul(31).wrapping_add(i32::from(unit)))
}

/// SplitMix64: a small, fast, seedable generator (YCSB uses ThreadLocalRandom), with YCSB's
/// draws on top.
#[derive(Clone, Debug)]
pub struct Random(SplitMix64);

impl Random {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Random {
        Random(SplitMix64::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1_u64 << 53) as f64)
    }

    /// Uniform in [low, high] (inclusive).
    pub fn uniform(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }
}

/// YCSB's zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// `ScrambledZipfianGenerator.ITEM_COUNT`: the ranks drawn before folding onto the key space.
const SCRAMBLED_ITEM_COUNT: i64 = 10_000_000_000;
/// `ScrambledZipfianGenerator.ZETAN`: ζ(10^10, 0.99), precomputed by YCSB.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// ζ(n, θ) = Σ_{i=1..n} 1 / i^θ, continued from `sum` = ζ(start, θ).
pub fn zeta_from(start: i64, n: i64, theta: f64, sum: f64) -> f64 {
    (start..n).fold(sum, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating billion-record synthetic
/// databases"): item `base + 0` is the most popular.
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: i64,
    base: i64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: i64,
}

impl Zipfian {
    /// Over [min, max] with constant `theta`, given ζ(max − min + 1, θ).
    pub fn with_zetan(min: i64, max: i64, theta: f64, zetan: f64) -> Zipfian {
        let items = max - min + 1;
        let zeta2theta = zeta_from(0, 2, theta, 0.0);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Zipfian {
            items,
            base: min,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
            count_for_zeta: items,
        }
    }

    /// Over [min, max] with θ = 0.99 (computes ζ, O(max − min)).
    pub fn new(min: i64, max: i64) -> Zipfian {
        let zetan = zeta_from(0, max - min + 1, ZIPFIAN_CONSTANT, 0.0);
        Zipfian::with_zetan(min, max, ZIPFIAN_CONSTANT, zetan)
    }

    /// `nextLong(itemcount)`: a draw over `item_count` items; a larger count than before
    /// extends ζ incrementally (YCSB does not allow the count to decrease).
    pub fn next_long(&mut self, item_count: i64, random: &mut Random) -> i64 {
        if item_count > self.count_for_zeta {
            self.zetan = zeta_from(self.count_for_zeta, item_count, self.theta, self.zetan);
            self.count_for_zeta = item_count;
            // YCSB recomputes eta with the original item count.
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2theta / self.zetan);
        }
        let u = random.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5_f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (item_count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as i64
    }

    /// `nextValue()`: a draw over the generator's own item count.
    pub fn next_value(&mut self, random: &mut Random) -> i64 {
        self.next_long(self.count_for_zeta, random)
    }
}

/// YCSB's `ScrambledZipfianGenerator` over [min, max]: zipfian ranks over 10^10 items, hashed
/// onto the range so that popular keys are scattered.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: i64,
    item_count: i64,
    ranks: Zipfian,
}

impl ScrambledZipfian {
    /// Over [min, max].
    pub fn new(min: i64, max: i64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            item_count: max - min + 1,
            ranks: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    /// The next key number.
    pub fn next_value(&mut self, random: &mut Random) -> i64 {
        let rank = self.ranks.next_value(random);
        self.min + fnv_hash64(rank) % self.item_count
    }
}

/// YCSB's `AcknowledgedCounterGenerator`: hands out insert key numbers; `last_value` is the
/// highest number below which every insert was acknowledged.
#[derive(Debug)]
pub struct AcknowledgedCounter {
    next: AtomicU64,
    state: Mutex<(u64, BTreeSet<u64>)>,
}

impl AcknowledgedCounter {
    /// Starting at `start` (the first key number handed out).
    pub fn new(start: u64) -> AcknowledgedCounter {
        AcknowledgedCounter {
            next: AtomicU64::new(start),
            state: Mutex::new((start.wrapping_sub(1), BTreeSet::new())),
        }
    }

    /// The next key number to insert.
    pub fn next_value(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks `value`'s insert as acknowledged.
    pub fn acknowledge(&self, value: u64) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (limit, pending) = &mut *state;
        pending.insert(value);
        while pending.remove(&limit.wrapping_add(1)) {
            *limit = limit.wrapping_add(1);
        }
    }

    /// The highest key number readable so far.
    pub fn last_value(&self) -> u64 {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).0
    }
}

/// YCSB's `SkewedLatestGenerator`: `last − zipfian(last)`, favouring recent inserts.
#[derive(Clone, Debug)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// For a counter whose last value is now `last`.
    pub fn new(last: u64) -> SkewedLatest {
        SkewedLatest { zipfian: Zipfian::new(0, last as i64 - 1) }
    }

    /// The next key number, given the counter's last value now.
    pub fn next_value(&mut self, last: u64, random: &mut Random) -> u64 {
        let last = last as i64;
        (last - self.zipfian.next_long(last, random)).max(0) as u64
    }
}

/// A core workload's operation mix.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// a..f.
    pub name: char,
    read: f64,
    update: f64,
    /// Share of inserts.
    pub insert: f64,
    /// Share of scans.
    pub scan: f64,
    read_modify_write: f64,
    /// requestdistribution=latest (otherwise zipfian).
    pub latest: bool,
}

impl Workload {
    /// The shipped `workloads/workload[a-f]` files.
    pub fn core(name: char) -> Option<Workload> {
        let (read, update, insert, scan, read_modify_write, latest) = match name {
            'a' => (0.5, 0.5, 0.0, 0.0, 0.0, false),
            'b' => (0.95, 0.05, 0.0, 0.0, 0.0, false),
            'c' => (1.0, 0.0, 0.0, 0.0, 0.0, false),
            'd' => (0.95, 0.0, 0.05, 0.0, 0.0, true),
            'e' => (0.0, 0.0, 0.05, 0.95, 0.0, false),
            'f' => (0.5, 0.0, 0.0, 0.0, 0.5, false),
            _ => return None,
        };
        Some(Workload { name, read, update, insert, scan, read_modify_write, latest })
    }

    /// Chooses an operation like YCSB's `DiscreteGenerator`.
    pub fn choose(&self, random: &mut Random) -> Operation {
        let choices = [
            (self.read, Operation::Read),
            (self.update, Operation::Update),
            (self.insert, Operation::Insert),
            (self.scan, Operation::Scan),
            (self.read_modify_write, Operation::ReadModifyWrite),
        ];
        let total: f64 = choices.iter().map(|(weight, _)| weight).sum();
        let mut value = random.next_f64() * total;
        for (weight, operation) in choices {
            if value < weight {
                return operation;
            }
            value -= weight;
        }
        Operation::Read
    }
}

/// Fields per record and bytes per field (YCSB defaults).
pub const FIELD_COUNT: usize = 10;
/// Bytes per field.
pub const FIELD_LENGTH: usize = 100;
/// Bytes a record takes in a Stratus log (its 1 000 bytes of fields, its key and the entry's
/// headers), for sizing tables from a log's or a DRAM budget's memory.
pub const RECORD_LOG_BYTES: u64 = 1_100;
/// YCSB's `maxscanlength` in workload E.
pub const SCAN_LENGTH_MAX: u64 = 100;

/// Random printable bytes, as YCSB's `RandomByteIterator` produces.
pub fn random_field(random: &mut Random) -> Vec<u8> {
    (0..FIELD_LENGTH).map(|_| b' ' + (random.next_u64() % 95) as u8).collect()
}

/// The operation types YCSB reports, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Read all fields.
    Read,
    /// Write one field.
    Update,
    /// Write a whole new record.
    Insert,
    /// Read up to 100 records in key order from a start key.
    Scan,
    /// Read all fields, then write one.
    ReadModifyWrite,
}

impl Operation {
    /// YCSB's name of the operation.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "READ",
            Operation::Update => "UPDATE",
            Operation::Insert => "INSERT",
            Operation::Scan => "SCAN",
            Operation::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_hash_matches_ycsb() {
        // Values of YCSB's Utils.fnvhash64 (Java), computed independently.
        assert_eq!(fnv_hash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv_hash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnv_hash64(2), 1_820_151_046_732_198_393);
        assert_eq!(fnv_hash64(1_000), 5_952_875_239_596_136_740);
        assert_eq!(fnv_hash64(-1), 8_289_690_350_564_177_859);
        // The key YCSB's documentation shows for the first record.
        assert_eq!(key_name(0), "user6284781860667377211");
    }

    #[test]
    fn java_string_hash_matches_java() {
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        // Overflows wrap like Java's int.
        assert_eq!(java_string_hash("user6284781860667377211"), {
            let mut hash = 0_i32;
            for byte in "user6284781860667377211".bytes() {
                hash = hash.wrapping_mul(31).wrapping_add(i32::from(byte));
            }
            hash
        });
    }

    #[test]
    fn zipfian_most_popular_item_has_the_predicted_frequency() {
        // Plain zipfian over N items: P(item 0) = 1 / ζ(N, θ).
        let items = 1_000;
        let mut zipfian = Zipfian::new(0, items - 1);
        let mut random = Random::new(7);
        let draws = 200_000;
        let mut counts = vec![0_u64; items as usize];
        for _ in 0..draws {
            let value = zipfian.next_value(&mut random);
            assert!((0..items).contains(&value), "{value}");
            counts[value as usize] += 1;
        }
        let expected = 1.0 / zeta_from(0, items, ZIPFIAN_CONSTANT, 0.0);
        let observed = counts[0] as f64 / draws as f64;
        // Five binomial standard deviations.
        let tolerance = 5.0 * (expected * (1.0 - expected) / draws as f64).sqrt();
        assert!((observed - expected).abs() < tolerance, "{observed} vs {expected}");
        // Rank 1 next: P = 0.5^θ / ζ.
        let expected_second = 0.5_f64.powf(ZIPFIAN_CONSTANT) * expected;
        let observed_second = counts[1] as f64 / draws as f64;
        let tolerance_second =
            5.0 * (expected_second * (1.0 - expected_second) / draws as f64).sqrt();
        assert!((observed_second - expected_second).abs() < tolerance_second);
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn scrambled_zipfian_scatters_the_hot_key_and_stays_in_range() {
        let (min, max) = (100_i64, 10_099_i64);
        let mut generator = ScrambledZipfian::new(min, max);
        let mut random = Random::new(11);
        let draws = 200_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..draws {
            let value = generator.next_value(&mut random);
            assert!((min..=max).contains(&value), "{value}");
            *counts.entry(value).or_insert(0_u64) += 1;
        }
        // Rank 0 has probability 1 / ζ(10^10) and lands on min + fnv(0) % count; other ranks
        // add about 1 / count of the rest on average.
        let hot = min + fnv_hash64(0) % (max - min + 1);
        let (&most_popular, _) = counts.iter().max_by_key(|(_, count)| **count).unwrap();
        assert_eq!(most_popular, hot);
        let expected = 1.0 / SCRAMBLED_ZETAN;
        let observed = counts[&hot] as f64 / draws as f64;
        let tolerance = 5.0 * (expected / draws as f64).sqrt() + 2.0 / (max - min + 1) as f64;
        assert!((observed - expected).abs() < tolerance, "{observed} vs {expected}");
    }

    #[test]
    fn latest_favours_recent_inserts() {
        let counter = AcknowledgedCounter::new(1_000);
        assert_eq!(counter.last_value(), 999);
        let mut latest = SkewedLatest::new(counter.last_value());
        let mut random = Random::new(3);
        let draws = 100_000;
        let mut newest = 0;
        let mut recent = 0;
        for _ in 0..draws {
            let value = latest.next_value(counter.last_value(), &mut random);
            assert!(value <= 999);
            newest += u64::from(value == 999);
            recent += u64::from(value >= 900);
        }
        let expected = 1.0 / zeta_from(0, 999, ZIPFIAN_CONSTANT, 0.0);
        let observed = newest as f64 / draws as f64;
        assert!((observed - expected).abs() < 5.0 * (expected / draws as f64).sqrt(), "{observed}");
        // The newest tenth of the keys gets most of the requests.
        assert!(recent as f64 / draws as f64 > 0.5, "{recent}");

        // Inserts acknowledged out of order move the limit only when contiguous.
        let first = counter.next_value();
        let second = counter.next_value();
        counter.acknowledge(second);
        assert_eq!(counter.last_value(), 999);
        counter.acknowledge(first);
        assert_eq!(counter.last_value(), 1_001);
        let mut at_newest = 0;
        for _ in 0..10_000 {
            at_newest += u64::from(latest.next_value(counter.last_value(), &mut random) == 1_001);
        }
        assert!(at_newest > 10_000 / 20, "{at_newest}");
    }

    #[test]
    fn operation_mix_follows_the_workload() {
        let workload = Workload::core('b').unwrap();
        let mut random = Random::new(5);
        let updates =
            (0..100_000).filter(|_| workload.choose(&mut random) == Operation::Update).count();
        assert!((4_500..5_500).contains(&updates), "{updates}");
        let workload = Workload::core('c').unwrap();
        assert!((0..1_000).all(|_| workload.choose(&mut random) == Operation::Read));
    }
}
