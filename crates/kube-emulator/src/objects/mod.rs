//! What a write means, independent of HTTP. All of it runs under the server's one lock, on
//! [`State`], one concern a module:
//!
//! - `create`: POST (names from `generateName`, server-owned metadata, the namespace must
//!   exist and not be terminating, a `default` ServiceAccount per new namespace);
//! - `update`: PUT, and the tail every update shares with PATCH (generation bumped on spec
//!   changes only, no-op writes write nothing);
//! - `patch`: the four patch types; server-side apply creates a missing object;
//! - `strategic`: strategic merge patch of built-in kinds (lists merged by key);
//! - `subresource`: which part of an object the main and `/status` endpoints may change;
//! - `delete`: DELETE with preconditions, finalizers and `deletionTimestamp`;
//! - `cascade`: what removing one object does to others (a CRD's kind and objects, a
//!   terminating namespace's contents, an owner's dependents);
//! - `admission`: what every write does to the new object (kind defaults, schema pruning,
//!   defaulting and validation, name rules);
//! - `limits`: the apiserver's and etcd's size limits;
//! - `managed`: field ownership (`metadata.managedFields`), and what an apply removes.

mod admission;
mod cascade;
mod create;
mod delete;
mod limits;
mod managed;
mod patch;
mod strategic;
mod subresource;
mod update;

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{Value, json};

use crate::crd;
use crate::errors::ApiError;
use crate::registry::{Registry, ResourceType, Special};
use crate::store::Store;

pub use delete::DeleteOptions;
pub use managed::Conflict;
pub use patch::PatchKind;
pub use subresource::Subresource;

/// The namespaces a fresh cluster has.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// What a write does with fields the schema does not know (`?fieldValidation=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// A write's `fieldManager`. The apiserver allows at most 128 bytes, so it is kept inline and
/// [`WriteOptions`] stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FieldManager {
    len: u8,
    bytes: [u8; FieldManager::MAX],
}

impl FieldManager {
    pub const MAX: usize = 128;

    /// `None` when `name` is longer than the apiserver allows.
    pub fn new(name: &str) -> Option<FieldManager> {
        let mut bytes = [0; FieldManager::MAX];
        bytes.get_mut(..name.len())?.copy_from_slice(name.as_bytes());
        Some(FieldManager {
            len: name.len() as u8,
            bytes,
        })
    }

    /// The manager the apiserver names when a request gives none: its user agent up to the
    /// first `/` (`kubectl/v1.32.0 (linux/amd64)` is `kubectl`), cut to 128 bytes.
    pub fn from_user_agent(ua: &str) -> FieldManager {
        let mut prefix = ua.split('/').next().unwrap_or_default();
        let mut end = prefix.len().min(FieldManager::MAX);
        while !prefix.is_char_boundary(end) {
            end -= 1;
        }
        prefix = &prefix[..end];
        FieldManager::new(prefix).expect("cut to the limit")
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len as usize]).expect("made from a str")
    }
}

impl Default for FieldManager {
    fn default() -> Self {
        FieldManager::new("").expect("empty")
    }
}

impl std::fmt::Debug for FieldManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// The query parameters every write takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// Who owns the fields the write sets (none: nobody, for the server's own writes).
    pub manager: FieldManager,
    /// An apply takes the fields it conflicts on from their managers.
    pub force: bool,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            dry_run: false,
            field_validation: FieldValidation::Warn,
            manager: FieldManager::default(),
            force: false,
        }
    }
}

/// The result of a write: the object as stored (or as it would be, for a dry run).
#[derive(Debug)]
pub struct Written {
    pub object: Arc<Value>,
    pub created: bool,
    /// `Warning` header values (unknown fields under `fieldValidation=Warn`).
    pub warnings: Vec<String>,
}

/// The whole cluster state.
#[derive(Debug)]
pub struct State {
    pub registry: Registry,
    pub store: Store,
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj["metadata"][field].as_str().filter(|s| !s.is_empty())
}

/// The shape of a write's fields, for `managed`.
fn shape(rt: &ResourceType, sub: Subresource) -> managed::Shape {
    managed::Shape {
        sub,
        status_separate: subresource::status_is_separate(rt),
        // Custom resources' lists are atomic unless their schema says otherwise (not read).
        keyed_lists: rt.crd_uid.is_none(),
    }
}

fn finalizers_empty(obj: &Value) -> bool {
    obj["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty)
}

impl State {
    pub fn new(event_log_capacity: usize) -> State {
        let mut state = State {
            registry: Registry::default(),
            store: Store::new(event_log_capacity),
        };
        let ns_type = state
            .registry
            .find("", "v1", "namespaces")
            .expect("namespaces are built in");
        for ns in INITIAL_NAMESPACES {
            state
                .create(
                    &ns_type,
                    "v1",
                    "",
                    json!({ "metadata": { "name": ns } }),
                    WriteOptions::default(),
                )
                .expect("initial namespaces are valid");
        }
        state
    }

    /// The object as `rt` serves it (a kind may be a view of another kind's storage).
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.store
            .get(&rt.store_id(), ns, name)
            .map(|o| rt.view(o))
            .ok_or_else(|| rt.not_found(name))
    }

    /// Stores an object given as `rt` serves it, and returns it as stored, in that view.
    fn put(&mut self, rt: &ResourceType, obj: Value) -> Arc<Value> {
        let stored = self.store.put(&rt.store_id(), rt.to_storage(obj));
        rt.view(&stored)
    }

    /// Registers the kind a CRD defines whenever the CRD is written.
    fn after_write(&mut self, rt: &ResourceType, stored: &Value) {
        if rt.special == Special::Crd
            && let Ok(t) = crd::resource_type(stored)
        {
            self.registry.upsert(t);
        }
    }
}

