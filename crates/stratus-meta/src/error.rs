//! [`MetaError`]: every way a metadata store operation can fail.

use std::fmt;

/// Why a [`MetaStore`](crate::MetaStore) call, or opening a store, failed.
#[derive(Debug)]
pub enum MetaError {
    /// The operating system refused a file operation.
    Io(std::io::Error),
    /// The stored data is damaged in a way that cannot be a torn, unacknowledged write, so
    /// acknowledged data may be lost; the store refuses to start rather than guess. `offset` is
    /// the byte offset in the log file where the damage was found (0 when not about a file).
    Corrupt {
        /// Byte offset of the damage in the file.
        offset: u64,
        /// What was wrong, for an operator.
        reason: String,
    },
    /// A key, value or batch exceeded its limit ([`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX),
    /// [`VALUE_BYTES_MAX`](crate::VALUE_BYTES_MAX), [`BATCH_BYTES_MAX`](crate::BATCH_BYTES_MAX));
    /// nothing was applied.
    TooLarge {
        /// Which thing was too large: "key", "value" or "batch".
        what: &'static str,
        /// Its size in bytes.
        bytes: u64,
    },
    /// An earlier write or fsync failed, so it is unknown whether that batch is on disk; the
    /// store refuses every call until it is reopened (reopening replays what really is there).
    Poisoned {
        /// The failure that poisoned the store.
        reason: String,
    },
    /// A networked store could not be reached, or answered with an error; for a batch, nothing
    /// was applied (a batch whose outcome is unknown poisons the store instead).
    Unavailable {
        /// What failed, for an operator.
        reason: String,
    },
    /// Another coordinator holds the leadership this store's writes are conditional on: this
    /// one was deposed and must stop. Nothing was applied.
    Fenced {
        /// Who holds it now, as far as the store could tell.
        reason: String,
    },
}

impl fmt::Display for MetaError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaError::Io(error) => write!(formatter, "metadata store I/O error: {error}"),
            MetaError::Corrupt { offset, reason } => {
                write!(formatter, "metadata store corrupt at byte {offset}: {reason}")
            }
            MetaError::TooLarge { what, bytes } => {
                write!(formatter, "metadata store {what} too large: {bytes} bytes")
            }
            MetaError::Poisoned { reason } => write!(
                formatter,
                "metadata store unusable after an earlier failure ({reason}); reopen it"
            ),
            MetaError::Unavailable { reason } => {
                write!(formatter, "metadata store unavailable: {reason}")
            }
            MetaError::Fenced { reason } => {
                write!(formatter, "metadata store refused a write: leadership lost ({reason})")
            }
        }
    }
}

impl std::error::Error for MetaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MetaError::Io(error) => Some(error),
            _ => None,
        }
    }
}

impl From<std::io::Error> for MetaError {
    fn from(error: std::io::Error) -> Self {
        MetaError::Io(error)
    }
}
