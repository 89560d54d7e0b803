//! A CRD version's `openAPIV3Schema`, compiled once when the CRD is written, and the three
//! things the apiserver does with it on every write, in its order: prune unknown fields, apply
//! defaults, validate.
//!
//! Validation covers `type` (with `nullable` and `x-kubernetes-int-or-string`), `required`,
//! `enum`, `minimum`/`maximum` (and the exclusive flags), `pattern`, `minLength`/`maxLength`,
//! `minItems`/`maxItems`, `minProperties`/`maxProperties`, `allOf`/`anyOf`/`oneOf`/`not`.
//! CEL rules (`x-kubernetes-validations`) are compiled and evaluated by `cel`, after those
//! checks pass. Not covered: `format`, `uniqueItems`, `x-kubernetes-list-type` uniqueness.

pub mod cel;
mod defaults;
mod prune;
mod validate;

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::Value;

#[derive(Debug, Clone, Default)]
enum Additional {
    /// Not given: unknown keys are pruned unless `x-kubernetes-preserve-unknown-fields`.
    #[default]
    Absent,
    Any,
    Schema(Box<Schema>),
}

/// One compiled schema node.
#[derive(Debug, Clone, Default)]
pub struct Schema {
    type_: Option<String>,
    nullable: bool,
    properties: BTreeMap<String, Schema>,
    additional: Additional,
    items: Option<Box<Schema>>,
    required: Vec<String>,
    enum_: Option<Vec<Value>>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: bool,
    exclusive_maximum: bool,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    pattern: Option<Regex>,
    default: Option<Value>,
    preserve_unknown: bool,
    int_or_string: bool,
    embedded: bool,
    all_of: Vec<Schema>,
    any_of: Vec<Schema>,
    one_of: Vec<Schema>,
    not: Option<Box<Schema>>,
}

impl Schema {
    /// Compiles a schema; the error (a bad `pattern`, say) is reported on the CRD.
    pub fn compile(v: &Value) -> Result<Schema, String> {
        let Value::Object(m) = v else {
            return Err("schema must be an object".into());
        };
        let u64_of = |k: &str| m.get(k).and_then(Value::as_u64);
        let list = |k: &str| -> Result<Vec<Schema>, String> {
            m.get(k)
                .and_then(Value::as_array)
                .map_or(Ok(Vec::new()), |a| a.iter().map(Schema::compile).collect())
        };
        let mut properties = BTreeMap::new();
        if let Some(Value::Object(props)) = m.get("properties") {
            for (k, p) in props {
                properties.insert(
                    k.clone(),
                    Schema::compile(p).map_err(|e| format!("properties[{k}]: {e}"))?,
                );
            }
        }
        let additional = match m.get("additionalProperties") {
            Some(Value::Bool(true)) => Additional::Any,
            Some(s @ Value::Object(_)) => Additional::Schema(Box::new(Schema::compile(s)?)),
            _ => Additional::Absent,
        };
        let pattern = match m.get("pattern").and_then(Value::as_str) {
            Some(p) => Some(Regex::new(p).map_err(|e| format!("invalid pattern {p:?}: {e}"))?),
            None => None,
        };
        let flag = |k: &str| m.get(k).and_then(Value::as_bool).unwrap_or(false);
        Ok(Schema {
            type_: m.get("type").and_then(Value::as_str).map(str::to_string),
            nullable: flag("nullable"),
            properties,
            additional,
            items: m.get("items").map(Schema::compile).transpose()?.map(Box::new),
            required: m
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default(),
            enum_: m.get("enum").and_then(Value::as_array).cloned(),
            minimum: m.get("minimum").and_then(Value::as_f64),
            maximum: m.get("maximum").and_then(Value::as_f64),
            exclusive_minimum: flag("exclusiveMinimum"),
            exclusive_maximum: flag("exclusiveMaximum"),
            min_length: u64_of("minLength"),
            max_length: u64_of("maxLength"),
            min_items: u64_of("minItems"),
            max_items: u64_of("maxItems"),
            min_properties: u64_of("minProperties"),
            max_properties: u64_of("maxProperties"),
            pattern,
            default: m.get("default").cloned(),
            preserve_unknown: flag("x-kubernetes-preserve-unknown-fields"),
            int_or_string: flag("x-kubernetes-int-or-string"),
            embedded: flag("x-kubernetes-embedded-resource"),
            all_of: list("allOf")?,
            any_of: list("anyOf")?,
            one_of: list("oneOf")?,
            not: m.get("not").map(Schema::compile).transpose()?.map(Box::new),
        })
    }
}

/// `spec` + `replicas` = `spec.replicas`.
fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A Workflow's schema: `spec.image` required and patterned, `spec.replicas` bounded with a
/// default, an enum, a preserved subtree, a list of objects.
#[cfg(test)]
fn workflow_schema() -> Schema {
    Schema::compile(&serde_json::json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["image"],
                "properties": {
                    "image": {"type": "string", "pattern": "^[a-z]+$"},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                    "mode": {"type": "string", "enum": ["fast", "safe"]},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "steps": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}
                }
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }
    }))
    .unwrap()
}
