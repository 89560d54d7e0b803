//! The resource kinds the server serves: the built-in ones, plus one per established CRD. A
//! kind is served at every served version; objects are stored once, and a version differs only
//! by `apiVersion` (a CRD's `conversion: None`). `events.k8s.io` Events are the exception: a
//! view of the core Events' storage (see [`Storage`]). Also builds the discovery documents.

use std::cmp::Ordering;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::errors::{ApiError, FieldError};
use crate::schema::Schema;
use crate::table::Column;

/// What a kind needs beyond plain storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    None,
    Namespace,
    Secret,
    Crd,
}

/// Where a kind's objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Under the kind's own store key, as served.
    Own,
    /// As core `v1` Events, converted on every read and write: on a real apiserver
    /// `events.k8s.io/v1` Events are another API view of the same objects.
    CoreEvents,
}

/// One served version of a kind.
#[derive(Debug, Clone)]
pub struct Version {
    pub name: String,
    pub schema: Option<Arc<Schema>>,
    pub columns: Vec<Column>,
}

/// A kind of object and everything the server needs to serve it.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    /// Served versions, most preferred first.
    pub versions: Vec<Version>,
    pub status_subresource: bool,
    /// Whether `metadata.generation` is maintained (custom resources and CRDs; not ConfigMaps).
    pub has_generation: bool,
    /// For kinds defined by a CRD, that CRD's uid: a watch ends when it changes.
    pub crd_uid: Option<String>,
    pub special: Special,
    pub storage: Storage,
}

impl ResourceType {
    /// The store key: `workflows.lyra.example.com`, `configmaps`.
    pub fn id(&self) -> String {
        crate::errors::qualified_resource(&self.group, &self.plural)
    }

    /// The store key its objects live under (another kind's, for a view of that kind).
    pub fn store_id(&self) -> String {
        match self.storage {
            Storage::Own => self.id(),
            Storage::CoreEvents => "events".into(),
        }
    }

    /// A stored object as this kind serves it.
    pub fn view(&self, stored: &Arc<Value>) -> Arc<Value> {
        match self.storage {
            Storage::Own => stored.clone(),
            Storage::CoreEvents => Arc::new(crate::events::to_events_v1(stored)),
        }
    }

    /// An object of this kind in its stored form.
    pub fn to_storage(&self, obj: Value) -> Value {
        match self.storage {
            Storage::Own => obj,
            Storage::CoreEvents => crate::events::to_core(&obj),
        }
    }

    pub fn version(&self, v: &str) -> Option<&Version> {
        self.versions.iter().find(|x| x.name == v)
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(&self.group, &self.plural, name)
    }

    pub fn invalid(&self, name: &str, errors: &[FieldError]) -> ApiError {
        ApiError::invalid(&self.group, &self.kind, name, errors)
    }
}

/// All served kinds.
#[derive(Debug, Clone)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            types: builtin_types().into_iter().map(Arc::new).collect(),
        }
    }
}

