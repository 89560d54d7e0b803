//! What removing one object does to others, as the apiserver's controllers would: a CRD
//! takes its kind and objects with it, a terminating namespace deletes its contents and then
//! goes, and objects whose owners are all gone are deleted (background garbage collection).

use std::sync::Arc;

use serde_json::Value;

use super::delete::DeleteOptions;
use super::{State, finalizers_empty, meta_str};
use crate::registry::{ResourceType, Special};

impl State {
    /// Removes an object for good, with the side effects of its kind; `id` is a store key and
    /// `last` is in its stored form.
    pub(super) fn remove_object(&mut self, id: &str, last: Value) -> Arc<Value> {
        let gone = self.store.remove(id, last);
        let rt = self.registry.by_id(id);
        match rt.as_ref().map(|t| t.special) {
            Some(Special::Crd) => self.drop_kind(&gone),
            Some(Special::Namespace) => {}
            _ => {
                if let Some(ns) = meta_str(&gone, "namespace") {
                    self.finish_namespace_if_empty(ns);
                }
            }
        }
        gone
    }

    /// Unregisters the kind a deleted CRD defined and drops its objects (finalizers or not).
    fn drop_kind(&mut self, crd: &Value) {
        let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
        let plural = crd
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind_id = crate::errors::qualified_resource(group, plural);
        self.registry.remove(&kind_id);
        for obj in self.store.all_of(&kind_id) {
            self.store.remove(&kind_id, (*obj).clone());
        }
    }

    /// Deletes everything in a terminating namespace, then the namespace once it is empty.
    pub(super) fn empty_namespace(&mut self, ns: &str) {
        // Views of another kind's storage would delete its objects a second time.
        let types: Vec<Arc<ResourceType>> = self
            .registry
            .types()
            .filter(|t| t.namespaced && t.store_id() == t.id())
            .cloned()
            .collect();
        for t in types {
            let names: Vec<String> = self
                .store
                .list(&t.id(), Some(ns))
                .filter_map(|o| meta_str(o, "name").map(str::to_string))
                .collect();
            for name in names {
                // A failure here can only be "already gone".
                let _ = self.delete(&t, ns, &name, &DeleteOptions::default(), false);
            }
        }
        self.finish_namespace_if_empty(ns);
    }

    fn finish_namespace_if_empty(&mut self, ns: &str) {
        let Some(obj) = self.store.get("namespaces", "", ns).cloned() else {
            return;
        };
        if obj["metadata"].get("deletionTimestamp").is_some()
            && finalizers_empty(&obj)
            && self.store.namespace_is_empty(ns)
        {
            self.store.remove("namespaces", (*obj).clone());
        }
    }

    /// Background deletion of the objects whose owners are all gone (the garbage collector).
    pub(super) fn collect_garbage(&mut self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        for (id, dependent) in self.store.dependents_of(uid) {
            let orphaned = dependent
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| {
                    refs.iter()
                        .all(|r| r["uid"].as_str().is_none_or(|u| !self.store.uid_exists(u)))
                });
            if !orphaned {
                continue;
            }
            if let Some(t) = self.registry.by_id(&id) {
                let (ns, name) = crate::store::key_of(&dependent);
                let _ = self.delete(&t, &ns, &name, &DeleteOptions::default(), false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::{WriteOptions, state_with_crd};

    #[test]
    fn deleting_a_crd_drops_its_kind_and_objects() {
        let (mut s, wf) = state_with_crd();
        s.create(
            &wf,
            "v1",
            "default",
            json!({"metadata": {"name": "a", "finalizers": ["x/y"]}}),
            WriteOptions::default(),
        )
        .unwrap();
        let crd_type = s
            .registry
            .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .unwrap();
        s.delete(
            &crd_type,
            "",
            "workflows.lyra.example.com",
            &DeleteOptions::default(),
            false,
        )
        .unwrap();
        assert!(s.registry.find("lyra.example.com", "v1", "workflows").is_none());
        assert_eq!(s.store.list(&wf.id(), None).count(), 0);
    }

    #[test]
    fn owner_deletion_collects_dependents() {
        let mut s = State::new(1000);
        let cm = s.registry.find("", "v1", "configmaps").unwrap();
        let o = WriteOptions::default();
        let owner = s
            .create(&cm, "v1", "default", json!({"metadata": {"name": "owner"}}), o)
            .unwrap();
        let uid = owner.object["metadata"]["uid"].clone();
        s.create(
            &cm,
            "v1",
            "default",
            json!({"metadata": {"name": "child", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]}}),
            o,
        )
        .unwrap();
        s.delete(&cm, "default", "owner", &DeleteOptions::default(), false)
            .unwrap();
        assert_eq!(s.get(&cm, "default", "child").unwrap_err().code, 404);
    }

    #[test]
    fn deleting_a_namespace_deletes_its_contents() {
        let mut s = State::new(1000);
        let ns = s.registry.find("", "v1", "namespaces").unwrap();
        let cm = s.registry.find("", "v1", "configmaps").unwrap();
        let o = WriteOptions::default();
        s.create(&ns, "v1", "", json!({"metadata": {"name": "team"}}), o)
            .unwrap();
        s.create(&cm, "v1", "team", json!({"metadata": {"name": "c"}}), o)
            .unwrap();
        s.delete(&ns, "", "team", &DeleteOptions::default(), false).unwrap();
        assert_eq!(s.get(&ns, "", "team").unwrap_err().code, 404);
        assert_eq!(
            s.create(&cm, "v1", "team", json!({"metadata": {"name": "d"}}), o)
                .unwrap_err()
                .code,
            404
        );
    }
}
