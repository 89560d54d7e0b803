//! Source positions and diagnostics: every error about a workflow names its file, line and
//! column, and can be rendered with the offending line and a caret.

use std::fmt;

/// Index of a source file in [`Sources`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FileId(pub u32);

/// A position in a workflow source. Lines and columns are 1-based; line 0 means "unknown".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Span {
    pub file: FileId,
    pub line: u32,
    pub col: u32,
}

impl Span {
    pub fn new(file: FileId, line: u32, col: u32) -> Self {
        Span { file, line, col }
    }

    /// The same position, `n` columns further right (for a `$ref` inside a string).
    pub fn shifted(self, n: usize) -> Self {
        Span {
            col: self.col + n as u32,
            ..self
        }
    }
}

/// One loaded source file.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// How to show the file to a person: the path as given.
    pub name: String,
    pub text: String,
}

/// All source files an engine run has read, so that spans can be shown.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    files: Vec<SourceFile>,
}

impl Sources {
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<String>) -> FileId {
        self.files.push(SourceFile {
            name: name.into(),
            text: text.into(),
        });
        FileId(self.files.len() as u32 - 1)
    }

    pub fn get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
    }

    /// Every file, in the order they were added.
    pub fn files(&self) -> &[SourceFile] {
        &self.files
    }

    /// `file:line:col` for a span.
    pub fn location(&self, span: Span) -> String {
        let name = self.get(span.file).map_or("<unknown>", |f| f.name.as_str());
        if span.line == 0 {
            name.to_owned()
        } else {
            format!("{name}:{}:{}", span.line, span.col)
        }
    }
}

/// An error (or warning) about a workflow, tied to a place in its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub span: Span,
    pub message: String,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            span,
            message: message.into(),
            help: None,
        }
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Renders like rustc: the message, `--> file:line:col`, the source line and a caret.
    pub fn render(&self, sources: &Sources) -> String {
        let mut out = format!("error: {}\n  --> {}\n", self.message, sources.location(self.span));
        let line = sources
            .get(self.span.file)
            .and_then(|f| f.text.lines().nth((self.span.line as usize).wrapping_sub(1)));
        if let Some(line) = line.filter(|_| self.span.line > 0) {
            let num = self.span.line.to_string();
            let pad = " ".repeat(num.len());
            let (shown, col) = window(line, self.span.col.saturating_sub(1) as usize);
            let caret_pad: String = shown
                .chars()
                .take(col)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            out.push_str(&format!("{pad} |\n{num} | {shown}\n{pad} | {caret_pad}^\n"));
        }
        if let Some(help) = &self.help {
            out.push_str(&format!("  = help: {help}\n"));
        }
        out
    }
}

/// The part of a long source line around column `col` (0-based, in characters), and the
/// column within it: a minified or deeply nested line can be megabytes long.
fn window(line: &str, col: usize) -> (String, usize) {
    const BEFORE: usize = 60;
    const AFTER: usize = 40;
    let len = line.chars().count();
    if len <= BEFORE + AFTER + 20 {
        return (line.to_owned(), col);
    }
    let start = col.saturating_sub(BEFORE);
    let end = (col + AFTER).min(len);
    let mut shown: String = line.chars().skip(start).take(end - start).collect();
    let mut at = col - start;
    if start > 0 {
        shown.insert_str(0, "...");
        at += 3;
    }
    if end < len {
        shown.push_str("...");
    }
    (shown, at)
}

/// Every problem found in one pass; validation reports all of them at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn push(&mut self, d: Diagnostic) {
        self.0.push(d);
    }
    pub fn error(&mut self, span: Span, message: impl Into<String>) {
        self.0.push(Diagnostic::new(span, message));
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }

    /// Sorted by position, without exact duplicates.
    pub fn sorted(mut self) -> Self {
        self.0.sort_by(|a, b| {
            (a.span.file.0, a.span.line, a.span.col, &a.message).cmp(&(
                b.span.file.0,
                b.span.line,
                b.span.col,
                &b.message,
            ))
        });
        self.0.dedup();
        self
    }

    pub fn render(&self, sources: &Sources) -> String {
        self.0.iter().map(|d| d.render(sources)).collect::<Vec<_>>().join("\n")
    }

    pub fn into_result(self) -> Result<(), Diagnostics> {
        if self.is_empty() { Ok(()) } else { Err(self.sorted()) }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.0 {
            writeln!(f, "{}:{}: {}", d.span.line, d.span.col, d.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_line_and_caret() {
        let mut s = Sources::default();
        let f = s.add("wf.yaml", "steps:\n  a:\n    resource: X\n");
        let d = Diagnostic::new(Span::new(f, 3, 15), "unknown resource type 'X'").with_help("try Null::Resource");
        let r = d.render(&s);
        assert!(r.contains("--> wf.yaml:3:15"), "{r}");
        assert!(r.contains("3 |     resource: X\n  |               ^"), "{r}");
        assert!(r.contains("help: try Null::Resource"), "{r}");
    }

    #[test]
    fn long_lines_are_shown_around_the_column() {
        let mut s = Sources::default();
        let line = format!("k: {}x{}", "[".repeat(100_000), "]".repeat(100_000));
        let f = s.add("deep.yaml", line);
        let r = Diagnostic::new(Span::new(f, 1, 50_004), "here").render(&s);
        assert!(r.len() < 500, "{r}");
        let lines: Vec<&str> = r.lines().collect();
        let caret = lines[4].find('^').unwrap();
        assert_eq!(&lines[3][caret..caret + 1], "[", "{r}");
        assert!(lines[3].starts_with("1 | ...[[[") && lines[3].ends_with("[[..."), "{r}");
    }
}
