//! The file-system side of the front end, shared by the `lyra` CLI and the controller:
//! finding workflows on a load path, reading them (and the workflows they call), and reading
//! data files; and [`Advice`], the advice the engine's messages end with. `lyra-core` stays
//! pure; this is where the reading happens.

mod hints;

use std::path::{Path, PathBuf};

pub use hints::Advice;
use lyra_core::diag::{Diagnostic, Diagnostics, Sources, Span};
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
    /// The file exists but cannot be read, or is not UTF-8.
    Read { path: PathBuf, source: ReadError },
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

    /// Reads workflow `name`: its display path and text (see [`read_text`]).
    pub fn read(&self, name: &str) -> Result<(String, String), LookupError> {
        let (shown, real) = self.resolve(name)?;
        // The resolved path, which was checked: not the name's path again, whose links could
        // have been changed since.
        let text = read_text(&real).map_err(|source| LookupError::Read {
            path: shown.clone(),
            source,
        })?;
        Ok((shown.display().to_string(), text))
    }

    /// The names of the workflows on the load path, sorted: every `.yaml`/`.yml` file whose
    /// name [`check_workflow_name`] accepts (in directories whose names are segments), and
    /// whose real path lies inside the load path: names [`Self::read`] finds. Links are not
    /// followed out of the load path, nor back into a directory being walked (that would make
    /// endless names), and the walk stops after [`Self::MAX_LISTED`] entries: it only feeds a
    /// help message.
    pub fn names(&self) -> Vec<String> {
        let dir = if self.dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            self.dir.as_path()
        };
        let Ok(root) = dir.canonicalize() else {
            return Vec::new();
        };
        let mut names = Vec::new();
        let mut budget = Self::MAX_LISTED;
        // (real directories from the root down to this one, name prefix)
        let mut stack = vec![(vec![root.clone()], String::new())];
        while let Some((chain, prefix)) = stack.pop() {
            let real_dir = chain.last().expect("a directory");
            let Ok(entries) = std::fs::read_dir(real_dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if budget == 0 {
                    break;
                }
                budget -= 1;
                let file_name = entry.file_name();
                let Some(file_name) = file_name.to_str() else {
                    continue;
                };
                let Ok(real) = entry.path().canonicalize() else {
                    continue;
                };
                if !real.starts_with(&root) {
                    continue;
                }
                if real.is_dir() {
                    // A link back to a directory being walked would never end.
                    if check_workflow_name(file_name).is_ok() && !chain.contains(&real) {
                        let mut deeper = chain.clone();
                        deeper.push(real);
                        stack.push((deeper, format!("{prefix}{file_name}::")));
                    }
                    continue;
                }
                let stem = file_name
                    .strip_suffix(".yaml")
                    .or_else(|| file_name.strip_suffix(".yml"));
                if let Some(stem) = stem
                    && real.is_file()
                    && check_workflow_name(stem).is_ok()
                {
                    names.push(format!("{prefix}{stem}"));
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        names
    }

    /// How many directory entries [`Self::names`] looks at, at most.
    pub const MAX_LISTED: usize = 10_000;

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
        let read_error = |e| LookupError::Read {
            path: shown.clone(),
            source: ReadError::Io(e),
        };
        // An empty directory is the working directory (a bare file name's parent).
        let dir = if self.dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            self.dir.as_path()
        };
        let dir = dir.canonicalize().map_err(read_error)?;
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

impl LookupError {
    /// The error as diagnostics about the file it names (added to `sources`): at the offending
    /// byte for text that is not UTF-8, at the top of the file otherwise. Never the file's
    /// contents beyond the valid prefix of a file inside the load path.
    pub fn diagnostics(&self, sources: &mut Sources) -> Diagnostics {
        let shown = match self {
            LookupError::Read { path, source } => return source.diagnostics(&path.display().to_string(), sources),
            LookupError::OutsideLoadPath { path, .. } => path.display().to_string(),
            LookupError::NotFound { looked_for, .. } => looked_for.display().to_string(),
            LookupError::InvalidName { name, .. } => name.clone(),
        };
        let file = sources.add(shown, "");
        let mut d = Diagnostics::default();
        d.push(Diagnostic::new(Span::new(file, 0, 0), self.to_string()));
        d
    }
}

/// The workflows a program calls, read from a load path. Files that exist but cannot be read
/// (or lead out of the load path) are refused: their callers say why, rather than call them
/// unknown workflows.
struct Reading<'a> {
    load_path: &'a LoadPath,
    refused: Vec<(String, LookupError)>,
}

impl WorkflowSource for Reading<'_> {
    fn names(&mut self) -> Option<Vec<String>> {
        Some(self.load_path.names())
    }

    fn refused(&mut self, name: &str) -> Option<String> {
        self.refused
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, e)| e.to_string())
    }

    fn fetch(&mut self, name: &str) -> Option<(String, String)> {
        match self.load_path.read(name) {
            Ok(found) => Some(found),
            // No such workflow (or not a name): the front end reports the unknown call.
            Err(LookupError::NotFound { .. } | LookupError::InvalidName { .. }) => None,
            Err(e) => {
                self.refused.push((name.to_owned(), e));
                None
            }
        }
    }
}

