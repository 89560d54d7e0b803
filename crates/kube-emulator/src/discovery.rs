//! Discovery documents: `/api`, `/apis`, group and group-version documents with every served
//! kind, `/version`, health, and the `/openapi/v3` root (`openapi` builds the documents;
//! `api` serves them, with their caching headers).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::registry::{Registry, ResourceType};

/// The document at a discovery, OpenAPI or health path, or `None` for any other path.
pub fn document(reg: &Registry, segments: &[&str]) -> Option<Result<Value, ApiError>> {
    let found = |v: Option<Value>| Some(v.ok_or_else(ApiError::no_such_path));
    match segments {
        ["version"] => Some(Ok(version_doc())),
        ["healthz" | "readyz" | "livez"] => Some(Ok(json!("ok"))),
        ["api"] => Some(Ok(
            json!({ "kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [] }),
        )),
        ["apis"] => Some(Ok(reg.api_group_list())),
        ["api", "v1"] => found(reg.api_resource_list("", "v1")),
        ["apis", g] => found(reg.api_group(g)),
        ["apis", g, v] => found(reg.api_resource_list(g, v)),
        ["openapi", "v3"] => Some(Ok(crate::openapi::root(reg))),
        _ => None,
    }
}

fn version_doc() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-lyra-kube-emulator",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// The documents of the registry's kinds.
impl Registry {
    /// `GET /apis`.
    pub fn api_group_list(&self) -> Value {
        let groups: Vec<Value> = self.groups().into_iter().map(|(g, vs)| group_doc(&g, &vs)).collect();
        json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
    }

    /// `GET /apis/<group>`.
    pub fn api_group(&self, group: &str) -> Option<Value> {
        let (g, vs) = self.groups().into_iter().find(|(g, _)| g == group)?;
        let mut doc = group_doc(&g, &vs);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        Some(doc)
    }

    /// `GET /api/v1` or `GET /apis/<group>/<version>`.
    pub fn api_resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let types: Vec<&Arc<ResourceType>> = self
            .types()
            .filter(|t| t.group == group && t.version(version).is_some())
            .collect();
        if types.is_empty() {
            return None;
        }
        let mut resources = Vec::new();
        for t in types {
            let verbs = [
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ];
            let mut r = json!({
                "name": t.plural,
                "singularName": t.singular,
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": verbs,
            });
            // Short names and categories on the main entry only: on the status entry too,
            // kubectl warns that `wf` could also match `workflows/status`.
            if !t.short_names.is_empty() {
                r["shortNames"] = json!(t.short_names);
            }
            if !t.categories.is_empty() {
                r["categories"] = json!(t.categories);
            }
            resources.push(r);
            if t.status_subresource {
                resources.push(json!({
                    "name": format!("{}/status", t.plural),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": ["get", "patch", "update"],
                }));
            }
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources }))
    }
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": format!("{group}/{v}"), "version": v }))
        .collect();
    json!({ "name": group, "versions": vs, "preferredVersion": vs[0] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_builtins() {
        let r = Registry::default();
        let core = r.api_resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"configmaps") && names.contains(&"namespaces/status") && names.contains(&"events"));
        let groups = r.api_group_list();
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "coordination.k8s.io")
        );
    }
}
