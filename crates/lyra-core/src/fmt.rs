//! `lyra fmt`: the canonical layout of a YAML file, comments kept. Text in, text out, no I/O.
//!
//! The canonical form (docs/fmt.md is the reference):
//!
//! - block mappings and block sequences are indented 2 spaces per level; a sequence that is
//!   the value of a key is indented under the key (`key:` then `  - x`), also when it was
//!   written at the key's own column;
//! - exactly one space after `key:` and after `-` when something follows on the line;
//! - full-line comments are re-indented with the structure: to the following line's
//!   indentation, or to the level they were written at when that level is still open
//!   (a commented-out last key stays inside its block); a trailing comment gets exactly one
//!   space before its `#`; the text of every comment is kept as written;
//! - no trailing whitespace, LF line endings, no byte-order mark, exactly one final newline;
//!   blank lines are kept, but a run of them becomes one and blank lines at the start and
//!   end of the file are dropped;
//! - scalars are kept byte for byte (quotes, escapes, plain text, the header of a block
//!   scalar), except that a block scalar's (`|`, `>`) content is moved as a whole to 2 spaces
//!   under its key, keeping its relative indentation and trailing spaces, and continuation
//!   lines of multi-line scalars and of flow collections move with the line they continue;
//! - flow collections (`{a: 1}`, `[x, y]`) are kept as written; document markers (`---`,
//!   `...`) and directives are kept.
//!
//! The layout is computed line by line from the YAML scanner's tokens, and then checked: the
//! input and the output are both parsed, and unless they give exactly the same event stream
//! (the same documents, collections, keys, scalar values and styles, anchors and tags),
//! [`format`] refuses with [`FmtError::ChangesMeaning`]. A formatter must never change what
//! a file means, so that check is not an assertion that can be compiled out.

use thiserror::Error;
use yaml_rust2::Event;
use yaml_rust2::parser::Parser;
use yaml_rust2::scanner::{Marker, ScanError, Scanner, TScalarStyle, TokenType};

use crate::diag::{Diagnostic, FileId, Span};

/// Why a text was not formatted. Lines and columns are 1-based, in the input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FmtError {
    /// The input is not YAML.
    #[error("malformed YAML: {message}")]
    Syntax { line: u32, column: u32, message: String },
    /// The input uses YAML the formatter does not lay out (it is left as it is).
    #[error("{message}")]
    Unsupported { line: u32, column: u32, message: String },
    /// The formatted text would not parse to the same data as the input: a bug of the
    /// formatter, caught before anything is written.
    #[error(
        "formatting would change what the file means (from here on), so it is left as it is; please report this as a bug of `lyra fmt`"
    )]
    ChangesMeaning { line: u32, column: u32 },
}

impl FmtError {
    /// Where in the input the problem is: (line, column), 1-based.
    pub fn position(&self) -> (u32, u32) {
        match self {
            FmtError::Syntax { line, column, .. }
            | FmtError::Unsupported { line, column, .. }
            | FmtError::ChangesMeaning { line, column } => (*line, *column),
        }
    }

    /// The error as a diagnostic of `file`, for rendering with its source line.
    pub fn diagnostic(&self, file: FileId) -> Diagnostic {
        let (line, column) = self.position();
        let d = Diagnostic::new(Span::new(file, line, column), self.to_string());
        match self {
            FmtError::Unsupported { .. } => d.with_help("format this file by hand; `lyra fmt` leaves it as it is"),
            _ => d,
        }
    }
}

/// The canonical form of a YAML text (see the module docs), or why there is none. An empty
/// (or all-blank) text formats to the empty text.
pub fn format(text: &str) -> Result<String, FmtError> {
    // The parser does not skip a byte-order mark; Lyra drops it before parsing too.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let before = events(text).map_err(|e| syntax(&e))?;
    let normalized = normalize(text);
    let out = layout(&normalized)?;
    same_events(&before, &out)?;
    Ok(out)
}

/// CRLF and lone CR made LF: the parser reads all of them as the same line breaks, so none
/// of it is meaning.
fn normalize(text: &str) -> String {
    if text.contains('\r') {
        text.replace("\r\n", "\n").replace('\r', "\n")
    } else {
        text.to_owned()
    }
}

