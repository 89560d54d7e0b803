//! The Foobernetes file: loading, and serialized, atomic load-modify-save.
//!
//! The engine runs steps in parallel, so every change holds one lock for its whole
//! load-modify-save; otherwise two creates could both load the old file and one would lose the
//! other's entry. Saves write a temporary file in the same directory, fsync it and rename it over
//! the old one, so a crash leaves the old or the new file, never half of one, and reads need no
//! lock. The blocking file work runs on tokio's blocking pool.
//!
//! A later idempotency index (a side file mapping `OpContext::idempotency_key` to ids) belongs
//! in the same critical section as the deployment, loaded and saved by [`Store::modify`].

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lyra_core::provider::ProviderError;
use tokio::sync::Mutex;

use super::gojson;
use super::model::{Deployment, Session};

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

    /// Runs `f` on the current deployment under the lock and saves the result when `f` says it
    /// changed something (its second return value).
    pub(crate) async fn modify<T, F>(&self, f: F) -> Result<T, ProviderError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Deployment, &mut Session) -> Result<(T, bool), ProviderError> + Send + 'static,
    {
        // The guard moves into the blocking task: should the caller give up waiting, the lock is
        // still held until the file work it started has finished.
        let mut session = Arc::clone(&self.session).lock_owned().await;
        let path = self.path.clone();
        blocking(move || {
            let mut deployment = load(&path)?;
            let (out, changed) = f(&mut deployment, &mut session)?;
            if changed {
                save(&path, &deployment)?;
            }
            Ok(out)
        })
        .await
    }
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
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Deployment::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ProviderError::Other(format!(
            "Foobernetes file {} is not a valid deployment file: {e}",
            path.display()
        ))
    })
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
    let tmp = dir.join(format!(
        ".{}.{}-{:08x}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        rand::random::<u32>()
    ));
    let written = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        file.write_all(bytes)?;
        // Keep whatever permissions the user gave the file.
        if let Ok(meta) = fs::metadata(path) {
            file.set_permissions(meta.permissions())?;
        }
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    // Makes the rename itself durable; not possible everywhere (Windows), hence best effort.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
