//! The file-system side of the front end, shared by the `lyra` CLI and the controller:
//! finding workflows on a load path, reading them (and the workflows they call), and reading
//! data files. `lyra-core` stays pure; this is where the reading happens.

use std::path::{Path, PathBuf};

use lyra_core::diag::{Diagnostics, Sources};
pub use lyra_core::program::check_workflow_name;
use lyra_core::program::{self, Program, WorkflowSource};
use lyra_core::schema::SchemaRegistry;
use lyra_core::value::{Map, Value};
use lyra_core::yaml::{parse_data, parse_value};

/// A directory where workflows are found by name: `a::b` is `<dir>/a/b.yaml` (or `.yml`).
///
/// Names are checked ([`check_workflow_name`]) and the file they lead to must really be inside
/// the directory once symbolic links are resolved: a name never reaches a file elsewhere, and
/// a refused file is never read (so no message can quote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPath {
    dir: PathBuf,
}

/// Why a workflow name did not lead to a file on the load path.
#[derive(Debug)]
pub enum LookupError {
    /// Not an `a::b` name (see [`check_workflow_name`]).
    InvalidName { name: String, reason: String },
    /// No file for the name; `looked_for` is `<dir>/a/b.yaml`.
    NotFound {
        looked_for: PathBuf,
        /// The load path, when it does not exist itself.
        missing_dir: Option<PathBuf>,
    },
    /// The file is a symbolic link (or lies in a linked directory) leading out of the load path.
    OutsideLoadPath { path: PathBuf, dir: PathBuf },
    /// The file exists but cannot be read.
    Read { path: PathBuf, source: std::io::Error },
}

impl LookupError {
    /// A short machine-readable reason, e.g. for a Kubernetes condition.
    pub fn reason(&self) -> &'static str {
        match self {
            LookupError::InvalidName { .. } => "InvalidWorkflowName",
            LookupError::NotFound { .. } => "WorkflowNotFound",
            LookupError::OutsideLoadPath { .. } => "WorkflowOutsideLoadPath",
            LookupError::Read { .. } => "WorkflowUnreadable",
        }
    }
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LookupError::InvalidName { name, reason } => write!(f, "{name:?} is not a workflow name: {reason}"),
            LookupError::NotFound {
                looked_for,
                missing_dir: None,
            } => write!(f, "no {}", looked_for.display()),
            LookupError::NotFound {
                looked_for,
                missing_dir: Some(dir),
            } => write!(f, "no {} ({} does not exist)", looked_for.display(), dir.display()),
            LookupError::OutsideLoadPath { path, dir } => write!(
                f,
                "{} leads outside the load path {} (through a symbolic link): refused",
                path.display(),
                dir.display()
            ),
            LookupError::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for LookupError {}

