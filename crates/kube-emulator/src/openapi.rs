//! The `/openapi/v3` documents, as a real apiserver publishes them: the root lists every
//! served group-version with a hash of its document (so kubectl's cache refreshes when a CRD
//! changes), and each group-version document has paths whose operations name their
//! `x-kubernetes-group-version-kind`, and `components.schemas` with one schema a kind (and
//! its list) carrying the same GVK.
//!
//! kubectl needs both halves. Its `--validate=strict` default sees `fieldValidation` among a
//! `patch`'s parameters and leaves validation to the server. `kubectl explain` finds the GVK on
//! an operation of the resource's path, then the component schema listing that GVK, and walks
//! its `properties` (following `$ref`, `allOf`, `items`, `additionalProperties`).
//!
//! A CRD's schema is published as written, with `apiVersion`, `kind` and `metadata` (a `$ref`
//! to `ObjectMeta`) added as the apiserver adds them. Built-in kinds get only those three
//! fields: the emulator does not carry their real schemas.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value, json};

use crate::registry::{Registry, ResourceType};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

/// A group-version's document as served: its JSON text and the hash the root lists.
#[derive(Debug)]
pub struct Doc {
    pub body: String,
    pub hash: String,
}

/// The documents built so far, by group-version, until a served kind changes. kubectl may
/// ask for the root (whose hashes need every document) and a document for each object it
/// applies, and they are built under the store's lock, which every other request waits for.
#[derive(Debug, Default)]
pub struct Cache(Mutex<HashMap<GroupVersion, Option<Arc<Doc>>>>);

/// `(group, version)`; the core group is `""`.
type GroupVersion = (String, String);

impl Clone for Cache {
    /// A copy of a registry starts with no documents: it may change apart from the original.
    fn clone(&self) -> Cache {
        Cache::default()
    }
}

impl Cache {
    /// Forgets every document (a kind was added, changed or removed).
    pub fn clear(&mut self) {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// The document of `group`/`version` with its hash, built once per change of the served kinds.
pub fn cached_document(reg: &Registry, group: &str, version: &str) -> Option<Arc<Doc>> {
    let key = (group.to_owned(), version.to_owned());
    let mut cache = reg.openapi_cache().0.lock().unwrap_or_else(PoisonError::into_inner);
    cache
        .entry(key)
        .or_insert_with(|| {
            document(reg, group, version).map(|doc| {
                Arc::new(Doc {
                    hash: hash(&doc),
                    body: doc.to_string(),
                })
            })
        })
        .clone()
}

/// `GET /openapi/v3`: every served group-version, each with the hash of its document.
pub fn root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, version) in group_versions(reg) {
        let Some(doc) = cached_document(reg, &group, &version) else {
            continue;
        };
        let p = if group.is_empty() {
            format!("api/{version}")
        } else {
            format!("apis/{group}/{version}")
        };
        let url = format!("/openapi/v3/{p}?hash={}", doc.hash);
        paths.insert(p, json!({ "serverRelativeURL": url }));
    }
    json!({ "paths": paths })
}

fn group_versions(reg: &Registry) -> Vec<(String, String)> {
    let mut gvs = vec![(String::new(), "v1".to_string())];
    for (g, vs) in reg.groups() {
        gvs.extend(vs.into_iter().map(|v| (g.clone(), v)));
    }
    gvs
}

