//! The YAML front end: the original Lyra workflow language (see `original-lyra.md` §2), read
//! with source positions so that every error names its file, line and column.
//!
//! The top level of a file is one step of any kind; the kind is chosen by key: `steps` →
//! workflow, `each`/`eachPair`/`times`/`range` → collection, `call` → call, `resource` →
//! resource. Unlike the original parser, unknown keys are errors.

mod tree;

use tree::{LoadError, Mapping, Mark, Node, Scalar};
use yaml_rust2::scanner::TokenType;

use crate::diag::{Diagnostic, Diagnostics, FileId, Span};
use crate::expr::{Expr, Ref};
use crate::guard::Guard;
use std::time::Duration;

use crate::model::{
    Attr, Controls, Over, Param, ParamSource, ProviderConfig, Return, ReturnSource, Step, StepKind, Workflow,
};
use crate::types::Type;
use crate::value::{MAX_DEPTH, Map, Value};

const COMMON_KEYS: &[&str] = &["parameters", "returns", "when"];
const COLLECTION_KEYS: &[&str] = &["each", "eachPair", "times", "range"];

/// Parses one workflow file. `name` is the workflow's name (see [`workflow_name`]).
pub fn parse_workflow(name: &str, file: FileId, text: &str) -> Result<Workflow, Diagnostics> {
    match parse_workflow_partial(name, file, text) {
        (Some(wf), d) if d.is_empty() => Ok(wf),
        (_, d) => Err(d.sorted()),
    }
}

/// Parses as much of a workflow file as makes sense, with every problem found: a bad guard
/// or an unknown key still leaves a workflow that validation can check further, so that all
/// problems are reported at once.
pub fn parse_workflow_partial(name: &str, file: FileId, text: &str) -> (Option<Workflow>, Diagnostics) {
    // The top level's steps are built while the file is read, each from its own small tree,
    // freed once its step is built: the document is never a whole tree. Their problems are
    // kept apart until the top level turns out to be a workflow that reads them.
    let mut streamed = Streamed {
        fe: FrontEnd {
            file,
            diags: Diagnostics::default(),
        },
        steps: Vec::new(),
    };
    let loaded = load_with(
        file,
        text,
        Some(&mut |k, v| streamed.fe.child_step(&k, &v, &mut streamed.steps)),
    );
    let mut node = match loaded {
        Ok(n) => n,
        Err(d) => return (None, d),
    };
    streamed.steps.shrink_to_fit();
    let mut fe = FrontEnd {
        file,
        diags: Diagnostics::default(),
    };
    let span = Span::new(file, 1, 1);
    let mut providers = Vec::new();
    let root = match node.as_mapping_mut() {
        Some(map) => {
            if let Some(n) = map.get_node("providers") {
                providers = fe.providers(n);
            }
            // What streaming left of `steps:`: an empty mapping, or what was not one.
            let steps = map.take_node("steps");
            fe.step_at(name, span, map, steps.map(|node| (node, streamed)), true)
        }
        None => {
            fe.diags
                .error(fe.span(&node), "a workflow file must be a mapping (a step)");
            None
        }
    };
    (
        root.map(|root| Workflow {
            name: name.to_owned(),
            file,
            root,
            providers,
        }),
        fe.diags,
    )
}

/// The top level's steps, built as the file was read, with their problems.
struct Streamed {
    fe: FrontEnd,
    steps: Vec<Step>,
}

/// Parses a data file (`data.yaml`): any mapping of values.
pub fn parse_data(file: FileId, text: &str) -> Result<Map, Diagnostics> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    let node = load(file, text)?;
    match value_of(&node) {
        Value::Object(m) => Ok(m),
        _ => {
            let mut d = Diagnostics::default();
            d.error(Span::new(file, 1, 1), "a data file must be a mapping");
            Err(d)
        }
    }
}

/// Parses a YAML value given on the command line or in data (no positions needed).
pub fn parse_value(text: &str) -> Result<Value, String> {
    let wrapped = format!("v: {text}");
    // The wrapping map is one level more than the value itself.
    if let Some(m) = nesting_exceeds(&wrapped, MAX_DEPTH + 1) {
        return Err(format!(
            "{} (at column {})",
            crate::value::too_deep_message("the value"),
            m.col().saturating_sub(2)
        ));
    }
    let node = tree::parse(&wrapped).map_err(|e| e.to_string())?;
    Ok(node
        .as_mapping()
        .and_then(|m| m.get_node("v"))
        .map(value_of)
        .unwrap_or(Value::Null))
}

/// `a/b.yaml` (relative to a load path) → `a::b`.
pub fn workflow_name(relative_path: &str) -> String {
    let trimmed = relative_path.trim_start_matches("./");
    let stem = trimmed
        .strip_suffix(".yaml")
        .or_else(|| trimmed.strip_suffix(".yml"))
        .unwrap_or(trimmed);
    stem.replace(['/', '\\'], "::")
}

