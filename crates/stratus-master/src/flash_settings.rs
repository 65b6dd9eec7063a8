//! Where a master's flash log lives and how much disk it may use: the settings of the flash
//! tier (tables created with tier flash keep their objects there). The master keeps them for
//! the store's flash log; it opens nothing itself.

use std::fmt;
use std::path::{Path, PathBuf};

/// Default disk budget of a server's flash log: 4 GiB. Sixteen times the default memory log
/// (`stratus server --log-mib 256`), so a flash table can outgrow memory many times over out
/// of the box, while a `stratus up` cluster of several servers on one development machine
/// stays within a few tens of GiB of disk even when every server fills its budget (segment
/// files are created as the log grows, so an idle budget costs nothing). Production servers
/// set it to their drive's size less headroom (`--flash-gib`).
pub const FLASH_BYTES_MAX_DEFAULT: u64 = 4 << 30;

/// The name of the flash directory inside a server's data directory, used when no
/// `--flash-dir` is given.
pub const FLASH_DIRECTORY_NAME: &str = "flash";

/// The flash tier of one server: its log's directory and its disk budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlashSettings {
    /// The directory of the flash log's segment files (one file per segment).
    pub dir: PathBuf,
    /// Most bytes of segments the log may hold on disk.
    pub bytes_max: u64,
}

/// Why the flash flags of a server make no settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlashSettingsError {
    /// `--flash-dir` with `--flash-gib 0`, which turns the flash tier off.
    DirectoryWithoutBudget {
        /// The directory given.
        dir: PathBuf,
    },
    /// A budget whose bytes do not fit 64 bits.
    BudgetTooLarge {
        /// The GiB given.
        gib: u64,
    },
}

impl fmt::Display for FlashSettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlashSettingsError::DirectoryWithoutBudget { dir } => write!(
                f,
                "--flash-dir {} with --flash-gib 0: a budget of 0 turns the flash tier off",
                dir.display()
            ),
            FlashSettingsError::BudgetTooLarge { gib } => {
                write!(f, "--flash-gib {gib} is more bytes than 64 bits count")
            }
        }
    }
}

impl std::error::Error for FlashSettingsError {}

impl FlashSettings {
    /// The settings of a server started with `--flash-dir dir` (if given), `--flash-gib gib`
    /// and the data directory `data_dir` (if it has one). The directory is `dir`, else
    /// `<data_dir>/flash`; without either (a server that keeps nothing on disk) there is no
    /// flash tier, and neither is there with a budget of 0 GiB. A server without a flash tier
    /// still serves memory tables.
    pub fn from_flags(
        dir: Option<&Path>,
        gib: u64,
        data_dir: Option<&Path>,
    ) -> Result<Option<FlashSettings>, FlashSettingsError> {
        if gib == 0 {
            return match dir {
                Some(dir) => {
                    Err(FlashSettingsError::DirectoryWithoutBudget { dir: dir.to_path_buf() })
                }
                None => Ok(None),
            };
        }
        let bytes_max =
            gib.checked_mul(1 << 30).ok_or(FlashSettingsError::BudgetTooLarge { gib })?;
        let dir = match (dir, data_dir) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(data_dir)) => data_dir.join(FLASH_DIRECTORY_NAME),
            (None, None) => return Ok(None),
        };
        Ok(Some(FlashSettings { dir, bytes_max }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_GIB: u64 = FLASH_BYTES_MAX_DEFAULT >> 30;

    #[test]
    fn the_flash_directory_defaults_to_one_inside_the_data_directory() {
        let data = Path::new("/var/lib/stratus");
        let settings = FlashSettings::from_flags(None, DEFAULT_GIB, Some(data)).unwrap();
        let expected =
            FlashSettings { dir: data.join("flash"), bytes_max: FLASH_BYTES_MAX_DEFAULT };
        assert_eq!(settings, Some(expected));
        // A directory given wins; the budget is in GiB.
        let given = Path::new("/mnt/nvme0/stratus");
        let settings = FlashSettings::from_flags(Some(given), 2, Some(data)).unwrap().unwrap();
        assert_eq!((settings.dir.as_path(), settings.bytes_max), (given, 2 << 30));
    }

    #[test]
    fn without_a_directory_or_a_budget_there_is_no_flash_tier() {
        assert_eq!(FlashSettings::from_flags(None, DEFAULT_GIB, None), Ok(None));
        assert_eq!(FlashSettings::from_flags(None, 0, Some(Path::new("/data"))), Ok(None));
        let dir = Path::new("/mnt/flash");
        assert_eq!(
            FlashSettings::from_flags(Some(dir), 0, None),
            Err(FlashSettingsError::DirectoryWithoutBudget { dir: dir.to_path_buf() })
        );
        assert_eq!(
            FlashSettings::from_flags(Some(dir), u64::MAX, None),
            Err(FlashSettingsError::BudgetTooLarge { gib: u64::MAX })
        );
    }
}