/// Parses and validates `main` (display path and text, already read) and every workflow it
/// calls, which are read from `load_path`. All problems come back at once; a call of a
/// workflow whose file cannot be read, is not UTF-8 or leads out of the load path says so,
/// and text that is not UTF-8 is also pointed at, at the offending byte.
pub fn load_program(
    main_name: &str,
    main: (String, String),
    load_path: &LoadPath,
    schemas: &SchemaRegistry,
    sources: &mut Sources,
) -> Result<Program, Diagnostics> {
    let mut reading = Reading {
        load_path,
        refused: Vec::new(),
    };
    let (path, text) = main;
    let loaded = program::load(main_name, (path, strip_bom(text)), &mut reading, sources, schemas);
    let mut diags = match loaded {
        Ok(program) => return Ok(program),
        Err(d) => d,
    };
    for (_, e) in reading.refused {
        if let LookupError::Read {
            source: source @ ReadError::NotUtf8(_),
            path,
        } = &e
        {
            diags.extend(source.diagnostics(&path.display().to_string(), sources));
        }
    }
    Err(diags.sorted())
}

/// Why a data file could not be used.
#[derive(Debug)]
pub enum DataError {
    Read(std::io::Error),
    /// Not valid data YAML, or not UTF-8; the diagnostics point into the file (added to
    /// `sources`).
    Invalid(Diagnostics),
}

/// Reads a data file (YAML mapping) for `lookup:`.
pub fn read_data_file(path: &Path, sources: &mut Sources) -> Result<Map, DataError> {
    let shown = path.display().to_string();
    let text = match read_text(path) {
        Ok(text) => text,
        Err(ReadError::Io(e)) => return Err(DataError::Read(e)),
        Err(e) => return Err(DataError::Invalid(e.diagnostics(&shown, sources))),
    };
    let file = sources.add(shown, text.clone());
    parse_data(file, &text).map_err(DataError::Invalid)
}

/// Why a text file could not be read.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    /// The bytes are not UTF-8.
    NotUtf8(NotUtf8),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => e.fmt(f),
            ReadError::NotUtf8(e) => e.fmt(f),
        }
    }
}

impl ReadError {
    /// The error as diagnostics about the file `path` (added to `sources`): at the offending
    /// byte for text that is not UTF-8, at the top of the file otherwise.
    pub fn diagnostics(&self, path: &str, sources: &mut Sources) -> Diagnostics {
        let mut d = Diagnostics::default();
        match self {
            ReadError::Io(e) => {
                let file = sources.add(path, "");
                d.push(Diagnostic::new(
                    Span::new(file, 0, 0),
                    format!("cannot read {path}: {e}"),
                ));
            }
            ReadError::NotUtf8(e) => {
                // The text up to the bad byte, so the rendered line shows where it is.
                let file = sources.add(path, e.valid_prefix.clone());
                d.push(
                    Diagnostic::new(Span::new(file, e.line, e.column), e.to_string())
                        .with_help("Lyra reads UTF-8 text (with or without a byte-order mark): save the file as UTF-8"),
                );
            }
        }
        d
    }
}

/// Where a text stops being UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotUtf8 {
    /// Offset of the first bad byte in the file, from 0.
    pub offset: usize,
    /// Its line and column (1-based; the column counts characters).
    pub line: u32,
    pub column: u32,
    pub byte: u8,
    /// The file starts with a UTF-16 byte-order mark.
    pub utf16: bool,
    /// The text before the bad byte.
    pub valid_prefix: String,
}

impl std::fmt::Display for NotUtf8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.utf16 {
            write!(
                f,
                "the file is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8"
            )
        } else {
            write!(
                f,
                "not valid UTF-8: byte 0x{:02X} at byte offset {} (line {}, column {})",
                self.byte, self.offset, self.line, self.column
            )
        }
    }
}

const UTF8_BOM: &str = "\u{feff}";

/// Drops a leading UTF-8 byte-order mark, which some editors write and which is not part of
/// the text.
pub fn strip_bom(text: String) -> String {
    match text.strip_prefix(UTF8_BOM) {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

/// Decodes a file's bytes as Lyra reads every text file (workflows, data, state exports):
/// UTF-8, a leading byte-order mark dropped.
pub fn decode_text(bytes: Vec<u8>) -> Result<String, NotUtf8> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(strip_bom(text)),
        Err(e) => {
            let bytes = e.as_bytes();
            let offset = e.utf8_error().valid_up_to();
            let utf16 = bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]);
            let prefix = std::str::from_utf8(&bytes[..offset]).unwrap_or_default();
            let shown = prefix.strip_prefix(UTF8_BOM).unwrap_or(prefix);
            let line_start = shown.rfind('\n').map_or(0, |i| i + 1);
            Err(NotUtf8 {
                offset,
                line: u32::try_from(shown.matches('\n').count() + 1).unwrap_or(u32::MAX),
                column: u32::try_from(shown[line_start..].chars().count() + 1).unwrap_or(u32::MAX),
                byte: bytes[offset],
                utf16,
                valid_prefix: shown.to_owned(),
            })
        }
    }
}

