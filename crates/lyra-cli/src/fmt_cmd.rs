//! `lyra fmt`: workflow files in their canonical layout (`lyra_core::fmt`, which also refuses
//! any result that would not mean what the file means). Files are rewritten atomically;
//! `--check` and `--diff` write nothing; `-` formats stdin to stdout.

use std::collections::HashSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use lyra_core::diag::{Diagnostics, Sources, Span};
use lyra_host::ReadError;
use serde::Serialize;

use crate::args::{FmtArgs, Output};
use crate::exit::Exit;
use crate::output::{DiagnosticJson, diagnostics_json};
use crate::{json, print, warn};

/// How stdin is named in messages and in `-o json`.
const STDIN: &str = "-";

/// `lyra fmt -o json`: one row per file, in the order they were formatted.
#[derive(Debug, Serialize)]
struct FmtJson {
    files: Vec<FileJson>,
    /// Files changed (or, with --check or --diff, that would be).
    changed: usize,
}

#[derive(Debug, Serialize)]
struct FileJson {
    path: String,
    /// The file is not in its canonical form (false when it could not be formatted).
    changed: bool,
    /// Why it could not be formatted (empty when it was); it is then left as it is.
    diagnostics: Vec<DiagnosticJson>,
    /// With --diff: the unified diff of the change, if any.
    diff: Option<String>,
    /// Formatting stdin (`-`): the formatted text.
    #[serde(skip_serializing_if = "Option::is_none")]
    formatted: Option<String>,
}

/// What became of one file.
enum Outcome {
    /// The text read, its canonical form, and whether that differs from the file's bytes.
    Formatted {
        before: String,
        text: String,
        changed: bool,
    },
    Failed(Diagnostics),
}

pub fn fmt(a: &FmtArgs, out: Output) -> Result<(), Exit> {
    if a.paths.iter().any(|p| p.as_os_str() == STDIN) {
        if a.paths.len() > 1 {
            return Err(Exit::usage("`-` (stdin) cannot be formatted together with files"));
        }
        return stdin(a, out);
    }
    let files = files(a)?;
    let mut sources = Sources::default();
    let mut rows = Vec::new();
    let (mut changed, mut failed) = (0, 0);
    for path in &files {
        let shown = path.display().to_string();
        let outcome = match std::fs::read(path) {
            Ok(bytes) => format_bytes(&shown, bytes, &mut sources),
            Err(e) => Outcome::Failed(ReadError::Io(e).diagnostics(&shown, &mut sources)),
        };
        let outcome = match outcome {
            Outcome::Formatted {
                before,
                text,
                changed: true,
            } if !a.check && !a.diff => match crate::files::replace(path, text.as_bytes(), crate::files::Mode::Keep) {
                Ok(()) => Outcome::Formatted {
                    before,
                    text,
                    changed: true,
                },
                Err(e) => {
                    let file = sources.add(&shown, "");
                    let mut d = Diagnostics::default();
                    d.error(Span::new(file, 0, 0), format!("cannot write {shown}: {e}"));
                    Outcome::Failed(d)
                }
            },
            other => other,
        };
        let mut row = FileJson {
            path: shown.clone(),
            changed: false,
            diagnostics: Vec::new(),
            diff: None,
            formatted: None,
        };
        match outcome {
            Outcome::Failed(d) => {
                failed += 1;
                if out == Output::Text {
                    warn(&format!("{}\n", d.render(&sources).trim_end()));
                }
                row.diagnostics = diagnostics_json(&d, &sources);
            }
            Outcome::Formatted {
                before,
                text,
                changed: is_changed,
            } => {
                row.changed = is_changed;
                if is_changed {
                    changed += 1;
                    if a.diff {
                        row.diff = Some(unified_diff(&shown, &before, &text));
                    }
                    if out == Output::Text {
                        match &row.diff {
                            Some(diff) => print(diff)?,
                            None => print(&format!("{shown}\n"))?,
                        }
                    }
                }
            }
        }
        rows.push(row);
    }
    finish(out, a.check, rows, changed, failed)
}

/// Formats one file's bytes. Its text is added to `sources` under `shown`.
fn format_bytes(shown: &str, bytes: Vec<u8>, sources: &mut Sources) -> Outcome {
    let original = bytes.clone();
    let text = match lyra_host::decode_text(bytes) {
        Ok(text) => text,
        Err(e) => return Outcome::Failed(ReadError::NotUtf8(e).diagnostics(shown, sources)),
    };
    let file = sources.add(shown, text.clone());
    match lyra_core::fmt::format(&text) {
        Ok(formatted) => {
            // Against the bytes, not the decoded text: a byte-order mark dropped is a change.
            let changed = formatted.as_bytes() != original.as_slice();
            Outcome::Formatted {
                before: text,
                text: formatted,
                changed,
            }
        }
        Err(e) => {
            let mut d = Diagnostics::default();
            d.push(e.diagnostic(file));
            Outcome::Failed(d)
        }
    }
}

