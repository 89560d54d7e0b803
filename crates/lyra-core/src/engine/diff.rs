//! What would change: desired against actual, attribute by attribute.

use crate::report::{Action, AttrChange};
use crate::schema::{AttributeSchema, ResourceSchema};
use crate::value::{self, Map, Value};

/// The action a resource needs and its attribute changes: created when there is no current
/// resource (`actual`: its actual state), replaced when a changed attribute is
/// immutable, else updated or left alone.
pub(super) fn changes(
    schema: &ResourceSchema,
    desired: &Map,
    unknown: &[String],
    actual: Option<&Map>,
) -> (Action, Vec<AttrChange>) {
    match actual {
        None => (Action::Create, creation(schema, desired, unknown)),
        Some(actual) => {
            let changes = diff(schema, desired, unknown, actual);
            let action = if changes.iter().any(|c| c.forces_replace) {
                Action::Replace
            } else if changes.is_empty() {
                Action::Noop
            } else {
                Action::Update
            };
            (action, changes)
        }
    }
}

/// One value that differs, at a path into an attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct PathChange {
    pub path: String,
    /// `None`: absent before.
    pub old: Option<Value>,
    /// `None`: absent now.
    pub new: Option<Value>,
}

/// Where `old` and `new` (the values of `attribute`) differ, as paths to the innermost values
/// that do: objects are compared key by key in sorted order (a stable order whatever the
/// order keys were written in), lists of the same length element by element; anything else
/// (a scalar, lists of different lengths, a type change) is one change of the whole value.
/// Absent and null are the same, as everywhere in diffs.
pub fn change_paths(attribute: &str, old: Option<&Value>, new: Option<&Value>) -> Vec<PathChange> {
    let mut out = Vec::new();
    walk(&mut attribute.to_owned(), old, new, &mut out);
    out
}

fn walk(path: &mut String, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<PathChange>) {
    let null = Value::Null;
    if same(old.unwrap_or(&null), new.unwrap_or(&null)) {
        return;
    }
    let len = path.len();
    match (old, new) {
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                push_key(path, k);
                walk(path, a.get(k), b.get(k), out);
                path.truncate(len);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                use std::fmt::Write as _;
                let _ = write!(path, "[{i}]");
                walk(path, Some(x), Some(y), out);
                path.truncate(len);
            }
        }
        _ => out.push(PathChange {
            path: path.clone(),
            old: old.cloned(),
            new: new.cloned(),
        }),
    }
}

/// `.key`, or `["key"]` when the key is not a plain name (dots, slashes, spaces...).
fn push_key(path: &mut String, key: &str) {
    let plain = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&Value::String(key.to_owned()).to_string());
        path.push(']');
    }
}

/// Whether two values are the same for diffing: numbers compare by value (8080 = 8080.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.iter()
                .all(|(k, v)| same(v, value::attr(y, k).unwrap_or(&Value::Null)))
                && y.iter().all(|(k, v)| x.contains_key(k) || v.is_null())
        }
        _ => a == b,
    }
}

/// The attribute-level difference between desired and actual. Provided attributes are only
/// compared when the workflow sets them; attributes the workflow does not mention are
/// the provider's business.
fn diff(schema: &ResourceSchema, desired: &Map, unknown: &[String], actual: &Map) -> Vec<AttrChange> {
    let mut out = Vec::new();
    for (name, want) in desired {
        let attr = schema.attribute(name);
        if attr.is_some_and(|a| a.provided) && want.is_null() {
            continue;
        }
        let have = value::attr(actual, name).unwrap_or(&Value::Null);
        if !same(want, have) {
            let sensitive = attr.is_some_and(AttributeSchema::is_secret);
            let forces_replace = attr.is_some_and(|a| a.immutable);
            // A secret's inner keys are not shown: one masked change for the whole value.
            let leaves = if sensitive {
                vec![PathChange {
                    path: name.clone(),
                    old: Some(have.clone()),
                    new: Some(want.clone()),
                }]
            } else {
                change_paths(name, Some(have), Some(want))
            };
            out.extend(leaves.into_iter().map(|c| AttrChange {
                attribute: name.clone(),
                path: c.path,
                old: c.old,
                // A key gone from inside the value: it becomes null (an AttrChange's `None`
                // means "known after apply").
                new: Some(c.new.unwrap_or(Value::Null)),
                forces_replace,
                sensitive,
            }));
        }
    }
    for name in unknown {
        let attr = schema.attribute(name);
        out.push(AttrChange {
            attribute: name.clone(),
            path: name.clone(),
            old: actual.get(name).cloned(),
            new: None,
            forces_replace: attr.is_some_and(|a| a.immutable),
            sensitive: attr.is_some_and(AttributeSchema::is_secret),
        });
    }
    out
}

