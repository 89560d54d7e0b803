//! Inline workflows (`spec.workflow`): the engine's front end reads YAML with positions, but
//! the object arrives as JSON, without the lines the user wrote. So the workflow is rendered
//! to YAML here, one mapping entry or list item per line, and every line remembers its field
//! path in the object: a diagnostic's position becomes `spec.workflow.steps.web.value.port`.
//!
//! The line in the user's manifest cannot be known: kubectl sends JSON, and the
//! `last-applied-configuration` annotation is that JSON too (keys sorted, comments gone).
//! What can be known is how kubectl read the manifest: YAML 1.1, in which unquoted `y`, `yes`,
//! `on` (and `n`, `no`, `off`) are booleans, so as keys they arrive as `"true"` and `"false"`.
//! Diagnostics about such keys say so.

use lyra_core::value::Value;

/// One segment of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A field path, e.g. `spec.workflow.steps.web.value.port`, `spec.data[aws.region]`,
/// `spec.workflow.returns[0]`, as the API server writes field paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldPath(pub Vec<Segment>);

impl FieldPath {
    fn child(&self, segment: Segment) -> FieldPath {
        let mut p = self.0.clone();
        p.push(segment);
        FieldPath(p)
    }

    /// The keys on the path that kubectl may have made from YAML 1.1 booleans.
    pub fn boolean_keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|s| match s {
            Segment::Key(k) if is_boolean_key(k) => Some(k.as_str()),
            _ => None,
        })
    }

    /// The path under `root` (`spec.workflow`).
    pub fn display(&self, root: &str) -> String {
        let mut out = root.to_owned();
        for s in &self.0 {
            match s {
                Segment::Key(k) if is_plain_key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Segment::Key(k) => out.push_str(&format!("[{k}]")),
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `"true"` / `"false"`: what kubectl makes of `y`, `yes`, `on`, `n`, `no`, `off` keys.
pub fn is_boolean_key(k: &str) -> bool {
    k == "true" || k == "false"
}

/// What a user probably wrote, for a boolean key.
pub fn yaml11_hint(key: &str) -> String {
    let (spellings, example) = if key == "true" {
        ("y, yes or on", "y")
    } else {
        ("n, no or off", "n")
    };
    format!(
        "the key \"{key}\" is probably an unquoted {spellings} in the manifest: kubectl reads keys \
         as YAML 1.1, where those are booleans; quote the key (e.g. \"{example}\":) to keep it"
    )
}

/// Every key anywhere in `value` that kubectl may have made from a YAML 1.1 boolean, with
/// its path.
pub fn boolean_keys(value: &Value) -> Vec<FieldPath> {
    fn walk(v: &Value, at: &FieldPath, out: &mut Vec<FieldPath>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let p = at.child(Segment::Key(k.clone()));
                    if is_boolean_key(k) {
                        out.push(p.clone());
                    }
                    walk(child, &p, out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, &at.child(Segment::Index(i)), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &FieldPath::default(), &mut out);
    out
}

/// An inline workflow as YAML text, with the field path of every line.
#[derive(Debug, Clone)]
pub struct InlineSource {
    pub text: String,
    /// `paths[n]` is the path of line `n + 1`.
    paths: Vec<FieldPath>,
}

impl InlineSource {
    /// The field path of a 1-based line.
    pub fn path_at(&self, line: u32) -> Option<&FieldPath> {
        self.paths.get((line as usize).checked_sub(1)?)
    }
}

/// Renders a mapping as block YAML the front end reads back to the same values: keys and
/// strings double-quoted (JSON escapes are YAML escapes), numbers, booleans and nulls plain,
/// one entry or item per line.
pub fn render(body: &Value) -> InlineSource {
    let mut r = Renderer {
        text: String::new(),
        paths: Vec::new(),
    };
    r.value_block(body, 0, &FieldPath::default());
    InlineSource {
        text: r.text,
        paths: r.paths,
    }
}

struct Renderer {
    text: String,
    paths: Vec<FieldPath>,
}

impl Renderer {
    fn line(&mut self, indent: usize, content: &str, path: FieldPath) {
        self.text.push_str(&" ".repeat(indent));
        self.text.push_str(content);
        self.text.push('\n');
        self.paths.push(path);
    }

    /// The entries of a non-empty mapping, or items of a non-empty list, at `indent`.
    fn value_block(&mut self, v: &Value, indent: usize, at: &FieldPath) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let key = quote(k);
                    let p = at.child(Segment::Key(k.clone()));
                    match inline_form(child) {
                        Some(s) => self.line(indent, &format!("{key}: {s}"), p),
                        None => {
                            self.line(indent, &format!("{key}:"), p.clone());
                            self.value_block(child, indent + 2, &p);
                        }
                    }
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    let p = at.child(Segment::Index(i));
                    match inline_form(child) {
                        Some(s) => self.line(indent, &format!("- {s}"), p),
                        None => {
                            self.line(indent, "-", p.clone());
                            self.value_block(child, indent + 2, &p);
                        }
                    }
                }
            }
            // Only reached for a top level that is not a collection (refused before this).
            other => self.line(indent, &inline_form(other).unwrap_or_default(), at.clone()),
        }
    }
}

