//! CustomResourceDefinitions: checking one, defaulting it, turning it into a served kind, and
//! the status a real apiserver reports once the names are accepted (so
//! `kubectl wait --for=condition=Established` returns at once).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::errors::FieldError;
use crate::registry::{ResourceType, Special, Storage, Version, version_priority};
use crate::schema::Schema;
use crate::schema::cel::Rules;
use crate::table::Column;

/// Fills the defaults the apiserver fills (singular, listKind, conversion strategy).
pub fn apply_defaults(crd: &mut Value) {
    let names = &mut crd["spec"]["names"];
    if let Some(kind) = names["kind"].as_str().map(str::to_string) {
        if names
            .get("singular")
            .is_none_or(|s| s.as_str().is_none_or(str::is_empty))
        {
            names["singular"] = json!(kind.to_lowercase());
        }
        if names
            .get("listKind")
            .is_none_or(|s| s.as_str().is_none_or(str::is_empty))
        {
            names["listKind"] = json!(format!("{kind}List"));
        }
    }
    if crd["spec"].get("conversion").is_none() {
        crd["spec"]["conversion"] = json!({ "strategy": "None" });
    }
}

fn str_at<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    v.pointer(path).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Checks a CRD and builds the kind it defines.
pub fn resource_type(crd: &Value) -> Result<ResourceType, Vec<FieldError>> {
    let mut errs = Vec::new();
    let group = str_at(crd, "/spec/group");
    let plural = str_at(crd, "/spec/names/plural");
    let kind = str_at(crd, "/spec/names/kind");
    if group.is_none() {
        errs.push(FieldError::required("spec.group", ""));
    }
    if plural.is_none() {
        errs.push(FieldError::required("spec.names.plural", ""));
    }
    if kind.is_none() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    let scope = crd.pointer("/spec/scope").cloned().unwrap_or(Value::Null);
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(FieldError {
            kind: crate::errors::FieldErrorKind::NotSupported(vec![json!("Cluster"), json!("Namespaced")]),
            field: "spec.scope".into(),
            value: crate::errors::show_value(&scope),
            detail: String::new(),
        });
    }
    if let (Some(g), Some(p)) = (group, plural) {
        let name = crd.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
        if name != format!("{p}.{g}").as_str() {
            errs.push(FieldError::invalid(
                "metadata.name",
                &name,
                "must be spec.names.plural+\".\"+spec.group",
            ));
        }
    }
    let empty = Vec::new();
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    } else if versions.iter().filter(|v| v["storage"] == true).count() != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            &Value::Array(versions.clone()),
            "must have exactly one version marked as storage version",
        ));
    }
    let mut served = Vec::new();
    let mut status_subresource = false;
    for (i, v) in versions.iter().enumerate() {
        let at = format!("spec.versions[{i}]");
        let Some(name) = v["name"].as_str() else {
            errs.push(FieldError::required(format!("{at}.name"), ""));
            continue;
        };
        let source = v.pointer("/schema/openAPIV3Schema");
        let schema = match source {
            None => {
                errs.push(FieldError::required(
                    format!("{at}.schema.openAPIV3Schema"),
                    "schemas are required",
                ));
                None
            }
            Some(s) => match Schema::compile(s) {
                Ok(s) => Some(Arc::new(s)),
                Err(e) => {
                    errs.push(FieldError::invalid(
                        format!("{at}.schema.openAPIV3Schema"),
                        &json!("object"),
                        e,
                    ));
                    None
                }
            },
        };
        let mut columns = Vec::new();
        for (j, c) in v["additionalPrinterColumns"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .enumerate()
        {
            match Column::from_crd(c) {
                Ok(c) => columns.push(c),
                Err(e) => errs.push(FieldError::invalid(format!("{at}.additionalPrinterColumns[{j}]"), c, e)),
            }
        }
        if columns.is_empty() {
            columns.push(Column::creation_age());
        }
        if v.pointer("/subresources/status").is_some() {
            status_subresource = true;
        }
        if v["served"] == true {
            served.push(Version {
                name: name.to_string(),
                schema,
                openapi: source.map(|s| Arc::new(s.clone())),
                rules: source.and_then(Rules::compile).map(Arc::new),
                columns,
            });
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    served.sort_by(|a, b| version_priority(&a.name, &b.name));
    let (group, plural, kind) = (
        group.unwrap_or_default(),
        plural.unwrap_or_default(),
        kind.unwrap_or_default(),
    );
    let strings = |p: &str| -> Vec<String> {
        crd.pointer(p)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    Ok(ResourceType {
        group: group.into(),
        kind: kind.into(),
        list_kind: str_at(crd, "/spec/names/listKind").map_or_else(|| format!("{kind}List"), str::to_string),
        plural: plural.into(),
        singular: str_at(crd, "/spec/names/singular").map_or_else(|| kind.to_lowercase(), str::to_string),
        short_names: strings("/spec/names/shortNames"),
        categories: strings("/spec/names/categories"),
        namespaced: scope == "Namespaced",
        versions: served,
        status_subresource,
        has_generation: true,
        crd_uid: crd.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string),
        special: Special::None,
        storage: Storage::Own,
    })
}

/// The status of an accepted CRD; keeps transition times and stored versions from `old`.
pub fn status(crd: &Value, old: Option<&Value>, now: &str) -> Value {
    let old_cond = |t: &str| {
        old.and_then(|o| o.pointer("/status/conditions"))
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == t && c["status"] == "True"))
            .and_then(|c| c["lastTransitionTime"].as_str())
            .unwrap_or(now)
            .to_string()
    };
    let mut stored: Vec<Value> = old
        .and_then(|o| o.pointer("/status/storedVersions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(storage) = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v["storage"] == true).map(|v| v["name"].clone()))
        && !stored.contains(&storage)
    {
        stored.push(storage);
    }
    json!({
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": old_cond("NamesAccepted"),
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": old_cond("Established"),
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "acceptedNames": crd["spec"]["names"],
        "storedVersions": stored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "workflows.lyra.example.com", "uid": "u1"},
            "spec": {
                "group": "lyra.example.com",
                "scope": "Namespaced",
                "names": {"plural": "workflows", "kind": "Workflow", "shortNames": ["wf"]},
                "versions": [
                    {"name": "v1alpha1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object"}}},
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                     "schema": {"openAPIV3Schema": {"type": "object"}},
                     "additionalPrinterColumns": [{"name": "Phase", "type": "string", "jsonPath": ".status.phase"}]}
                ]
            }
        })
    }

    #[test]
    fn a_crd_defines_a_kind_with_preferred_version_first() {
        let mut c = crd();
        apply_defaults(&mut c);
        assert_eq!(c["spec"]["names"]["listKind"], "WorkflowList");
        let t = resource_type(&c).unwrap();
        assert_eq!(
            t.versions.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            vec!["v1", "v1alpha1"]
        );
        assert!(t.namespaced && t.status_subresource);
        assert_eq!(t.singular, "workflow");
        let s = status(&c, None, "2026-01-01T00:00:00Z");
        assert_eq!(s["conditions"][1]["type"], "Established");
        assert_eq!(s["storedVersions"], json!(["v1"]));
    }

    #[test]
    fn a_bad_crd_is_invalid() {
        let mut c = crd();
        c["metadata"]["name"] = json!("wrong");
        c["spec"]["versions"][0]["storage"] = json!(true);
        let errs = resource_type(&c).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, vec!["metadata.name", "spec.versions"]);
    }
}
