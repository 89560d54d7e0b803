//! Validation: every violation of the schema, with its field path and the apiserver's
//! message.

use serde_json::{Map, Value};

use super::{Additional, Schema, join};
use crate::errors::{FieldError, FieldErrorKind};

impl Schema {
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
    use serde_json::json;

    use super::super::workflow_schema;

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
