//! Core `v1` Events and `events.k8s.io/v1` Events are one storage with two API views, as on a
//! real apiserver: objects are stored in the core form, and the `events.k8s.io` view is
//! converted on every read and write. The two schemas differ only by renamed top-level
//! fields, so the conversion is lossless both ways.

use serde_json::{Map, Value};

use crate::errors::FieldError;

/// `(core v1 name, events.k8s.io/v1 name)` of every field the two versions name differently;
/// everything else (`metadata`, `reason`, `type`, `action`, `eventTime`, `series`, `related`,
/// `reportingInstance`) is shared.
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

pub const EVENTS_V1_API_VERSION: &str = "events.k8s.io/v1";

/// Moves every `from` field to its `to` name. A `to` field already present is unknown in the
/// source version; dropping it keeps it from shadowing the converted one.
fn rename(obj: &Value, api_version: &str, pairs: impl Iterator<Item = (&'static str, &'static str)>) -> Value {
    let Some(src) = obj.as_object() else {
        return obj.clone();
    };
    let mut out: Map<String, Value> = src.clone();
    for (from, to) in pairs {
        out.remove(to);
        if let Some(v) = out.remove(from) {
            out.insert(to.to_string(), v);
        }
    }
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    Value::Object(out)
}

/// A stored (core `v1`) Event as `events.k8s.io/v1` serves it.
pub fn to_events_v1(core: &Value) -> Value {
    rename(core, EVENTS_V1_API_VERSION, RENAMED.iter().copied())
}

/// An `events.k8s.io/v1` Event in the stored (core `v1`) form.
pub fn to_core(ev: &Value) -> Value {
    rename(ev, "v1", RENAMED.iter().map(|&(core, v1)| (v1, core)))
}

/// Limits the apiserver enforces on `events.k8s.io/v1` writes (bytes, as Go's `len`).
pub const NOTE_LIMIT: usize = 1024;
pub const REASON_LIMIT: usize = 128;
pub const ACTION_LIMIT: usize = 128;
pub const REPORTING_INSTANCE_LIMIT: usize = 128;

/// The apiserver's strict validation of Events written through `events.k8s.io/v1` (core `v1`
/// writes only get the lenient legacy checks): required fields and length limits on create;
/// on update, what identifies the event is immutable (so a series cannot change its note).
pub fn validate_events_v1(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let text = |v: &Value, f: &str| v.get(f).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut errs = Vec::new();
    if let Some(old) = old {
        for field in ["regarding", "reason", "note", "action", "reportingController", "type"] {
            if new.get(field) != old.get(field) {
                errs.push(FieldError::invalid(
                    field,
                    new.get(field).unwrap_or(&Value::Null),
                    "field is immutable",
                ));
            }
        }
        return errs;
    }
    if new.get("eventTime").is_none_or(Value::is_null) {
        errs.push(FieldError::required("eventTime", ""));
    }
    let kind = text(new, "type");
    if kind != "Normal" && kind != "Warning" {
        errs.push(FieldError::invalid(
            "type",
            &Value::String(String::new()),
            format!("has invalid value: {kind}"),
        ));
    }
    for (field, limit, required) in [
        ("reportingController", usize::MAX, true),
        ("reportingInstance", REPORTING_INSTANCE_LIMIT, true),
        ("action", ACTION_LIMIT, true),
        ("reason", REASON_LIMIT, true),
        ("note", NOTE_LIMIT, false),
    ] {
        let value = text(new, field);
        if required && value.is_empty() {
            errs.push(FieldError::required(field, ""));
        }
        if value.len() > limit {
            errs.push(FieldError::invalid(
                field,
                &Value::String(String::new()),
                format!("can have at most {limit} characters"),
            ));
        }
    }
    errs
}

