//! Keeping secrets out of everything a run prints or records.
//!
//! Values typed `Sensitive`, attributes a provider marks secret, and everything derived from
//! them are tracked through a run (`Val::sensitive` in the engine) and masked where they are
//! shown. Tracking cannot follow a value through a provider, though: a provider may echo a
//! secret in a computed attribute or quote it in an error. So the engine also remembers every
//! secret value it meets ([`Secrets`]) and, before a report leaves it, masks any attribute
//! or return that contains one and scrubs them from every message. The engine's [`Report`]
//! and the history it records are therefore safe to show as they are, by the CLI, the
//! controller's status and events, or anything else.
//!
//! [`Report`]: crate::report::Report

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::report::{AttrChange, StepReport};
use crate::schema::ResourceSchema;
use crate::state::ResourceRecord;
use crate::value::{Map, Value};

/// What a secret is shown as.
pub const MASK: &str = "(sensitive)";

/// Secrets shorter than this are masked where they are known to be secret but not scrubbed
/// from free text: scrubbing `"1"` or `"ab"` would mangle every message.
pub const MIN_SCRUB_LEN: usize = 3;

/// The mask, as a value.
pub fn masked() -> Value {
    Value::String(MASK.to_owned())
}

/// The secret values a run has met, as the texts they may appear as in messages.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    /// Longest first, so that a secret containing another is scrubbed whole. A sorted set:
    /// a run adds secrets one by one, and re-sorting a list on each would be quadratic.
    needles: BTreeSet<(Reverse<usize>, String)>,
}

impl Secrets {
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// Remembers a secret value: each string and number inside it (map keys are structure,
    /// not secrets), as written and as JSON would escape it.
    pub fn add(&mut self, value: &Value) {
        let mut stack = vec![value];
        while let Some(v) = stack.pop() {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Array(items) => {
                    stack.extend(items);
                    continue;
                }
                Value::Object(m) => {
                    stack.extend(m.values());
                    continue;
                }
                Value::Null | Value::Bool(_) => continue,
            };
            let escaped = Value::String(text.clone()).to_string();
            let escaped = escaped[1..escaped.len() - 1].to_owned();
            for t in [text, escaped] {
                if t.chars().count() >= MIN_SCRUB_LEN {
                    self.needles.insert((Reverse(t.len()), t));
                }
            }
        }
    }

    /// Remembers a value derived from secrets (built from them, or echoing them) only when it
    /// is a scalar: a reference copies values whole, so a derived scalar is a secret itself,
    /// while a derived list or hash (a manifest holding one password) is mostly structure, and
    /// its secrets are remembered where they came from. Remembering the whole would scrub
    /// `default`, `Secret` or a name from every message.
    pub fn add_derived(&mut self, value: &Value) {
        if matches!(value, Value::String(_) | Value::Number(_)) {
            self.add(value);
        }
    }

    /// Remembers the secret attributes of a record: those its provider marks (`schema`), whole,
    /// and those it lists as derived from secrets, when scalars ([`Secrets::add_derived`]).
    pub fn add_record(&mut self, rec: &ResourceRecord, schema: Option<&ResourceSchema>) {
        // Most records hold none: every record of a run is asked.
        if rec.sensitive.is_empty() && !schema.is_some_and(ResourceSchema::has_secrets) {
            return;
        }
        for attr in record_secret_names(rec, schema) {
            if attr == crate::engine::PROVIDER_CONFIG_KEY {
                // Only the secret settings: the rest (a host, a namespace) would be masked
                // everywhere else too.
                let entry = rec.desired.get(&attr);
                let settings = entry.and_then(|e| e.get("settings"));
                let names = entry.and_then(|e| e.get("secret")).and_then(Value::as_array);
                for n in names.into_iter().flatten().filter_map(Value::as_str) {
                    if let Some(v) = settings.and_then(|s| s.get(n)) {
                        self.add(v);
                    }
                }
                continue;
            }
            let marked = schema.is_some_and(|s| s.is_secret(&attr));
            for m in [&rec.desired, &rec.actual] {
                if let Some(v) = m.get(&attr) {
                    if marked {
                        self.add(v);
                    } else {
                        self.add_derived(v);
                    }
                }
            }
        }
    }

    /// `text` with every known secret replaced by [`MASK`].
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (_, n) in &self.needles {
            if out.contains(n.as_str()) {
                out = out.replace(n.as_str(), MASK);
            }
        }
        out
    }

    /// Whether `value` holds a known secret anywhere: a string containing one, or a number
    /// that is one.
    pub fn reveals(&self, value: &Value) -> bool {
        if self.needles.is_empty() {
            return false;
        }
        let mut stack = vec![value];
        while let Some(v) = stack.pop() {
            match v {
                Value::String(s) => {
                    if self.needles.iter().any(|(_, n)| s.contains(n.as_str())) {
                        return true;
                    }
                }
                Value::Number(n) => {
                    let t = n.to_string();
                    if self.needles.contains(&(Reverse(t.len()), t)) {
                        return true;
                    }
                }
                Value::Array(items) => stack.extend(items),
                Value::Object(m) => stack.extend(m.values()),
                Value::Null | Value::Bool(_) => {}
            }
        }
        false
    }

    /// Makes a step's report safe to show: changes of secret attributes (or holding a known
    /// secret) are masked and the error and external id are scrubbed.
    pub fn redact_step(&self, step: &mut StepReport) {
        for c in &mut step.changes {
            self.redact_change(c);
        }
        // In place: a run reports every step twice over, and most texts hold no secret.
        for text in [&mut step.error, &mut step.external_id].into_iter().flatten() {
            if self.needles.iter().any(|(_, n)| text.contains(n.as_str())) {
                *text = self.scrub(text);
            }
        }
    }

    fn redact_change(&self, c: &mut AttrChange) {
        let reveals = |v: &Option<Value>| v.as_ref().is_some_and(|v| self.reveals(v));
        c.sensitive |= reveals(&c.old) || reveals(&c.new);
        if c.sensitive {
            for v in [&mut c.old, &mut c.new].into_iter().flatten() {
                if !v.is_null() {
                    *v = masked();
                }
            }
        }
    }
}