/// A stable digest of a document: kubectl caches documents by URL, hash included.
pub fn hash(doc: &Value) -> String {
    // `DefaultHasher::new()` has fixed keys: the same document hashes the same every time.
    let mut h = DefaultHasher::new();
    doc.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `GET /openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
pub fn document(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for t in reg.types().filter(|t| t.group == group && t.version(version).is_some()) {
        let gvk = json!({ "group": group, "kind": t.kind, "version": version });
        let list_gvk = json!({ "group": group, "kind": t.list_kind, "version": version });
        let name = schema_name(t, version, &t.kind);
        let list_name = schema_name(t, version, &t.list_kind);
        schemas.insert(name.clone(), kind_schema(t, version, &gvk));
        schemas.insert(list_name.clone(), list_schema(t, &name, &list_gvk));
        resource_paths(&mut paths, t, group, version, &gvk, &name, &list_name);
    }
    if paths.is_empty() {
        return None;
    }
    for (k, v) in meta_schemas() {
        schemas.insert(k, v);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes (lyra kube-emulator)", "version": "v1.32.0" },
        "paths": paths,
        "components": { "schemas": schemas },
    }))
}

/// The apiserver's component names: `io.k8s.api.core.v1.ConfigMap` for built-in kinds, the
/// reversed group for CRDs (`com.example.lyra.v1.Workflow`).
fn schema_name(t: &ResourceType, version: &str, kind: &str) -> String {
    let prefix = if t.crd_uid.is_some() {
        t.group.split('.').rev().collect::<Vec<_>>().join(".")
    } else if t.group.is_empty() {
        "io.k8s.api.core".into()
    } else if t.group == "apiextensions.k8s.io" {
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions".into()
    } else {
        format!("io.k8s.api.{}", t.group.split('.').next().unwrap_or_default())
    };
    format!("{prefix}.{version}.{kind}")
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn kind_schema(t: &ResourceType, version: &str, gvk: &Value) -> Value {
    let given = t.version(version).and_then(|v| v.openapi.as_deref());
    let mut s = match given {
        Some(Value::Object(m)) => Value::Object(m.clone()),
        _ => json!({
            "description": format!(
                "{} (kube-emulator publishes no schema of this built-in kind's fields).",
                t.kind
            ),
            "type": "object",
        }),
    };
    if s.get("type").is_none() {
        s["type"] = json!("object");
    }
    if !s["properties"].is_object() {
        s["properties"] = json!({});
    }
    let props = &mut s["properties"];
    props["apiVersion"] = json!({ "type": "string", "description": API_VERSION_DOC });
    props["kind"] = json!({ "type": "string", "description": KIND_DOC });
    props["metadata"] = json!({
        "allOf": [reference(&format!("{META}.ObjectMeta"))],
        "default": {},
        "description": METADATA_DOC,
    });
    s["x-kubernetes-group-version-kind"] = json!([gvk]);
    s
}

fn list_schema(t: &ResourceType, item: &str, gvk: &Value) -> Value {
    json!({
        "description": format!("{} is a list of {}", t.list_kind, t.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": { "type": "string", "description": API_VERSION_DOC },
            "items": {
                "description": format!("List of {}.", t.plural),
                "type": "array",
                "items": reference(item),
            },
            "kind": { "type": "string", "description": KIND_DOC },
            "metadata": {
                "allOf": [reference(&format!("{META}.ListMeta"))],
                "default": {},
                "description": "Standard list metadata.",
            },
        },
        "x-kubernetes-group-version-kind": [gvk],
    })
}

/// The collection, item and status paths of a kind, each operation naming its GVK (where
/// `kubectl explain` looks) and the writes taking `fieldValidation` (what `kubectl apply`
/// checks before it leaves validation to the server).
fn resource_paths(
    paths: &mut Map<String, Value>,
    t: &ResourceType,
    group: &str,
    version: &str,
    gvk: &Value,
    name: &str,
    list_name: &str,
) {
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let op = |action: &str, schema: &str, write: bool| {
        let mut params = vec![json!({ "name": "dryRun", "in": "query", "schema": { "type": "string" } })];
        if write {
            params.push(json!({ "name": "fieldManager", "in": "query", "schema": { "type": "string" } }));
            params.push(json!({ "name": "fieldValidation", "in": "query", "schema": { "type": "string" } }));
        }
        json!({
            "operationId": format!("{action}{}", t.kind),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": params,
            "responses": { "200": {
                "description": "OK",
                "content": { "application/json": { "schema": reference(schema) } },
            }},
        })
    };
    let scoped = if t.namespaced {
        // The cluster-wide list of a namespaced kind.
        paths.insert(
            format!("{base}/{}", t.plural),
            json!({ "get": op("list", list_name, false) }),
        );
        format!("{base}/namespaces/{{namespace}}/{}", t.plural)
    } else {
        format!("{base}/{}", t.plural)
    };
    paths.insert(
        scoped.clone(),
        json!({ "get": op("list", list_name, false), "post": op("post", name, true) }),
    );
    let item = json!({
        "get": op("get", name, false),
        "put": op("put", name, true),
        "patch": op("patch", name, true),
        "delete": op("delete", name, false),
    });
    paths.insert(format!("{scoped}/{{name}}"), item);
    if t.status_subresource {
        paths.insert(
            format!("{scoped}/{{name}}/status"),
            json!({
                "get": op("get", name, false),
                "put": op("put", name, true),
                "patch": op("patch", name, true),
            }),
        );
    }
}

const API_VERSION_DOC: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DOC: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DOC: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// `ObjectMeta` and what it refers to, with the fields the emulator maintains.
fn meta_schemas() -> Vec<(String, Value)> {
    let s = |d: &str| json!({ "type": "string", "description": d, "default": "" });
    let strings = |d: &str| json!({ "type": "object", "additionalProperties": { "type": "string", "default": "" }, "description": d });
    let time = |d: &str| json!({ "allOf": [reference(&format!("{META}.Time"))], "description": d });
    let object_meta = json!({
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "type": "object",
        "properties": {
            "annotations": strings("Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata. They are not queryable and should be preserved when modifying objects."),
            "creationTimestamp": time("CreationTimestamp is a timestamp representing the server time when this object was created. Populated by the system. Read-only."),
            "deletionTimestamp": time("DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted. Set by the server when a graceful deletion is requested by the user. Read-only."),
            "finalizers": {
                "type": "array",
                "items": { "type": "string", "default": "" },
                "description": "Must be empty before the object is deleted from the registry. Each entry is an identifier for the responsible component that will remove the entry from the list.",
            },
            "generateName": s("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
            "generation": { "type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state. Populated by the system. Read-only." },
            "labels": strings("Map of string keys and values that can be used to organize and categorize (scope and select) objects."),
            "name": s("Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Cannot be updated."),
            "namespace": s("Namespace defines the space within which each name must be unique. An empty namespace is equivalent to the \"default\" namespace. Cannot be updated."),
            "ownerReferences": {
                "type": "array",
                "items": { "allOf": [reference(&format!("{META}.OwnerReference"))], "default": {} },
                "description": "List of objects depended by this object. If ALL objects in the list have been deleted, this object will be garbage collected.",
            },
            "resourceVersion": s("An opaque value that represents the internal version of this object that can be used by clients to determine when objects have changed. Populated by the system. Read-only."),
            "uid": s("UID is the unique in time and space value for this object. Populated by the system. Read-only."),
        },
    });
    let owner = json!({
        "description": "OwnerReference contains enough information to let you identify an owning object.",
        "type": "object",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": s("API version of the referent."),
            "blockOwnerDeletion": { "type": "boolean", "description": "If true, AND if the owner has the \"foregroundDeletion\" finalizer, then the owner cannot be deleted from the key-value store until this reference is removed." },
            "controller": { "type": "boolean", "description": "If true, this reference points to the managing controller." },
            "kind": s("Kind of the referent."),
            "name": s("Name of the referent."),
            "uid": s("UID of the referent."),
        },
    });
    let list_meta = json!({
        "description": "ListMeta describes metadata that synthetic resources must have, including lists and various status objects.",
        "type": "object",
        "properties": {
            "continue": { "type": "string", "description": "continue may be set if the user set a limit on the number of items returned, and indicates that the server has more data available." },
            "resourceVersion": { "type": "string", "description": "String that identifies the server's internal version of this object that can be used by clients to determine when objects have changed." },
        },
    });
    let time = json!({
        "description": "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON.",
        "type": "string",
        "format": "date-time",
    });
    vec![
        (format!("{META}.ListMeta"), list_meta),
        (format!("{META}.ObjectMeta"), object_meta),
        (format!("{META}.OwnerReference"), owner),
        (format!("{META}.Time"), time),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry_with_crd() -> Registry {
        let mut crd = json!({
            "metadata": {"name": "workflows.lyra.example.com", "uid": "u1"},
            "spec": {
                "group": "lyra.example.com",
                "scope": "Namespaced",
                "names": {"plural": "workflows", "kind": "Workflow"},
                "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "description": "A workflow.", "properties": {
                        "spec": {"type": "object", "properties": {"replicas": {"type": "integer", "description": "How many."}}}
                    }}}}]
            }
        });
        crate::crd::apply_defaults(&mut crd);
        let mut reg = Registry::default();
        reg.upsert(crate::crd::resource_type(&crd).unwrap());
        reg
    }

    #[test]
    fn a_crd_publishes_its_schema_under_its_gvk() {
        let reg = registry_with_crd();
        let doc = document(&reg, "lyra.example.com", "v1").unwrap();
        let gvk = json!({"group": "lyra.example.com", "kind": "Workflow", "version": "v1"});
        let path = &doc["paths"]["/apis/lyra.example.com/v1/namespaces/{namespace}/workflows/{name}"];
        assert_eq!(path["get"]["x-kubernetes-group-version-kind"], gvk);
        assert!(
            path["patch"]["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        let s = &doc["components"]["schemas"]["com.example.lyra.v1.Workflow"];
        assert_eq!(s["x-kubernetes-group-version-kind"], json!([gvk]));
        assert_eq!(
            s["properties"]["spec"]["properties"]["replicas"]["description"],
            "How many."
        );
        assert_eq!(
            s["properties"]["metadata"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert!(doc["components"]["schemas"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"].is_object());
        assert_eq!(
            doc["components"]["schemas"]["com.example.lyra.v1.WorkflowList"]["properties"]["items"]["items"]["$ref"],
            "#/components/schemas/com.example.lyra.v1.Workflow"
        );
    }

    #[test]
    fn the_root_hash_follows_the_document() {
        let before = root(&Registry::default());
        assert!(before["paths"]["apis/lyra.example.com/v1"].is_null());
        assert!(
            before["paths"]["api/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/api/v1?hash=")
        );
        let after = root(&registry_with_crd());
        let url = after["paths"]["apis/lyra.example.com/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/lyra.example.com/v1?hash="), "{url}");
        assert_eq!(before["paths"]["api/v1"], after["paths"]["api/v1"]);
        let core = document(&Registry::default(), "", "v1").unwrap();
        let cm = &core["components"]["schemas"]["io.k8s.api.core.v1.ConfigMap"];
        assert_eq!(cm["properties"]["kind"]["type"], "string");
    }

    /// Documents are built once and kept, but never outlive a change of the served kinds:
    /// an added, changed or removed CRD is in the next document and the root's hash.
    #[test]
    fn kept_documents_follow_every_change_of_the_kinds() {
        let mut reg = registry_with_crd();
        let first = cached_document(&reg, "lyra.example.com", "v1").unwrap();
        assert!(Arc::ptr_eq(
            &first,
            &cached_document(&reg, "lyra.example.com", "v1").unwrap()
        ));
        let mut t = (*reg.find("lyra.example.com", "v1", "workflows").unwrap()).clone();
        t.kind = "Flow".to_owned();
        reg.upsert(t);
        let changed = cached_document(&reg, "lyra.example.com", "v1").unwrap();
        assert_ne!(first.hash, changed.hash);
        assert!(changed.body.contains("\"com.example.lyra.v1.Flow\""));
        assert!(
            root(&reg)["paths"]["apis/lyra.example.com/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .ends_with(&changed.hash)
        );
        let id = reg.find("lyra.example.com", "v1", "workflows").unwrap().id();
        reg.remove(&id);
        assert!(cached_document(&reg, "lyra.example.com", "v1").is_none());
        assert!(root(&reg)["paths"]["apis/lyra.example.com/v1"].is_null());
    }
}
