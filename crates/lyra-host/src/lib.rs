//! The file-system side of the front end, shared by the `lyra` CLI and the controller:
//! finding workflows on a load path, reading them (and the workflows they call), and reading
//! data files. `lyra-core` stays pure; this is where the reading happens.

use std::path::{Path, PathBuf};

use lyra_core::diag::{Diagnostic, Diagnostics, Sources, Span};
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

    /// Reads workflow `name`: its display path and text (see [`read_text`]). `Ok(None)` when
    /// there is no such file; a file that exists but cannot be read or decoded is an error, not
    /// "not found".
    pub fn read(&self, name: &str) -> Result<Option<(String, String)>, (String, ReadError)> {
        let Some(p) = self.find(name) else {
            return Ok(None);
        };
        let shown = p.display().to_string();
        match read_text(&p) {
            Ok(text) => Ok(Some((shown, text))),
            Err(e) => Err((shown, e)),
        }
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

/// The workflows a program calls, read from a load path; files that exist but cannot be read
/// are kept aside, to be reported as what they are rather than as unknown workflows.
struct Reading<'a> {
    load_path: &'a LoadPath,
    unreadable: Vec<(String, ReadError)>,
}

impl WorkflowSource for Reading<'_> {
    fn fetch(&mut self, name: &str) -> Option<(String, String)> {
        match self.load_path.read(name) {
            Ok(found) => found,
            Err(e) => {
                self.unreadable.push(e);
                None
            }
        }
    }
}

/// Parses and validates `main` (display path and text, already read) and every workflow it
/// calls, which are read from `load_path`. All problems come back at once; a called workflow
/// whose file cannot be read or is not UTF-8 is reported by itself (its callers would only
/// say it is unknown).
pub fn load_program(
    main_name: &str,
    main: (String, String),
    load_path: &LoadPath,
    schemas: &SchemaRegistry,
    sources: &mut Sources,
) -> Result<Program, Diagnostics> {
    let mut reading = Reading {
        load_path,
        unreadable: Vec::new(),
    };
    let (path, text) = main;
    let loaded = program::load(main_name, (path, strip_bom(text)), &mut reading, sources, schemas);
    if reading.unreadable.is_empty() {
        return loaded;
    }
    let mut diags = Diagnostics::default();
    for (path, e) in reading.unreadable {
        diags.extend(e.diagnostics(&path, sources));
    }
    Err(diags)
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
        assert_eq!(lp.find("a::b"), Some(dir.path().join("a/b.yml")));
        assert_eq!(lp.find("top"), Some(dir.path().join("top.yaml")));
        assert_eq!(lp.find("missing"), None);
        assert!(lp.not_found("x::y").ends_with("/x/y.yaml"));
        assert!(LoadPath::new("/nonexistent").not_found("x").contains("does not exist"));
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
