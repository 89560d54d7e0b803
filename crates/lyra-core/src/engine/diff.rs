//! What would change: desired against actual, attribute by attribute.

use crate::report::{Action, AttrChange};
use crate::schema::{AttributeSchema, ResourceSchema};
use crate::value::{Map, Value};

/// The action a resource needs and its attribute changes: created when there is no current
/// resource (`current`: its id and actual state), replaced when a changed attribute is
/// immutable, else updated or left alone.
pub(super) fn changes(
    schema: &ResourceSchema,
    desired: &Map,
    unknown: &[String],
    current: Option<&(String, Map)>,
) -> (Action, Vec<AttrChange>) {
    match current {
        None => (Action::Create, creation(schema, desired, unknown)),
        Some((_, actual)) => {
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

/// Whether two values are the same for diffing: numbers compare by value (8080 = 8080.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.iter().all(|(k, v)| same(v, y.get(k).unwrap_or(&Value::Null)))
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
        let have = actual.get(name).unwrap_or(&Value::Null);
        if !same(want, have) {
            out.push(AttrChange {
                attribute: name.clone(),
                old: Some(have.clone()),
                new: Some(want.clone()),
                forces_replace: attr.is_some_and(|a| a.immutable),
                sensitive: attr.is_some_and(AttributeSchema::is_secret),
            });
        }
    }
    for name in unknown {
        let attr = schema.attribute(name);
        out.push(AttrChange {
            attribute: name.clone(),
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
            old: None,
            new: Some(v.clone()),
            forces_replace: false,
            sensitive: schema.is_secret(k),
        })
        .chain(unknown.iter().map(|k| AttrChange {
            attribute: k.clone(),
            old: None,
            new: None,
            forces_replace: false,
            sensitive: schema.is_secret(k),
        }))
        .collect()
}
