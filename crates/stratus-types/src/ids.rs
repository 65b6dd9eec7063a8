//! Newtype identifiers, so a table id can never be passed where a server id is expected.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        id_type!(@type $(#[$doc])* $name);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
    (@type $(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u64);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

id_type!(
    /// A table's 64-bit identifier, assigned by the coordinator, never reused. Zero is invalid.
    TableId
);
id_type!(
    @type
    /// A server's identifier, assigned by the coordinator at enlistment, never reused. Zero is
    /// invalid. As in RAMCloud, it has two parts: the low 32 bits are the server's *index*,
    /// its place in the cluster, which a server restarted on the same data keeps (what an
    /// operator names it by); the high 32 bits are the *generation*, which every enlistment at
    /// that index increments, so each process has an id of its own (fencing, leases and logs
    /// tell a restarted server from the one before it). Printed as `index` for generation 0
    /// and `index.generation` after.
    ServerId
);

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.generation() {
            0 => write!(f, "{}", self.index()),
            generation => write!(f, "{}.{generation}", self.index()),
        }
    }
}
id_type!(
    /// A log segment's identifier; ascending within one master's log, starting at 1.
    SegmentId
);
id_type!(
    /// An object version. Zero means "no object"; a stored object always has a version >= 1,
    /// strictly increasing per key and never reused (see the safe version in the log format).
    Version
);
id_type!(
    /// The 64-bit hash of (table id, key) that places a key in a tablet and a hash bucket.
    KeyHash
);

impl Version {
    /// The version reported for an object that does not exist.
    pub const NONEXISTENT: Version = Version(0);
}

impl TableId {
    /// True for ids the coordinator can hand out.
    pub fn is_valid(self) -> bool {
        self.0 != 0
    }
}

impl ServerId {
    /// The id of generation `generation` of the server at `index`.
    pub fn new(index: u32, generation: u32) -> ServerId {
        ServerId(u64::from(generation) << 32 | u64::from(index))
    }

    /// True for ids the coordinator can hand out (index 0 is never used).
    pub fn is_valid(self) -> bool {
        self.index() != 0
    }

    /// The server's place in the cluster, kept across restarts on the same data.
    pub fn index(self) -> u32 {
        self.0 as u32
    }

    /// How many times a server enlisted at this index before this one.
    pub fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The id written `index` or `index.generation` (as `Display` prints it).
    pub fn parse(text: &str) -> Option<ServerId> {
        let (index, generation) = match text.split_once('.') {
            Some((index, generation)) => (index, generation.parse().ok()?),
            None => (text, 0),
        };
        let id = ServerId::new(index.parse().ok()?, generation);
        id.is_valid().then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::ServerId;

    #[test]
    fn a_server_id_is_an_index_and_a_generation_and_prints_as_it_parses() {
        let first = ServerId(3);
        assert_eq!((first.index(), first.generation(), first.to_string()), (3, 0, "3".into()));
        let restarted = ServerId::new(3, 2);
        assert_eq!(restarted.0, (2 << 32) | 3);
        assert_eq!(restarted.to_string(), "3.2");
        for id in [first, restarted, ServerId::new(u32::MAX, u32::MAX)] {
            assert_eq!(ServerId::parse(&id.to_string()), Some(id));
        }
        for bad in ["", "0", "0.1", "x", "3.", ".3", "3.x", "4294967296", "1.4294967296", "-1"] {
            assert_eq!(ServerId::parse(bad), None, "{bad:?}");
        }
        assert!(!ServerId(1 << 32).is_valid(), "index 0 is no server, whatever its generation");
    }
}