impl LoadPath {
    pub fn new(dir: impl Into<PathBuf>) -> LoadPath {
        LoadPath { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file defining workflow `name`, as a path under [`Self::dir`] (for messages); it is
    /// checked to be inside the load path.
    pub fn find(&self, name: &str) -> Result<PathBuf, LookupError> {
        self.resolve(name).map(|(shown, _)| shown)
    }

    /// Reads workflow `name`: its display path and text.
    pub fn read(&self, name: &str) -> Result<(String, String), LookupError> {
        let (shown, real) = self.resolve(name)?;
        // The resolved path, which was checked: not the name's path again, whose links could
        // have been changed since.
        let text = std::fs::read_to_string(&real).map_err(|source| LookupError::Read {
            path: shown.clone(),
            source,
        })?;
        Ok((shown.display().to_string(), text))
    }

    /// (path under the load path for messages, canonical path to read).
    fn resolve(&self, name: &str) -> Result<(PathBuf, PathBuf), LookupError> {
        check_workflow_name(name).map_err(|reason| LookupError::InvalidName {
            name: name.to_owned(),
            reason,
        })?;
        let rel = name.replace("::", "/");
        let Some(shown) = ["yaml", "yml"]
            .iter()
            .map(|ext| self.dir.join(format!("{rel}.{ext}")))
            .find(|p| p.is_file())
        else {
            return Err(LookupError::NotFound {
                looked_for: self.dir.join(format!("{rel}.yaml")),
                missing_dir: (!self.dir.is_dir()).then(|| self.dir.clone()),
            });
        };
        let read_error = |source| LookupError::Read {
            path: shown.clone(),
            source,
        };
        let dir = self.dir.canonicalize().map_err(read_error)?;
        let real = shown.canonicalize().map_err(read_error)?;
        if !real.starts_with(&dir) {
            return Err(LookupError::OutsideLoadPath {
                path: shown,
                dir: self.dir.clone(),
            });
        }
        Ok((shown, real))
    }
}

impl WorkflowSource for LoadPath {
    fn fetch(&mut self, name: &str) -> Option<(String, String)> {
        self.read(name).ok()
    }
}

/// Parses and validates `main` (display path and text, already read) and every workflow it
/// calls, which are read from `load_path`. All problems come back at once.
pub fn load_program(
    main_name: &str,
    main: (String, String),
    load_path: &LoadPath,
    schemas: &SchemaRegistry,
    sources: &mut Sources,
) -> Result<Program, Diagnostics> {
    let mut source = load_path.clone();
    program::load(main_name, main, &mut source, sources, schemas)
}

/// Why a data file could not be used.
#[derive(Debug)]
pub enum DataError {
    Read(std::io::Error),
    /// Not valid data YAML; the diagnostics point into the file (added to `sources`).
    Invalid(Diagnostics),
}

/// Reads a data file (YAML mapping) for `lookup:`.
pub fn read_data_file(path: &Path, sources: &mut Sources) -> Result<Map, DataError> {
    let text = std::fs::read_to_string(path).map_err(DataError::Read)?;
    let file = sources.add(path.display().to_string(), text.clone());
    parse_data(file, &text).map_err(DataError::Invalid)
}

/// The value of a `--var key=VALUE`: what it would mean in a data file (`false` is a Boolean,
/// `3` an Integer, `{a: 1}` a Hash, `'08'` a String). Plain text that is not valid YAML
/// (`a: b`) stays text; an error only for text that looks like a quoted or flow value.
pub fn parse_var_value(raw: &str) -> Result<Value, String> {
    match parse_value(raw) {
        Ok(v) => Ok(v),
        Err(_) if !raw.starts_with(['{', '[', '"', '\'']) => Ok(Value::String(raw.to_owned())),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_names_and_both_extensions() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/b.yml"), "steps: {}\n").unwrap();
        std::fs::write(dir.path().join("top.yaml"), "steps: {}\n").unwrap();
        let lp = LoadPath::new(dir.path());
        assert_eq!(lp.find("a::b").unwrap(), dir.path().join("a/b.yml"));
        assert_eq!(lp.find("top").unwrap(), dir.path().join("top.yaml"));
        assert_eq!(lp.read("top").unwrap().1, "steps: {}\n");
        let missing = lp.find("x::y").unwrap_err();
        assert!(matches!(missing, LookupError::NotFound { missing_dir: None, .. }));
        assert!(missing.to_string().ends_with("/x/y.yaml"), "{missing}");
        let gone = LoadPath::new("/nonexistent").find("x").unwrap_err().to_string();
        assert_eq!(gone, "no /nonexistent/x.yaml (/nonexistent does not exist)");
    }

    /// Names that would leave the directory are refused before any file is looked at.
    #[test]
    fn names_never_leave_the_load_path() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("workflows");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(root.path().join("secret.yaml"), "password: hunter2\n").unwrap();
        let lp = LoadPath::new(&dir);
        let abs = root.path().join("secret");
        for name in [
            "../secret",
            "sub::..::..::secret",
            "..::secret",
            abs.to_str().unwrap(),
            "sub/../../secret",
        ] {
            let err = lp.read(name).unwrap_err();
            assert!(matches!(err, LookupError::InvalidName { .. }), "{name}: {err:?}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    /// A link inside the load path that leads out of it is refused (and not read); one that
    /// stays inside works.
    #[cfg(unix)]
    #[test]
    fn links_out_of_the_load_path_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("workflows");
        std::fs::create_dir_all(dir.join("real")).unwrap();
        std::fs::write(root.path().join("secret.yaml"), "password: hunter2\n").unwrap();
        std::fs::write(dir.join("real/ok.yaml"), "steps: {}\n").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret.yaml"), dir.join("evil.yaml")).unwrap();
        std::os::unix::fs::symlink(root.path(), dir.join("up")).unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("alias")).unwrap();
        let lp = LoadPath::new(&dir);
        for name in ["evil", "up::secret"] {
            let err = lp.read(name).unwrap_err();
            assert!(matches!(err, LookupError::OutsideLoadPath { .. }), "{name}: {err:?}");
            assert_eq!(err.reason(), "WorkflowOutsideLoadPath");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        assert_eq!(lp.read("alias::ok").unwrap().1, "steps: {}\n");
        // Through a linked load path too: what counts is where the files really are.
        std::os::unix::fs::symlink(&dir, root.path().join("linked")).unwrap();
        let linked = LoadPath::new(root.path().join("linked"));
        assert!(linked.read("real::ok").is_ok());
        assert!(matches!(linked.read("evil"), Err(LookupError::OutsideLoadPath { .. })));
    }

    #[test]
    fn var_values_mean_what_they_mean_in_data() {
        assert_eq!(parse_var_value("3"), Ok(Value::from(3)));
        assert_eq!(parse_var_value("false"), Ok(Value::Bool(false)));
        assert_eq!(parse_var_value("a: b"), Ok(Value::String("a: b".into())));
        assert!(parse_var_value("{a: ").is_err());
    }
}
