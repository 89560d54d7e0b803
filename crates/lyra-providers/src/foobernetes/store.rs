//! The Foobernetes file: loading, and serialized, atomic load-modify-save.
//!
//! The engine runs steps in parallel, and several `lyra` processes (the CLI and the controller,
//! say, applying different deployments) may share one file, so every change holds a lock for its
//! whole load-modify-save; otherwise two creates could both load the old file and one would lose
//! the other's entry. The lock is two-level:
//!
//! - an OS advisory lock (`flock`, `LockFileEx`) on `<file>.lock`, exclusive for changes and
//!   shared for [`Store::view`], which serializes processes. It is taken on a file of its own
//!   because saves rename a new `deployment.json` over the old one: a lock on the data file
//!   would stay with the replaced inode and a later opener would lock another file;
//! - an in-process mutex, taken first, so that the tasks of one process queue on it rather than
//!   each parking a blocking-pool thread on the OS lock, and so that the process stays
//!   serialized where the OS lock is per process rather than per open file (`flock` emulated
//!   over NFS) or unsupported.
//!
//! Saves write a temporary file in the same directory, fsync it and rename it over the old one,
//! so a crash leaves the old or the new file, never half of one, and a read of the deployment
//! alone ([`Store::load`]) needs no lock. The blocking file work, waiting for the OS lock
//! included, runs on tokio's blocking pool.
//!
//! The idempotency index (see [`super::keys`]) lives in a second file, loaded and saved under
//! the same lock. The two cannot be replaced together, so the order of the writes keeps one
//! invariant across crashes: *every resource in the deployment has its key in the index*. A key
//! is written before the resource it names (a crash in between leaves a dangling key, whose id
//! the retried create reuses) and dropped after it (a crash in between leaves a dangling key,
//! which reads as absent). The reverse orders could leave a resource no key finds, which the
//! engine would then create a second time.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lyra_core::provider::ProviderError;
use tokio::sync::Mutex;

use super::gojson;
use super::keys::{self, Keys};
use super::model::{Deployment, Session};

/// Everything the provider keeps on disk: the deployment and its idempotency index.
#[derive(Debug, Default)]
pub(crate) struct Cloud {
    pub deployment: Deployment,
    pub keys: Keys,
}

#[derive(Debug)]
pub(crate) struct Store {
    path: PathBuf,
    session: Arc<Mutex<Session>>,
}

impl Store {
    pub(crate) fn new(path: PathBuf) -> Self {
        Store {
            path,
            session: Arc::default(),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The current deployment; a missing file is an empty cloud.
    pub(crate) async fn load(&self) -> Result<Deployment, ProviderError> {
        let path = self.path.clone();
        blocking(move || load(&path)).await
    }

    /// Runs `f` on the current deployment and index under the exclusive lock and saves the
    /// result: the deployment when `f` says it changed (its second return value), the index when
    /// a key was added or dropped, in the order that keeps every resource findable by its key.
    pub(crate) async fn modify<T, F>(&self, f: F) -> Result<T, ProviderError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Cloud, &mut Session) -> Result<(T, bool), ProviderError> + Send + 'static,
    {
        // The guard moves into the blocking task: should the caller give up waiting, the lock is
        // still held until the file work it started has finished.
        let mut session = Arc::clone(&self.session).lock_owned().await;
        let path = self.path.clone();
        blocking(move || {
            let _locked = lock(&path, Mode::Exclusive)?;
            let keys_path = keys::path_for(&path);
            let mut cloud = Cloud {
                deployment: load(&path)?,
                keys: load_keys(&keys_path)?,
            };
            let (out, changed) = f(&mut cloud, &mut session)?;
            if cloud.keys.added() {
                save_keys(&keys_path, &cloud.keys)?;
            }
            if changed {
                save(&path, &cloud.deployment)?;
            }
            if cloud.keys.removed() && !cloud.keys.added() {
                save_keys(&keys_path, &cloud.keys)?;
            }
            Ok(out)
        })
        .await
    }

    /// Runs `f` on the current deployment and index as one snapshot: under the shared lock, so
    /// that no change (from this process or another) lands between reading the two files.
    pub(crate) async fn view<T, F>(&self, f: F) -> Result<T, ProviderError>
    where
        T: Send + 'static,
        F: FnOnce(&Cloud) -> Result<T, ProviderError> + Send + 'static,
    {
        // Also the in-process mutex: where the OS lock is per process (see the module docs),
        // a view ending would release the lock a concurrent view of this process still needs.
        let guard = Arc::clone(&self.session).lock_owned().await;
        let path = self.path.clone();
        blocking(move || {
            let _guard = guard;
            let _locked = lock(&path, Mode::Shared)?;
            let cloud = Cloud {
                deployment: load(&path)?,
                keys: load_keys(&keys::path_for(&path))?,
            };
            f(&cloud)
        })
        .await
    }
}

/// The lock file of the Foobernetes file `path`: `<file>.lock`.
pub(crate) fn lock_path_for(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Shared,
    Exclusive,
}

/// Takes the OS lock on the lock file of `path`, waiting for it; it is released when the
/// returned file is dropped (closed). `None` where the platform has no such locks, or for a
/// shared lock where the lock file neither exists nor can be made (see below).
fn lock(path: &Path, mode: Mode) -> Result<Option<File>, ProviderError> {
    let lock_path = lock_path_for(path);
    let failed = |e: io::Error| {
        ProviderError::Other(format!(
            "cannot lock Foobernetes lock file {}: {e}",
            lock_path.display()
        ))
    };
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
    {
        Ok(file) => file,
        // A reader may lack write access to the directory (another user's cloud, a read-only
        // mount); a shared lock needs only a readable lock file, and where there is none and
        // none can be made, no lyra can be changing the cloud through one either.
        Err(e) if mode == Mode::Shared && is_read_only(&e) => match File::open(&lock_path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(failed(e)),
        },
        Err(e) => return Err(failed(e)),
    };
    let locked = match mode {
        Mode::Shared => file.lock_shared(),
        Mode::Exclusive => file.lock(),
    };
    match locked {
        Ok(()) => Ok(Some(file)),
        // Platforms std has no file locks for: the in-process mutex is all there is.
        Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

fn is_read_only(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
    )
}

async fn blocking<T, F>(f: F) -> Result<T, ProviderError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ProviderError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProviderError::Other(format!("Foobernetes file operation failed: {e}")))?
}