/// A scalar or empty collection on one line; `None` for a collection with content.
fn inline_form(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("null".to_owned()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(quote(s)),
        Value::Object(m) if m.is_empty() => Some("{}".to_owned()),
        Value::Array(a) if a.is_empty() => Some("[]".to_owned()),
        _ => None,
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rendering_round_trips_through_the_front_end_and_lines_know_their_paths() {
        let body = json!({
            "steps": {
                "web": {"resource": "Null::Resource", "value": {"port": 8080, "name": "a: b # c", "on": true,
                    "empty": {}, "none": [], "nothing": null, "ratio": 0.5, "text": "8080", "multi": "x\ny\t\"z\""}},
                "list": {"resource": "Null::Resource", "value": {"input": [1, {"a.b": [true]}, [], "$web"]}},
            },
        });
        let src = render(&body);
        let parsed = lyra_core::yaml::parse_data(lyra_core::diag::FileId(0), &src.text).unwrap();
        assert_eq!(Value::Object(parsed), body, "{}", src.text);
        let line_of = |needle: &str| {
            src.text
                .lines()
                .position(|l| l.contains(needle))
                .map(|i| i as u32 + 1)
                .unwrap()
        };
        let at = |needle: &str| src.path_at(line_of(needle)).unwrap().display("spec.workflow");
        assert_eq!(at("\"port\""), "spec.workflow.steps.web.value.port");
        assert_eq!(at("\"value\":"), "spec.workflow.steps.web.value");
        assert_eq!(at("\"a.b\""), "spec.workflow.steps.list.value.input[1][a.b]");
        assert_eq!(at("- true"), "spec.workflow.steps.list.value.input[1][a.b][0]");
        assert_eq!(at("\"$web\""), "spec.workflow.steps.list.value.input[3]");
        assert_eq!(src.path_at(0), None);
    }

    #[test]
    fn boolean_keys_are_found_with_their_paths() {
        let body = json!({"parameters": {"true": {"type": "String"}}, "steps": {"a": {"value": {"false": 1, "x": [{"true": 2}]}}}});
        let found: Vec<String> = boolean_keys(&body).iter().map(|p| p.display("spec.workflow")).collect();
        assert_eq!(
            found,
            [
                "spec.workflow.parameters.true",
                "spec.workflow.steps.a.value.false",
                "spec.workflow.steps.a.value.x[0].true"
            ]
        );
        assert!(yaml11_hint("true").contains("y, yes or on"));
        assert!(yaml11_hint("false").contains("n, no or off"));
    }
}