/// How the command ends: `-o json`'s one document, and exit 1 when a file could not be
/// formatted or, with --check, when one is not formatted.
fn finish(out: Output, check: bool, files: Vec<FileJson>, changed: usize, failed: usize) -> Result<(), Exit> {
    let not_formatted = check && changed > 0;
    if out == Output::Json {
        json(&FmtJson { files, changed })?;
        return if failed > 0 || not_formatted {
            Err(Exit::reported(Exit::FAILURE))
        } else {
            Ok(())
        };
    }
    if failed > 0 {
        return Err(Exit::invalid_input(format!(
            "{failed} file{} could not be formatted (left as {})",
            plural(failed),
            if failed == 1 { "it was" } else { "they were" },
        )));
    }
    if not_formatted {
        return Err(Exit::failure(format!(
            "{changed} file{} not formatted: `lyra fmt` formats {}",
            if changed == 1 { " is" } else { "s are" },
            if changed == 1 { "it" } else { "them" },
        )));
    }
    Ok(())
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `lyra fmt -`: stdin formatted to stdout (with --check, nothing printed; with --diff, the
/// diff).
fn stdin(a: &FmtArgs, out: Output) -> Result<(), Exit> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .map_err(|e| Exit::failure(format!("reading stdin: {e}")))?;
    let mut sources = Sources::default();
    let outcome = format_bytes(STDIN, bytes, &mut sources);
    let mut row = FileJson {
        path: STDIN.to_owned(),
        changed: false,
        diagnostics: Vec::new(),
        diff: None,
        formatted: None,
    };
    let (changed, failed) = match outcome {
        Outcome::Failed(d) => {
            if out == Output::Text {
                warn(&format!("{}\n", d.render(&sources).trim_end()));
            }
            row.diagnostics = diagnostics_json(&d, &sources);
            (0, 1)
        }
        Outcome::Formatted { before, text, changed } => {
            row.changed = changed;
            if a.diff && changed {
                row.diff = Some(unified_diff(STDIN, &before, &text));
            }
            if out == Output::Text {
                match (&row.diff, a.check || a.diff) {
                    (Some(diff), _) => print(diff)?,
                    (None, true) => {}
                    (None, false) => print(&text)?,
                }
            }
            row.formatted = Some(text);
            (usize::from(changed), 0)
        }
    };
    if out == Output::Text && failed > 0 {
        return Err(Exit::invalid_input("stdin could not be formatted"));
    }
    if out == Output::Text && a.check && changed > 0 {
        return Err(Exit::failure("stdin is not formatted"));
    }
    finish(out, a.check, vec![row], changed, failed)
}

/// The files to format, each once, in a stable order: the paths given (a directory stands for
/// every `*.yaml` and `*.yml` beneath it, hidden files and directories left out), or the load
/// path.
fn files(a: &FmtArgs) -> Result<Vec<PathBuf>, Exit> {
    let roots: Vec<PathBuf> = if !a.paths.is_empty() {
        a.paths.clone()
    } else if let Some(dir) = &a.workflows {
        vec![dir.clone()]
    } else if Path::new("workflows").is_dir() {
        vec![PathBuf::from("workflows")]
    } else {
        vec![PathBuf::from(".")]
    };
    let mut files = Vec::new();
    for root in &roots {
        // Following links: a linked workflow is formatted where it really is.
        match std::fs::metadata(root) {
            Ok(m) if m.is_dir() => walk(root, &mut files)
                .map_err(|e| Exit::usage(format!("cannot read directory {}: {e}", root.display())))?,
            Ok(_) => files.push(root.clone()),
            Err(e) => return Err(Exit::usage(format!("{}: {e}", root.display()))),
        }
    }
    // A file reached twice (named and inside a directory given, or through a link) is
    // formatted once.
    let mut seen = HashSet::new();
    files.retain(|f| seen.insert(std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())));
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Linked directories are not entered (they can loop); linked files are formatted.
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&path, files)?;
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") && path.is_file() {
            files.push(path);
        }
    }
    Ok(())
}

/// The unified diff (3 lines of context) from `old` to `new`, both named `path`.
fn unified_diff(path: &str, old: &str, new: &str) -> String {
    let diff = similar::TextDiff::configure()
        // Bounded: a pathological pair of files gets a coarser diff, not a stuck command.
        .timeout(std::time::Duration::from_secs(2))
        .diff_lines(old, new);
    let mut out = format!("--- {path}\n+++ {path}\n");
    out.push_str(&diff.unified_diff().context_radius(3).to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_are_unified_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n";
        let new = "a\nB\nc\nd\ne\nf\ng\nh\ni\nj\nK\n";
        assert_eq!(
            unified_diff("w.yaml", old, new),
            "--- w.yaml\n+++ w.yaml\n@@ -1,5 +1,5 @@\n a\n-b\n+B\n c\n d\n e\n@@ -8,4 +8,4 @@\n h\n i\n j\n-k\n+K\n"
        );
        assert_eq!(unified_diff("w", "x\n", "x\n"), "--- w\n+++ w\n");
        assert_eq!(
            unified_diff("w", "x", "x\n"),
            "--- w\n+++ w\n@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+x\n"
        );
        assert_eq!(unified_diff("w", "", "x\n"), "--- w\n+++ w\n@@ -0,0 +1 @@\n+x\n");
    }
}
