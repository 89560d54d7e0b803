//! CEL rules (`x-kubernetes-validations`), compiled once when the CRD is written and evaluated
//! on every write after the schema's own checks pass, with `self` bound to the rule's node and
//! `oldSelf` to the same node of the stored object on updates (transition rules). The engine
//! is `kube-cel`, the one kube's `cel` feature uses.
//!
//! On updates an unchanged top-level field (`spec` when only `status` or `metadata` moved)
//! has its rules skipped: a real apiserver (1.33+, validation ratcheting) ignores what they
//! would say about a value the write did not change. Fields that hold a transition rule
//! (`oldSelf`) are always checked, and so is the whole object when the root has rules of
//! its own.
//!
//! What a real apiserver refuses at CRD registration (a rule that does not parse, or that
//! uses a macro the `cel` crate lacks, such as `sortBy` or `cel.bind`) is logged and skipped
//! here, and reported as a `Warning` on the CRD write: the emulator enforces fewer rules
//! rather than refusing a CRD a real cluster takes.

use kube_cel::{CompilationError, CompilationResult, CompiledSchema, ErrorKind, ValidationError, compile_schema};
use serde_json::{Value, json};

use crate::errors::{FieldError, FieldErrorKind};

/// The CEL rules of one CRD version's schema.
#[derive(Debug)]
pub struct Rules {
    compiled: CompiledSchema,
    /// The top-level fields that hold rules, checked one by one; `None`: the root's own
    /// rules (or its `allOf`, `items`...) need the whole object at once.
    fields: Option<Vec<Field>>,
    /// The schema they came from: a failed rule's value is shown as its node's `type`.
    source: Value,
    warnings: Vec<String>,
}

impl Rules {
    /// The rules of a schema, or `None` when it has none (most writes then skip CEL).
    pub fn compile(schema: &Value) -> Option<Rules> {
        if !has_rules(schema) {
            return None;
        }
        let compiled = compile_schema(schema);
        let mut warnings = Vec::new();
        compilation_warnings(&compiled, "", &mut warnings);
        let c = &compiled;
        let whole = !c.validations.is_empty()
            || c.items.is_some()
            || c.additional_properties.is_some()
            || !(c.all_of.is_empty() && c.one_of.is_empty() && c.any_of.is_empty());
        let fields = (!whole).then(|| {
            let mut fields: Vec<Field> = c
                .properties
                .iter()
                .filter(|(_, p)| any_rule(p, &|_| true))
                .map(|(name, p)| Field {
                    name: name.clone(),
                    transition: any_rule(p, &|r| r.as_ref().is_ok_and(|r| r.is_transition_rule)),
                })
                .collect();
            // Errors in a stable order.
            fields.sort_by(|a, b| a.name.cmp(&b.name));
            fields
        });
        Some(Rules {
            compiled,
            fields,
            source: schema.clone(),
            warnings,
        })
    }

    /// One line for each rule that cannot be compiled and so is not enforced.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Every rule `obj` breaks, as the apiserver reports it: `Invalid` with the node's type as
    /// the value (`spec: Invalid value: "object": <message>`), or `Forbidden`/`Required` when
    /// the rule's `reason` says so. `old` is the stored object, on updates.
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let Some(fields) = &self.fields else {
            return self.report(evaluate(&self.compiled, obj, old));
        };
        let mut errs = Vec::new();
        for f in fields {
            let Some(value) = obj.get(&f.name) else { continue };
            let before = old.and_then(|o| o.get(&f.name));
            if !f.transition && before == Some(value) {
                continue;
            }
            let child = &self.compiled.properties[&f.name];
            errs.extend(evaluate(child, value, before).into_iter().map(|mut e| {
                e.field_path = under(&f.name, &e.field_path);
                e
            }));
        }
        self.report(errs)
    }

    /// The errors of a rule evaluation as the apiserver reports them.
    fn report(&self, errs: Vec<ValidationError>) -> Vec<FieldError> {
        let mut out = Vec::new();
        for e in &errs {
            match e.kind {
                // A runtime error (a missing key, say) fails the write on a real apiserver.
                ErrorKind::ValidationFailure | ErrorKind::EvaluationError => {}
                // Reported once, when the CRD was written.
                ErrorKind::CompilationFailure | ErrorKind::InvalidRule => continue,
                _ => {
                    // Skipped, as documented: what a real apiserver would have refused at
                    // registration, or what this engine cannot evaluate.
                    tracing::warn!(
                        field = %e.field_path,
                        rule = %e.rule,
                        "CEL rule not enforced by the emulator: {}",
                        e.message
                    );
                    continue;
                }
            }
            let field = e.field_path.clone();
            let err = match e.reason.as_deref() {
                Some("FieldValueForbidden") => FieldError {
                    kind: FieldErrorKind::Forbidden,
                    field,
                    value: String::new(),
                    detail: e.message.clone(),
                },
                Some("FieldValueRequired") => FieldError::required(field, e.message.clone()),
                _ => {
                    let t = type_at(&self.source, &field);
                    FieldError::invalid(field, &json!(t), e.message.clone())
                }
            };
            out.push(err);
        }
        out
    }
}

