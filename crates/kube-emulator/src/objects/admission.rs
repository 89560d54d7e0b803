//! What every write does to the new object before it is stored: kind-specific defaults,
//! pruning, defaulting and validation against the version's schema and its CEL rules, name and
//! annotation rules.

use std::sync::LazyLock;

use base64::Engine as _;
use regex::Regex;
use serde_json::{Value, json};

use super::limits::validate_annotations;
use super::{FieldValidation, WriteOptions, meta_str, now_rfc3339};
use crate::crd;
use crate::errors::{ApiError, FieldError};
use crate::registry::{ResourceType, Special};

static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").expect("valid regex")
});
static DNS_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("valid regex"));

fn validate_name(rt: &ResourceType, name: &str) -> Option<FieldError> {
    let v = json!(name);
    if rt.special == Special::Namespace {
        if name.len() > 63 || !DNS_LABEL.is_match(name) {
            return Some(FieldError::invalid(
                "metadata.name",
                &v,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            ));
        }
    } else if name.len() > 253 || !DNS_SUBDOMAIN.is_match(name) {
        return Some(FieldError::invalid(
            "metadata.name",
            &v,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
    }
    None
}

/// What the apiserver fills in on a Service: its `type`, a cluster IP (kept across updates),
/// and each port's `protocol` and `targetPort` (the port itself, when not given), which a
/// webhook's `service` reference is resolved through.
fn service_defaults(obj: &mut Value, old: Option<&Value>) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    if spec["type"].as_str().is_none_or(str::is_empty) {
        spec["type"] = json!("ClusterIP");
    }
    if spec["sessionAffinity"].is_null() {
        spec["sessionAffinity"] = json!("None");
    }
    if spec["type"] != "ExternalName" && spec["clusterIP"].as_str().is_none_or(str::is_empty) {
        let ip = match old.and_then(|o| o["spec"]["clusterIP"].as_str()) {
            Some(ip) => ip.to_owned(),
            None => {
                // A random address in the default service range.
                let uid = uuid::Uuid::new_v4();
                let b = uid.as_bytes();
                format!("10.96.{}.{}", b[0], b[1].max(1))
            }
        };
        spec["clusterIP"] = json!(ip);
        spec["clusterIPs"] = json!([ip]);
    }
    for port in spec["ports"].as_array_mut().into_iter().flatten() {
        if port["protocol"].is_null() {
            port["protocol"] = json!("TCP");
        }
        if port["targetPort"].is_null() {
            port["targetPort"] = port["port"].clone();
        }
    }
}

/// The Deployment defaults clients read back (`kubectl rollout`, helm's readiness checks).
fn deployment_defaults(obj: &mut Value) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    for (key, value) in [
        ("replicas", json!(1)),
        ("revisionHistoryLimit", json!(10)),
        ("progressDeadlineSeconds", json!(600)),
        (
            "strategy",
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
        ),
    ] {
        if spec[key].is_null() {
            spec[key] = value;
        }
    }
}

/// Everything every write does to the new object: kind-specific defaults, pruning,
/// defaulting and validation against the version's schema. Returns the `Warning`s to send.
pub(super) fn admit(
    rt: &ResourceType,
    version: &str,
    old: Option<&Value>,
    obj: &mut Value,
    opts: WriteOptions,
) -> Result<Vec<String>, ApiError> {
    obj["apiVersion"] = json!(rt.api_version(version));
    obj["kind"] = json!(rt.kind);
    let name = meta_str(obj, "name").unwrap_or_default().to_string();
    let mut warnings = Vec::new();
    let mut errs = Vec::new();
    match rt.special {
        Special::Secret => {
            if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
                for (k, v) in sd {
                    let encoded = base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap_or_default());
                    obj["data"][k] = json!(encoded);
                }
            }
            if obj.get("type").is_none_or(Value::is_null) {
                obj["type"] = json!("Opaque");
            }
        }
        Special::Namespace => {
            if obj.pointer("/spec/finalizers").is_none() {
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
            }
            let terminating = old.is_some_and(|o| o["status"]["phase"] == "Terminating");
            obj["status"]["phase"] = json!(if terminating { "Terminating" } else { "Active" });
            // The apiserver sets it on every write: namespaceSelectors match namespaces by name
            // with it.
            if !obj["metadata"]["labels"].is_object() {
                obj["metadata"]["labels"] = json!({});
            }
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        Special::Service => service_defaults(obj, old),
        Special::Deployment => deployment_defaults(obj),
        Special::Crd => {
            crd::apply_defaults(obj);
            match crd::resource_type(obj) {
                Ok(t) => {
                    for v in &t.versions {
                        for w in v.rules.iter().flat_map(|r| r.warnings()) {
                            tracing::warn!(crd = %name, version = %v.name, "{w}");
                            warnings.push(format!("version {}: {w}", v.name));
                        }
                    }
                }
                Err(e) => errs.extend(e),
            }
            obj["status"] = crd::status(obj, old, &now_rfc3339());
        }
        Special::None => {}
    }
    if rt.group == "events.k8s.io" {
        errs.extend(crate::events::validate_events_v1(obj, old));
    }
    if let Some(schema) = rt.version(version).and_then(|v| v.schema.clone()) {
        let unknown = schema.prune(obj, true);
        if !unknown.is_empty() {
            let described: Vec<String> = unknown.iter().map(|f| format!("unknown field {f:?}")).collect();
            match opts.field_validation {
                FieldValidation::Strict => {
                    return Err(ApiError::bad_request(format!(
                        "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                        described.join(", "),
                        kind = rt.kind,
                    )));
                }
                FieldValidation::Warn => warnings.extend(described),
                FieldValidation::Ignore => {}
            }
        }
        schema.apply_defaults(obj);
        let schema_errs = schema.validate(obj);
        // As the apiserver, CEL runs on objects of the right shape only: its rules assume it.
        if schema_errs.is_empty()
            && let Some(rules) = rt.version(version).and_then(|v| v.rules.as_ref())
        {
            errs.extend(rules.validate(obj, old));
        }
        errs.extend(schema_errs);
    }
    if let Some(e) = validate_annotations(obj) {
        errs.insert(0, e);
    }
    if let Some(e) = validate_name(rt, &name) {
        errs.insert(0, e);
    }
    if !errs.is_empty() {
        return Err(rt.invalid(&name, &errs));
    }
    Ok(warnings)
}