fn syntax(e: &ScanError) -> FmtError {
    FmtError::Syntax {
        line: to_u32(e.marker().line()),
        column: to_u32(e.marker().col() + 1),
        message: e.info().to_owned(),
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The parser's event stream of `text`, with where each event is.
fn events(text: &str) -> Result<Vec<(Event, Marker)>, ScanError> {
    let mut parser = Parser::new_from_str(text);
    let mut all = Vec::new();
    loop {
        let (event, mark) = parser.next_token()?;
        let end = event == Event::StreamEnd;
        all.push((event, mark));
        if end {
            return Ok(all);
        }
    }
}

/// The safety check: `output` must parse to exactly the events of the input (positions
/// aside). Where they part, the input's position is reported.
fn same_events(before: &[(Event, Marker)], output: &str) -> Result<(), FmtError> {
    let at = |i: usize| {
        let m = before.get(i).or(before.last()).map(|(_, m)| *m);
        FmtError::ChangesMeaning {
            line: m.map_or(1, |m| to_u32(m.line())),
            column: m.map_or(1, |m| to_u32(m.col() + 1)),
        }
    };
    let mut parser = Parser::new_from_str(output);
    for (i, (event, _)) in before.iter().enumerate() {
        match parser.next_token() {
            Ok((e, _)) if e == *event => {}
            _ => return Err(at(i)),
        }
    }
    Ok(())
}

/// What one input line is.
#[derive(Debug, Clone)]
enum Kind {
    /// Nothing but whitespace.
    Blank,
    /// A comment alone on its line (starting at this column), with the levels open around
    /// it: (old column, new column).
    Comment { col: usize, open: Vec<(usize, usize)> },
    /// A line that starts block structure (a key, `-`, a value on a line of its own, a
    /// document marker), re-indented to `new`.
    Content { new: usize },
    /// The rest of a multi-line scalar or flow collection begun on an earlier line, moved by
    /// as much as the line it continues.
    Continuation { delta: isize },
    /// Content of a block scalar whose text starts at column `indent`, moved by `shift`.
    BlockText { indent: usize, shift: isize },
}

/// A block collection open at some line: where it was and where it goes.
#[derive(Debug, Clone, Copy)]
struct Level {
    seq: bool,
    old: usize,
    new: usize,
}

impl Level {
    fn delta(&self) -> isize {
        self.new as isize - self.old as isize
    }
}

/// What the layout needs of a scanner token, on the line it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// `-` of a block sequence (its column is found on the line).
    Dash,
    /// A simple key starting here.
    Key,
    /// An explicit key (`? key`).
    ExplicitKey,
    /// `:` of a block mapping.
    Value,
    /// The header (`|`, `>`) of a block scalar.
    Header,
    /// `---`, `...`, `%YAML`, `%TAG`.
    Document,
    /// Any other token: scalars, flow punctuation, anchors, tags, aliases.
    Other,
}

#[derive(Debug, Clone, Copy)]
struct Placed {
    line: usize,
    col: usize,
    item: Item,
    /// Inside a flow collection.
    flow: bool,
}

struct Layout {
    lines: Vec<Vec<char>>,
    /// Per line: column ranges inside quoted scalars (a `#` there is no comment).
    quoted: Vec<Vec<(usize, usize)>>,
    /// Per line: it starts, or ends, inside a quoted scalar.
    starts_quoted: Vec<bool>,
    ends_quoted: Vec<bool>,
    /// Per line: inside a flow collection when it starts.
    starts_in_flow: Vec<bool>,
    /// Per line: the items placed on it, in stream order.
    items: Vec<Vec<Placed>>,
    kinds: Vec<Option<Kind>>,
}

fn unsupported(line: usize, col: usize, message: &str) -> FmtError {
    FmtError::Unsupported {
        line: to_u32(line + 1),
        column: to_u32(col + 1),
        message: message.to_owned(),
    }
}

fn is_ws(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The formatted text of an LF-normalized input that parses.
fn layout(text: &str) -> Result<String, FmtError> {
    let lines: Vec<Vec<char>> = text.split('\n').map(|l| l.chars().collect()).collect();
    let mut scanner = Scanner::new(text.chars());
    let tokens: Vec<(Marker, TokenType)> = scanner.by_ref().map(|t| (t.0, t.1)).collect();
    if let Some(e) = scanner.get_error() {
        return Err(syntax(&e));
    }
    let n = lines.len();
    let mut l = Layout {
        quoted: vec![Vec::new(); n],
        starts_quoted: vec![false; n],
        ends_quoted: vec![false; n],
        starts_in_flow: vec![false; n],
        items: vec![Vec::new(); n],
        kinds: vec![None; n],
        lines,
    };
    l.place(&tokens)?;
    l.classify()?;
    Ok(l.render())
}

impl Layout {
    fn len(&self, line: usize) -> usize {
        self.lines.get(line).map_or(0, Vec::len)
    }

    fn char_at(&self, line: usize, col: usize) -> Option<char> {
        self.lines.get(line).and_then(|l| l.get(col)).copied()
    }

    /// Places the tokens on their lines, and finds quoted scalars' extents and the lines
    /// that start inside flow collections.
    fn place(&mut self, tokens: &[(Marker, TokenType)]) -> Result<(), FmtError> {
        let mut flow = 0usize;
        // The lines on which flow collections open (+1) and close (-1).
        let mut flow_changes: Vec<(usize, isize)> = Vec::new();
        for (i, (mark, token)) in tokens.iter().enumerate() {
            // Scanner lines are 1-based, columns 0-based, both in characters.
            let (line, col) = (mark.line().saturating_sub(1), mark.col());
            let in_flow = flow > 0;
            let item = match token {
                TokenType::BlockEntry => Item::Dash,
                TokenType::Key if self.char_at(line, col) == Some('?') && !in_flow => {
                    let next = self.char_at(line, col + 1);
                    if next.is_none_or(is_ws) {
                        Item::ExplicitKey
                    } else {
                        Item::Key
                    }
                }
                TokenType::Key => Item::Key,
                TokenType::Value => Item::Value,
                TokenType::DocumentStart
                | TokenType::DocumentEnd
                | TokenType::VersionDirective(..)
                | TokenType::TagDirective(..) => Item::Document,
                TokenType::Scalar(TScalarStyle::Literal | TScalarStyle::Folded, _) => {
                    // The scanner marks a block scalar where its content starts: its header is
                    // the first `|` or `>` after the token before it.
                    let (line, col) = self.header_after(tokens, i)?;
                    self.items[line].push(Placed {
                        line,
                        col,
                        item: Item::Header,
                        flow: in_flow,
                    });
                    continue;
                }
                TokenType::Scalar(style @ (TScalarStyle::SingleQuoted | TScalarStyle::DoubleQuoted), _) => {
                    self.quote(line, col, *style == TScalarStyle::DoubleQuoted);
                    Item::Other
                }
                TokenType::FlowSequenceStart | TokenType::FlowMappingStart => {
                    flow += 1;
                    flow_changes.push((line, 1));
                    Item::Other
                }
                TokenType::FlowSequenceEnd | TokenType::FlowMappingEnd => {
                    flow = flow.saturating_sub(1);
                    flow_changes.push((line, -1));
                    Item::Other
                }
                // Zero-width or misplaced marks (a mapping's start is marked at its first `:`,
                // a block's end at the next token): the layout follows columns instead.
                TokenType::StreamStart(_)
                | TokenType::StreamEnd
                | TokenType::BlockEnd
                | TokenType::BlockMappingStart
                | TokenType::BlockSequenceStart => continue,
                _ => Item::Other,
            };
            if line < self.lines.len() {
                self.items[line].push(Placed {
                    line,
                    col,
                    item,
                    flow: in_flow,
                });
            }
        }
        // A line starts inside a flow collection when more open before it than close.
        let mut level = 0isize;
        let mut changes = flow_changes.iter().peekable();
        for line in 0..self.lines.len() {
            while let Some((_, d)) = changes.next_if(|(l, _)| *l < line) {
                level += d;
            }
            self.starts_in_flow[line] = level > 0;
        }
        Ok(())
    }

    /// Finds where a quoted scalar starting at (line, col) ends, and masks it.
    fn quote(&mut self, line: usize, col: usize, double: bool) {
        let quote = if double { '"' } else { '\'' };
        let (mut l, mut c) = (line, col + 1);
        while let Some(row) = self.lines.get(l) {
            if c >= row.len() {
                l += 1;
                c = 0;
                continue;
            }
            let ch = row[c];
            if double && ch == '\\' {
                c += 2;
                continue;
            }
            if ch == quote {
                if !double && row.get(c + 1) == Some(&'\'') {
                    c += 2;
                    continue;
                }
                break;
            }
            c += 1;
        }
        let end_line = l.min(self.lines.len().saturating_sub(1));
        if end_line == line {
            self.quoted[line].push((col, c + 1));
            return;
        }
        let first_len = self.len(line);
        self.quoted[line].push((col, first_len));
        self.ends_quoted[line] = true;
        for mid in line + 1..end_line {
            let len = self.len(mid);
            self.quoted[mid].push((0, len));
            self.starts_quoted[mid] = true;
            self.ends_quoted[mid] = true;
        }
        self.quoted[end_line].push((0, c + 1));
        self.starts_quoted[end_line] = true;
    }

    /// The position of the block scalar header of token `i`: the first `|` or `>` after the
    /// token before it (past that token's own text, whitespace, line breaks and comments).
    fn header_after(&self, tokens: &[(Marker, TokenType)], i: usize) -> Result<(usize, usize), FmtError> {
        let before = tokens[..i]
            .iter()
            .rev()
            .find(|(_, t)| !matches!(t, TokenType::BlockEnd | TokenType::BlockMappingStart));
        let (mut line, mut col) = match before {
            None | Some((_, TokenType::StreamStart(_))) => (0, 0),
            Some((m, t)) => {
                let (line, col) = (m.line().saturating_sub(1), m.col());
                let skip = match t {
                    TokenType::Value | TokenType::Key => 1,
                    TokenType::DocumentStart => 3,
                    TokenType::Anchor(_) | TokenType::Tag(..) => {
                        self.lines[line][col..].iter().take_while(|c| !is_ws(**c)).count()
                    }
                    _ => 0,
                };
                (line, col + skip)
            }
        };
        let mut after_ws = true;
        loop {
            match self.char_at(line, col) {
                None if line + 1 >= self.lines.len() => break,
                None => {
                    (line, col, after_ws) = (line + 1, 0, true);
                }
                Some(c) if is_ws(c) => {
                    col += 1;
                    after_ws = true;
                }
                Some('#') if after_ws => {
                    (line, col, after_ws) = (line + 1, 0, true);
                }
                Some('|' | '>') => return Ok((line, col)),
                Some(_) => break,
            }
        }
        let (m, _) = &tokens[i];
        Err(unsupported(
            m.line().saturating_sub(1),
            m.col(),
            "cannot find this block scalar's `|` or `>`",
        ))
    }

    /// The columns of the `-` entries a line starts with, from its first non-blank column.
    fn dashes(&self, line: usize, first: usize) -> Vec<usize> {
        let row = &self.lines[line];
        let mut dashes = Vec::new();
        let mut pos = first;
        while row.get(pos) == Some(&'-') && row.get(pos + 1).is_none_or(|c| is_ws(*c)) {
            dashes.push(pos);
            pos += 1;
            while row.get(pos).is_some_and(|c| is_ws(*c)) {
                pos += 1;
            }
        }
        dashes
    }

    fn leading_spaces(&self, line: usize) -> usize {
        self.lines[line].iter().take_while(|c| **c == ' ').count()
    }

    fn first_non_ws(&self, line: usize) -> Option<usize> {
        self.lines[line].iter().position(|c| !is_ws(*c))
    }

    fn in_quotes(&self, line: usize, col: usize) -> bool {
        self.quoted[line].iter().any(|(s, e)| (*s..*e).contains(&col))
    }

    /// Where a comment starts on a line (a `#` at the start or after whitespace, outside
    /// quoted scalars).
    fn comment_start(&self, line: usize) -> Option<usize> {
        let row = &self.lines[line];
        (0..row.len()).find(|&c| row[c] == '#' && (c == 0 || is_ws(row[c - 1])) && !self.in_quotes(line, c))
    }

    /// Decides every line's kind, walking the block structure by columns.
    fn classify(&mut self) -> Result<(), FmtError> {
        let mut stack: Vec<Level> = Vec::new();
        // How far the lines continuing the last structural line move.
        let mut cont_delta: isize = 0;
        for line in 0..self.lines.len() {
            if self.kinds[line].is_some() {
                continue;
            }
            let Some(first) = self.first_non_ws(line) else {
                self.kinds[line] = Some(Kind::Blank);
                continue;
            };
            let block_items: Vec<Placed> = self.items[line].iter().filter(|p| !p.flow).copied().collect();
            let kind = if self.starts_quoted[line] || self.starts_in_flow[line] {
                Kind::Continuation { delta: cont_delta }
            } else if self.lines[line][first] == '#' {
                Kind::Comment {
                    col: first,
                    open: stack.iter().map(|s| (s.old, s.new)).collect(),
                }
            } else if block_items.is_empty() {
                Kind::Continuation { delta: cont_delta }
            } else {
                let (new, delta) = self.structure(line, first, &block_items, &mut stack)?;
                cont_delta = delta;
                if let Some(h) = block_items.iter().find(|p| p.item == Item::Header) {
                    self.block_scalar(h.line, h.col, &stack)?;
                }
                Kind::Content { new }
            };
            self.kinds[line] = Some(kind);
        }
        Ok(())
    }

    /// The structure a content line opens or continues: its new indentation, and how far
    /// lines continuing it move.
    fn structure(
        &self,
        line: usize,
        first: usize,
        items: &[Placed],
        stack: &mut Vec<Level>,
    ) -> Result<(usize, isize), FmtError> {
        let dashes = self.dashes(line, first);
        let dash_items = items.iter().filter(|p| p.item == Item::Dash).count();
        if dash_items != dashes.len() {
            return Err(unsupported(line, first, "cannot follow this line's `-` entries"));
        }
        if let Some(p) = items.iter().find(|p| p.item == Item::ExplicitKey) {
            return Err(unsupported(p.line, p.col, "explicit keys (`? key`) are not supported"));
        }
        let keys: Vec<&Placed> = items.iter().filter(|p| p.item == Item::Key).collect();
        if keys.len() > 1 {
            return Err(unsupported(line, keys[1].col, "more than one key on a line"));
        }
        let document = items.first().is_some_and(|p| p.item == Item::Document);
        if document {
            if !dashes.is_empty() || !keys.is_empty() {
                return Err(unsupported(
                    line,
                    first,
                    "a document marker followed by block structure",
                ));
            }
            stack.clear();
            return Ok((0, 0));
        }
        if dashes.is_empty() && keys.is_empty() && items.first().is_some_and(|p| p.item == Item::Value) {
            return Err(unsupported(
                line,
                first,
                "explicit values (`: value`) are not supported",
            ));
        }
        let mut indent = None;
        for &d in &dashes {
            while stack.last().is_some_and(|s| s.old > d) {
                stack.pop();
            }
            match stack.last() {
                Some(s) if s.seq && s.old == d => {}
                // A sequence at its key's own column: canonically indented under the key.
                top => {
                    let new = top.map_or(0, |s| s.new + 2);
                    stack.push(Level { seq: true, old: d, new });
                }
            }
            indent.get_or_insert(stack.last().map_or(0, |s| s.new));
        }
        if let Some(key) = keys.first() {
            let k = key.col;
            while stack.last().is_some_and(|s| s.old > k || (s.seq && s.old >= k)) {
                stack.pop();
            }
            match stack.last() {
                Some(s) if !s.seq && s.old == k => {}
                top => {
                    let new = top.map_or(0, |s| s.new + 2);
                    stack.push(Level {
                        seq: false,
                        old: k,
                        new,
                    });
                }
            }
            indent.get_or_insert(stack.last().map_or(0, |s| s.new));
        }
        match indent {
            Some(indent) => Ok((indent, stack.last().map_or(0, Level::delta))),
            None => {
                // A value on a line of its own, under the key or `-` it belongs to.
                while stack.last().is_some_and(|s| s.old >= first) {
                    stack.pop();
                }
                let new = stack.last().map_or(0, |s| s.new + 2);
                Ok((new, new as isize - first as isize))
            }
        }
    }

    /// Marks the content lines of the block scalar whose header is at (line, col).
    fn block_scalar(&mut self, line: usize, col: usize, stack: &[Level]) -> Result<(), FmtError> {
        let row = &self.lines[line];
        let mut explicit = None;
        let mut keep = false;
        for c in row[col + 1..].iter() {
            match c {
                '1'..='9' => explicit = c.to_digit(10).map(|d| d as usize),
                '+' => keep = true,
                '-' => {}
                _ => break,
            }
        }
        // The scanner's indentation for the header: the innermost block collection's column.
        let parent = stack.last();
        let n = parent.map_or(-1, |s| s.old as isize);
        let blank = |l: &Layout, i: usize| l.lines[i].iter().all(|c| is_ws(*c));
        let indent = match explicit {
            Some(k) => Some(if n >= 0 { n as usize + k } else { k }),
            None => (line + 1..self.lines.len())
                .find(|&i| !blank(self, i))
                .map(|i| self.leading_spaces(i))
                .filter(|&m| m as isize > n),
        };
        let Some(indent) = indent else {
            if keep {
                // An empty kept scalar: its blank lines are its value.
                for i in line + 1..self.lines.len() {
                    if !blank(self, i) {
                        break;
                    }
                    self.kinds[i] = Some(Kind::BlockText { indent: 0, shift: 0 });
                }
            }
            return Ok(());
        };
        let shift = match (explicit, parent) {
            (_, None) => 0,
            (Some(_), Some(p)) => p.delta(),
            (None, Some(p)) => (p.new + 2) as isize - indent as isize,
        };
        let mut end = line + 1;
        while end < self.lines.len() && (blank(self, end) || self.leading_spaces(end) >= indent) {
            end += 1;
        }
        // Trailing empty lines belong to the value only when it keeps them (`|+`).
        while !keep && end > line + 1 && blank(self, end - 1) && self.len(end - 1) <= indent {
            end -= 1;
        }
        for i in line + 1..end {
            self.kinds[i] = Some(Kind::BlockText { indent, shift });
        }
        Ok(())
    }

    /// The (old, new) indentation of a line that is neither blank nor a comment.
    fn indents(&self, line: usize) -> Option<(usize, usize)> {
        let old = self.first_non_ws(line).unwrap_or(0);
        match self.kinds[line].as_ref()? {
            Kind::Content { new } => Some((old, *new)),
            Kind::Continuation { delta } => {
                let lead = self.leading_spaces(line);
                Some((lead, shifted(lead, *delta)))
            }
            Kind::BlockText { .. } | Kind::Blank | Kind::Comment { .. } => None,
        }
    }

    /// The text of a content or continuation line from `from` on: the gaps after `-` and a
    /// block `:` made one space, a trailing comment one space after the content, trailing
    /// whitespace dropped (unless it is inside a quoted scalar).
    fn body(&self, line: usize, from: usize, gaps: &[usize]) -> String {
        let row = &self.lines[line];
        let comment = self.comment_start(line);
        let mut end = comment.unwrap_or(row.len());
        if comment.is_some() || !self.ends_quoted[line] {
            while end > from && is_ws(row[end - 1]) {
                end -= 1;
            }
        }
        let mut out = String::new();
        let mut c = from;
        while c < end {
            out.push(row[c]);
            if gaps.contains(&c) {
                let mut next = c + 1;
                while next < end && is_ws(row[next]) {
                    next += 1;
                }
                if next > c + 1 && next < end {
                    out.push(' ');
                    c = next;
                    continue;
                }
            }
            c += 1;
        }
        if let Some(cm) = comment {
            if !out.is_empty() {
                out.push(' ');
            }
            let text: String = row[cm..].iter().collect();
            out.push_str(text.trim_end());
        }
        out
    }

    /// Where a full-line comment at old column `col` goes.
    fn comment_indent(&self, line: usize, col: usize, open: &[(usize, usize)]) -> usize {
        let next = (line + 1..self.lines.len()).find_map(|i| self.indents(i));
        let prev = (0..line).rev().find_map(|i| self.indents(i));
        if let Some((old, new)) = next
            && old == col
        {
            return new;
        }
        if let Some(&(_, new)) = open.iter().rev().chain(prev.as_ref()).find(|(old, _)| *old == col) {
            return new;
        }
        next.or(prev).map_or(0, |(_, new)| new)
    }

    fn render(&self) -> String {
        // (text, a blank line that may be collapsed or dropped)
        let mut out: Vec<(String, bool)> = Vec::with_capacity(self.lines.len());
        for line in 0..self.lines.len() {
            let row = &self.lines[line];
            let kind = self.kinds[line].clone().unwrap_or(Kind::Blank);
            let text = match kind {
                Kind::Blank => {
                    // Blank lines before a continuation are inside a scalar or flow collection.
                    let next = (line + 1..self.lines.len()).find(|&i| !matches!(self.kinds[i], Some(Kind::Blank)));
                    let inside = next.is_some_and(|i| matches!(self.kinds[i], Some(Kind::Continuation { .. })));
                    out.push((String::new(), !inside));
                    continue;
                }
                Kind::Comment { col, open } => {
                    let indent = self.comment_indent(line, col, &open);
                    let text: String = row[col..].iter().collect();
                    format!("{}{}", " ".repeat(indent), text.trim_end())
                }
                Kind::Content { new } => {
                    let first = self.first_non_ws(line).unwrap_or(0);
                    let mut gaps = self.dashes(line, first);
                    gaps.extend(
                        self.items[line]
                            .iter()
                            .filter(|p| p.item == Item::Value && !p.flow)
                            .map(|p| p.col),
                    );
                    format!("{}{}", " ".repeat(new), self.body(line, first, &gaps))
                }
                Kind::Continuation { delta } => {
                    let lead = self.leading_spaces(line);
                    format!("{}{}", " ".repeat(shifted(lead, delta)), self.body(line, lead, &[]))
                }
                Kind::BlockText { indent, shift } => {
                    let lead = self.leading_spaces(line);
                    let blank = row.iter().all(|c| is_ws(*c));
                    if blank && row.len() <= indent {
                        String::new()
                    } else if lead >= indent && row.len() > indent {
                        let text: String = row[indent..].iter().collect();
                        format!("{}{text}", " ".repeat(shifted(indent, shift)))
                    } else if blank {
                        String::new()
                    } else {
                        row.iter().collect()
                    }
                }
            };
            out.push((text, false));
        }
        let mut text = String::new();
        let mut pending_blank = false;
        for (line, collapsible) in out {
            if collapsible {
                pending_blank = !text.is_empty();
                continue;
            }
            if pending_blank {
                text.push('\n');
                pending_blank = false;
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    }
}

fn shifted(col: usize, delta: isize) -> usize {
    (col as isize + delta).max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Formats, and checks the result is a fixed point.
    #[track_caller]
    fn fmt(text: &str) -> String {
        let once = format(text).unwrap_or_else(|e| panic!("{e:?} for\n{text}"));
        let twice = format(&once).unwrap_or_else(|e| panic!("{e:?} formatting again\n{once}"));
        assert_eq!(once, twice, "not idempotent: {text:?}");
        once
    }

    #[test]
    fn four_spaces_become_two() {
        let input = "steps:\n    a:\n        resource: Null::Resource\n        value:\n            input: 1\n";
        assert_eq!(
            fmt(input),
            "steps:\n  a:\n    resource: Null::Resource\n    value:\n      input: 1\n"
        );
    }

    #[test]
    fn sequences_are_indented_under_their_key() {
        let input = "\
list:
- a
-   b
- k: 1
  j: 2
-     x: 1
      y:
      - deep
nested:
      - - one
        - two
      -
        three
";
        assert_eq!(
            fmt(input),
            "\
list:
  - a
  - b
  - k: 1
    j: 2
  - x: 1
    y:
      - deep
nested:
  - - one
    - two
  -
    three
"
        );
    }

    #[test]
    fn spacing_after_keys_and_dashes() {
        assert_eq!(fmt("a:    1\nb: \t 2\nc:   [x,   y]\n"), "a: 1\nb: 2\nc: [x,   y]\n");
        assert_eq!(fmt("- \t x\n"), "- x\n");
    }

    #[test]
    fn comments_are_kept_and_reindented() {
        let input = "\
# top comment
steps:
        # about a
    a:   # trailing
        resource: X    #   spaced out
        # commented-out key, inside a
    # about b
    b:
        value: '#not a comment' # but this is
        url: http://x/#frag
# the end
";
        assert_eq!(
            fmt(input),
            "\
# top comment
steps:
  # about a
  a: # trailing
    resource: X #   spaced out
    # commented-out key, inside a
  # about b
  b:
    value: '#not a comment' # but this is
    url: http://x/#frag
# the end
"
        );
    }

    #[test]
    fn block_scalars_keep_their_content() {
        let input = "\
a:
    script: |
            line one
              indented   
            
            after blank
    folded: >-
        folded
        text
    kept: |+
      x


b: 1
";
        let out = fmt(input);
        assert_eq!(
            out,
            "\
a:
  script: |
    line one
      indented   

    after blank
  folded: >-
    folded
    text
  kept: |+
    x


b: 1
"
        );
    }

    #[test]
    fn block_scalar_indentation_indicators_move_with_their_block() {
        let out = fmt("a:\n    b: |2\n         x\n    c: 1\n");
        assert_eq!(out, "a:\n  b: |2\n       x\n  c: 1\n");
    }

    #[test]
    fn flow_collections_and_quotes_are_kept_as_written() {
        let input = "\
a:    {x: 1,   y: [ 1,2 ]}
b: [
      one,   # first
      \"two\"
   ]
c: 'it''s'
d: \"multi
    line  \"
e: plain text
    that continues

    after a blank
";
        assert_eq!(
            fmt(input),
            "\
a: {x: 1,   y: [ 1,2 ]}
b: [
      one, # first
      \"two\"
   ]
c: 'it''s'
d: \"multi
    line  \"
e: plain text
    that continues

    after a blank
"
        );
    }

    #[test]
    fn whitespace_line_endings_and_blank_lines() {
        let input = "\u{feff}\r\n\r\na: 1   \r\n\r\n\r\n\r\nb: 2\r\n\r\n\r\n";
        assert_eq!(fmt(input), "a: 1\n\nb: 2\n");
        assert_eq!(fmt("a: 1"), "a: 1\n");
        assert_eq!(fmt(""), "");
        assert_eq!(fmt("\n\n"), "");
        assert_eq!(fmt("# only a comment"), "# only a comment\n");
    }

    #[test]
    fn document_markers_are_kept() {
        assert_eq!(
            fmt("---\na:\n    b: 1\n---   # second\n- x\n...\n"),
            "---\na:\n  b: 1\n--- # second\n- x\n...\n"
        );
        assert_eq!(fmt("--- |\n  text\n"), "--- |\n  text\n");
    }

    #[test]
    fn a_file_indented_as_a_whole_moves_to_column_zero() {
        assert_eq!(fmt("  a: 1\n  b:\n      c: 2\n"), "a: 1\nb:\n  c: 2\n");
    }

    #[test]
    fn anchors_tags_and_aliases_survive() {
        assert_eq!(
            fmt("base: &b\n    x: 1\nuse: *b\nt: !!str 3\nlist:\n- &e k: v\n"),
            "base: &b\n  x: 1\nuse: *b\nt: !!str 3\nlist:\n  - &e k: v\n"
        );
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = format("a: 1\nb: [unclosed\nc: 2\n").unwrap_err();
        assert!(matches!(e, FmtError::Syntax { .. }), "{e:?}");
        let e = format("a:\n  b: 1\n c: 2\n").unwrap_err();
        let FmtError::Syntax { line, .. } = e else {
            panic!("{e:?}")
        };
        assert_eq!(line, 3);
        let d = format("a: \"x\n").unwrap_err().diagnostic(FileId(0));
        assert!(d.message.starts_with("malformed YAML"), "{d:?}");
    }

    /// The safety check refuses any output that parses to something else, and one that does
    /// not parse at all.
    #[test]
    fn a_change_of_meaning_is_refused() {
        let check = |input: &str, output: &str| same_events(&events(input).unwrap(), output);
        assert_eq!(check("a:\n  b: 1\n", "a:\n  b: 1\n"), Ok(()));
        // Dedenting a key moves it to the outer mapping.
        assert_eq!(
            check("a:\n  b: 1\n  c: 2\n", "a:\n  b: 1\nc: 2\n"),
            Err(FmtError::ChangesMeaning { line: 3, column: 3 })
        );
        // Re-indenting a block scalar unevenly changes its text.
        assert!(check("a: |\n  x\n    y\n", "a: |\n  x\n  y\n").is_err());
        // A quoted scalar made plain is another type.
        assert!(check("a: '1'\n", "a: 1\n").is_err());
        // Output that does not parse.
        assert!(check("a: [1]\n", "a: [1\n").is_err());
        // Changed style alone (literal to folded) is refused too.
        assert!(check("a: |\n  x\n", "a: >\n  x\n").is_err());
    }

    #[test]
    fn explicit_keys_are_left_alone() {
        let e = format("? a\n: b\n").unwrap_err();
        assert!(matches!(e, FmtError::Unsupported { line: 1, .. }), "{e:?}");
    }

    /// A spread of YAML shapes: each formats, keeps its meaning (checked by `format`) and is a
    /// fixed point.
    #[test]
    fn assorted_shapes_are_idempotent() {
        for input in [
            "a:\n- - x\n  - y\n- z\n",
            "- a:\n  - b\n  c: d\n",
            "-\n  - x\n",
            "a: >\n\n  folded after blank\n",
            "a: |-\n    x\n\nb: 1\n",
            "a: |\nb: 1\n",
            "a: |+\n\nb: 1\n",
            "k: \"a \\\n   b\"\n",
            "k: 'multi\n\n  line'\n",
            "a: {x: [1,\n  2], y: 3}\nb: 4\n",
            "a:   # c\n    # d\n    b: 1\n",
            "\"quoted key\":    1\n'single': 2\n",
            "a:\n    - |\n        t\n    - >\n        u\n",
            "%YAML 1.2\n---\na: 1\n",
            "a: 1 # c\n\n\n# d\n\n\nb: 2\n",
            "x: [a, b] # c\n",
            "a:\n  b:\n    c: 1\n      # deep comment\nd: 2\n",
            "a:\n  - b\n  # end comment\n",
        ] {
            fmt(input);
        }
    }
}
