//! A storage server's identity across restarts: the id it enlisted with, kept in its data
//! directory (the backup's directory, which holds what the server stores), so that when it
//! restarts on that directory it asks the coordinator for the same index again
//! (`ServerId`: index and generation; wire-protocol.md, ENLIST_SERVER) and operators keep
//! naming it by the same number.
//!
//! The file holds the id as text (`3` or `3.2`, as ids print) and a newline. It is replaced
//! atomically (written beside, synced, renamed, directory synced), so a crash leaves the old
//! id or the new one, never a torn one; a file that does not parse is an error that names it
//! rather than a silent new identity.

use std::io::Write;
use std::path::{Path, PathBuf};

use stratus_types::ServerId;

/// The file, in the server's data directory, that holds its id.
pub const SERVER_ID_FILE_NAME: &str = "server-id";

fn identity_path(directory: &Path) -> PathBuf {
    directory.join(SERVER_ID_FILE_NAME)
}

/// The id a server on `directory` had before, or `ServerId(0)` when it never enlisted from
/// there (a new directory, or none).
pub fn previous_server_id(directory: Option<&Path>) -> Result<ServerId, String> {
    let Some(directory) = directory else { return Ok(ServerId(0)) };
    let path = identity_path(directory);
    match std::fs::read_to_string(&path) {
        Ok(text) => ServerId::parse(text.trim()).ok_or_else(|| {
            format!(
                "{}: {:?} is not a server id; remove the file to join as a new server",
                path.display(),
                text.trim()
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(ServerId(0)),
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
}

/// Keeps `server_id` in `directory`, replacing what was there, durably.
pub fn remember_server_id(directory: &Path, server_id: ServerId) -> Result<(), String> {
    let path = identity_path(directory);
    let temporary = directory.join(format!("{SERVER_ID_FILE_NAME}.new"));
    let failed = |error: std::io::Error| format!("{}: {error}", path.display());
    let mut file = std::fs::File::create(&temporary).map_err(failed)?;
    writeln!(file, "{server_id}").map_err(failed)?;
    file.sync_all().map_err(failed)?;
    std::fs::rename(&temporary, &path).map_err(failed)?;
    std::fs::File::open(directory).and_then(|directory| directory.sync_all()).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_kept_in_a_directory_is_read_back_and_a_bad_file_is_an_error() {
        let directory = tempfile::tempdir().unwrap();
        assert_eq!(previous_server_id(None), Ok(ServerId(0)));
        assert_eq!(previous_server_id(Some(directory.path())), Ok(ServerId(0)));
        remember_server_id(directory.path(), ServerId::new(3, 0)).unwrap();
        assert_eq!(previous_server_id(Some(directory.path())), Ok(ServerId(3)));
        remember_server_id(directory.path(), ServerId::new(3, 1)).unwrap();
        assert_eq!(previous_server_id(Some(directory.path())), Ok(ServerId::new(3, 1)));
        std::fs::write(directory.path().join(SERVER_ID_FILE_NAME), "three\n").unwrap();
        let error = previous_server_id(Some(directory.path())).unwrap_err();
        assert!(error.contains("is not a server id"), "{error}");
    }
}
