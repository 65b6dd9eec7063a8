//! Storage tiers: where a table's objects live on the master that serves them.

use std::fmt;

/// Where a table's objects live, chosen when the table is created (issue 25,
/// docs/design/flash-tier.md).
///
/// - `Memory`: every object's bytes in the master's log-structured memory (the default).
/// - `Flash`: new writes land in the memory log as for a memory table (and are replicated
///   the same way); the cleaner's compaction moves their bytes to the master's flash log and
///   leaves a small reference in DRAM, so the table may be many times the server's memory.
/// - `Auto`: as `Flash`, but only the objects not read or written for longest go to flash,
///   once the server's DRAM budget for auto tables is reached, and a flash object that is read
///   comes back to DRAM (docs/design/flash-tier.md, "Automatic tiering").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Objects in DRAM (the default).
    #[default]
    Memory,
    /// Objects on the server's flash log, their index (and a reference each) in DRAM.
    Flash,
    /// The working set in DRAM, the rest on flash, moved by the master.
    Auto,
}

impl Tier {
    /// Every tier, in code order.
    pub const ALL: [Tier; 3] = [Tier::Memory, Tier::Flash, Tier::Auto];

    /// The one-byte code used on the wire and in the coordinator's table records.
    pub fn code(self) -> u8 {
        match self {
            Tier::Memory => 0,
            Tier::Flash => 1,
            Tier::Auto => 2,
        }
    }

    /// The tier of a code; `None` for a code no version defines (callers answer with an
    /// error status, never guess).
    pub fn from_code(code: u8) -> Option<Tier> {
        match code {
            0 => Some(Tier::Memory),
            1 => Some(Tier::Flash),
            2 => Some(Tier::Auto),
            _ => None,
        }
    }

    /// The name users type (`--tier flash`) and that status pages show.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Flash => "flash",
            Tier::Auto => "auto",
        }
    }

    /// The tier of a name, as `name` spells it.
    pub fn from_name(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|tier| tier.name() == name)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip_and_unknown_ones_are_refused() {
        for tier in Tier::ALL {
            assert_eq!(Tier::from_code(tier.code()), Some(tier));
            assert_eq!(Tier::from_name(tier.name()), Some(tier));
        }
        assert_eq!(Tier::from_code(3), None);
        assert_eq!(Tier::from_name("disk"), None);
        assert_eq!(Tier::default(), Tier::Memory);
    }
}
