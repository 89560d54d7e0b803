//! `wait`: what an applied object must show before its create or update is done.
//!
//! - `for: Ready`: kstatus-like readiness. Deployments, StatefulSets and DaemonSets have
//!   finished their rollout; an object with `status.conditions` has `Ready=True`, or, without
//!   a `Ready` condition, is neither `Reconciling` nor `Stalled`; an object whose
//!   `status.observedGeneration` is behind its `metadata.generation` is not ready; an object
//!   without a status is ready at once.
//! - `for: Rollout`: the rollout of a Deployment, StatefulSet or DaemonSet (other kinds are
//!   refused): the controller saw the latest generation and every replica is updated and
//!   available.
//! - `condition: {type: X, status: "True"}`: condition X has that status (default `True`),
//!   for the latest generation when the condition says which one it saw.
//! - `fields: {"status.phase": "Active"}`: each dotted path holds that value.
//! - `timeout: "2m"` (default 5m): how long to wait, also for a delete to finish.
//!
//! All the criteria given must hold at once.

use std::time::Duration;

use lyra_core::provider::ProviderError;
use lyra_core::types::kind_of;
use lyra_core::value::Value;

/// How long a wait (or a delete's wait) lasts unless `wait.timeout` says.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// The kinds whose rollout `for: Rollout` (and `for: Ready`) follows, all in `apps`.
const ROLLOUT_KINDS: [&str; 3] = ["Deployment", "StatefulSet", "DaemonSet"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum For {
    Ready,
    Rollout,
}

/// A parsed `wait` attribute.
#[derive(Debug, Clone)]
pub(super) struct Wait {
    for_: Option<For>,
    /// A condition's type and the status it must have.
    condition: Option<(String, String)>,
    /// Dotted paths and the values they must hold.
    fields: Vec<(String, Value)>,
    pub(super) timeout: Duration,
}

fn invalid(message: String) -> ProviderError {
    ProviderError::InvalidValue {
        attribute: super::WAIT.to_owned(),
        message,
    }
}

/// `wait.timeout` of `wait` (absent: the default), for deletes.
pub(super) fn timeout(wait: Option<&Value>) -> Result<Duration, ProviderError> {
    match wait.and_then(|w| w.get("timeout")) {
        None | Some(Value::Null) => Ok(DEFAULT_TIMEOUT),
        Some(Value::String(s)) => humantime::parse_duration(s.trim())
            .map_err(|_| invalid(format!("timeout '{s}' is not a duration such as 30s, 2m or 1h"))),
        Some(other) => Err(invalid(format!(
            "timeout must be a duration string such as 2m, got {}",
            kind_of(other)
        ))),
    }
}

impl Wait {
    /// The `wait` attribute of an object of `kind` in API group `group`; `None` when unset.
    pub(super) fn parse(value: Option<&Value>, group: &str, kind: &str) -> Result<Option<Wait>, ProviderError> {
        let map = match value {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(m)) => m,
            Some(other) => return Err(invalid(format!("expects a hash, got {}", kind_of(other)))),
        };
        let mut wait = Wait {
            for_: None,
            condition: None,
            fields: Vec::new(),
            timeout: timeout(value)?,
        };
        for (key, v) in map {
            match (key.as_str(), v) {
                ("timeout", _) | (_, Value::Null) => {}
                ("for", Value::String(s)) => {
                    wait.for_ = Some(match s.as_str() {
                        "Ready" => For::Ready,
                        "Rollout" if is_rollout_kind(group, kind) => For::Rollout,
                        "Rollout" => {
                            return Err(invalid(format!(
                                "for: Rollout follows apps/v1 Deployments, StatefulSets and DaemonSets, \
                                 not {kind}: wait for Ready, a condition or fields instead"
                            )));
                        }
                        other => return Err(invalid(format!("for is Ready or Rollout, not '{other}'"))),
                    });
                }
                ("condition", Value::Object(c)) => {
                    let Some(Value::String(ty)) = c.get("type") else {
                        return Err(invalid(
                            "condition needs a type (a string), e.g. {type: Ready}".to_owned(),
                        ));
                    };
                    let status = match c.get("status") {
                        None | Some(Value::Null) => "True".to_owned(),
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Bool(b)) => if *b { "True" } else { "False" }.to_owned(),
                        Some(other) => {
                            return Err(invalid(format!(
                                "condition status is True, False or Unknown, got {}",
                                kind_of(other)
                            )));
                        }
                    };
                    if let Some(extra) = c.keys().find(|k| *k != "type" && *k != "status") {
                        return Err(invalid(format!("condition takes type and status, not {extra}")));
                    }
                    wait.condition = Some((ty.clone(), status));
                }
                ("fields", Value::Object(f)) => {
                    wait.fields = f.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                }
                ("for" | "condition" | "fields", other) => {
                    return Err(invalid(format!(
                        "{key} expects {}, got {}",
                        if key == "for" { "Ready or Rollout" } else { "a hash" },
                        kind_of(other)
                    )));
                }
                (other, _) => {
                    return Err(invalid(format!(
                        "unknown key {other}: wait takes for, condition, fields and timeout"
                    )));
                }
            }
        }
        Ok(Some(wait))
    }

    /// Whether there is anything to wait for (a `wait` with only a timeout has not).
    pub(super) fn waits(&self) -> bool {
        self.for_.is_some() || self.condition.is_some() || !self.fields.is_empty()
    }

    /// What is waited for, for messages.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.for_ {
            Some(For::Ready) => parts.push("be Ready".to_owned()),
            Some(For::Rollout) => parts.push("finish its rollout".to_owned()),
            None => {}
        }
        if let Some((ty, status)) = &self.condition {
            parts.push(format!("have condition {ty}={status}"));
        }
        for (path, v) in &self.fields {
            parts.push(format!("have {path} = {}", scalar(v)));
        }
        parts.join(" and ")
    }

    /// `Ok` when `obj` (the live object) is as waited for, else what it shows instead.
    pub(super) fn check(&self, obj: &Value) -> Result<(), String> {
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let group = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.rsplit_once('/'))
            .map_or("", |(g, _)| g);
        match self.for_ {
            Some(For::Rollout) => rollout(obj, kind)?,
            Some(For::Ready) if is_rollout_kind(group, kind) => rollout(obj, kind)?,
            Some(For::Ready) => ready(obj)?,
            None => {}
        }
        if let Some((ty, status)) = &self.condition {
            match condition(obj, ty) {
                Some(c) if c.get("status").and_then(Value::as_str) == Some(status.as_str()) => {
                    let observed = c.get("observedGeneration").and_then(Value::as_i64);
                    let generation = int(obj, "/metadata/generation");
                    if observed.is_some_and(|o| o < generation) {
                        return Err(format!(
                            "condition {ty} is {status} for generation {} of {generation}",
                            observed.unwrap_or_default()
                        ));
                    }
                }
                Some(c) => return Err(format!("condition {}", summary(c))),
                None => return Err(format!("no condition {ty}")),
            }
        }
        for (path, want) in &self.fields {
            let pointer = format!("/{}", path.split('.').collect::<Vec<_>>().join("/"));
            match obj.pointer(&pointer) {
                Some(have) if same(have, want) => {}
                Some(have) => return Err(format!("{path} is {}", scalar(have))),
                None => return Err(format!("{path} is not set")),
            }
        }
        Ok(())
    }
}

