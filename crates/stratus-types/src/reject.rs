//! Reject rules: the conditions under which a conditional operation is refused.
//!
//! A missing object counts as version 0 ([`Version::NONEXISTENT`]). Rules are checked in this
//! order and the first that matches decides: `doesnt_exist`, `exists`, `version_le_given`,
//! `version_ne_given`. On rejection the current version (0 when missing) is reported back.

use crate::ids::Version;

/// Conditions that abort an operation; all false means "unconditional".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectRules {
    /// The version the two version rules compare against.
    pub given_version: Version,
    /// Reject if the object does not exist.
    pub doesnt_exist: bool,
    /// Reject if the object exists.
    pub exists: bool,
    /// Reject if the object's version (0 when missing) is <= `given_version`.
    pub version_le_given: bool,
    /// Reject if the object's version (0 when missing) is != `given_version`.
    pub version_ne_given: bool,
}

/// Why a reject rule refused an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// `doesnt_exist` matched.
    ObjectDoesntExist,
    /// `exists` matched.
    ObjectExists,
    /// `version_le_given` or `version_ne_given` matched.
    WrongVersion,
}

impl RejectRules {
    /// No conditions.
    pub const NONE: RejectRules = RejectRules {
        given_version: Version(0),
        doesnt_exist: false,
        exists: false,
        version_le_given: false,
        version_ne_given: false,
    };

    /// Only write if the object does not exist yet.
    pub fn create_only() -> Self {
        RejectRules { exists: true, ..Self::NONE }
    }

    /// Only proceed if the object's current version equals `version` (0 = missing).
    pub fn version_equals(version: Version) -> Self {
        RejectRules { given_version: version, version_ne_given: true, ..Self::NONE }
    }

    /// True when no rule is set.
    pub fn is_unconditional(&self) -> bool {
        !(self.doesnt_exist || self.exists || self.version_le_given || self.version_ne_given)
    }

    /// Applies the rules to an object whose current version is `current` (0 when missing).
    pub fn check(&self, current: Version) -> Result<(), RejectReason> {
        let object_exists = current != Version::NONEXISTENT;
        if self.doesnt_exist && !object_exists {
            return Err(RejectReason::ObjectDoesntExist);
        }
        if self.exists && object_exists {
            return Err(RejectReason::ObjectExists);
        }
        if self.version_le_given && current <= self.given_version {
            return Err(RejectReason::WrongVersion);
        }
        if self.version_ne_given && current != self.given_version {
            return Err(RejectReason::WrongVersion);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(doesnt_exist: bool, exists: bool, le: bool, ne: bool, given: u64) -> RejectRules {
        RejectRules {
            given_version: Version(given),
            doesnt_exist,
            exists,
            version_le_given: le,
            version_ne_given: ne,
        }
    }

    #[test]
    fn every_rule_on_missing_and_present_objects() {
        let missing = Version(0);
        let present = Version(7);
        assert_eq!(RejectRules::NONE.check(missing), Ok(()));
        assert_eq!(RejectRules::NONE.check(present), Ok(()));
        let doesnt_exist = rules(true, false, false, false, 0);
        assert_eq!(doesnt_exist.check(missing), Err(RejectReason::ObjectDoesntExist));
        assert_eq!(doesnt_exist.check(present), Ok(()));
        let exists = rules(false, true, false, false, 0);
        assert_eq!(exists.check(missing), Ok(()));
        assert_eq!(exists.check(present), Err(RejectReason::ObjectExists));
        // A missing object is version 0, and 0 <= any given version.
        assert_eq!(
            rules(false, false, true, false, 0).check(missing),
            Err(RejectReason::WrongVersion)
        );
        assert_eq!(rules(false, false, true, false, 6).check(present), Ok(()));
        assert_eq!(
            rules(false, false, true, false, 7).check(present),
            Err(RejectReason::WrongVersion)
        );
        assert_eq!(
            rules(false, false, true, false, 8).check(present),
            Err(RejectReason::WrongVersion)
        );
        assert_eq!(rules(false, false, false, true, 0).check(missing), Ok(()));
        assert_eq!(
            rules(false, false, false, true, 3).check(missing),
            Err(RejectReason::WrongVersion)
        );
        assert_eq!(rules(false, false, false, true, 7).check(present), Ok(()));
        assert_eq!(
            rules(false, false, false, true, 8).check(present),
            Err(RejectReason::WrongVersion)
        );
    }

    #[test]
    fn first_matching_rule_decides() {
        let all = rules(true, true, true, true, 100);
        assert_eq!(all.check(Version(0)), Err(RejectReason::ObjectDoesntExist));
        assert_eq!(all.check(Version(5)), Err(RejectReason::ObjectExists));
        let version_rules = rules(false, false, true, true, 100);
        assert_eq!(version_rules.check(Version(5)), Err(RejectReason::WrongVersion));
        assert!(version_rules.check(Version(101)).is_err());
        assert_eq!(
            rules(false, false, true, true, 100).check(Version(100)),
            Err(RejectReason::WrongVersion)
        );
    }
}