/// A top-level field whose subtree holds rules.
#[derive(Debug)]
struct Field {
    name: String,
    /// Whether one of them reads `oldSelf`: checked even when the field is unchanged.
    transition: bool,
}

/// What the rules of `compiled` say about `obj`.
fn evaluate(compiled: &CompiledSchema, obj: &Value, old: Option<&Value>) -> Vec<ValidationError> {
    // A rule the interpreter panics on is skipped like one it cannot evaluate: the write
    // goes on rather than the connection dropping.
    let run = || kube_cel::validate_compiled(compiled, obj, old);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(())) => Vec::new(),
        Ok(Err(errs)) => errs.into_vec(),
        Err(_) => {
            tracing::warn!("the CEL interpreter panicked: this object's rules are not enforced");
            Vec::new()
        }
    }
}

/// A field path found under the top-level field `name`, as it reads from the root.
fn under(name: &str, path: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else if path.starts_with(['.', '[']) {
        format!("{name}{path}")
    } else {
        format!("{name}.{path}")
    }
}

/// Whether a rule anywhere in `c` is one `pred` picks.
fn any_rule(c: &CompiledSchema, pred: &dyn Fn(&Result<CompilationResult, CompilationError>) -> bool) -> bool {
    c.validations.iter().any(pred)
        || c.properties.values().any(|p| any_rule(p, pred))
        || c.items.as_deref().is_some_and(|p| any_rule(p, pred))
        || c.additional_properties.as_deref().is_some_and(|p| any_rule(p, pred))
        || c.all_of
            .iter()
            .chain(&c.one_of)
            .chain(&c.any_of)
            .any(|p| any_rule(p, pred))
}

fn has_rules(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.contains_key("x-kubernetes-validations") || m.values().any(has_rules),
        Value::Array(a) => a.iter().any(has_rules),
        _ => false,
    }
}

fn compilation_warnings(c: &CompiledSchema, path: &str, out: &mut Vec<String>) {
    for e in c.compilation_errors() {
        let at = if path.is_empty() { "<root>" } else { path };
        // The parser's message spans lines (the source, a caret): its first one says it all,
        // and a `Warning` header holds one line.
        let e = e.to_string();
        let e = e.lines().next().unwrap_or_default();
        out.push(format!(
            "x-kubernetes-validations at {at}: {e}; kube-emulator does not enforce this rule"
        ));
    }
    for (k, child) in &c.properties {
        compilation_warnings(child, &super::join(path, k), out);
    }
    if let Some(items) = &c.items {
        compilation_warnings(items, &format!("{path}[*]"), out);
    }
    if let Some(extra) = &c.additional_properties {
        compilation_warnings(extra, &format!("{path}[*]"), out);
    }
}

