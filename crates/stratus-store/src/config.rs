//! Store configuration: memory sizes and limits, with the rules that tie them together.

use stratus_log::format::ENTRY_HEADER_BYTES_MAX;
use stratus_log::LogConfig;

use crate::cleaner::CleanerConfig;
use stratus_types::limits::{
    KEY_BYTES_MAX, SEGLET_BYTES_DEFAULT, SEGMENT_BYTES_DEFAULT, VALUE_BYTES_MAX_DEFAULT,
};

/// Smallest hash table: 1024 buckets, so small test stores still spread keys over all 1024
/// bucket locks.
const HASH_TABLE_BYTES_MIN: u64 = 64 << 10;

/// Share of the log given to the hash table by default (RAMCloud: 10% of master memory).
const HASH_TABLE_SHARE_OF_LOG_DIVISOR: u64 = 10;

/// Share of the log auto tables' objects may hold in DRAM by default: half. The other half
/// holds memory tables, the FLASH_OBJECT entries of objects on flash, tombstones and the
/// cleaner's headroom; RAMCloud's measurements show cleaning cost rising steeply once the log
/// is more than about 80 % live, so auto tables alone are not let near that.
pub const AUTO_DRAM_SHARE_OF_LOG_DIVISOR: u64 = 2;

/// Bytes per second that reads of auto tables may rewrite from flash into DRAM by default
/// (promotion). Each promoted byte is appended to the log and replicated R times like a
/// write, and it may push another object out by a demotion: 16 MiB/s keeps promotion well
/// below a server's write bandwidth (a 10 Gb/s link carries ~1 GiB/s, a third of it per
/// replica with R = 3), and still replaces a 1 GiB working set within about a minute.
pub const PROMOTION_BYTES_PER_SECOND_MAX_DEFAULT: u64 = 16 << 20;

/// A read of an auto table's object on flash that is admitted promotes it with probability one
/// in this many by default: every admitted read. The admission (a second read while the first
/// is remembered, [`PromotionAdmission`]) already keeps objects read once in a long while out;
/// a random draw on top only delays the hot ones. `stratus bench tiering` measured the draw
/// alone (one in 4, admitting every read): about 40 % of promotions were of objects read once,
/// each pushing a hotter one out, and the hit ratio on YCSB's zipfian was 0.45 where an oracle
/// gets 0.55.
pub const PROMOTION_ONE_IN_READS_DEFAULT: u32 = 1;

/// Which reads of an auto object on flash may promote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromotionAdmission {
    /// Every read (tests that want a promotion on the first read).
    FirstRead,
    /// A read of an object whose previous read from flash is still remembered (a table of
    /// recent flash reads, a few budgets' worth of objects): what 2Q and ARC call a ghost hit.
    SecondRead,
}

/// Largest object fields before the key: checksum, timestamp, widths, table id, version, key
/// length (see docs/design/log-format.md).
const OBJECT_FIELDS_BYTES_MAX: usize = 4 + 4 + 1 + 8 + 8 + 2;

/// Largest tombstone fields before the key.
const TOMBSTONE_FIELDS_BYTES_MAX: usize = 4 + 4 + 1 + 1 + 8 + 8 + 8;

/// Sizes of an object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Bytes of the log region.
    pub log_bytes: u64,
    /// Bytes per segment.
    pub segment_bytes: u32,
    /// Bytes per seglet.
    pub seglet_bytes: u32,
    /// Bytes of main hash-table buckets (rounded down to a power of two of 64-byte buckets).
    pub hash_table_bytes: u64,
    /// Largest value accepted by writes.
    pub value_bytes_max: u32,
    /// The cleaner's policy.
    pub cleaner: CleanerConfig,
    /// Touch every page of the log region at start (see `LogConfig::prefault_memory`).
    pub prefault_memory: bool,
    /// Bytes of segment images the master may keep on its flash tier (0: no flash tier; see
    /// `LogConfig::flash_image_bytes`).
    pub flash_image_bytes: u64,
    /// Bytes of DRAM (live object bytes, entry headers included) the objects of auto tables may
    /// hold before the cleaner demotes their least recently used segments to flash (auto
    /// tables need a flash tier; without one their objects stay in memory).
    pub auto_dram_bytes_max: u64,
    /// Bytes per second reads may promote from flash into DRAM (a token bucket of one
    /// second's worth); 0 turns promotion off.
    pub promotion_bytes_per_second_max: u64,
    /// A read of an auto table's object on flash that `promotion_admission` admits promotes
    /// it with probability one in this many (1: every admitted read), within the byte rate.
    pub promotion_one_in_reads: u32,
    /// Which reads may promote.
    pub promotion_admission: PromotionAdmission,
}

/// A configuration rule that does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigError {
    /// The named rule is broken.
    Invalid(&'static str),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Invalid(reason) => formatter.write_str(reason),
        }
    }
}

impl std::error::Error for ConfigError {}

