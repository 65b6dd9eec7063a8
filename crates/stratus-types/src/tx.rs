//! Multi-object transactions (docs/design/transactions.md): the kinds of a transaction's
//! operations, the votes participants give, and the decisions clients send. Both sides of the
//! wire and the log share these codes; never renumber them.

use std::fmt;

/// What a transaction does to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TxOpKind {
    /// Read only: the object must still be at the version read when the transaction commits.
    Read = 1,
    /// Write a new value.
    Write = 2,
    /// Remove the object.
    Remove = 3,
}

impl TxOpKind {
    /// The byte on the wire and in the log.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The kind with this code; `None` for any other byte.
    pub fn from_code(code: u8) -> Option<TxOpKind> {
        match code {
            1 => Some(TxOpKind::Read),
            2 => Some(TxOpKind::Write),
            3 => Some(TxOpKind::Remove),
            _ => None,
        }
    }
}

/// A participant's vote on one operation of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TxVote {
    /// The object is locked for the transaction at the version read, and the lock is durable:
    /// the transaction may commit.
    Prepared = 1,
    /// The object changed since it was read, or another transaction holds it: the
    /// transaction must abort.
    Abort = 2,
}

impl TxVote {
    /// The byte on the wire and in the log.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The vote with this code; `None` for any other byte.
    pub fn from_code(code: u8) -> Option<TxVote> {
        match code {
            1 => Some(TxVote::Prepared),
            2 => Some(TxVote::Abort),
            _ => None,
        }
    }
}

/// The outcome of a transaction, as its decision tells the participants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TxDecision {
    /// Every operation was prepared: apply them.
    Commit = 1,
    /// Some operation was not: release the locks, apply nothing.
    Abort = 2,
}

impl TxDecision {
    /// The byte on the wire and in the log.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The decision with this code; `None` for any other byte.
    pub fn from_code(code: u8) -> Option<TxDecision> {
        match code {
            1 => Some(TxDecision::Commit),
            2 => Some(TxDecision::Abort),
            _ => None,
        }
    }
}

impl fmt::Display for TxDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TxDecision::Commit => "commit",
            TxDecision::Abort => "abort",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_nothing_else_decodes() {
        for code in 0..=u8::MAX {
            if let Some(kind) = TxOpKind::from_code(code) {
                assert_eq!(kind.code(), code);
            }
            if let Some(vote) = TxVote::from_code(code) {
                assert_eq!(vote.code(), code);
            }
            if let Some(decision) = TxDecision::from_code(code) {
                assert_eq!(decision.code(), code);
            }
        }
        assert_eq!(TxOpKind::from_code(0), None);
        assert_eq!(TxOpKind::from_code(4), None);
        assert_eq!(TxVote::from_code(3), None);
        assert_eq!(TxDecision::from_code(0), None);
    }
}