/// A cluster with one CRD, `workflows.lyra.example.com` (status subresource, `spec.replicas`
/// at most 5), for the tests of every write.
#[cfg(test)]
pub(crate) fn state_with_crd() -> (State, Arc<ResourceType>) {
    let mut s = State::new(1000);
    let crd_type = s
        .registry
        .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .unwrap();
    let crd = json!({
        "metadata": {"name": "workflows.lyra.example.com"},
        "spec": {"group": "lyra.example.com", "scope": "Namespaced",
            "names": {"plural": "workflows", "kind": "Workflow"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"replicas": {"type": "integer", "maximum": 5}}},
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}
    });
    s.create(&crd_type, "v1", "", crd, WriteOptions::default()).unwrap();
    let wf = s.registry.find("lyra.example.com", "v1", "workflows").unwrap();
    (s, wf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_managers_are_named_as_the_apiserver_names_them() {
        assert_eq!(FieldManager::new("helm").unwrap().as_str(), "helm");
        assert!(FieldManager::new(&"m".repeat(FieldManager::MAX)).is_some());
        assert!(FieldManager::new(&"m".repeat(FieldManager::MAX + 1)).is_none());
        let ua = "kubectl/v1.32.0 (linux/amd64) kubernetes/70d3cc9";
        assert_eq!(FieldManager::from_user_agent(ua).as_str(), "kubectl");
        assert_eq!(FieldManager::from_user_agent("").as_str(), "");
        let long = "é".repeat(100);
        assert_eq!(FieldManager::from_user_agent(&long).as_str(), "é".repeat(64));
    }

    #[test]
    fn core_and_events_k8s_io_events_are_one_storage() {
        let mut s = State::new(1000);
        let core = s.registry.find("", "v1", "events").unwrap();
        let v1 = s.registry.find("events.k8s.io", "v1", "events").unwrap();
        let o = WriteOptions::default();
        let recorded = json!({"metadata": {"name": "demo.1"}, "reason": "Reconciled", "type": "Normal",
            "action": "Reconcile", "reportingInstance": "lyra-test-1",
            "note": "workflow is ready", "reportingController": "lyra-test", "eventTime": "2026-01-01T00:00:00.000001Z",
            "regarding": {"kind": "Workflow", "name": "demo", "namespace": "default", "uid": "u-1"}});
        let created = s.create(&v1, "v1", "default", recorded, o).unwrap();
        assert_eq!(created.object["apiVersion"], "events.k8s.io/v1");
        assert_eq!(created.object["note"], "workflow is ready");
        let seen = s.get(&core, "default", "demo.1").unwrap();
        assert_eq!(seen["apiVersion"], "v1");
        assert_eq!(seen["involvedObject"]["uid"], "u-1");
        assert_eq!(seen["message"], "workflow is ready");
        assert_eq!(seen["reportingComponent"], "lyra-test");
        assert_eq!(seen["metadata"]["uid"], created.object["metadata"]["uid"]);

        // The Recorder's repeat: a merge patch of the series through events.k8s.io.
        let series = json!({"series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000001Z"}});
        let patched = s
            .patch(
                &v1,
                "v1",
                "default",
                "demo.1",
                PatchKind::Merge,
                &series,
                Subresource::Main,
                o,
            )
            .unwrap();
        assert_eq!(patched.object["regarding"]["name"], "demo");
        let seen = s.get(&core, "default", "demo.1").unwrap();
        assert_eq!(seen["series"]["count"], 2);
        assert_eq!(
            seen["metadata"]["resourceVersion"],
            patched.object["metadata"]["resourceVersion"]
        );

        // And the other way round: a core write reads back through events.k8s.io.
        let count = json!([{"op": "add", "path": "/count", "value": 5}]);
        s.patch(
            &core,
            "v1",
            "default",
            "demo.1",
            PatchKind::Json,
            &count,
            Subresource::Main,
            o,
        )
        .unwrap();
        assert_eq!(s.get(&v1, "default", "demo.1").unwrap()["deprecatedCount"], 5);
        assert_eq!(s.store.list(&v1.store_id(), None).count(), 1, "stored once");

        s.delete(&core, "default", "demo.1", &DeleteOptions::default(), false)
            .unwrap();
        assert_eq!(s.get(&v1, "default", "demo.1").unwrap_err().code, 404);
    }
}