/// A new resource's attributes: everything the workflow sets.
fn creation(schema: &ResourceSchema, desired: &Map, unknown: &[String]) -> Vec<AttrChange> {
    desired
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| AttrChange {
            attribute: k.clone(),
            path: k.clone(),
            old: None,
            new: Some(v.clone()),
            forces_replace: false,
            sensitive: schema.is_secret(k),
        })
        .chain(unknown.iter().map(|k| AttrChange {
            attribute: k.clone(),
            path: k.clone(),
            old: None,
            new: None,
            forces_replace: false,
            sensitive: schema.is_secret(k),
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(old: Value, new: Value) -> Vec<(String, Option<Value>, Option<Value>)> {
        change_paths("config", Some(&old), Some(&new))
            .into_iter()
            .map(|c| (c.path, c.old, c.new))
            .collect()
    }

    #[test]
    fn nested_changes_are_paths_in_sorted_order() {
        let got = paths(
            json!({"name": "beta", "z": 1, "a": {"x": [1, 2], "keep": true}, "gone": 1}),
            json!({"a": {"keep": true, "x": [1, 3]}, "z": 1, "name": "gamma", "new": "n"}),
        );
        assert_eq!(
            got,
            vec![
                ("config.a.x[1]".to_owned(), Some(json!(2)), Some(json!(3))),
                ("config.gone".to_owned(), Some(json!(1)), None),
                ("config.name".to_owned(), Some(json!("beta")), Some(json!("gamma"))),
                ("config.new".to_owned(), None, Some(json!("n"))),
            ]
        );
    }

    #[test]
    fn odd_keys_are_quoted_and_whole_values_change_whole() {
        let got = paths(
            json!({"app.kubernetes.io/name": "a"}),
            json!({"app.kubernetes.io/name": "b"}),
        );
        assert_eq!(got[0].0, r#"config["app.kubernetes.io/name"]"#);
        // Lists of another length, and a change of type, are one change.
        assert_eq!(paths(json!([1]), json!([1, 2])).len(), 1);
        assert_eq!(paths(json!({"a": 1}), json!("x"))[0].0, "config");
        // Null and absent are the same; 8080 and 8080.0 too.
        assert!(paths(json!({"a": null, "p": 8080}), json!({"p": 8080.0})).is_empty());
    }

    #[test]
    fn a_plan_shows_nested_changes_but_masks_secrets_whole() {
        use crate::schema::{AttributeSchema, ResourceSchema};
        use crate::types::Type;
        let schema = ResourceSchema::new(
            "T::R",
            vec![
                AttributeSchema::new("config", Type::Any),
                AttributeSchema::new("secret", Type::Any).sensitive(),
                AttributeSchema::new("name", Type::String).immutable(),
            ],
        );
        let map = |v: Value| v.as_object().cloned().unwrap();
        let actual = map(json!({"config": {"name": "beta", "n": 1}, "secret": {"k": "old"}, "name": "a"}));
        let desired = map(json!({"config": {"name": "gamma", "n": 1}, "secret": {"k": "new"}, "name": "a"}));
        let (action, changes) = changes(&schema, &desired, &[], Some(&actual));
        assert_eq!(action, Action::Update);
        let got: Vec<(&str, &str, bool)> = changes
            .iter()
            .map(|c| (c.attribute.as_str(), c.path.as_str(), c.sensitive))
            .collect();
        assert_eq!(got, vec![("config", "config.name", false), ("secret", "secret", true)]);
    }
}
