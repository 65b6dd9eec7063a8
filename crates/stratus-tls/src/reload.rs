//! A TLS configuration built from files, and built again when their contents change.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use sha2::{Digest, Sha256};

use crate::files::{read_bounded, TlsError};

/// A digest of the files' contents: what decides whether they changed. Contents, not
/// modification times: a file rewritten in place with the same size within one timestamp tick,
/// or copied with its old time kept (`cp -p`, `rsync -t`), changes no stamp but its bytes.
/// The files are small (certificates and keys, at most 1 MiB each) and read once per check.
type FilesDigest = [u8; 32];

fn digest(paths: &[PathBuf]) -> FilesDigest {
    let mut hasher = Sha256::new();
    for path in paths {
        hasher.update(path.as_os_str().as_encoded_bytes());
        match read_bounded(path) {
            Ok(bytes) => {
                hasher.update([1]);
                hasher.update((bytes.len() as u64).to_le_bytes());
                hasher.update(&bytes);
            }
            // Unreadable now: a digest of its own, so its return is a change.
            Err(_) => hasher.update([0]),
        }
    }
    hasher.finalize().into()
}

/// A configuration of type `T` built by `build` from `paths`, current as of their last
/// successful load.
pub(crate) struct Reloading<T> {
    paths: Vec<PathBuf>,
    build: Box<dyn Fn() -> Result<Arc<T>, TlsError> + Send + Sync>,
    current: RwLock<Arc<T>>,
    /// The digest of the files that built `current`, or of files that last failed to build (so
    /// a broken set is reported once, not at every check).
    digest: Mutex<FilesDigest>,
    reloads: AtomicU64,
    reloads_failed: AtomicU64,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading").field("paths", &self.paths).finish_non_exhaustive()
    }
}

impl<T> Reloading<T> {
    /// Builds the first configuration (an error says which file is missing or wrong).
    pub(crate) fn load(
        paths: Vec<PathBuf>,
        build: impl Fn() -> Result<Arc<T>, TlsError> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, TlsError> {
        // The digest first: a change while the files are read is seen at the next check.
        let digest = digest(&paths);
        let current = build()?;
        Ok(Reloading {
            paths,
            build: Box::new(build),
            current: RwLock::new(current),
            digest: Mutex::new(digest),
            reloads: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        })
    }

    /// The configuration new handshakes use.
    pub(crate) fn current(&self) -> Arc<T> {
        self.current.read().expect("TLS configuration lock poisoned").clone()
    }

    /// Builds the configuration again if the files' contents changed since the last check.
    /// `Ok(true)`: the new one is in use from now on. An error leaves the previous one in use,
    /// and is returned once per distinct content of the files (a certificate replaced before
    /// its key fails, then loads when the key follows).
    pub(crate) fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = digest(&self.paths);
        let mut last = self.digest.lock().expect("TLS digest lock poisoned");
        if *last == now {
            return Ok(false);
        }
        *last = now;
        match (self.build)() {
            Ok(config) => {
                *self.current.write().expect("TLS configuration lock poisoned") = config;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(error) => {
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                Err(error)
            }
        }
    }

    pub(crate) fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    pub(crate) fn reloads_failed(&self) -> u64 {
        self.reloads_failed.load(Ordering::Relaxed)
    }

    pub(crate) fn first_path(&self) -> &Path {
        &self.paths[0]
    }
}

/// Checks `reloading` every `interval` forever, logging each reload and each failed one (what
/// describes the configuration in the log: `what`).
pub(crate) async fn watch<T>(reloading: &Reloading<T>, what: &str, interval: std::time::Duration) {
    loop {
        tokio::time::sleep(interval).await;
        // Reading and hashing a few KiB: cheap enough for the runtime's thread.
        match reloading.reload_if_changed() {
            Ok(true) => tracing::info!(
                file = %reloading.first_path().display(),
                "{what} reloaded; new connections use it"
            ),
            Ok(false) => {}
            Err(error) => tracing::warn!(
                %error,
                "{what} files changed but do not load; the previous configuration stays in use"
            ),
        }
    }
}