/// The attributes a record says are secret, and those its provider marks secret.
fn record_secret_names(rec: &ResourceRecord, schema: Option<&ResourceSchema>) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = rec.sensitive.iter().cloned().collect();
    if let Some(schema) = schema {
        // By the schema's secret attributes, usually none: every record of a run is asked.
        names.extend(
            schema
                .attributes
                .iter()
                .filter(|a| a.is_secret())
                .filter(|a| rec.desired.contains_key(&a.name) || rec.actual.contains_key(&a.name))
                .map(|a| a.name.clone()),
        );
    }
    names
}

/// A record's actual state as it may be shown (`lyra state show`, a status): secret
/// attributes, and any attribute holding one of the record's secret values, masked. `schema`
/// is the provider's schema of the record's type, when known.
pub fn shown_state(rec: &ResourceRecord, schema: Option<&ResourceSchema>) -> Map {
    let names = record_secret_names(rec, schema);
    let mut secrets = Secrets::default();
    secrets.add_record(rec, schema);
    rec.actual
        .iter()
        .map(|(k, v)| {
            let secret = !v.is_null() && (names.contains(k) || secrets.reveals(v));
            (k.clone(), if secret { masked() } else { v.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Action, Status};
    use serde_json::json;

    #[test]
    fn scrubs_every_form_of_a_secret() {
        let mut s = Secrets::default();
        s.add(&json!({"user": "admin-ro", "pass": "pa\"55word", "pin": 98765, "flag": true, "x": "ab"}));
        assert_eq!(
            s.scrub(r#"login admin-ro with "pa\"55word" or pa"55word, pin 98765, ab"#),
            "login (sensitive) with \"(sensitive)\" or (sensitive), pin (sensitive), ab"
        );
        assert!(s.reveals(&json!(["x", {"k": "the admin-ro account"}])));
        assert!(s.reveals(&json!(98765)));
        assert!(!s.reveals(&json!({"admin-ro": 1, "n": 9876})));
    }

    #[test]
    fn redacts_changes_holding_secrets_and_scrubs_errors() {
        let mut s = Secrets::default();
        s.add(&json!("old-s3cret"));
        let mut step = StepReport {
            id: "a".into(),
            type_name: Some("T".into()),
            action: Action::Update,
            status: Status::Failed,
            external_id: Some("x".into()),
            duration: Default::default(),
            error: Some("cannot set old-s3cret".into()),
            changes: vec![
                AttrChange {
                    attribute: "echo".into(),
                    path: "echo".into(),
                    old: Some(json!("was old-s3cret")),
                    new: Some(json!("now public")),
                    forces_replace: false,
                    sensitive: false,
                },
                AttrChange {
                    attribute: "size".into(),
                    path: "size".into(),
                    old: Some(json!(1)),
                    new: None,
                    forces_replace: false,
                    sensitive: false,
                },
            ],
            refused: false,
        };
        s.redact_step(&mut step);
        assert_eq!(step.error.as_deref(), Some("cannot set (sensitive)"));
        assert!(step.changes[0].sensitive);
        assert_eq!(step.changes[0].old, Some(masked()));
        assert_eq!(step.changes[0].new, Some(masked()));
        assert_eq!(step.changes[1].old, Some(json!(1)));
    }

    #[test]
    fn shown_state_masks_listed_attributes_and_echoes_of_them() {
        let rec = ResourceRecord {
            step_id: "s".into(),
            type_name: "T".into(),
            external_id: "x".into(),
            desired: json!({"input": "hunter22"}).as_object().unwrap().clone(),
            actual: json!({"input": "hunter22", "output": "x-hunter22-x", "other": 1, "gone": null})
                .as_object()
                .unwrap()
                .clone(),
            depends_on: vec![],
            managed: true,
            pending: false,
            sensitive: vec!["input".into(), "gone".into()],
            create_key: None,
        };
        let shown = shown_state(&rec, None);
        assert_eq!(
            Value::Object(shown),
            json!({"input": MASK, "output": MASK, "other": 1, "gone": null})
        );
    }
}
