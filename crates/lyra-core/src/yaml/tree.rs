//! A YAML document as a small tree with positions, built from `yaml-rust2`'s event stream.
//!
//! The front end reads each node once, so the tree only has to say what was written where:
//! scalars keep their text, whether they were plain (only plain scalars are typed), and their
//! line and column; collections keep their children in order and where they start. Mappings
//! are vectors of entries, not hash maps: their keys are looked up a handful of times, and a
//! workflow of 10,000 steps then costs a fraction of a linked hash map per node.
//!
//! The loader is a loop over events with an explicit stack (no recursion), children are
//! gathered on one shared stack and moved into an exactly sized vector when their collection
//! ends, and what the language refuses (anchors, tags, complex keys, duplicate keys) stops
//! the build at the first one met, in document order. The scanner still reads to the end of
//! the (first) document: malformed YAML further down is reported rather than a refusal
//! before it.

use yaml_rust2::Event;
use yaml_rust2::parser::Parser;
use yaml_rust2::scanner::{ScanError, TScalarStyle};

use crate::FastMap;

/// Where a node starts: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub line: u32,
    pub col: u32,
}

impl Mark {
    /// A scanner's marker (0-based column) as a mark.
    pub fn of(m: yaml_rust2::scanner::Marker) -> Mark {
        Mark {
            line: u32::try_from(m.line()).unwrap_or(u32::MAX),
            col: u32::try_from(m.col() + 1).unwrap_or(u32::MAX),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Scalar {
    text: String,
    mark: Mark,
    /// Written plain (not quoted, not a block scalar): only then may it be typed.
    plain: bool,
}

impl Scalar {
    pub fn as_str(&self) -> &str {
        &self.text
    }
    pub fn may_coerce(&self) -> bool {
        self.plain
    }
    pub fn mark(&self) -> Mark {
        self.mark
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    items: Vec<Node>,
    mark: Mark,
}

impl std::ops::Deref for Sequence {
    type Target = [Node];
    fn deref(&self) -> &[Node] {
        &self.items
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Mapping {
    entries: Vec<(Scalar, Node)>,
    mark: Mark,
}

impl Mapping {
    /// The entries in document order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&Scalar, &Node)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }
    pub fn get_node(&self, key: &str) -> Option<&Node> {
        self.entries.iter().find(|(k, _)| k.text == key).map(|(_, v)| v)
    }
    /// Takes the value of `key` out, leaving an empty plain scalar where it was (the key
    /// stays, at its place).
    pub fn take_node(&mut self, key: &str) -> Option<Node> {
        let (_, v) = self.entries.iter_mut().find(|(k, _)| k.text == key)?;
        let empty = Node::Scalar(Scalar {
            text: String::new(),
            mark: v.mark(),
            plain: true,
        });
        Some(std::mem::replace(v, empty))
    }
    /// The entries, owned, in document order.
    pub fn into_entries(self) -> std::vec::IntoIter<(Scalar, Node)> {
        self.entries.into_iter()
    }
    pub fn mark(&self) -> Mark {
        self.mark
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Scalar(Scalar),
    Sequence(Sequence),
    Mapping(Mapping),
}

impl Node {
    pub fn mark(&self) -> Mark {
        match self {
            Node::Scalar(s) => s.mark,
            Node::Sequence(s) => s.mark,
            Node::Mapping(m) => m.mark,
        }
    }
    pub fn as_scalar(&self) -> Option<&Scalar> {
        match self {
            Node::Scalar(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_sequence(&self) -> Option<&Sequence> {
        match self {
            Node::Sequence(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_mapping(&self) -> Option<&Mapping> {
        match self {
            Node::Mapping(m) => Some(m),
            _ => None,
        }
    }
    pub fn as_mapping_mut(&mut self) -> Option<&mut Mapping> {
        match self {
            Node::Mapping(m) => Some(m),
            _ => None,
        }
    }
}

/// Why a document is not one the front end reads.
#[derive(Debug)]
pub(crate) enum LoadError {
    /// The document is not a mapping (a scalar or a sequence at the top).
    TopLevelMustBeMapping(Mark),
    UnexpectedAnchor(Mark),
    UnexpectedTag(Mark),
    /// A key that is a list or a mapping.
    MappingKeyMustBeScalar(Mark),
    DuplicateKey {
        key: Scalar,
        first: Mark,
    },
    /// The scanner or the parser gave up.
    Scan(Mark, ScanError),
}

impl std::fmt::Display for Mark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::TopLevelMustBeMapping(m) => write!(f, "{m}: the top level must be a mapping"),
            LoadError::UnexpectedAnchor(m) => write!(f, "{m}: YAML anchors are not supported"),
            LoadError::UnexpectedTag(m) => write!(f, "{m}: YAML tags are not supported"),
            LoadError::MappingKeyMustBeScalar(m) => write!(f, "{m}: mapping keys must be plain scalars"),
            LoadError::DuplicateKey { key, first } => write!(
                f,
                "{}: duplicate key '{}' (first defined at line {})",
                key.mark, key.text, first.line
            ),
            LoadError::Scan(m, e) => write!(f, "{m}: {}", e.info()),
        }
    }
}

/// Mappings with more entries than this find duplicate keys through an index.
const INDEXED: usize = 16;

/// An open collection: where its children start on the shared stack.
struct Open {
    mark: Mark,
    start: usize,
    /// A mapping's: its key read, waiting for the value.
    key: Option<Scalar>,
    mapping: bool,
    /// A large mapping's keys so far, with where each was written.
    index: Option<FastMap<String, Mark>>,
    /// The top level's `steps:`, whose entries go to the caller's sink as they are read.
    streams: bool,
}

/// What the shared stack holds: sequence items and mapping entries alike (an item's key is
/// unused).
type Child = (Option<Scalar>, Node);

/// Parses `text`, whose top level must be a mapping (an empty document is an empty one).
pub(crate) fn parse(text: &str) -> Result<Node, LoadError> {
    parse_with(text, None)
}

/// What [`parse_streaming`] hands over: an entry of the top level's `steps:` mapping.
pub(crate) type StepSink<'a> = &'a mut dyn FnMut(Scalar, Node);

/// [`parse`], with the entries of the top level's `steps:` mapping (when it is one) given to
/// `steps` one at a time, each as soon as it is read, instead of kept in the tree (where that
/// mapping is left empty): a workflow's steps then never all exist as a tree at once. They
/// are still checked for duplicates. When this fails, what `steps` was given means nothing.
pub(crate) fn parse_streaming(text: &str, steps: StepSink<'_>) -> Result<Node, LoadError> {
    parse_with(text, Some(steps))
}

fn parse_with(text: &str, mut sink: Option<StepSink<'_>>) -> Result<Node, LoadError> {
    let mut parser = Parser::new_from_str(text);
    let mut open: Vec<Open> = Vec::new();
    let mut children: Vec<Child> = Vec::new();
    let mut root: Option<Node> = None;
    // The first refusal; the scanner goes on, and a scan error later wins.
    let mut refused: Option<LoadError> = None;
    loop {
        let (event, marker) = match parser.next_token() {
            Ok(e) => e,
            Err(e) => return Err(LoadError::Scan(Mark::of(*e.marker()), e)),
        };
        let mark = Mark::of(marker);
        // Only the first document is read.
        if matches!(event, Event::StreamEnd | Event::DocumentEnd) {
            break;
        }
        if refused.is_some() {
            continue;
        }
        let at_top = open.is_empty() && root.is_none();
        let mapping = matches!(event, Event::MappingStart(..));
        let done = match event {
            Event::StreamStart | Event::DocumentStart | Event::DocumentEnd | Event::StreamEnd | Event::Nothing => {
                continue;
            }
            // An alias needs an anchor, which is refused first (or the scanner fails on it).
            Event::Alias(_) => Err(LoadError::UnexpectedAnchor(mark)),
            Event::MappingStart(anchor, tag) | Event::SequenceStart(anchor, tag) => {
                if tag.is_some() {
                    Err(LoadError::UnexpectedTag(mark))
                } else if anchor != 0 {
                    Err(LoadError::UnexpectedAnchor(mark))
                } else if at_top && !mapping {
                    Err(LoadError::TopLevelMustBeMapping(mark))
                } else if open.last().is_some_and(|o| o.mapping && o.key.is_none()) {
                    Err(LoadError::MappingKeyMustBeScalar(mark))
                } else {
                    let streams = mapping
                        && sink.is_some()
                        && matches!(open.as_slice(), [root] if root.key.as_ref().is_some_and(|k| k.text == "steps"));
                    open.push(Open {
                        mark,
                        start: children.len(),
                        key: None,
                        mapping,
                        index: streams.then(FastMap::default),
                        streams,
                    });
                    Ok(None)
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let o = open.pop().expect("the parser balances collections");
                let node = if o.mapping {
                    let entries = children
                        .drain(o.start..)
                        .map(|(k, v)| (k.expect("a mapping entry has a key"), v))
                        .collect();
                    Node::Mapping(Mapping { entries, mark: o.mark })
                } else {
                    let items = children.drain(o.start..).map(|(_, v)| v).collect();
                    Node::Sequence(Sequence { items, mark: o.mark })
                };
                Ok(Some(node))
            }
            Event::Scalar(text, style, anchor, tag) => {
                if anchor != 0 {
                    Err(LoadError::UnexpectedAnchor(mark))
                } else if tag.is_some() {
                    Err(LoadError::UnexpectedTag(mark))
                } else if at_top {
                    Err(LoadError::TopLevelMustBeMapping(mark))
                } else {
                    let scalar = Scalar {
                        text,
                        mark,
                        plain: matches!(style, TScalarStyle::Plain),
                    };
                    match open.last_mut() {
                        Some(o) if o.mapping && o.key.is_none() => {
                            o.key = Some(scalar);
                            Ok(None)
                        }
                        _ => Ok(Some(Node::Scalar(scalar))),
                    }
                }
            }
        };
        match done {
            Err(e) => refused = Some(e),
            Ok(None) => {}
            Ok(Some(node)) => {
                if let Err(e) = place(&mut open, &mut children, &mut root, node, &mut sink) {
                    refused = Some(e);
                }
            }
        }
    }
    if let Some(e) = refused {
        return Err(e);
    }
    Ok(root.unwrap_or(Node::Mapping(Mapping {
        entries: Vec::new(),
        mark: Mark { line: 1, col: 1 },
    })))
}

/// Puts a finished node where it belongs: the value of its mapping's waiting key, the next
/// item of its sequence, the document, or (an entry of the top level's `steps:`) the sink.
fn place(
    open: &mut [Open],
    children: &mut Vec<Child>,
    root: &mut Option<Node>,
    node: Node,
    sink: &mut Option<StepSink<'_>>,
) -> Result<(), LoadError> {
    let Some(o) = open.last_mut() else {
        *root = Some(node);
        return Ok(());
    };
    if !o.mapping {
        children.push((None, node));
        return Ok(());
    }
    let key = o.key.take().expect("a value follows its key");
    let entries = &children[o.start..];
    let first = match &mut o.index {
        Some(index) => index.get(&key.text).copied(),
        None => entries
            .iter()
            .find_map(|(k, _)| k.as_ref().filter(|k| k.text == key.text).map(|k| k.mark)),
    };
    if let Some(first) = first {
        return Err(LoadError::DuplicateKey { key, first });
    }
    if let Some(index) = &mut o.index {
        index.insert(key.text.clone(), key.mark);
        if o.streams
            && let Some(sink) = sink
        {
            sink(key, node);
            return Ok(());
        }
    } else if entries.len() + 1 >= INDEXED {
        let mut index: FastMap<String, Mark> = entries
            .iter()
            .filter_map(|(k, _)| k.as_ref().map(|k| (k.text.clone(), k.mark)))
            .collect();
        index.insert(key.text.clone(), key.mark);
        o.index = Some(index);
    }
    children.push((Some(key), node));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(text: &str) -> LoadError {
        parse(text).expect_err("refused")
    }

    #[test]
    fn positions_plainness_and_order() {
        let doc = parse("b: 1\na:\n  - 'x'\n  - {c: d}\n").expect("parses");
        let m = doc.as_mapping().expect("a mapping");
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a"], "document order");
        let b = m.get_node("b").and_then(Node::as_scalar).expect("b");
        assert!(b.may_coerce());
        assert_eq!(b.mark(), Mark { line: 1, col: 4 });
        let a = m.get_node("a").and_then(Node::as_sequence).expect("a");
        assert_eq!(a.len(), 2);
        let x = a.first().and_then(Node::as_scalar).expect("x");
        assert!(!x.may_coerce(), "quoted");
        assert_eq!(x.mark(), Mark { line: 3, col: 5 });
        let inner = a.get(1).and_then(Node::as_mapping).expect("{c: d}");
        assert_eq!(inner.mark(), Mark { line: 4, col: 5 });
        assert_eq!(
            inner.get_node("c").and_then(Node::as_scalar).map(Scalar::as_str),
            Some("d")
        );
    }

    #[test]
    fn an_empty_document_is_an_empty_mapping() {
        assert!(
            parse("# nothing\n")
                .expect("parses")
                .as_mapping()
                .is_some_and(|m| m.iter().len() == 0)
        );
    }

    #[test]
    fn refusals_name_where() {
        assert!(matches!(
            refusal("- a\n"),
            LoadError::TopLevelMustBeMapping(Mark { line: 1, .. })
        ));
        assert!(matches!(refusal("just text\n"), LoadError::TopLevelMustBeMapping(_)));
        assert!(matches!(refusal("a: &x 1\nb: 2\n"), LoadError::UnexpectedAnchor(_)));
        assert!(matches!(refusal("a: !t 1\n"), LoadError::UnexpectedTag(_)));
        assert!(matches!(refusal("? [a]\n: 1\n"), LoadError::MappingKeyMustBeScalar(_)));
        assert!(matches!(refusal("a: [1\n"), LoadError::Scan(..)));
    }

    #[test]
    fn the_first_duplicate_in_document_order_is_reported() {
        // The parent's duplicate comes before the child's.
        match refusal("a: 1\na: 2\nc: {x: 1, x: 2}\n") {
            LoadError::DuplicateKey { key, first } => {
                assert_eq!((key.as_str(), key.mark().line, first.line), ("a", 2, 1));
            }
            other => panic!("{other:?}"),
        }
        // In a mapping large enough to be indexed too.
        let mut big: String = (0..40).map(|i| format!("k{i}: {i}\n")).collect();
        big.push_str("k7: again\n");
        match refusal(&big) {
            LoadError::DuplicateKey { key, first } => {
                assert_eq!((key.as_str(), key.mark().line, first.line), ("k7", 41, 8));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_yaml_after_a_refusal_is_what_is_reported() {
        assert!(matches!(refusal("a: 1\na: 2\nb: [\n"), LoadError::Scan(..)));
    }

    #[test]
    fn deep_documents_build_without_recursion() {
        let text = format!("a:\n{}x\n", "- ".repeat(2_000));
        let root = parse(&text).expect("parses");
        let (mut node, mut depth) = (&root, 0);
        loop {
            let next = match node {
                Node::Mapping(m) => m.get_node("a"),
                Node::Sequence(s) => s.iter().next(),
                Node::Scalar(_) => None,
            };
            let Some(next) = next else { break };
            node = next;
            depth += 1;
        }
        assert_eq!(depth, 2_001);
    }

    #[test]
    fn top_level_steps_stream_out_of_the_tree() {
        let text = "parameters: [a]\nsteps:\n  x:\n    resource: T\n  y: {steps: {z: 1}}\nreturns: r\n";
        let mut seen = Vec::new();
        let root = parse_streaming(text, &mut |k, v| seen.push((k.as_str().to_owned(), k.mark(), v))).expect("parses");
        let names: Vec<&str> = seen.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(names, ["x", "y"], "in order, nested `steps:` not streamed");
        assert_eq!(seen[0].1, Mark { line: 3, col: 3 });
        assert!(seen[0].2.as_mapping().is_some_and(|m| m.get_node("resource").is_some()));
        let nested = seen[1]
            .2
            .as_mapping()
            .and_then(|m| m.get_node("steps"))
            .and_then(Node::as_mapping);
        assert!(nested.is_some_and(|m| m.get_node("z").is_some()), "kept in the tree");
        let top = root.as_mapping().expect("a mapping");
        let keys: Vec<&str> = top.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["parameters", "steps", "returns"]);
        assert!(
            top.get_node("steps")
                .and_then(Node::as_mapping)
                .is_some_and(|m| m.iter().len() == 0)
        );
        // Without a sink, the same document keeps its steps.
        let whole = parse(text).expect("parses");
        let steps = whole
            .as_mapping()
            .and_then(|m| m.get_node("steps"))
            .and_then(Node::as_mapping);
        assert_eq!(steps.map(|m| m.iter().len()), Some(2));
    }

    #[test]
    fn streamed_steps_are_still_checked_for_duplicates() {
        let mut n = 0;
        let err = parse_streaming("steps:\n  a: {resource: T}\n  a: {resource: U}\n", &mut |_, _| n += 1)
            .expect_err("a duplicate step");
        match err {
            LoadError::DuplicateKey { key, first } => {
                assert_eq!((key.as_str(), key.mark().line, first.line), ("a", 3, 2))
            }
            other => panic!("{other:?}"),
        }
        // A `steps:` that is not a mapping stays in the tree.
        let root = parse_streaming("steps: [a]\n", &mut |_, _| n += 1).expect("parses");
        assert!(
            root.as_mapping()
                .and_then(|m| m.get_node("steps"))
                .and_then(Node::as_sequence)
                .is_some()
        );
        assert_eq!(n, 1, "only the first `a` was handed over");
    }

    #[test]
    fn only_the_first_document_is_read() {
        let doc = parse("a: 1\n---\nb: 2\n").expect("parses");
        let keys: Vec<&str> = doc
            .as_mapping()
            .expect("a mapping")
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, ["a"]);
    }
}
