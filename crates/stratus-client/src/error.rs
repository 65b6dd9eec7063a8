//! The client's error type.

use std::fmt;

use stratus_types::Version;
use stratus_wire::Status;

/// A failed operation: the status, the object's current version when the status is an object
/// outcome (rejections report it), and a message from the server or the client library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What went wrong.
    pub status: Status,
    /// The current version of the object, for OBJECT_EXISTS, WRONG_VERSION and similar.
    pub version: Version,
    /// Details, possibly empty.
    pub message: String,
}

/// Result type of the client.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with a status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, version: Version(0), message: message.into() }
    }

    /// An object outcome with the current version.
    pub fn with_version(status: Status, version: Version) -> Error {
        Error { status, version, message: String::new() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.status)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}
