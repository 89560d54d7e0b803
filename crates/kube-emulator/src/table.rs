//! `meta.k8s.io/v1 Table` responses (what `kubectl get` asks for), built from a CRD version's
//! `additionalPrinterColumns` or a built-in kind's fixed columns. kubectl prints cells
//! verbatim, so the server formats ages (`15s`, `3m2s`) itself.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::jsonpath::JsonPath;

#[derive(Debug, Clone)]
enum Source {
    Path(JsonPath),
    /// A timestamp shown as its age.
    Age(JsonPath),
    /// How many entries the named maps or lists hold together (a ConfigMap's DATA).
    Count(Vec<String>),
    /// `<kind>/<name>` of an object reference (an Event's OBJECT).
    Reference(String),
    /// An Event's LAST SEEN, which falls back through several timestamps.
    EventLastSeen,
    /// The object's name, for kinds that do not show it first.
    Name,
    /// `<a>/<b>` of two counts, missing ones 0 (a Deployment's READY).
    Ratio(JsonPath, JsonPath),
    /// A Service's PORT(S): `443/TCP,80:30080/TCP`.
    ServicePorts,
    /// An Endpoints object's ENDPOINTS: `10.0.0.1:8443,10.0.0.2:8443`.
    Endpoints,
    /// A binding's ROLE: `ClusterRole/<name>`.
    RoleRef,
}

/// One printer column.
#[derive(Debug, Clone)]
pub struct Column {
    name: String,
    type_: String,
    format: String,
    description: String,
    priority: i64,
    source: Source,
}

impl Column {
    fn new(name: &str, type_: &str, source: Source) -> Column {
        Column {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            source,
        }
    }

    pub fn path(name: &str, type_: &str, path: &str) -> Column {
        Column::new(
            name,
            type_,
            Source::Path(JsonPath::parse(path).expect("built-in column paths parse")),
        )
    }

    pub fn age(name: &str, path: &str) -> Column {
        Column::new(
            name,
            "date",
            Source::Age(JsonPath::parse(path).expect("built-in column paths parse")),
        )
    }

    pub fn count(name: &str, fields: &[&str]) -> Column {
        Column::new(
            name,
            "integer",
            Source::Count(fields.iter().map(|f| f.to_string()).collect()),
        )
    }

    pub fn event_last_seen() -> Column {
        Column::new("Last Seen", "string", Source::EventLastSeen)
    }

    /// NAME as a wide-only last column, as the apiserver prints Events (a Table without one
    /// starts with NAME).
    pub fn wide_name() -> Column {
        let mut c = Column::new("Name", "string", Source::Name);
        c.priority = 1;
        c
    }

    pub fn ratio(name: &str, a: &str, b: &str) -> Column {
        let p = |x| JsonPath::parse(x).expect("built-in column paths parse");
        Column::new(name, "string", Source::Ratio(p(a), p(b)))
    }

    pub fn service_ports() -> Column {
        Column::new("Port(s)", "string", Source::ServicePorts)
    }

    pub fn endpoints() -> Column {
        Column::new("Endpoints", "string", Source::Endpoints)
    }

    pub fn role_ref() -> Column {
        Column::new("Role", "string", Source::RoleRef)
    }

    pub fn involved_object(name: &str, field: &str) -> Column {
        Column::new(name, "string", Source::Reference(field.into()))
    }

    /// The `AGE` column every built-in kind ends with, and a CRD without printer columns gets.
    pub fn creation_age() -> Column {
        let mut c = Column::age("Age", ".metadata.creationTimestamp");
        c.description =
            "CreationTimestamp is a timestamp representing the server time when this object was created.".into();
        c
    }