impl StoreConfig {
    /// Defaults for a log of `log_bytes`: 8 MiB segments, 64 KiB seglets, a hash table of
    /// log / 10 (rounded down to a power of two of buckets, at least 64 KiB), values up to 1 MiB.
    pub fn with_log_bytes(log_bytes: u64) -> StoreConfig {
        let wanted_buckets = (log_bytes / HASH_TABLE_SHARE_OF_LOG_DIVISOR / 64).max(1);
        let buckets = 1u64 << (63 - wanted_buckets.leading_zeros());
        StoreConfig {
            log_bytes,
            segment_bytes: SEGMENT_BYTES_DEFAULT as u32,
            seglet_bytes: SEGLET_BYTES_DEFAULT as u32,
            hash_table_bytes: (buckets * 64).max(HASH_TABLE_BYTES_MIN),
            value_bytes_max: VALUE_BYTES_MAX_DEFAULT as u32,
            cleaner: CleanerConfig::default(),
            prefault_memory: false,
            flash_image_bytes: 0,
            auto_dram_bytes_max: log_bytes / AUTO_DRAM_SHARE_OF_LOG_DIVISOR,
            promotion_bytes_per_second_max: PROMOTION_BYTES_PER_SECOND_MAX_DEFAULT,
            promotion_one_in_reads: PROMOTION_ONE_IN_READS_DEFAULT,
            promotion_admission: PromotionAdmission::SecondRead,
        }
    }

    /// A small store for tests: 16 MiB log, 1 MiB segments, 64 KiB seglets, values up to
    /// 128 KiB.
    pub fn for_testing() -> StoreConfig {
        StoreConfig {
            log_bytes: 16 << 20,
            segment_bytes: 1 << 20,
            seglet_bytes: 64 << 10,
            hash_table_bytes: HASH_TABLE_BYTES_MIN,
            value_bytes_max: 128 << 10,
            cleaner: CleanerConfig::default(),
            prefault_memory: false,
            flash_image_bytes: 0,
            auto_dram_bytes_max: (16 << 20) / AUTO_DRAM_SHARE_OF_LOG_DIVISOR,
            promotion_bytes_per_second_max: PROMOTION_BYTES_PER_SECOND_MAX_DEFAULT,
            promotion_one_in_reads: PROMOTION_ONE_IN_READS_DEFAULT,
            promotion_admission: PromotionAdmission::SecondRead,
        }
    }

    /// The log's part of the configuration.
    pub fn log_config(&self) -> LogConfig {
        LogConfig {
            log_bytes: self.log_bytes,
            segment_bytes: self.segment_bytes,
            seglet_bytes: self.seglet_bytes,
            prefault_memory: self.prefault_memory,
            flash_image_bytes: self.flash_image_bytes,
        }
    }

    /// Checks every rule; the error names the first broken one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let log = self.log_config();
        log.validate().map_err(ConfigError::Invalid)?;
        if self.cleaner.tombstone_ratio_percent > 100 {
            return Err(ConfigError::Invalid("tombstone_ratio_percent must be at most 100"));
        }
        if self.promotion_one_in_reads == 0 {
            return Err(ConfigError::Invalid("promotion_one_in_reads must be at least 1"));
        }
        if self.auto_dram_bytes_max > self.log_bytes {
            return Err(ConfigError::Invalid("auto_dram_bytes_max must be at most log_bytes"));
        }
        if self.hash_table_bytes < 64 {
            return Err(ConfigError::Invalid("hash_table_bytes must hold at least one bucket"));
        }
        if self.value_bytes_max > self.segment_bytes / 8 {
            // RAMCloud's rule: bounded tail waste when the cleaner packs survivors.
            return Err(ConfigError::Invalid("value_bytes_max must be at most segment_bytes / 8"));
        }
        // The largest overwrite (object + tombstone, both with the longest key) must fit in a
        // new head together with its header, digest and safe version.
        let largest_append = 2 * ENTRY_HEADER_BYTES_MAX
            + OBJECT_FIELDS_BYTES_MAX
            + TOMBSTONE_FIELDS_BYTES_MAX
            + 2 * KEY_BYTES_MAX
            + self.value_bytes_max as usize;
        if largest_append + log.head_entries_bytes_max() > self.segment_bytes as usize {
            return Err(ConfigError::Invalid(
                "segment_bytes too small for the largest object and its tombstone",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        StoreConfig::for_testing().validate().unwrap();
        let config = StoreConfig::with_log_bytes(1 << 30);
        config.validate().unwrap();
        assert_eq!(config.hash_table_bytes, 64 << 20);
        assert_eq!(StoreConfig::with_log_bytes(64 << 20).hash_table_bytes, 4 << 20);
        assert_eq!(StoreConfig::with_log_bytes(32 << 20).hash_table_bytes, 2 << 20);
    }

    #[test]
    fn broken_rules_are_reported() {
        let base = StoreConfig::for_testing();
        let cases = [
            StoreConfig { seglet_bytes: 1000, ..base },
            StoreConfig { segment_bytes: (1 << 20) + 1024, ..base },
            StoreConfig { log_bytes: 2 << 20, ..base },
            StoreConfig { value_bytes_max: (128 << 10) + 1, ..base },
            StoreConfig { hash_table_bytes: 0, ..base },
            StoreConfig { log_bytes: 1 << 47, ..base },
            StoreConfig { promotion_one_in_reads: 0, ..base },
            StoreConfig { auto_dram_bytes_max: (16 << 20) + 1, ..base },
        ];
        for config in cases {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