/// The timestamp kubectl's LAST SEEN shows, from either view: the series' last observation,
/// else the last timestamp, else the first, else `eventTime` (the apiserver's event printer
/// does the same; events.k8s.io writers set only `eventTime` and `series`).
pub fn last_seen(obj: &Value) -> Option<&str> {
    let field = |name: &str| obj.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
    obj.pointer("/series/lastObservedTime")
        .and_then(Value::as_str)
        .or_else(|| field("lastTimestamp"))
        .or_else(|| field("deprecatedLastTimestamp"))
        .or_else(|| field("firstTimestamp"))
        .or_else(|| field("deprecatedFirstTimestamp"))
        .or_else(|| field("eventTime"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What kube-rs's `Recorder` creates.
    fn recorded() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "demo.1", "namespace": "default"},
            "regarding": {"apiVersion": "lyra.example.com/v1", "kind": "Workflow", "name": "demo",
                "namespace": "default", "uid": "u-1"},
            "note": "workflow is ready",
            "reason": "Reconciled",
            "type": "Normal",
            "action": "Reconcile",
            "reportingController": "lyra-test",
            "reportingInstance": "lyra-test",
            "eventTime": "2026-01-01T00:00:00.000001Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000001Z"},
            "deprecatedCount": 3,
            "deprecatedFirstTimestamp": "2026-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2026-01-01T00:02:00Z",
            "deprecatedSource": {"component": "kubelet", "host": "node-1"},
        })
    }

    #[test]
    fn events_v1_fields_map_onto_core_names() {
        let core = to_core(&recorded());
        assert_eq!(
            core,
            json!({
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "demo.1", "namespace": "default"},
                "involvedObject": {"apiVersion": "lyra.example.com/v1", "kind": "Workflow", "name": "demo",
                    "namespace": "default", "uid": "u-1"},
                "message": "workflow is ready",
                "reason": "Reconciled",
                "type": "Normal",
                "action": "Reconcile",
                "reportingComponent": "lyra-test",
                "reportingInstance": "lyra-test",
                "eventTime": "2026-01-01T00:00:00.000001Z",
                "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000001Z"},
                "count": 3,
                "firstTimestamp": "2026-01-01T00:00:00Z",
                "lastTimestamp": "2026-01-01T00:02:00Z",
                "source": {"component": "kubelet", "host": "node-1"},
            })
        );
        assert_eq!(to_events_v1(&core), recorded(), "the round trip is lossless");
    }

    #[test]
    fn a_core_event_reads_as_events_v1() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "ConfigMap", "name": "c"}, "message": "hi", "count": 1,
            "source": {"component": "me"}, "lastTimestamp": "2026-01-01T00:00:00Z"});
        let v1 = to_events_v1(&core);
        assert_eq!(v1["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v1["regarding"]["name"], "c");
        assert_eq!(v1["note"], "hi");
        assert_eq!(v1["deprecatedCount"], 1);
        assert_eq!(v1["deprecatedSource"]["component"], "me");
        assert!(v1.get("involvedObject").is_none() && v1.get("message").is_none());
        assert_eq!(to_core(&v1), core);
    }

    #[test]
    fn fields_unknown_in_the_source_version_do_not_shadow_converted_ones() {
        let v1 = json!({"note": "real", "message": "unknown in events.k8s.io"});
        assert_eq!(to_core(&v1)["message"], "real");
        let core = json!({"regarding": {"name": "unknown in core"}});
        assert!(to_events_v1(&core).get("regarding").is_none());
    }

    #[test]
    fn events_v1_writes_are_validated_like_the_apiserver_does() {
        let ok = recorded();
        assert_eq!(validate_events_v1(&ok, None), []);
        let mut long = recorded();
        long["note"] = json!("é".repeat(600));
        long["reportingInstance"] = json!("i".repeat(129));
        let errs: Vec<String> = validate_events_v1(&long, None)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errs,
            [
                "reportingInstance: Invalid value: \"\": can have at most 128 characters",
                "note: Invalid value: \"\": can have at most 1024 characters",
            ]
        );
        let mut renoted = recorded();
        renoted["note"] = json!("something else");
        let errs = validate_events_v1(&renoted, Some(&ok));
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].to_string(),
            "note: Invalid value: \"something else\": field is immutable"
        );
        let mut counted = ok.clone();
        counted["series"]["count"] = json!(3);
        assert_eq!(validate_events_v1(&counted, Some(&ok)), []);
    }

    #[test]
    fn last_seen_prefers_the_series_then_timestamps_then_event_time() {
        let mut ev = recorded();
        assert_eq!(last_seen(&ev), Some("2026-01-01T00:01:00.000001Z"));
        ev.as_object_mut().unwrap().remove("series");
        assert_eq!(last_seen(&ev), Some("2026-01-01T00:02:00Z"));
        assert_eq!(last_seen(&to_core(&ev)), Some("2026-01-01T00:02:00Z"));
        let only_time = json!({"eventTime": "2026-01-01T00:00:00.000001Z", "lastTimestamp": null});
        assert_eq!(last_seen(&only_time), Some("2026-01-01T00:00:00.000001Z"));
    }
}