impl Registry {
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.plural == plural && t.version(version).is_some())
            .cloned()
    }

    pub fn by_id(&self, id: &str) -> Option<Arc<ResourceType>> {
        self.types.iter().find(|t| t.id() == id).cloned()
    }

    pub fn types(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.iter()
    }

    /// Adds or replaces (by group and plural) a CRD-defined kind.
    pub fn upsert(&mut self, t: ResourceType) {
        let t = Arc::new(t);
        match self
            .types
            .iter_mut()
            .find(|x| x.group == t.group && x.plural == t.plural)
        {
            Some(slot) => *slot = t,
            None => self.types.push(t),
        }
    }

    pub fn remove(&mut self, id: &str) {
        self.types.retain(|t| t.id() != id);
    }

    /// API groups (not the core group) with their versions, most preferred first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for t in self.types.iter().filter(|t| !t.group.is_empty()) {
            let entry = match groups.iter_mut().position(|(g, _)| *g == t.group) {
                Some(i) => &mut groups[i].1,
                None => {
                    groups.push((t.group.clone(), Vec::new()));
                    &mut groups.last_mut().expect("just pushed").1
                }
            };
            for v in &t.versions {
                if !entry.contains(&v.name) {
                    entry.push(v.name.clone());
                }
            }
        }
        for (_, versions) in &mut groups {
            versions.sort_by(|a, b| version_priority(a, b));
        }
        groups
    }

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
            .types
            .iter()
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

    /// Every served group-version as an OpenAPI v3 path (`api/v1`, `apis/<g>/<v>`).
    pub fn openapi_paths(&self) -> Vec<String> {
        let mut paths = vec!["api/v1".to_string()];
        for (g, vs) in self.groups() {
            paths.extend(vs.iter().map(|v| format!("apis/{g}/{v}")));
        }
        paths
    }

    /// The tiny OpenAPI v3 document of one group-version: just enough for kubectl to see that
    /// the server validates (`fieldValidation`), so it skips client-side validation.
    pub fn openapi_doc(&self, group: &str, version: &str) -> Option<Value> {
        let mut paths = serde_json::Map::new();
        for t in self
            .types
            .iter()
            .filter(|t| t.group == group && t.version(version).is_some())
        {
            let base = if group.is_empty() {
                "/api/v1".to_string()
            } else {
                format!("/apis/{group}/{version}")
            };
            let path = if t.namespaced {
                format!("{base}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
            } else {
                format!("{base}/{}/{{name}}", t.plural)
            };
            paths.insert(
                path,
                json!({ "patch": {
                    "x-kubernetes-group-version-kind": { "group": group, "version": version, "kind": t.kind },
                    "parameters": [{ "name": "fieldValidation", "in": "query", "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "OK" } },
                }}),
            );
        }
        if paths.is_empty() {
            return None;
        }
        Some(json!({
            "openapi": "3.0.0",
            "info": { "title": "Kubernetes (lyra kube-emulator)", "version": "v1.32.0" },
            "paths": paths,
        }))
    }
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": format!("{group}/{v}"), "version": v }))
        .collect();
    json!({ "name": group, "versions": vs, "preferredVersion": vs[0] })
}

/// Kubernetes version priority: GA before beta before alpha, higher numbers first, then
/// non-Kubernetes-style names alphabetically.
pub fn version_priority(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u8, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: u32 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((major, 2, 0));
        }
        let (rank, num) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            return None;
        };
        Some((major, rank, num.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some((ma, ra, na)), Some((mb, rb, nb))) => rb.cmp(&ra).then(mb.cmp(&ma)).then(nb.cmp(&na)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    columns: Vec<Column>,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        short_names: Vec::new(),
        categories: Vec::new(),
        namespaced,
        versions: vec![Version {
            name: version.into(),
            schema: None,
            columns,
        }],
        status_subresource: false,
        has_generation: false,
        crd_uid: None,
        special: Special::None,
        storage: Storage::Own,
    }
}

fn builtin_types() -> Vec<ResourceType> {
    use crate::table::Column as C;
    let mut ns = builtin(
        "",
        "v1",
        "Namespace",
        "namespaces",
        false,
        vec![C::path("Status", "string", ".status.phase"), C::creation_age()],
    );
    ns.short_names = vec!["ns".into()];
    ns.status_subresource = true;
    ns.special = Special::Namespace;
    let mut cm = builtin(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        true,
        vec![C::count("Data", &["data", "binaryData"]), C::creation_age()],
    );
    cm.short_names = vec!["cm".into()];
    let mut secret = builtin(
        "",
        "v1",
        "Secret",
        "secrets",
        true,
        vec![
            C::path("Type", "string", ".type"),
            C::count("Data", &["data"]),
            C::creation_age(),
        ],
    );
    secret.special = Special::Secret;
    let mut sa = builtin(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        true,
        vec![C::count("Secrets", &["secrets"]), C::creation_age()],
    );
    sa.short_names = vec!["sa".into()];
    let mut ev = builtin(
        "",
        "v1",
        "Event",
        "events",
        true,
        vec![
            C::event_last_seen(),
            C::path("Type", "string", ".type"),
            C::path("Reason", "string", ".reason"),
            C::involved_object("Object", "involvedObject"),
            C::path("Message", "string", ".message"),
            C::wide_name(),
        ],
    );
    ev.short_names = vec!["ev".into()];
    let mut ev2 = builtin(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        true,
        vec![
            C::event_last_seen(),
            C::path("Type", "string", ".type"),
            C::path("Reason", "string", ".reason"),
            C::involved_object("Object", "regarding"),
            C::path("Message", "string", ".note"),
            C::wide_name(),
        ],
    );
    ev2.short_names = vec!["ev".into()];
    ev2.storage = Storage::CoreEvents;
    let lease = builtin(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        true,
        vec![C::path("Holder", "string", ".spec.holderIdentity"), C::creation_age()],
    );
    let mut crd = builtin(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        vec![C::path("Created At", "date", ".metadata.creationTimestamp")],
    );
    crd.short_names = vec!["crd".into(), "crds".into()];
    crd.status_subresource = true;
    crd.has_generation = true;
    crd.special = Special::Crd;
    vec![ns, cm, secret, sa, ev, ev2, lease, crd]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_like_kubernetes() {
        let mut vs = vec!["v1alpha1", "foo", "v1beta1", "v2", "v1", "v1beta2", "v10alpha1"];
        vs.sort_by(|a, b| version_priority(a, b));
        assert_eq!(
            vs,
            vec!["v2", "v1", "v1beta2", "v1beta1", "v10alpha1", "v1alpha1", "foo"]
        );
    }

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