/// The `type` of the schema node at a field path (`spec.items[0].name`); `object` when the
/// path leaves the schema (a rule's `fieldPath` may name a key the schema does not).
fn type_at(schema: &Value, path: &str) -> String {
    let mut node = schema;
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        let (key, indexes) = match seg.find('[') {
            Some(i) => (&seg[..i], seg[i..].matches('[').count()),
            None => (seg, 0),
        };
        if !key.is_empty() {
            node = match node.pointer(&format!("/properties/{}", key.replace('~', "~0").replace('/', "~1"))) {
                Some(n) => n,
                None => match node.get("additionalProperties") {
                    Some(n @ Value::Object(_)) => n,
                    _ => return "object".into(),
                },
            };
        }
        for _ in 0..indexes {
            node = match node.get("items") {
                Some(n) => n,
                None => return "object".into(),
            };
        }
    }
    node["type"].as_str().unwrap_or("object").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "x-kubernetes-validations": [
                        {"rule": "has(self.a) != has(self.b)", "message": "exactly one of a or b"},
                        {"rule": "!has(self.b) || self.b.size() > 1",
                         "messageExpression": "'b is too short: ' + self.b"},
                    ],
                    "properties": {
                        "a": {"type": "string"},
                        "b": {"type": "string"},
                        "size": {
                            "type": "integer",
                            "x-kubernetes-validations": [
                                {"rule": "self >= oldSelf", "message": "size may not shrink"},
                                {"rule": "self != 13", "reason": "FieldValueForbidden", "message": "unlucky"},
                            ],
                        },
                        "tags": {
                            "type": "array",
                            "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'x'"}]},
                        },
                        "odd": {"type": "string", "x-kubernetes-validations": [{"rule": "self.sortBy(x, x) =="}]},
                    },
                },
            },
        });
        let rules = Rules::compile(&schema).expect("the schema has rules");
        let w = rules.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("x-kubernetes-validations at spec.odd: "), "{w:?}");
        rules
    }

    fn shown(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_schema_without_rules_compiles_to_nothing() {
        let rules = Rules::compile(&json!({"type": "object", "properties": {"a": {"type": "string"}}}));
        assert!(rules.is_none());
    }

    #[test]
    fn broken_rules_are_reported_with_their_path_and_message() {
        let r = rules();
        assert!(r.validate(&json!({"spec": {"a": "x"}}), None).is_empty());
        assert_eq!(
            shown(&r.validate(&json!({"spec": {}}), None)),
            vec!["spec: Invalid value: \"object\": exactly one of a or b"]
        );
        assert_eq!(
            shown(&r.validate(&json!({"spec": {"b": "y"}}), None)),
            vec!["spec: Invalid value: \"object\": b is too short: y"]
        );
        assert_eq!(
            shown(&r.validate(&json!({"spec": {"a": "x", "tags": ["ok", "x"]}}), None)),
            vec!["spec.tags[1]: Invalid value: \"string\": failed rule: self != 'x'"]
        );
        assert_eq!(
            shown(&r.validate(&json!({"spec": {"a": "x", "size": 13}}), None)),
            vec!["spec.size: Forbidden: unlucky"]
        );
    }

    #[test]
    fn or_short_circuits() {
        let r = Rules::compile(&json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.size <= 3 || self.color == 'red'"}],
            "properties": {"size": {"type": "integer", "default": 1,
                "x-kubernetes-validations": [{"rule": "self >"}]}, "color": {"type": "string"}}}}}))
        .unwrap();
        assert_eq!(
            shown(&r.validate(&json!({"spec": {"size": 1}}), None)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn transition_rules_see_the_stored_object() {
        let r = rules();
        let old = json!({"spec": {"a": "x", "size": 5}});
        assert!(r.validate(&json!({"spec": {"a": "x", "size": 3}}), None).is_empty());
        assert!(
            r.validate(&json!({"spec": {"a": "x", "size": 6}}), Some(&old))
                .is_empty()
        );
        assert_eq!(
            shown(&r.validate(&json!({"spec": {"a": "x", "size": 3}}), Some(&old))),
            vec!["spec.size: Invalid value: \"integer\": size may not shrink"]
        );
    }

    #[test]
    fn an_update_skips_the_rules_of_fields_it_leaves_as_they_were() {
        let r = Rules::compile(&json!({"type": "object", "properties": {
            "spec": {"type": "object", "x-kubernetes-validations": [{"rule": "has(self.a)", "message": "a is required"}],
                "properties": {"a": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'x'"}]}},
            "status": {"type": "object", "properties": {"n": {"type": "integer"}}}}}))
        .unwrap();
        // Stored before the rule was added, say: a status write does not trip over it...
        let old = json!({"spec": {}, "tags": ["x"]});
        let status_only = json!({"spec": {}, "tags": ["x"], "status": {"n": 1}});
        assert!(r.validate(&status_only, Some(&old)).is_empty());
        // ...but a change to the field does, and so does a create.
        assert_eq!(
            shown(&r.validate(&json!({"spec": {"b": 1}, "tags": ["x"]}), Some(&old))),
            vec!["spec: Invalid value: \"object\": a is required"]
        );
        assert_eq!(
            shown(&r.validate(&status_only, None)),
            vec![
                "spec: Invalid value: \"object\": a is required",
                "tags[0]: Invalid value: \"string\": failed rule: self != 'x'"
            ]
        );
    }

    #[test]
    fn transition_rules_and_rules_on_the_root_are_checked_even_when_nothing_changed() {
        let r = Rules::compile(&json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"n": {"type": "integer", "x-kubernetes-validations": [{"rule": "self != oldSelf", "message": "n must change"}]}}}}}))
        .unwrap();
        let obj = json!({"spec": {"n": 1}});
        assert_eq!(
            shown(&r.validate(&obj, Some(&obj))),
            vec!["spec.n: Invalid value: \"integer\": n must change"]
        );
        let r = Rules::compile(&json!({"type": "object", "x-kubernetes-validations": [{"rule": "has(self.spec.a)", "message": "a is required"}],
            "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}}}))
        .unwrap();
        let obj = json!({"spec": {}});
        let errs = shown(&r.validate(&obj, Some(&obj)));
        assert!(
            errs.len() == 1 && errs[0].ends_with("Invalid value: \"object\": a is required"),
            "{errs:?}"
        );
    }
}
