//! Writing files so that a reader or a crash sees the old file or the new one, never half of
//! one: a temporary file beside it, synced, renamed over it, and the directory synced.

use std::io::Write as _;
use std::path::Path;

/// Who may read the new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// As the file being replaced (owner and permissions kept; a read-only one is refused,
    /// as renaming over it would silently change a file its owner protected). A linked file
    /// is written where it really is, so the link stays.
    Keep,
    /// Its owner only (0600): files that say what a deployment holds (saved plans).
    Private,
}

pub fn replace(path: &Path, bytes: &[u8], mode: Mode) -> std::io::Result<()> {
    let (target, keep) = match mode {
        Mode::Keep => {
            let real = std::fs::canonicalize(path)?;
            let meta = std::fs::metadata(&real)?;
            if meta.permissions().readonly() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "the file is read-only",
                ));
            }
            (real, Some(meta))
        }
        Mode::Private => (path.to_path_buf(), None),
    };
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    // `tempfile` creates the file with mode 0600.
    let mut tmp = tempfile::Builder::new()
        .prefix(".lyra-")
        .suffix(".tmp")
        .tempfile_in(&dir)?;
    tmp.write_all(bytes)?;
    if let Some(meta) = &keep {
        tmp.as_file().set_permissions(meta.permissions())?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt as _;
            // Only root can give a file to another owner; for a file of our own this changes
            // nothing, and otherwise the file becomes ours, as any editor's save would make it.
            let _ = std::os::unix::fs::fchown(tmp.as_file(), Some(meta.uid()), Some(meta.gid()));
        }
    }
    tmp.as_file().sync_all()?;
    tmp.persist(&target).map_err(|e| e.error)?;
    // The rename itself is durable once the directory is synced.
    #[cfg(unix)]
    std::fs::File::open(&dir)?.sync_all()?;
    Ok(())
}