/// Reads a text file (see [`decode_text`]).
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = std::fs::read(path).map_err(ReadError::Io)?;
    decode_text(bytes).map_err(ReadError::NotUtf8)
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
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        assert_eq!(lp.read("alias::ok").unwrap().1, "steps: {}\n");
        // Through a linked load path too: what counts is where the files really are.
        std::os::unix::fs::symlink(&dir, root.path().join("linked")).unwrap();
        let linked = LoadPath::new(root.path().join("linked"));
        assert!(linked.read("real::ok").is_ok());
        assert!(matches!(linked.read("evil"), Err(LookupError::OutsideLoadPath { .. })));
    }

    /// The names on a load path are those `read` finds: valid names, in directories that are
    /// segments, inside the load path even through links; a link back up is not followed.
    #[cfg(unix)]
    #[test]
    fn lists_the_names_read_would_find() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("workflows");
        for f in [
            "top.yaml",
            "short.yml",
            "net/vpc.yaml",
            "net/deep/zone.yaml",
            "my file.yaml",
            "a.b.yaml",
            ".hidden/x.yaml",
            "notes.txt",
        ] {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "steps: {}\n").unwrap();
        }
        std::fs::create_dir_all(dir.join("empty.yaml")).unwrap();
        std::fs::write(root.path().join("secret.yaml"), "steps: {}\n").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret.yaml"), dir.join("evil.yaml")).unwrap();
        std::os::unix::fs::symlink(root.path(), dir.join("up")).unwrap();
        std::os::unix::fs::symlink(dir.join("net"), dir.join("alias")).unwrap();
        std::os::unix::fs::symlink(&dir, dir.join("net/loop")).unwrap();
        let lp = LoadPath::new(&dir);
        let names = lp.names();
        // Not through the loop (`net::loop::top` reads too, but there are endless such names).
        assert_eq!(
            names,
            [
                "alias::deep::zone",
                "alias::vpc",
                "net::deep::zone",
                "net::vpc",
                "short",
                "top"
            ]
        );
        for name in &names {
            assert!(lp.read(name).is_ok(), "{name}");
        }
        assert!(LoadPath::new(root.path().join("nothing")).names().is_empty());
    }

    #[test]
    fn decodes_utf8_with_or_without_a_bom() {
        assert_eq!(decode_text(b"a: 1\n".to_vec()).unwrap(), "a: 1\n");
        assert_eq!(decode_text(b"\xEF\xBB\xBFa: 1\n".to_vec()).unwrap(), "a: 1\n");
        // Only a leading mark is dropped.
        assert_eq!(decode_text("a\u{feff}".as_bytes().to_vec()).unwrap(), "a\u{feff}");
    }

    #[test]
    fn locates_the_first_byte_that_is_not_utf8() {
        let e = decode_text(b"\xEF\xBB\xBFa: 1\nb: \xC3\xA9\xFFx\n".to_vec()).unwrap_err();
        // Offsets count the file's bytes (mark included); columns count characters.
        assert_eq!((e.offset, e.line, e.column, e.byte), (13, 2, 5, 0xFF));
        assert_eq!(e.valid_prefix, "a: 1\nb: \u{e9}");
        assert!(e.to_string().contains("byte offset 13 (line 2, column 5)"), "{e}");
        let utf16 = decode_text(vec![0xFF, 0xFE, b'a', 0]).unwrap_err();
        assert!(utf16.utf16 && utf16.to_string().contains("UTF-16"), "{utf16}");
    }

    #[test]
    fn unreadable_data_is_invalid_input_at_the_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.yaml");
        std::fs::write(&path, b"a: 1\nb: \xFF\n").unwrap();
        let mut sources = Sources::default();
        let Err(DataError::Invalid(d)) = read_data_file(&path, &mut sources) else {
            panic!("not invalid input");
        };
        let d = d.iter().next().unwrap();
        assert_eq!((d.span.line, d.span.col), (2, 4));
        assert!(sources.location(d.span).ends_with("data.yaml:2:4"));
        std::fs::write(&path, b"\xEF\xBB\xBFa: 1\n").unwrap();
        let data = read_data_file(&path, &mut Sources::default()).unwrap();
        assert_eq!(data.get("a"), Some(&Value::from(1)));
    }

    #[test]
    fn var_values_mean_what_they_mean_in_data() {
        assert_eq!(parse_var_value("3"), Ok(Value::from(3)));
        assert_eq!(parse_var_value("false"), Ok(Value::Bool(false)));
        assert_eq!(parse_var_value("a: b"), Ok(Value::String("a: b".into())));
        assert!(parse_var_value("{a: ").is_err());
    }
}