/// Where a YAML document first nests deeper than `limit` levels of lists and maps, if it does.
///
/// The YAML loader builds its tree recursively, so a deeply nested document (10,000 levels of
/// block mappings, `- - - - …`) would overflow the stack before anything else could look at
/// it. The parser's event stream is produced iteratively: counting starts and ends there
/// costs one extra pass and no stack. Other malformed YAML is left for the loader to report.
fn nesting_exceeds(text: &str, limit: usize) -> Option<yaml_rust2::scanner::Marker> {
    use yaml_rust2::Event;
    // The extra pass costs a fifth of a large plan: skip it when a byte scan proves the
    // document shallow enough.
    if nesting_bound(text).is_some_and(|bound| bound <= limit) {
        return None;
    }
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    let mut depth = 0usize;
    loop {
        match parser.next_token() {
            Ok((Event::SequenceStart(..), mark)) => {
                depth += 1;
                if depth > limit {
                    return Some(mark);
                }
            }
            Ok((Event::MappingStart(..), mark)) => {
                depth += 1;
                if depth > limit {
                    // A block mapping's start is marked just past its first key: point at
                    // the key instead (a flow mapping's mark is its `{`, which is right).
                    let flow = text.chars().nth(mark.index()) == Some('{');
                    return match parser.next_token() {
                        Ok((Event::Scalar(..), key)) if !flow => Some(key),
                        _ => Some(mark),
                    };
                }
            }
            Ok((Event::SequenceEnd | Event::MappingEnd, _)) => depth = depth.saturating_sub(1),
            // The scanner reads flow collections (`[[[…`) ahead and gives up at 255 levels,
            // before their events come out: that too is a document nested too deep.
            Err(e) if e.info().contains("recursion limit") => return Some(*e.marker()),
            Ok((Event::StreamEnd, _)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// An upper bound on how deeply `text` nests lists and maps, read byte by byte without
/// parsing; `None` when the text has what this reading does not follow (quotes, tags,
/// anchors, aliases, tabs). Never less than the parser's count; may be much more.
///
/// Block collections: along a nesting path each starts at a greater column than its parent,
/// except a sequence at its mapping's own column (`key:` then `- x`), so at most two share a
/// column, and each starts at a column inside some line: at most twice the longest line.
/// Flow collections: every `[` and `{` counts as an opening and every `]` and `}` as a
/// closing, never below zero. Without quotes, and skipping comments, a closing bracket met
/// inside a flow collection closes it (plain scalars there cannot hold one); elsewhere (block
/// plain or block scalars) the count only errs high or stays at zero. A flow entry `a: b`
/// is an implicit map, so each opening may add two levels.
fn nesting_bound(text: &str) -> Option<usize> {
    // One pass over the bytes (every byte looked for is ASCII): searching for characters
    // and splitting lines by `char` patterns decoded the whole text twice over.
    let (mut longest, mut line_start, mut open, mut most_open) = (0usize, 0usize, 0usize, 0usize);
    let (mut after_blank, mut comment) = (true, false);
    for (i, &b) in text.as_bytes().iter().enumerate() {
        match b {
            b'"' | b'\'' | b'!' | b'&' | b'*' | b'\t' => return None,
            b'\n' | b'\r' => {
                longest = longest.max(i - line_start);
                line_start = i + 1;
                (after_blank, comment) = (true, false);
                continue;
            }
            _ if comment => continue,
            b'#' if after_blank => {
                comment = true;
                continue;
            }
            b'[' | b'{' => {
                open += 1;
                most_open = most_open.max(open);
            }
            b']' | b'}' => open = open.saturating_sub(1),
            _ => {}
        }
        after_blank = b == b' ';
    }
    longest = longest.max(text.len() - line_start);
    Some(2 * longest + 2 * most_open)
}

fn load(file: FileId, text: &str) -> Result<Node, Diagnostics> {
    load_with(file, text, None)
}

/// [`load`], streaming the top level's `steps:` entries to `steps` (see [`tree::parse_streaming`]).
fn load_with(file: FileId, text: &str, steps: Option<tree::StepSink<'_>>) -> Result<Node, Diagnostics> {
    if text.trim().is_empty() {
        let mut d = Diagnostics::default();
        d.error(Span::new(file, 1, 1), "the file is empty");
        return Err(d);
    }
    if let Some(m) = nesting_exceeds(text, MAX_DEPTH) {
        let mut d = Diagnostics::default();
        d.push(
            Diagnostic::new(
                Span::new(file, m.line() as u32, m.col() as u32 + 1),
                format!("the document nests more than {MAX_DEPTH} levels of lists and maps (the limit)"),
            )
            .with_help("flatten the structure; values this deep cannot be stored or shown"),
        );
        return Err(d);
    }
    let parsed = match steps {
        Some(sink) => tree::parse_streaming(text, sink),
        None => tree::parse(text),
    };
    parsed.map_err(|e| {
        let (mark, msg) = match &e {
            LoadError::TopLevelMustBeMapping(m) => (*m, "the top level must be a mapping".to_owned()),
            // The event of an anchor or a tag marks the node it belongs to, which starts after
            // it (on the next line for `when: !flag`): the scanner knows where it is written.
            LoadError::UnexpectedAnchor(m) => (
                first_token(text, |t| matches!(t, TokenType::Anchor(_))).unwrap_or(*m),
                "YAML anchors are not supported".to_owned(),
            ),
            LoadError::MappingKeyMustBeScalar(m) => (*m, "mapping keys must be plain scalars".to_owned()),
            LoadError::UnexpectedTag(m) => (
                first_token(text, |t| matches!(t, TokenType::Tag(..))).unwrap_or(*m),
                "YAML tags are not supported".to_owned(),
            ),
            // An alias (`*name`) is read as a reference to an anchor, which none can be.
            LoadError::Scan(m, _) if first_token(text, |t| matches!(t, TokenType::Alias(_))) == Some(*m) => {
                (*m, "YAML aliases are not supported".to_owned())
            }
            LoadError::Scan(m, scan) => (*m, format!("malformed YAML: {}", scan.info())),
            LoadError::DuplicateKey { key, first } => (
                key.mark(),
                format!(
                    "duplicate key '{}' (first defined at line {})",
                    key.as_str(),
                    first.line
                ),
            ),
        };
        let mut d = Diagnostics::default();
        d.error(Span::new(file, mark.line, mark.col), msg);
        d
    })
}

/// Where the first token that `wanted` picks is written, as a loader marker (1-based line and
/// column), if the scanner gets that far.
fn first_token(text: &str, wanted: impl Fn(&TokenType) -> bool) -> Option<Mark> {
    yaml_rust2::scanner::Scanner::new(text.chars())
        .find(|t| wanted(&t.1))
        .map(|t| Mark::of(t.0))
}

/// A YAML node's data value: plain scalars are typed (null, booleans, numbers), quoted ones
/// are strings.
pub(crate) fn value_of(node: &Node) -> Value {
    match node {
        Node::Scalar(s) => scalar_value(s),
        Node::Sequence(seq) => Value::Array(seq.iter().map(value_of).collect()),
        Node::Mapping(m) => Value::Object(m.iter().map(|(k, v)| (k.as_str().to_owned(), value_of(v))).collect()),
    }
}

fn scalar_value(s: &Scalar) -> Value {
    let text = s.as_str();
    if !s.may_coerce() {
        return Value::String(text.to_owned());
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let looks_numeric = text.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.');
    if looks_numeric {
        if let Ok(i) = text.parse::<i64>() {
            return Value::from(i);
        }
        if text.chars().any(|c| c.is_ascii_digit())
            && let Ok(f) = text.parse::<f64>()
            && let Some(n) = serde_json::Number::from_f64(f)
        {
            return Value::Number(n);
        }
    }
    Value::String(text.to_owned())
}

struct FrontEnd {
    file: FileId,
    diags: Diagnostics,
}

impl FrontEnd {
    fn span(&self, node: &Node) -> Span {
        self.marker_span(node.mark())
    }

    fn key_span(&self, key: &Scalar) -> Span {
        self.marker_span(key.mark())
    }

    fn marker_span(&self, m: Mark) -> Span {
        Span::new(self.file, m.line, m.col)
    }

    fn err(&mut self, span: Span, msg: impl Into<String>) {
        self.diags.push(Diagnostic::new(span, msg));
    }

    fn expr(&mut self, node: &Node) -> Expr {
        match node {
            Node::Scalar(s) => {
                let span = self.key_span(s);
                if let Some(r) = Ref::parse(s.as_str(), span) {
                    return Expr::Ref(r);
                }
                Expr::Lit(scalar_value(s))
            }
            Node::Sequence(seq) => {
                let items: Vec<Expr> = seq.iter().map(|n| self.expr(n)).collect();
                if items.iter().all(Expr::is_literal) {
                    Expr::Lit(value_of(node))
                } else {
                    Expr::Array(items)
                }
            }
            Node::Mapping(m) => {
                let fields: Vec<(String, Expr)> =
                    m.iter().map(|(k, v)| (k.as_str().to_owned(), self.expr(v))).collect();
                if fields.iter().all(|(_, e)| e.is_literal()) {
                    Expr::Lit(value_of(node))
                } else {
                    Expr::Object(fields)
                }
            }
        }
    }

    fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        match node.as_scalar() {
            Some(s) if !s.as_str().is_empty() => Some(s.as_str().to_owned()),
            _ => {
                self.err(self.span(node), format!("{what} must be a string"));
                None
            }
        }
    }

    fn names(&mut self, node: &Node, what: &str) -> Vec<(String, Span)> {
        match node {
            Node::Scalar(s) if !s.as_str().is_empty() => vec![(s.as_str().to_owned(), self.key_span(s))],
            Node::Sequence(seq) => seq
                .iter()
                .filter_map(|n| self.string(n, what).map(|s| (s, self.span(n))))
                .collect(),
            _ => {
                self.err(self.span(node), format!("{what} must be a name or a list of names"));
                Vec::new()
            }
        }
    }

    fn ty(&mut self, node: &Node) -> Option<Type> {
        let src = self.string(node, "a type")?;
        match Type::parse(&src) {
            Ok(t) => Some(t),
            Err(e) => {
                self.err(self.span(node), format!("bad type: {e}"));
                None
            }
        }
    }

    fn step(&mut self, name: &str, span: Span, map: &Mapping) -> Option<Step> {
        self.step_at(name, span, map, None, false)
    }

    /// `providers:`: a mapping of namespaces to their settings.
    fn providers(&mut self, node: &Node) -> Vec<ProviderConfig> {
        let mut out = Vec::new();
        match node {
            Node::Mapping(m) => {
                for (k, v) in m.iter() {
                    let span = self.key_span(k);
                    let mut value = Vec::new();
                    match v {
                        Node::Mapping(settings) => {
                            for (sk, sv) in settings.iter() {
                                value.push(Attr {
                                    name: sk.as_str().to_owned(),
                                    span: self.key_span(sk),
                                    expr: self.expr(sv),
                                });
                            }
                        }
                        Node::Scalar(s) if s.as_str().is_empty() => {}
                        other => {
                            self.err(
                                self.span(other),
                                format!("the settings of provider '{}' must be a mapping", k.as_str()),
                            );
                            continue;
                        }
                    }
                    out.push(ProviderConfig {
                        namespace: k.as_str().to_owned(),
                        span,
                        value,
                    });
                }
            }
            Node::Scalar(s) if s.as_str().is_empty() => {}
            other => self.err(
                self.span(other),
                "'providers' must be a mapping of provider namespaces to their settings",
            ),
        }
        out
    }

    /// A duration such as `30s`, `1m30s` or `500ms`.
    fn duration(&mut self, node: &Node, what: &str) -> Option<Duration> {
        let src = self.string(node, what)?;
        match humantime::parse_duration(&src) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                self.err(self.span(node), format!("{what} must be longer than zero"));
                None
            }
            Err(e) => {
                self.err(
                    self.span(node),
                    format!("{what} '{src}' is not a duration ({e}); write e.g. 30s, 1m30s or 500ms"),
                );
                None
            }
        }
    }

    /// `retry:` (`3`, or `{attempts: 3, backoff: 2s, max_backoff: 1m}`) and `timeout:`.
    fn controls(&mut self, map: &Mapping) -> Controls {
        let mut c = Controls::none();
        if let Some(n) = map.get_node("timeout") {
            c.timeout = self.duration(n, "'timeout'");
        }
        let attempts = |fe: &mut Self, n: &Node| -> Option<u32> {
            match n.as_scalar().and_then(|s| s.as_str().parse::<u32>().ok()) {
                Some(a) if (1..=100).contains(&a) => Some(a),
                _ => {
                    fe.err(fe.span(n), "'attempts' must be a whole number from 1 to 100");
                    None
                }
            }
        };
        match map.get_node("retry") {
            None => {}
            Some(n @ Node::Scalar(_)) => {
                if let Some(a) = attempts(self, n) {
                    c.attempts = a;
                }
            }
            Some(Node::Mapping(m)) => {
                for (k, v) in m.iter() {
                    match k.as_str() {
                        "attempts" => {
                            if let Some(a) = attempts(self, v) {
                                c.attempts = a;
                            }
                        }
                        "backoff" => {
                            if let Some(d) = self.duration(v, "'backoff'") {
                                c.backoff = d;
                            }
                        }
                        "max_backoff" => {
                            if let Some(d) = self.duration(v, "'max_backoff'") {
                                c.max_backoff = d;
                            }
                        }
                        other => self.diags.push(
                            Diagnostic::new(self.key_span(k), format!("unknown key '{other}' in 'retry'"))
                                .with_help("'retry' takes: attempts, backoff, max_backoff"),
                        ),
                    }
                }
                c.max_backoff = c.max_backoff.max(c.backoff);
            }
            Some(other) => self.err(
                self.span(other),
                "'retry' must be a number of attempts or a mapping of attempts, backoff and max_backoff",
            ),
        }
        c
    }

    /// One child of `steps:`.
    fn child_step(&mut self, k: &Scalar, v: &Node, steps: &mut Vec<Step>) {
        let cspan = self.key_span(k);
        match v.as_mapping() {
            Some(m) => {
                if let Some(s) = self.step(k.as_str(), cspan, m) {
                    steps.push(s);
                }
            }
            None => self.err(self.span(v), format!("step '{}' must be a mapping", k.as_str())),
        }
    }

    /// `steps:` that is not a mapping.
    fn not_steps(&mut self, node: &Node) {
        match node {
            // `steps:` with nothing under it: a workflow of parameters and returns only.
            Node::Scalar(s) if s.as_str().is_empty() => {}
            other => self.err(self.span(other), "'steps' must be a mapping of step names to steps"),
        }
    }

    /// A step from its mapping. `taken_steps` is its `steps:` value when the caller took it
    /// out of `map` (where an empty value stands in its place), to be consumed here, with the
    /// steps streamed out of it while it was read.
    fn step_at(
        &mut self,
        name: &str,
        span: Span,
        map: &Mapping,
        taken_steps: Option<(Node, Streamed)>,
        top: bool,
    ) -> Option<Step> {
        let has = |k: &str| map.get_node(k).is_some();
        let coll_keys: Vec<&str> = COLLECTION_KEYS.iter().copied().filter(|k| has(k)).collect();
        let kinds = [has("steps"), !coll_keys.is_empty(), has("call"), has("resource")];
        if kinds.iter().filter(|k| **k).count() > 1 {
            self.err(
                span,
                format!(
                    "step '{name}' mixes step kinds: use only one of 'steps', 'resource', 'call', or a collection key"
                ),
            );
            return None;
        }
        if coll_keys.len() > 1 {
            self.err(
                span,
                format!("step '{name}' has several collection keys: {}", coll_keys.join(", ")),
            );
            return None;
        }
        let (allowed, is_call): (&[&str], bool) = if kinds[0] {
            (&["steps"], false)
        } else if kinds[1] {
            (&["each", "eachPair", "times", "range", "as", "into", "step"], false)
        } else if kinds[2] {
            (&["call"], true)
        } else if kinds[3] {
            (&["resource", "value", "external_id", "retry", "timeout"], false)
        } else {
            self.err(
                span,
                format!("step '{name}' must contain one of the keys 'steps', 'resource', 'call', 'each', 'eachPair', 'times' or 'range'"),
            );
            return None;
        };
        for (k, _) in map.iter() {
            let known = allowed.contains(&k.as_str())
                || COMMON_KEYS.contains(&k.as_str())
                || (top && k.as_str() == "providers");
            if !known {
                let kind = if kinds[0] {
                    "workflow"
                } else if kinds[1] {
                    "collection"
                } else if kinds[2] {
                    "call"
                } else {
                    "resource"
                };
                let mut all: Vec<&str> = allowed.to_vec();
                all.extend(COMMON_KEYS);
                self.diags.push(
                    Diagnostic::new(
                        self.key_span(k),
                        format!("unknown key '{}' in {kind} step '{name}'", k.as_str()),
                    )
                    .with_help(format!("a {kind} step takes: {}", all.join(", "))),
                );
            }
        }

        let mut params = map
            .get_node("parameters")
            .map(|n| self.params(n, is_call))
            .unwrap_or_default();
        let returns = map.get_node("returns").map(|n| self.returns(n)).unwrap_or_default();
        let when = map.get_node("when").and_then(|n| {
            let src = self.string(n, "'when'")?;
            let at = self.span(n);
            match Guard::parse(&src) {
                Ok(g) => Some((g, at)),
                Err((off, msg)) => {
                    // Point into the guard text when it is on one line.
                    let quoted = n.as_scalar().is_some_and(|s| !s.may_coerce());
                    // A guard can be very long; the caret shows where the problem is.
                    let shown = if src.chars().count() > 80 {
                        format!("{}...", src.chars().take(77).collect::<String>())
                    } else {
                        src.clone()
                    };
                    self.err(
                        at.shifted(off + usize::from(quoted)),
                        format!("bad guard '{shown}': {msg}"),
                    );
                    None
                }
            }
        });

        let kind = if kinds[0] {
            let mut steps = Vec::new();
            let borrowed = match &taken_steps {
                Some(_) => None,
                None => map.get_node("steps"),
            };
            match (taken_steps, borrowed) {
                (Some((Node::Mapping(children), streamed)), _) => {
                    steps = streamed.steps;
                    self.diags.extend(streamed.fe.diags);
                    // Sized once: a workflow of 10,000 steps would otherwise grow (and keep)
                    // up to twice the room.
                    steps.reserve_exact(children.iter().len());
                    for (k, v) in children.into_entries() {
                        self.child_step(&k, &v, &mut steps);
                    }
                }
                (None, Some(Node::Mapping(children))) => {
                    steps.reserve_exact(children.iter().len());
                    for (k, v) in children.iter() {
                        self.child_step(k, v, &mut steps);
                    }
                }
                (Some((other, _)), _) => self.not_steps(&other),
                (None, Some(other)) => self.not_steps(other),
                (None, None) => {}
            }
            let n = steps.len();
            StepKind::Workflow {
                steps,
                deps: vec![Vec::new(); n],
            }
        } else if kinds[1] {
            self.collection(name, span, map, coll_keys[0])?
        } else if kinds[2] {
            let node = map.get_node("call").expect("checked");
            let target_span = self.span(node);
            let target = match node.as_scalar() {
                Some(s) if s.as_str().is_empty() => name.to_owned(),
                _ => self.string(node, "'call'")?,
            };
            // The arguments are the step's `parameters`, each with its own source and type.
            let args = std::mem::take(&mut params);
            StepKind::Call {
                target,
                target_span,
                args,
            }
        } else {
            let tnode = map.get_node("resource").expect("checked");
            let type_span = self.span(tnode);
            let type_name = self.string(tnode, "'resource'")?;
            let mut value = Vec::new();
            match map.get_node("value") {
                Some(Node::Mapping(m)) => {
                    value.reserve_exact(m.iter().len());
                    for (k, v) in m.iter() {
                        value.push(Attr {
                            name: k.as_str().to_owned(),
                            span: self.key_span(k),
                            expr: self.expr(v),
                        });
                    }
                }
                Some(Node::Scalar(s)) if s.as_str().is_empty() => {}
                Some(other) => self.err(
                    self.span(other),
                    "'value' must be a mapping of attribute names to values",
                ),
                None => {}
            }
            let external_id = map.get_node("external_id").map(|n| (self.expr(n), self.span(n)));
            let controls = self.controls(map);
            StepKind::Resource {
                type_name,
                type_span,
                value,
                external_id: external_id.map(Box::new),
                controls,
            }
        };
        // A call's `parameters` are its arguments (taken above): it has none of its own.
        Some(Step {
            name: name.to_owned(),
            span,
            params,
            returns,
            when: when.map(Box::new),
            kind,
            inputs: Vec::new(),
        })
    }

    fn collection(&mut self, name: &str, span: Span, map: &Mapping, key: &str) -> Option<StepKind> {
        let node = map.get_node(key).expect("checked");
        let over_span = self.span(node);
        let over = match key {
            "each" => Over::Each(self.expr(node)),
            "eachPair" => Over::EachPair(self.expr(node)),
            "times" => Over::Times(self.expr(node)),
            _ => match node.as_sequence() {
                Some(seq) if seq.len() == 2 => Over::Range(self.expr(&seq[0]), self.expr(&seq[1])),
                _ => {
                    self.err(over_span, "'range' must be a list of two integers [from, to]");
                    return None;
                }
            },
        };
        let vars: Vec<String> = map
            .get_node("as")
            .map(|n| self.names(n, "'as'"))
            .unwrap_or_default()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        match key {
            "each" if vars.is_empty() => self.err(span, format!("collection '{name}' needs 'as' to name each element")),
            "eachPair" if vars.len() != 2 => self.err(
                span,
                format!("collection '{name}' needs 'as: [key, value]' for eachPair"),
            ),
            "times" | "range" if vars.len() > 1 => self.err(
                span,
                format!("collection '{name}' binds only the index: give one name in 'as'"),
            ),
            _ => {}
        }
        let into = match map.get_node("into") {
            Some(n) => self.string(n, "'into'")?,
            None => name.to_owned(),
        };
        let step = match map.get_node("step") {
            Some(Node::Mapping(m)) => self.step(name, self.marker_span(m.mark()), m)?,
            Some(other) => {
                self.err(self.span(other), "'step' must be a mapping (the step to repeat)");
                return None;
            }
            None => {
                self.err(span, format!("collection '{name}' needs a 'step' to repeat"));
                return None;
            }
        };
        Some(StepKind::Collection {
            over: Box::new(over),
            over_span,
            vars,
            into,
            step: Box::new(step),
        })
    }

    fn params(&mut self, node: &Node, is_call: bool) -> Vec<Param> {
        match node {
            Node::Mapping(m) => {
                let mut out = Vec::with_capacity(m.iter().len());
                for (k, v) in m.iter() {
                    let span = self.key_span(k);
                    let name = k.as_str().to_owned();
                    let mut p = Param {
                        name: name.clone(),
                        span,
                        ty: None,
                        source: ParamSource::Implicit,
                        doc: None,
                        default: None,
                    };
                    match v {
                        // On a call, `local: calledName`: the called parameter `calledName`
                        // takes the caller's `$local`.
                        Node::Scalar(s) if is_call && !s.as_str().is_empty() => {
                            p.name = s.as_str().to_owned();
                            p.source = ParamSource::Value(Expr::Ref(Ref {
                                name,
                                path: vec![],
                                span,
                            }));
                        }
                        // Elsewhere the May 2019 shorthand `name: Type`.
                        Node::Scalar(s) if !s.as_str().is_empty() => p.ty = self.ty(v),
                        Node::Scalar(_) => {}
                        Node::Mapping(pm) => {
                            // One source: with both, one of them would be silently dropped.
                            let second = pm
                                .iter()
                                .map(|(k, _)| k)
                                .filter(|k| matches!(k.as_str(), "lookup" | "value"))
                                .nth(1);
                            if let Some(k) = second {
                                self.diags.push(
                                    Diagnostic::new(
                                        self.key_span(k),
                                        format!("parameter '{name}' has both a lookup and a value"),
                                    )
                                    .with_help("give it one of them: the data key to read, or the value itself"),
                                );
                            }
                            if let (Some((dk, _)), true) = (
                                pm.iter().find(|(k, _)| k.as_str() == "default"),
                                pm.iter().any(|(k, _)| k.as_str() == "value"),
                            ) {
                                self.diags.push(
                                    Diagnostic::new(
                                        self.key_span(dk),
                                        format!("parameter '{name}' has both a value and a default"),
                                    )
                                    .with_help(
                                        "a default is for a value read from the data: give a lookup, or neither",
                                    ),
                                );
                            }
                            for (pk, pv) in pm.iter() {
                                match pk.as_str() {
                                    "type" => p.ty = self.ty(pv),
                                    "lookup" => {
                                        p.source = match pv {
                                            Node::Sequence(seq) if !seq.is_empty() => {
                                                match self.string(&seq[0], "'lookup'") {
                                                    Some(key) => ParamSource::Lookup(key),
                                                    None => continue,
                                                }
                                            }
                                            _ => match self.string(pv, "'lookup'") {
                                                Some(key) => ParamSource::Lookup(key),
                                                None => continue,
                                            },
                                        }
                                    }
                                    "value" => p.source = ParamSource::Value(self.expr(pv)),
                                    "doc" => p.doc = self.string(pv, "'doc'"),
                                    "default" => match self.expr(pv) {
                                        Expr::Lit(v) => p.default = Some(v),
                                        _ => self.err(
                                            self.span(pv),
                                            format!("the default of parameter '{name}' must be a literal value (it cannot reference variables)"),
                                        ),
                                    },
                                    other => self.diags.push(
                                        Diagnostic::new(
                                            self.key_span(pk),
                                            format!("unknown key '{other}' in parameter '{name}'"),
                                        )
                                        .with_help("a parameter takes: type, lookup, value, default, doc"),
                                    ),
                                }
                            }
                        }
                        Node::Sequence(_) => {
                            self.err(self.span(v), format!("parameter '{name}' must be a type or a mapping"))
                        }
                    }
                    // A default must be a value of the parameter's type: checked here, where its
                    // position is known, rather than when it is first needed.
                    if let (Some(ty), Some(d)) = (&p.ty, &p.default) {
                        match ty.coerce(d) {
                            Ok(d) => p.default = Some(d),
                            Err(e) => {
                                let at = v
                                    .as_mapping()
                                    .and_then(|m| m.iter().find(|(k, _)| k.as_str() == "default"))
                                    .map_or(span, |(_, dv)| self.span(dv));
                                self.err(
                                    at,
                                    format!("the default of parameter '{}' does not fit its type {ty}: {e}", p.name),
                                );
                                p.default = None;
                            }
                        }
                    }
                    out.push(p);
                }
                out
            }
            _ => self
                .names(node, "'parameters'")
                .into_iter()
                .map(|(name, span)| Param {
                    name,
                    span,
                    ty: None,
                    source: ParamSource::Implicit,
                    doc: None,
                    default: None,
                })
                .collect(),
        }
    }

    fn returns(&mut self, node: &Node) -> Vec<Return> {
        match node {
            Node::Mapping(m) => {
                // Exactly sized: a first push would make room for four.
                let mut out = Vec::with_capacity(m.iter().len());
                for (k, v) in m.iter() {
                    let span = self.key_span(k);
                    let mut r = Return {
                        name: k.as_str().to_owned(),
                        span,
                        ty: None,
                        source: ReturnSource::Same,
                        read: true,
                    };
                    match v {
                        Node::Scalar(s) if s.as_str().is_empty() => {}
                        Node::Scalar(s) => r.source = ReturnSource::Alias(s.as_str().to_owned()),
                        Node::Mapping(rm) => {
                            for (rk, rv) in rm.iter() {
                                match rk.as_str() {
                                    "type" => r.ty = self.ty(rv),
                                    "value" => r.source = ReturnSource::Value(Box::new(self.expr(rv))),
                                    "alias" => {
                                        if let Some(a) = self.string(rv, "'alias'") {
                                            r.source = ReturnSource::Alias(a);
                                        }
                                    }
                                    other => self.diags.push(
                                        Diagnostic::new(
                                            self.key_span(rk),
                                            format!("unknown key '{other}' in return '{}'", r.name),
                                        )
                                        .with_help("a return takes: type, value, alias"),
                                    ),
                                }
                            }
                        }
                        Node::Sequence(_) => {
                            self.err(self.span(v), format!("return '{}' must be a name or a mapping", r.name))
                        }
                    }
                    out.push(r);
                }
                out
            }
            _ => self
                .names(node, "'returns'")
                .into_iter()
                .map(|(name, span)| Return {
                    name,
                    span,
                    ty: None,
                    source: ReturnSource::Same,
                    read: true,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(text: &str) -> Result<Workflow, Diagnostics> {
        parse_workflow("t", FileId(0), text)
    }

    fn messages(text: &str) -> Vec<String> {
        let d = parse(text).expect_err("refused");
        d.iter()
            .map(|d| format!("{}:{} {}", d.span.line, d.span.col, d.message))
            .collect()
    }

    #[test]
    fn steps_are_read_the_same_at_the_top_and_nested() {
        // The top level's `steps:` is consumed out of the tree, a nested one is borrowed:
        // both give the same steps, in order, and the same errors.
        let nested = "steps:\n  inner:\n    steps:\n      b: {resource: A::B}\n      a: {resource: A::B}\n";
        let wf = parse(nested).expect("parses");
        let StepKind::Workflow { steps, .. } = &wf.root.kind else {
            panic!("a workflow")
        };
        let StepKind::Workflow { steps: inner, .. } = &steps[0].kind else {
            panic!("nested")
        };
        assert_eq!(inner.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        let top = parse("steps:\n  b: {resource: A::B}\n  a: {resource: A::B}\n").expect("parses");
        let StepKind::Workflow { steps, .. } = &top.root.kind else {
            panic!("a workflow")
        };
        assert_eq!(steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(steps[0].span.line, 2);

        assert_eq!(
            messages("steps: 5\n"),
            ["1:8 'steps' must be a mapping of step names to steps"]
        );
        assert_eq!(
            messages("steps:\n  inner:\n    steps: [x]\n"),
            ["3:12 'steps' must be a mapping of step names to steps"]
        );
        assert_eq!(messages("steps:\n  a: 1\n"), ["2:6 step 'a' must be a mapping"]);
        assert!(parse("steps:\nreturns: []\n").is_ok(), "empty steps");
        assert!(
            messages("steps: {}\nresource: A::B\n")[0].contains("mixes step kinds"),
            "the key still counts once its value is taken"
        );
        // Steps read while the file streamed in are not looked at when the top level turns
        // out not to be a workflow, as nested ones are not.
        let mixed = messages("steps:\n  a: 1\nresource: A::B\n");
        assert_eq!(mixed.len(), 1, "{mixed:?}");
        assert!(mixed[0].contains("mixes step kinds"), "{mixed:?}");
        // But they are when it is.
        assert_eq!(
            messages("steps:\n  a: 1\n  b: {resource: A::B}\n  c: 2\n"),
            ["2:6 step 'a' must be a mapping", "4:6 step 'c' must be a mapping"]
        );
    }

    #[test]
    fn scalars_are_typed_unless_quoted() {
        let v = parse_value("{a: 1, b: '1', c: true, d: 1.5, e: ~, f: 8G, g: '10.0.0.2', h: 10.0.0.1}").unwrap();
        assert_eq!(
            v,
            json!({"a": 1, "b": "1", "c": true, "d": 1.5, "e": null, "f": "8G", "g": "10.0.0.2", "h": "10.0.0.1"})
        );
    }

    #[test]
    fn detects_kinds_and_refs() {
        let wf = parse(
            "parameters: {p: {type: 'Hash[String,String]', lookup: a.b}}\nreturns: [x]\nsteps:\n  s:\n    returns: {x: id}\n    resource: Null::Resource\n    value:\n      input: [$p.k, 2]\n",
        )
        .unwrap();
        let StepKind::Workflow { steps, .. } = &wf.root.kind else {
            panic!()
        };
        let StepKind::Resource { value, .. } = &steps[0].kind else {
            panic!()
        };
        let refs = value[0].expr.refs();
        assert_eq!(refs[0].name, "p");
        assert_eq!(refs[0].span, Span::new(FileId(0), 8, 15));
        assert!(matches!(wf.root.params[0].source, ParamSource::Lookup(ref k) if k == "a.b"));
    }

    #[test]
    fn reports_unknown_keys_and_missing_kind_together() {
        let err = parse("steps:\n  a:\n    resource: X\n    vaule: {}\n  b:\n    returns: x\n").unwrap_err();
        let msgs: Vec<&str> = err.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert!(msgs[0].contains("unknown key 'vaule'"));
        assert_eq!((err.0[0].span.line, err.0[0].span.col), (4, 5));
        assert!(msgs[1].contains("must contain one of the keys"));
    }

    #[test]
    fn malformed_yaml_has_a_position() {
        let err = parse("steps:\n  a: [1, 2\n").unwrap_err();
        assert!(err.0[0].message.starts_with("malformed YAML"), "{err}");
        assert!(err.0[0].span.line >= 2);
        let err = parse("steps: {}\nsteps: {}\n").unwrap_err();
        assert!(err.0[0].message.contains("duplicate key 'steps'"), "{err}");
    }

    /// A workflow whose one attribute holds `value` (YAML text placed at column 14, line 5).
    fn with_value(value: &str) -> String {
        format!("steps:\n  s:\n    resource: Null::Resource\n    value:\n      input: {value}\n")
    }

    /// `levels` block mappings, one per line, each indented one more space.
    fn block_maps(levels: usize) -> String {
        let mut y = String::new();
        for i in 0..levels {
            y.push_str(&" ".repeat(i));
            y.push_str("a:\n");
        }
        y.push_str(&" ".repeat(levels));
        y.push_str("x\n");
        y
    }

    #[track_caller]
    fn assert_too_deep(err: &Diagnostics, line: u32) {
        assert_eq!(err.len(), 1, "{err}");
        assert!(err.0[0].message.contains("nests more than 64 levels"), "{err}");
        assert_eq!(err.0[0].span.line, line, "{err}");
    }

    /// The byte scan's bound never undercounts: whatever it lets skip the parser's count is
    /// within the limit by that count too, closing brackets in plain scalars and comments
    /// included.
    #[test]
    fn the_nesting_bound_is_never_below_the_parsers_count() {
        let deep = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        let docs = [
            "a: 1\n".to_owned(),
            block_maps(20),
            block_maps(31),
            format!("x: a]]]]]]]]]]\ny: {}\n", deep(40)),
            format!("x: 1 # ]]]]]]]]]]\ny: {}\n", deep(40)),
            format!("y: {}\n", "[a: ".repeat(20) + "1" + &"]".repeat(20)),
            format!("y: [\n{}\n]\n", "- ".repeat(40)),
            format!("\n        {}1", "- ".repeat(40)),
            "a:\n- b:\n  - c:\n    - d: {e: [f]}\n".to_owned(),
        ];
        for doc in &docs {
            for limit in [8, 32, 64] {
                if nesting_bound(doc).is_some_and(|b| b <= limit) {
                    // The parser's own count, without the shortcut.
                    let mut parser = yaml_rust2::parser::Parser::new_from_str(doc);
                    let (mut depth, mut deepest) = (0usize, 0usize);
                    while let Ok((ev, _)) = parser.next_token() {
                        match ev {
                            yaml_rust2::Event::SequenceStart(..) | yaml_rust2::Event::MappingStart(..) => {
                                depth += 1;
                                deepest = deepest.max(depth);
                            }
                            yaml_rust2::Event::SequenceEnd | yaml_rust2::Event::MappingEnd => depth -= 1,
                            yaml_rust2::Event::StreamEnd => break,
                            _ => {}
                        }
                    }
                    assert!(
                        deepest <= limit,
                        "{doc:?}: bound {:?}, depth {deepest}",
                        nesting_bound(doc)
                    );
                }
            }
        }
        assert_eq!(nesting_bound("a: \"x\"\n"), None);
        // Twice the longest line (in bytes, any line break), plus twice the most brackets
        // open at once outside comments.
        assert_eq!(nesting_bound("a: [b]\r\n# {{{{\nlong: x #{[\n"), Some(2 * 11 + 2));
        assert_eq!(nesting_bound("k: x#{\n  - [[é]]"), Some(2 * 10 + 2 * 3));
        assert_eq!(nesting_bound("# a 'quote' in a comment\n"), None);
        assert!(nesting_bound(&block_maps(3)).is_some_and(|b| b <= MAX_DEPTH));
    }

    #[test]
    fn deep_documents_are_rejected_where_they_get_too_deep() {
        // Each of these overflowed the stack (or failed obscurely) in the YAML loader.
        for levels in [10_000, 100_000] {
            let flow_seq = format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
            let flow_map = format!("{}1{}", "{a: ".repeat(levels), "}".repeat(levels));
            let block_seq = format!("\n        {}1", "- ".repeat(levels));
            for value in [&flow_seq, &flow_map] {
                let err = parse(&with_value(value)).unwrap_err();
                assert_too_deep(&err, 5);
                // Levels 1-4 are the workflow's own maps; the 65th level opens at column 14 + 60.
                assert!(err.0[0].span.col > 14, "{err}");
            }
            assert_too_deep(&parse(&with_value(&block_seq)).unwrap_err(), 6);
            assert_too_deep(&parse_data(FileId(0), &format!("k: {flow_seq}\n")).unwrap_err(), 1);
            let err = parse_value(&flow_seq).unwrap_err();
            assert!(err.contains("nests more than 64 levels"), "{err}");
        }
        let err = parse_data(FileId(0), &block_maps(3_000)).unwrap_err();
        assert_too_deep(&err, 65);
        assert_eq!(err.0[0].span.col, 65, "{err}");
        assert_too_deep(&parse(&block_maps(3_000)).unwrap_err(), 65);
    }

    #[test]
    fn documents_at_the_limit_are_read_whole() {
        let data = parse_data(FileId(0), &block_maps(MAX_DEPTH)).unwrap();
        assert_eq!(crate::value::depth(&Value::Object(data)), MAX_DEPTH);
        assert!(parse_data(FileId(0), &block_maps(MAX_DEPTH + 1)).is_err());
        // The value of `--var`: itself up to the limit.
        let v = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(crate::value::depth(&parse_value(&v).unwrap()), MAX_DEPTH);
        assert!(parse_value(&format!("[{v}]")).is_err());
        // In a workflow, the four levels above the value count too.
        let inner = MAX_DEPTH - 4;
        let v = format!("{}1{}", "[".repeat(inner), "]".repeat(inner));
        assert!(parse(&with_value(&v)).is_ok());
        assert!(parse(&with_value(&format!("[{v}]"))).is_err());
    }

    /// `doc` and `default` are read; a default must fit the type, be a literal, and not
    /// come with a `value`.
    #[test]
    fn parameters_take_a_doc_and_a_default() {
        let wf = parse("parameters:\n  n: {type: Float, default: 2, doc: The count.}\n  m: {lookup: a.b}\nsteps: {}\n")
            .unwrap();
        let n = &wf.root.params[0];
        assert_eq!(n.doc.as_deref(), Some("The count."));
        assert_eq!(n.default, Some(Value::from(2)));
        assert_eq!(
            (wf.root.params[1].doc.as_ref(), wf.root.params[1].default.as_ref()),
            (None, None)
        );
        let errors = |text: &str| {
            parse(text)
                .unwrap_err()
                .0
                .iter()
                .map(|d| format!("{}:{}: {}", d.span.line, d.span.col, d.message))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            errors("parameters:\n  n:\n    type: Integer[1, 5]\n    default: 9\nsteps: {}\n"),
            ["4:14: the default of parameter 'n' does not fit its type Integer[1, 5]: expects Integer[1, 5], got 9"]
        );
        assert_eq!(
            errors("parameters:\n  n: {value: 1, default: 2}\nsteps: {}\n"),
            ["2:17: parameter 'n' has both a value and a default"]
        );
        assert_eq!(
            errors("parameters:\n  n: {default: $x}\nsteps: {}\n"),
            ["2:16: the default of parameter 'n' must be a literal value (it cannot reference variables)"]
        );
    }

    /// Tags and anchors are reported where they are written, not at the node they belong
    /// to (for `when: !flag`, that was the next line; for a tag ending the file, past it).
    #[test]
    fn tags_and_anchors_are_reported_where_they_are_written() {
        let at = |text: &str| {
            let err = parse(text).unwrap_err();
            assert_eq!(err.len(), 1, "{err}");
            let d = &err.0[0];
            (d.message.clone(), d.span.line, d.span.col)
        };
        let tag = "YAML tags are not supported".to_owned();
        let anchor = "YAML anchors are not supported".to_owned();
        assert_eq!(
            at("parameters: [flag]\nsteps:\n  x:\n    when: !flag\n    resource: Null::Resource\n"),
            (tag.clone(), 4, 11)
        );
        assert_eq!(
            at("steps:\n  x:\n    resource: N::R\n    value: !foo\n"),
            (tag.clone(), 4, 12)
        );
        assert_eq!(at("steps: !!map\n  x:\n    resource: N::R\n"), (tag.clone(), 1, 8));
        assert_eq!(at("steps:\n  x:\n    value:\n      input: !!str 5\n"), (tag, 4, 14));
        assert_eq!(
            at("steps:\n  x: &a\n    resource: N::R\n  y: *a\n"),
            (anchor.clone(), 2, 6)
        );
        assert_eq!(at("steps:\n  x:\n    value: &v [1]\n"), (anchor, 3, 12));
        assert_eq!(
            at("steps:\n  x:\n    value:\n      input: *a\n"),
            ("YAML aliases are not supported".to_owned(), 4, 14)
        );
    }

    /// A parameter (or a call's argument) takes one source: with a lookup and a value, one
    /// of them used to be dropped silently.
    #[test]
    fn a_parameter_has_one_source() {
        for text in [
            "parameters:\n  a:\n    lookup: k\n    value: 1\nsteps:\n",
            "steps:\n  c:\n    call: lib\n    parameters:\n      a: {value: 1, lookup: k}\n",
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.len(), 1, "{err}");
            assert_eq!(err.0[0].message, "parameter 'a' has both a lookup and a value");
            // At the second of them.
            assert!(
                matches!((err.0[0].span.line, err.0[0].span.col), (4, 5) | (5, 21)),
                "{err}"
            );
        }
    }

    /// A call's `parameters` are its arguments, each with its own source and type.
    #[test]
    fn call_arguments_keep_lookups_and_types() {
        let wf = parse(
            "steps:\n  c:\n    call: lib\n    parameters:\n      a: {lookup: k.a, type: Integer}\n      b:\n      local: c\n",
        )
        .unwrap();
        let StepKind::Workflow { steps, .. } = &wf.root.kind else {
            panic!()
        };
        assert!(steps[0].params.is_empty());
        let StepKind::Call { args, .. } = &steps[0].kind else {
            panic!()
        };
        let names: Vec<&str> = args.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(matches!(&args[0].source, ParamSource::Lookup(k) if k == "k.a"));
        assert_eq!(args[0].ty, Some(Type::INTEGER));
        assert!(matches!(args[1].source, ParamSource::Implicit));
        assert!(matches!(&args[2].source, ParamSource::Value(Expr::Ref(r)) if r.name == "local"));
    }

    #[test]
    fn names_from_paths() {
        assert_eq!(workflow_name("a/b.yaml"), "a::b");
        assert_eq!(workflow_name("foobernetes.yaml"), "foobernetes");
    }
}
