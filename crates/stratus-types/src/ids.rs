//! Newtype identifiers, so a table id can never be passed where a server id is expected.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u64);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A table's 64-bit identifier, assigned by the coordinator, never reused. Zero is invalid.
    TableId
);
id_type!(
    /// A server's identifier, assigned by the coordinator at enlistment, never reused. Zero is
    /// invalid. A restarted process enlists again and receives a new id.
    ServerId
);
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
    /// True for ids the coordinator can hand out.
    pub fn is_valid(self) -> bool {
        self.0 != 0
    }
}
