//! The file-system side of the front end, shared by the `lyra` CLI and the controller:
//! finding workflows on a load path, reading them (and the workflows they call), and reading
//! data files. `lyra-core` stays pure; this is where the reading happens.

use std::path::{Path, PathBuf};

use lyra_core::diag::{Diagnostics, Sources};
use lyra_core::program::{self, Program, WorkflowSource};
use lyra_core::schema::SchemaRegistry;
use lyra_core::value::{Map, Value};
use lyra_core::yaml::{parse_data, parse_value};

/// A directory where workflows are found by name: `a::b` is `<dir>/a/b.yaml` (or `.yml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPath {
    dir: PathBuf,
}

impl LoadPath {
    pub fn new(dir: impl Into<PathBuf>) -> LoadPath {
        LoadPath { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file defining workflow `name`, if there is one.
    pub fn find(&self, name: &str) -> Option<PathBuf> {
        let rel = name.replace("::", "/");
        ["yaml", "yml"]
            .iter()
            .map(|ext| self.dir.join(format!("{rel}.{ext}")))
            .find(|p| p.is_file())
    }

    /// Reads workflow `name`: its display path and text.
    pub fn read(&self, name: &str) -> Option<(String, String)> {
        let p = self.find(name)?;
        let text = std::fs::read_to_string(&p).ok()?;
        Some((p.display().to_string(), text))
    }

    /// Why `name` was not found, for an error message: the file that was looked for, and
    /// whether the directory itself is missing.
    pub fn not_found(&self, name: &str) -> String {
        format!(
            "no {}/{}.yaml{}",
            self.dir.display(),
            name.replace("::", "/"),
            if self.dir.is_dir() {
                String::new()
            } else {
                format!(" ({} does not exist)", self.dir.display())
            }
        )
    }
}

impl WorkflowSource for LoadPath {
    fn fetch(&mut self, name: &str) -> Option<(String, String)> {
        self.read(name)
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
        assert_eq!(lp.find("a::b"), Some(dir.path().join("a/b.yml")));
        assert_eq!(lp.find("top"), Some(dir.path().join("top.yaml")));
        assert_eq!(lp.find("missing"), None);
        assert!(lp.not_found("x::y").ends_with("/x/y.yaml"));
        assert!(LoadPath::new("/nonexistent").not_found("x").contains("does not exist"));
    }

    #[test]
    fn var_values_mean_what_they_mean_in_data() {
        assert_eq!(parse_var_value("3"), Ok(Value::from(3)));
        assert_eq!(parse_var_value("false"), Ok(Value::Bool(false)));
        assert_eq!(parse_var_value("a: b"), Ok(Value::String("a: b".into())));
        assert!(parse_var_value("{a: ").is_err());
    }
}
