//! A CRD version's `openAPIV3Schema`, compiled once when the CRD is written, and the three
//! things the apiserver does with it on every write, in its order: prune unknown fields, apply
//! defaults, validate.
//!
//! Validation covers `type` (with `nullable` and `x-kubernetes-int-or-string`), `required`,
//! `enum`, `minimum`/`maximum` (and the exclusive flags), `pattern`, `minLength`/`maxLength`,
//! `minItems`/`maxItems`, `minProperties`/`maxProperties`, `allOf`/`anyOf`/`oneOf`/`not`.
//! Not covered: `format`, `uniqueItems`, `x-kubernetes-list-type` uniqueness, CEL
//! (`x-kubernetes-validations`).

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use crate::errors::{FieldError, FieldErrorKind};

/// The ObjectMeta fields a client may send; anything else under `metadata` is pruned.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
    "selfLink",
];

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

    /// Removes fields the schema does not declare (and non-nullable nulls, which the apiserver
    /// drops before defaulting); returns the paths of the unknown fields removed, which a
    /// `fieldValidation=Strict` request turns into an error. `root` keeps apiVersion/kind/metadata.
    pub fn prune(&self, v: &mut Value, root: bool) -> Vec<String> {
        let mut unknown = Vec::new();
        self.prune_at(v, "", root, &mut unknown);
        unknown.sort();
        unknown
    }

    fn prune_at(&self, v: &mut Value, path: &str, is_resource: bool, unknown: &mut Vec<String>) {
        if self.int_or_string {
            return;
        }
        match v {
            Value::Object(m) => {
                if is_resource && let Some(Value::Object(meta)) = m.get_mut("metadata") {
                    let meta_path = join(path, "metadata");
                    meta.retain(|k, _| {
                        let keep = OBJECT_META_FIELDS.contains(&k.as_str());
                        if !keep {
                            unknown.push(join(&meta_path, k));
                        }
                        keep
                    });
                }
                let keep_unknown = self.preserve_unknown || matches!(self.additional, Additional::Any);
                let keys: Vec<String> = m.keys().cloned().collect();
                for k in keys {
                    if is_resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    let child_path = join(path, &k);
                    let child_schema = self.properties.get(&k).or(match &self.additional {
                        Additional::Schema(s) => Some(s),
                        _ => None,
                    });
                    match child_schema {
                        Some(s) => {
                            if m[&k].is_null() && !s.nullable {
                                m.remove(&k);
                                continue;
                            }
                            if let Some(child) = m.get_mut(&k) {
                                s.prune_at(child, &child_path, s.embedded, unknown);
                            }
                        }
                        None if keep_unknown => {}
                        None => {
                            m.remove(&k);
                            unknown.push(child_path);
                        }
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    for (i, item) in a.iter_mut().enumerate() {
                        items.prune_at(item, &format!("{path}[{i}]"), items.embedded, unknown);
                    }
                }
            }
            _ => {}
        }
    }

    /// Fills in `default`s of missing properties, outside in.
    pub fn apply_defaults(&self, v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, s) in &self.properties {
                    if !m.contains_key(k)
                        && let Some(d) = &s.default
                    {
                        m.insert(k.clone(), d.clone());
                    }
                    if let Some(child) = m.get_mut(k) {
                        s.apply_defaults(child);
                    }
                }
                if let Additional::Schema(s) = &self.additional {
                    for (k, child) in m.iter_mut() {
                        if !self.properties.contains_key(k) {
                            s.apply_defaults(child);
                        }
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    a.iter_mut().for_each(|item| items.apply_defaults(item));
                }
            }
            _ => {}
        }
    }

    /// Every violation in `v`; field paths are relative to the object root (`spec.replicas`).
    pub fn validate(&self, v: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        self.validate_at(v, "", &mut errs);
        errs.sort_by(|a, b| a.field.cmp(&b.field));
        errs
    }

    fn validate_at(&self, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
        let shown = if path.is_empty() { "body" } else { path };
        if v.is_null() && self.nullable {
            return;
        }
        if let Some(t) = &self.type_ {
            let ok = match t.as_str() {
                "object" => v.is_object(),
                "array" => v.is_array(),
                "string" => v.is_string() || (self.int_or_string && is_integer(v)),
                "integer" => is_integer(v) || (self.int_or_string && v.is_string()),
                "number" => v.is_number(),
                "boolean" => v.is_boolean(),
                _ => true,
            };
            if !ok {
                let actual = Value::String(type_name(v).to_string());
                errs.push(FieldError::invalid(
                    shown,
                    &actual,
                    format!("{shown} in body must be of type {t}: {:?}", type_name(v)),
                ));
                return;
            }
        } else if self.int_or_string && !(is_integer(v) || v.is_string()) {
            let actual = Value::String(type_name(v).to_string());
            errs.push(FieldError::invalid(
                shown,
                &actual,
                format!("{shown} in body must be of type integer or string"),
            ));
            return;
        }
        if let Some(allowed) = &self.enum_
            && !allowed.contains(v)
        {
            errs.push(FieldError {
                kind: FieldErrorKind::NotSupported(allowed.clone()),
                field: shown.to_string(),
                value: crate::errors::show_value(v),
                detail: String::new(),
            });
        }
        if let Some(n) = v.as_f64() {
            if let Some(min) = self.minimum {
                let bad = if self.exclusive_minimum { n <= min } else { n < min };
                if bad {
                    let rel = if self.exclusive_minimum {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        shown,
                        v,
                        format!("{shown} in body should be {rel} {}", num(min)),
                    ));
                }
            }
            if let Some(max) = self.maximum {
                let bad = if self.exclusive_maximum { n >= max } else { n > max };
                if bad {
                    let rel = if self.exclusive_maximum {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    errs.push(FieldError::invalid(
                        shown,
                        v,
                        format!("{shown} in body should be {rel} {}", num(max)),
                    ));
                }
            }
        }
        if let Some(s) = v.as_str() {
            let len = s.chars().count() as u64;
            if let Some(min) = self.min_length
                && len < min
            {
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    format!("{shown} in body should be at least {min} chars long"),
                ));
            }
            if let Some(max) = self.max_length
                && len > max
            {
                errs.push(FieldError {
                    kind: FieldErrorKind::TooLong(max),
                    field: shown.to_string(),
                    value: crate::errors::show_value(v),
                    detail: String::new(),
                });
            }
            if let Some(re) = &self.pattern
                && !re.is_match(s)
            {
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    format!("{shown} in body should match '{}'", re.as_str()),
                ));
            }
        }
        match v {
            Value::Object(m) => self.validate_object(m, path, shown, errs),
            Value::Array(a) => {
                let n = a.len() as u64;
                if let Some(min) = self.min_items
                    && n < min
                {
                    errs.push(FieldError::invalid(
                        shown,
                        v,
                        format!("{shown} in body should have at least {min} items"),
                    ));
                }
                if let Some(max) = self.max_items
                    && n > max
                {
                    errs.push(FieldError {
                        kind: FieldErrorKind::TooMany(max),
                        field: shown.to_string(),
                        value: n.to_string(),
                        detail: String::new(),
                    });
                }
                if let Some(items) = &self.items {
                    for (i, item) in a.iter().enumerate() {
                        items.validate_at(item, &format!("{path}[{i}]"), errs);
                    }
                }
            }
            _ => {}
        }
        for s in &self.all_of {
            s.validate_at(v, path, errs);
        }
        if !self.any_of.is_empty() && !self.any_of.iter().any(|s| s.validate(v).is_empty()) {
            errs.push(FieldError::invalid(
                shown,
                v,
                format!("{shown} in body must match at least one schema in anyOf"),
            ));
        }
        if !self.one_of.is_empty() {
            let matching = self.one_of.iter().filter(|s| s.validate(v).is_empty()).count();
            if matching != 1 {
                errs.push(FieldError::invalid(
                    shown,
                    v,
                    format!("{shown} in body must match exactly one schema in oneOf"),
                ));
            }
        }
        if let Some(not) = &self.not
            && not.validate(v).is_empty()
        {
            errs.push(FieldError::invalid(
                shown,
                v,
                format!("{shown} in body should not match the schema in not"),
            ));
        }
    }

    fn validate_object(&self, m: &Map<String, Value>, path: &str, shown: &str, errs: &mut Vec<FieldError>) {
        let n = m.len() as u64;
        if let Some(min) = self.min_properties
            && n < min
        {
            errs.push(FieldError::invalid(
                shown,
                &Value::from(n),
                format!("{shown} in body should have at least {min} properties"),
            ));
        }
        if let Some(max) = self.max_properties
            && n > max
        {
            errs.push(FieldError::invalid(
                shown,
                &Value::from(n),
                format!("{shown} in body should have at most {max} properties"),
            ));
        }
        for r in &self.required {
            if !m.contains_key(r) {
                errs.push(FieldError::required(join(path, r), ""));
            }
        }
        for (k, child) in m {
            if let Some(s) = self.properties.get(k) {
                s.validate_at(child, &join(path, k), errs);
            } else if let Additional::Schema(s) = &self.additional {
                s.validate_at(child, &join(path, k), errs);
            }
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn is_integer(v: &Value) -> bool {
    v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) if is_integer(v) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go's `%v` of a float64 bound: `10`, not `10.0`.
fn num(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        f.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn workflow_schema() -> Schema {
        Schema::compile(&json!({
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

    #[test]
    fn prunes_unknown_fields_but_keeps_preserved_ones() {
        let s = workflow_schema();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a", "bogus": 1},
            "spec": {"image": "a", "typo": 1, "extra": {"anything": [1]}, "steps": [{"name": "s", "junk": true}]}});
        let unknown = s.prune(&mut obj, true);
        assert_eq!(unknown, vec!["metadata.bogus", "spec.steps[0].junk", "spec.typo"]);
        assert_eq!(
            obj["spec"],
            json!({"image": "a", "extra": {"anything": [1]}, "steps": [{"name": "s"}]})
        );
        assert_eq!(obj["apiVersion"], "x/v1");
    }

    #[test]
    fn defaults_missing_fields() {
        let s = workflow_schema();
        let mut obj = json!({"spec": {"image": "a"}});
        s.apply_defaults(&mut obj);
        assert_eq!(obj["spec"]["replicas"], 1);
    }

    #[test]
    fn reports_each_violation_with_its_path() {
        let s = workflow_schema();
        let obj = json!({"spec": {"replicas": 20, "mode": "slow", "steps": [{"name": 3}]}});
        let msgs: Vec<String> = s.validate(&obj).iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            vec![
                "spec.image: Required value",
                "spec.mode: Unsupported value: \"slow\": supported values: \"fast\", \"safe\"",
                "spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10",
                "spec.steps[0].name: Invalid value: \"integer\": spec.steps[0].name in body must be of type string: \"integer\"",
            ]
        );
        let bad_pattern = s.validate(&json!({"spec": {"image": "A1"}}));
        assert_eq!(
            bad_pattern[0].to_string(),
            "spec.image: Invalid value: \"A1\": spec.image in body should match '^[a-z]+$'"
        );
    }
}
