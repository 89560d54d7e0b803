//! Provider configuration: the main workflow's `providers:` block, resolved once per run from
//! the top-level parameters, and recorded with each resource so that a resource can be
//! deleted (garbage, `lyra delete`) without the workflow that made it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;

use super::{Engine, EngineError, Env};
use crate::diag::Diagnostics;
use crate::expr::Var;
use crate::model::Workflow;
use crate::schema::{namespace_of, type_key};
use crate::state::ResourceRecord;
use crate::value::{Map, Value};

/// The configuration of a provider that has none.
pub(super) fn none() -> &'static Map {
    static NONE: OnceLock<Map> = OnceLock::new();
    NONE.get_or_init(Map::new)
}

/// Where a record keeps the configuration its resource was made with, inside its desired
/// state, as `{settings: {...}, secret: [names]}`: no attribute can be named so (attribute
/// names are identifiers), and the record's shape, hence every store and export, stays as it
/// was. The record lists the key as sensitive when any setting is secret; only those settings'
/// values are remembered as secrets (see `Secrets::add_record`).
pub const RECORD_KEY: &str = "lyra:provider";

/// One namespace's resolved settings.
#[derive(Debug, Clone, Default)]
pub(super) struct Resolved {
    pub map: Map,
    /// The settings that are secret (derived from something `Sensitive`, or marked so by the
    /// provider).
    pub secret: Vec<String>,
}

/// Every namespace's settings for one run, by namespace key.
#[derive(Debug, Default)]
pub(super) struct Configs(HashMap<String, Resolved>);

impl Configs {
    /// The settings for resources of `type_name`.
    pub fn for_type(&self, type_name: &str) -> Option<&Resolved> {
        // Asked for each step, and most workflows configure no provider.
        if self.0.is_empty() {
            return None;
        }
        crate::schema::with_type_key(namespace_of(type_name), |key| self.0.get(key))
    }

    pub fn values(&self) -> impl Iterator<Item = &Resolved> {
        self.0.values()
    }
}

impl Engine<'_> {
    /// Resolves `wf`'s `providers:` block against the top-level parameters `env`, converting
    /// each setting to its schema's type.
    pub(super) fn provider_configs(&self, wf: &Workflow, env: &Env) -> Result<Configs, EngineError> {
        let mut out = HashMap::new();
        let mut diags = Diagnostics::default();
        let schemas = self.providers.schemas();
        for block in &wf.providers {
            let schema = schemas.config(&block.namespace);
            let mut resolved = Resolved::default();
            for a in &block.value {
                let look = |n: &str| env.get(n).map(|v| &v.var);
                let from_secret = a
                    .expr
                    .refs()
                    .iter()
                    .any(|r| env.get(&r.name).is_some_and(|v| v.sensitive));
                let attr = schema.and_then(|s| s.attribute(&a.name));
                let value = match a.expr.resolve(&look) {
                    Ok(v) => v,
                    Err(_) => {
                        diags.error(a.span, format!("provider setting '{}' cannot be resolved", a.name));
                        continue;
                    }
                };
                let value = match attr {
                    Some(attr) => match attr.ty.coerce(&value) {
                        Ok(v) => v,
                        Err(e) => {
                            // The value itself is not shown: it may be a secret.
                            diags.error(
                                a.span,
                                format!(
                                    "provider setting '{}' of {} expects {}, got {}",
                                    a.name, block.namespace, e.expected, e.found
                                ),
                            );
                            continue;
                        }
                    },
                    None => value,
                };
                if from_secret || attr.is_some_and(crate::schema::AttributeSchema::is_secret) {
                    resolved.secret.push(a.name.clone());
                }
                resolved.map.insert(a.name.clone(), value);
            }
            out.insert(type_key(&block.namespace), resolved);
        }
        diags.into_result().map_err(EngineError::Input)?;
        Ok(Configs(out))
    }
}

/// The configuration `rec` was recorded with, if any.
pub(super) fn recorded(rec: &ResourceRecord) -> Option<&Map> {
    rec.desired
        .get(RECORD_KEY)
        .and_then(|c| c.get("settings"))
        .and_then(Value::as_object)
}

/// `desired` without the recorded configuration: the attributes a create was asked with.
pub(super) fn attributes(desired: &Map) -> Cow<'_, Map> {
    if desired.contains_key(RECORD_KEY) {
        let mut m = desired.clone();
        m.remove(RECORD_KEY);
        Cow::Owned(m)
    } else {
        Cow::Borrowed(desired)
    }
}

/// Records `config` with `rec` (nothing when it is empty), marked secret when it is.
pub(super) fn record(rec: &mut ResourceRecord, config: Option<&Resolved>) {
    let Some(c) = config.filter(|c| !c.map.is_empty()) else {
        return;
    };
    let mut entry = Map::new();
    entry.insert("settings".to_owned(), Value::Object(c.map.clone()));
    entry.insert(
        "secret".to_owned(),
        Value::Array(c.secret.iter().cloned().map(Value::String).collect()),
    );
    rec.desired.insert(RECORD_KEY.to_owned(), Value::Object(entry));
    if !c.secret.is_empty() && !rec.sensitive.iter().any(|s| s == RECORD_KEY) {
        rec.sensitive.push(RECORD_KEY.to_owned());
    }
}

/// The secret settings' values, to remember as the run's secrets.
pub(super) fn secret_values(configs: &Configs) -> impl Iterator<Item = Var> + '_ {
    configs
        .values()
        .flat_map(|c| c.secret.iter().filter_map(|k| c.map.get(k)))
        .map(|v| Var::Known(v.clone()))
}