fn is_rollout_kind(group: &str, kind: &str) -> bool {
    group == "apps" && ROLLOUT_KINDS.contains(&kind)
}

/// An integer at `pointer`, 0 when absent (the API omits zero counts).
fn int(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// A finished rollout: the controller saw the latest spec, and every replica is updated and
/// available (no old ones left).
fn rollout(obj: &Value, kind: &str) -> Result<(), String> {
    let generation = int(obj, "/metadata/generation");
    let observed = int(obj, "/status/observedGeneration");
    if observed < generation {
        return Err(format!("observedGeneration {observed} of generation {generation}"));
    }
    let want = obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    match kind {
        "Deployment" => {
            let updated = int(obj, "/status/updatedReplicas");
            let total = int(obj, "/status/replicas");
            let available = int(obj, "/status/availableReplicas");
            if updated < want {
                return Err(format!("{updated} of {want} replicas updated"));
            }
            if total > updated {
                return Err(format!("{} old replicas pending termination", total - updated));
            }
            if available < want {
                return Err(format!("{available} of {want} replicas available"));
            }
        }
        "StatefulSet" => {
            let updated = int(obj, "/status/updatedReplicas");
            let ready = int(obj, "/status/readyReplicas");
            if updated < want {
                return Err(format!("{updated} of {want} replicas updated"));
            }
            if ready < want {
                return Err(format!("{ready} of {want} replicas ready"));
            }
        }
        "DaemonSet" => {
            let desired = int(obj, "/status/desiredNumberScheduled");
            let updated = int(obj, "/status/updatedNumberScheduled");
            let available = int(obj, "/status/numberAvailable");
            if updated < desired {
                return Err(format!("{updated} of {desired} pods updated"));
            }
            if available < desired {
                return Err(format!("{available} of {desired} pods available"));
            }
        }
        _ => {}
    }
    Ok(())
}

/// kstatus-like readiness of an object that is not rolled out by a built-in controller.
fn ready(obj: &Value) -> Result<(), String> {
    let Some(status) = obj.get("status").filter(|s| s.is_object()) else {
        return Ok(());
    };
    let generation = int(obj, "/metadata/generation");
    if let Some(observed) = status.get("observedGeneration").and_then(Value::as_i64)
        && observed < generation
    {
        return Err(format!("observedGeneration {observed} of generation {generation}"));
    }
    if let Some(c) = condition(obj, "Ready") {
        return if c.get("status").and_then(Value::as_str) == Some("True") {
            Ok(())
        } else {
            Err(format!("condition {}", summary(c)))
        };
    }
    for ty in ["Stalled", "Reconciling"] {
        if let Some(c) = condition(obj, ty)
            && c.get("status").and_then(Value::as_str) == Some("True")
        {
            return Err(format!("condition {}", summary(c)));
        }
    }
    Ok(())
}

/// The condition of type `ty` in `status.conditions`.
fn condition<'a>(obj: &'a Value, ty: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
}

/// `Ready=False (Reason: message)`, the message cut short.
fn summary(c: &Value) -> String {
    let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
    let mut s = format!("{}={}", field("type"), field("status"));
    let (reason, message) = (field("reason"), field("message"));
    if !reason.is_empty() || !message.is_empty() {
        let message: String = message.chars().take(200).collect();
        s.push_str(&format!(
            " ({reason}{}{message})",
            if reason.is_empty() { "" } else { ": " }
        ));
    }
    s
}

/// A value as a message shows it: strings bare, the rest as JSON.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether a live value is the wanted one; `"3"` matches 3, as YAML authors mean it.
fn same(have: &Value, want: &Value) -> bool {
    have == want || (have.is_number() && have.as_f64() == want.as_f64()) || scalar(have) == scalar(want)
}
