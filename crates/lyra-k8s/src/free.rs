//! The spec's free-form fields (`spec.data`, `spec.workflow`): whatever JSON the API server
//! stored, and it stores objects nested up to 10,000 levels. Read as `serde_json::Value`,
//! such a field would fail the whole watch list at `serde_json`'s 128 levels, and with it
//! every other Workflow. So the field is taken unparsed ([`RawValue`], skipped without
//! recursion), measured iteratively, and parsed only when it nests within lyra-core's
//! [`MAX_DEPTH`]; deeper, it is kept as text and the object is refused, naming where.

use lyra_core::value::{MAX_DEPTH, Value, too_deep_message};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::inline::{FieldPath, Segment};

/// A free-form field: its value, or why it cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub struct FreeForm(Result<Value, TooDeep>);

/// A field nesting deeper than [`MAX_DEPTH`], as the API server sent it.
#[derive(Clone, Debug, PartialEq)]
struct TooDeep {
    raw: String,
    /// Where the first container beyond the limit is, under the field.
    at: FieldPath,
}

impl FreeForm {
    /// The value, or a message naming where under `field` (`spec.data`) it nests too deep.
    pub fn value(&self, field: &str) -> Result<&Value, String> {
        self.0.as_ref().map_err(|deep| deep.message(field))
    }
}

impl From<Value> for FreeForm {
    fn from(value: Value) -> Self {
        FreeForm(Ok(value))
    }
}

impl TooDeep {
    fn message(&self, field: &str) -> String {
        // A path 64 keys long can be long: its start and its end say where.
        let path = self.at.display(field);
        let shown = if path.chars().count() > 160 {
            let head: String = path.chars().take(100).collect();
            let tail: String = path.chars().skip(path.chars().count() - 50).collect();
            format!("{head}…{tail}")
        } else {
            path
        };
        format!(
            "{shown}: {}; the field itself is the first level",
            too_deep_message(field)
        )
    }
}

impl<'de> Deserialize<'de> for FreeForm {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        if let Some(at) = nested_beyond(raw.get(), MAX_DEPTH) {
            return Ok(FreeForm(Err(TooDeep {
                raw: raw.get().to_owned(),
                at,
            })));
        }
        // Within the limit, far below serde_json's own.
        serde_json::from_str(raw.get())
            .map(|v| FreeForm(Ok(v)))
            .map_err(D::Error::custom)
    }
}

impl Serialize for FreeForm {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Ok(v) => v.serialize(serializer),
            Err(deep) => match RawValue::from_string(deep.raw.clone()) {
                Ok(raw) => raw.serialize(serializer),
                Err(e) => Err(serde::ser::Error::custom(e)),
            },
        }
    }
}

/// Where in `json` (valid JSON, as the API server stored it) a list or map first nests deeper
/// than `limit` (the outermost container is level 1): the path to that container. Iterative:
/// any depth is safe.
fn nested_beyond(json: &str, limit: usize) -> Option<FieldPath> {
    enum Frame {
        Map(Option<String>),
        List(usize),
    }
    let bytes = json.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    // In a map, the next string is a key (after `{` and `,`).
    let mut expect_key = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                if expect_key && let Some(Frame::Map(key)) = stack.last_mut() {
                    let text = &json[start..i.min(json.len())];
                    *key = Some(
                        serde_json::from_str::<String>(&format!("\"{text}\"")).unwrap_or_else(|_| text.to_owned()),
                    );
                    expect_key = false;
                }
            }
            open @ (b'{' | b'[') => {
                if stack.len() == limit {
                    let path = stack
                        .iter()
                        .map(|f| match f {
                            Frame::Map(key) => Segment::Key(key.clone().unwrap_or_default()),
                            Frame::List(i) => Segment::Index(*i),
                        })
                        .collect();
                    return Some(FieldPath(path));
                }
                stack.push(if open == b'{' { Frame::Map(None) } else { Frame::List(0) });
                expect_key = open == b'{';
            }
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::List(n)) => *n += 1,
                Some(Frame::Map(_)) => expect_key = true,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lists(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn finds_the_first_container_beyond_the_limit() {
        assert_eq!(nested_beyond("{}", 1), None);
        assert_eq!(nested_beyond(&lists(3), 3), None);
        assert_eq!(
            nested_beyond(&lists(4), 3).map(|p| p.display("f")),
            Some("f[0][0][0]".to_owned())
        );
        let doc = r#"{"a\"[{":"x[[[","b":[1,{"c d":{}},{"e":[[1]]}]}"#;
        assert_eq!(nested_beyond(doc, 5), None);
        assert_eq!(
            nested_beyond(doc, 4).map(|p| p.display("spec.data")),
            Some("spec.data.b[2].e[0]".to_owned())
        );
        assert_eq!(
            nested_beyond(doc, 3).map(|p| p.display("spec.data")),
            Some("spec.data.b[1][c d]".to_owned())
        );
    }

    #[test]
    fn values_within_the_limit_are_parsed_deeper_ones_kept_and_named() {
        let ok: FreeForm = serde_json::from_str(&lists(MAX_DEPTH)).unwrap();
        assert_eq!(lyra_core::value::depth(ok.value("spec.data").unwrap()), MAX_DEPTH);
        // Deeper than serde_json would read into a Value: refused by a message, not an error.
        let doc = format!(r#"{{"k":{}}}"#, lists(10_000));
        let deep: FreeForm = serde_json::from_str(&doc).unwrap();
        let message = deep.value("spec.data").unwrap_err();
        assert!(message.starts_with("spec.data.k[0][0]"), "{message}");
        assert!(
            message.contains("…") && message.contains("more than 64 levels"),
            "{message}"
        );
        // It serializes back as it came.
        assert_eq!(serde_json::to_string(&deep).unwrap(), doc);
        // From a Value too (tests build objects so).
        let from_value: FreeForm = serde_json::from_value(json!({"a": [1]})).unwrap();
        assert_eq!(from_value, FreeForm::from(json!({"a": [1]})));
    }
}