pub(crate) fn load(path: &Path) -> Result<Deployment, ProviderError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Deployment::default()),
        Err(e) => {
            return Err(ProviderError::Other(format!(
                "cannot read Foobernetes file {}: {e}",
                path.display()
            )));
        }
    };
    // An emptied file (`: > deployment.json`) is a reset cloud, not a corrupt one.
    // A byte-order mark (an editor's) is not part of the JSON.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Deployment::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ProviderError::Other(format!(
            "Foobernetes file {} is not a valid deployment file: {e}",
            path.display()
        ))
    })
}

/// The idempotency index; a missing or emptied file is an empty one.
pub(crate) fn load_keys(path: &Path) -> Result<Keys, ProviderError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Keys::default()),
        Err(e) => {
            return Err(ProviderError::Other(format!(
                "cannot read Foobernetes key file {}: {e}",
                path.display()
            )));
        }
    };
    // A byte-order mark (an editor's) is not part of the JSON.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Keys::default());
    }
    serde_json::from_slice(bytes).map(Keys::from_map).map_err(|e| {
        ProviderError::Other(format!(
            "Foobernetes key file {} is not a valid key file (a JSON object of key to id): {e}",
            path.display()
        ))
    })
}

fn save_keys(path: &Path, keys: &Keys) -> Result<(), ProviderError> {
    let mut bytes = serde_json::to_vec_pretty(keys.as_map()).map_err(ProviderError::other)?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
        .map_err(|e| ProviderError::Other(format!("cannot write Foobernetes key file {}: {e}", path.display())))
}

pub(crate) fn save(path: &Path, deployment: &Deployment) -> Result<(), ProviderError> {
    let bytes = gojson::to_vec(deployment).map_err(ProviderError::other)?;
    write_atomic(path, &bytes)
        .map_err(|e| ProviderError::Other(format!("cannot write Foobernetes file {}: {e}", path.display())))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    // In the same directory, so the rename is atomic; removed when anything fails.
    let prefix = format!(".{}.", name.to_string_lossy());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    // A new file gets what any new file would (the umask applies), not the 0600 of a
    // temporary one.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut tmp = builder.tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    // Keep whatever permissions the user gave the file.
    if let Ok(meta) = fs::metadata(path) {
        tmp.as_file().set_permissions(meta.permissions())?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // Makes the rename itself durable; not possible everywhere (Windows), hence best effort.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_replace_whole_files_and_keep_permissions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("deployment.json");
        write_atomic(&path, b"one").expect("write");
        assert_eq!(fs::read(&path).expect("read"), b"one");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
            // A new file: as any new file (the umask applies), not a temporary file's 0600.
            let plain = dir.path().join("plain");
            File::create(&plain).expect("create");
            assert_eq!(mode(&path), mode(&plain));
            // An existing file keeps what the user gave it.
            fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).expect("chmod");
            write_atomic(&path, b"two").expect("write");
            assert_eq!(mode(&path), 0o640);
        }
        assert_eq!(fs::read(&path).expect("read"), b"two");
        // Nothing left behind.
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