    /// One entry of a CRD version's `additionalPrinterColumns`.
    pub fn from_crd(v: &Value) -> Result<Column, String> {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or("printer column without name")?;
        let type_ = v.get("type").and_then(Value::as_str).unwrap_or("string");
        let path = v
            .get("jsonPath")
            .and_then(Value::as_str)
            .ok_or("printer column without jsonPath")?;
        let path = JsonPath::parse(path)?;
        let source = if type_ == "date" {
            Source::Age(path)
        } else {
            Source::Path(path)
        };
        let mut c = Column::new(name, type_, source);
        c.format = v.get("format").and_then(Value::as_str).unwrap_or_default().into();
        c.description = v.get("description").and_then(Value::as_str).unwrap_or_default().into();
        c.priority = v.get("priority").and_then(Value::as_i64).unwrap_or(0);
        Ok(c)
    }

    fn definition(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }

    fn cell(&self, obj: &Value, now: SystemTime) -> Value {
        match &self.source {
            Source::Path(p) => match p.select(obj).first() {
                None | Some(Value::Null) => Value::Null,
                Some(v) => match (self.type_.as_str(), v) {
                    ("string", Value::String(_)) => (*v).clone(),
                    ("string", other) => Value::String(other.to_string()),
                    _ => (*v).clone(),
                },
            },
            Source::Age(p) => match p.select(obj).first().and_then(|v| v.as_str()) {
                Some(ts) => Value::String(age_of(ts, now)),
                None => Value::String("<unknown>".into()),
            },
            Source::Count(fields) => {
                let n: usize = fields
                    .iter()
                    .map(|f| match obj.get(f) {
                        Some(Value::Object(m)) => m.len(),
                        Some(Value::Array(a)) => a.len(),
                        _ => 0,
                    })
                    .sum();
                json!(n)
            }
            Source::EventLastSeen => match crate::events::last_seen(obj) {
                Some(ts) => Value::String(age_of(ts, now)),
                None => Value::String("<unknown>".into()),
            },
            Source::Name => obj["metadata"]["name"].clone(),
            Source::Ratio(a, b) => {
                let n = |p: &JsonPath| p.select(obj).first().and_then(|v| v.as_i64()).unwrap_or(0);
                json!(format!("{}/{}", n(a), n(b)))
            }
            Source::ServicePorts => {
                let ports: Vec<String> = obj["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let proto = p["protocol"].as_str().unwrap_or("TCP");
                        match p["nodePort"].as_i64() {
                            Some(node) => format!("{}:{node}/{proto}", p["port"]),
                            None => format!("{}/{proto}", p["port"]),
                        }
                    })
                    .collect();
                json!(if ports.is_empty() {
                    "<none>".to_owned()
                } else {
                    ports.join(",")
                })
            }
            Source::Endpoints => {
                let mut all = Vec::new();
                for subset in obj["subsets"].as_array().into_iter().flatten() {
                    for a in subset["addresses"].as_array().into_iter().flatten() {
                        for p in subset["ports"].as_array().into_iter().flatten() {
                            all.push(format!("{}:{}", a["ip"].as_str().unwrap_or_default(), p["port"]));
                        }
                    }
                }
                json!(if all.is_empty() {
                    "<none>".to_owned()
                } else {
                    all.join(",")
                })
            }
            Source::RoleRef => {
                let r = &obj["roleRef"];
                json!(format!(
                    "{}/{}",
                    r["kind"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default()
                ))
            }
            Source::Reference(field) => {
                let r = &obj[field.as_str()];
                let kind = r["kind"].as_str().unwrap_or_default().to_lowercase();
                json!(format!("{kind}/{}", r["name"].as_str().unwrap_or_default()))
            }
        }
    }
}

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn from_query(v: Option<&str>) -> IncludeObject {
        match v {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// The metadata-only view of an object (`PartialObjectMetadata`).
pub fn partial_metadata(obj: &Value) -> Value {
    json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"] })
}

/// A Table of `objects` (already at the requested version).
pub fn table(columns: &[Column], objects: &[&Value], list_meta: Value, include: IncludeObject) -> Value {
    let now = SystemTime::now();
    let name_first = !columns.iter().any(|c| matches!(c.source, Source::Name));
    let mut defs = Vec::new();
    if name_first {
        defs.push(json!({
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name must be unique within a namespace.",
            "priority": 0,
        }));
    }
    defs.extend(columns.iter().map(Column::definition));
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut cells = Vec::with_capacity(columns.len() + 1);
            if name_first {
                cells.push(obj["metadata"]["name"].clone());
            }
            cells.extend(columns.iter().map(|c| c.cell(obj, now)));
            let mut row = json!({ "cells": cells });
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => row["object"] = partial_metadata(obj),
                IncludeObject::Object => row["object"] = (*obj).clone(),
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

fn age_of(ts: &str, now: SystemTime) -> String {
    match humantime::parse_rfc3339_weak(ts) {
        Ok(t) => human_duration(now.duration_since(t).unwrap_or(Duration::ZERO)),
        Err(_) => "<invalid>".into(),
    }
}

/// kubectl's short durations: `45s`, `3m2s`, `25m`, `5h3m`, `2d4h`, `400d`, `3y20d`.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (mins, hours, days) = (secs / 60, secs / 3600, secs / 86400);
    let with = |big: u64, unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big}{unit}")
        } else {
            format!("{big}{unit}{small}{small_unit}")
        }
    };
    if secs < 120 {
        format!("{secs}s")
    } else if mins < 10 {
        with(mins, "m", secs % 60, "s")
    } else if mins < 180 {
        format!("{mins}m")
    } else if hours < 8 {
        with(hours, "h", mins % 60, "m")
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        with(days, "d", hours % 24, "h")
    } else if days < 365 * 2 {
        format!("{days}d")
    } else if days < 365 * 8 {
        with(days / 365, "y", days % 365, "d")
    } else {
        format!("{}y", days / 365)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl() {
        let d = |s| human_duration(Duration::from_secs(s));
        assert_eq!(d(15), "15s");
        assert_eq!(d(182), "3m2s");
        assert_eq!(d(1500), "25m");
        assert_eq!(d(5 * 3600 + 180), "5h3m");
        assert_eq!(d(52 * 3600), "2d4h");
        assert_eq!(d(400 * 86400), "400d");
    }

    #[test]
    fn table_cells_follow_printer_columns() {
        let cols = vec![
            Column::from_crd(&json!({"name": "Phase", "type": "string", "jsonPath": ".status.phase"})).unwrap(),
            Column::from_crd(
                &json!({"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas", "priority": 1}),
            )
            .unwrap(),
        ];
        let obj = json!({"metadata": {"name": "demo"}, "spec": {"replicas": 3}, "status": {"phase": "Ready"}});
        let t = table(&cols, &[&obj], json!({"resourceVersion": "7"}), IncludeObject::Metadata);
        assert_eq!(t["rows"][0]["cells"], json!(["demo", "Ready", 3]));
        assert_eq!(t["columnDefinitions"][2]["priority"], 1);
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn event_tables_end_with_a_wide_name_and_fall_back_to_event_time() {
        let cols = vec![
            Column::event_last_seen(),
            Column::involved_object("Object", "regarding"),
            Column::wide_name(),
        ];
        let when = humantime::format_rfc3339_micros(SystemTime::now() - Duration::from_secs(5)).to_string();
        let ev = json!({"metadata": {"name": "e1"}, "eventTime": when,
            "regarding": {"kind": "Workflow", "name": "demo"}});
        let t = table(&cols, &[&ev], json!({}), IncludeObject::None);
        let cells = t["rows"][0]["cells"].as_array().unwrap();
        assert!(matches!(cells[0].as_str(), Some("5s" | "6s")), "{cells:?}");
        assert_eq!(cells[1..], [json!("workflow/demo"), json!("e1")]);
        assert_eq!(t["columnDefinitions"][2]["priority"], 1);
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 3);
    }
}
