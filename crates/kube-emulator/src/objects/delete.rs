//! DELETE: preconditions, then either removal or, while finalizers remain (and always for a
//! namespace, which empties itself first), a `deletionTimestamp`.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{State, finalizers_empty, meta_str, now_rfc3339};
use crate::errors::ApiError;
use crate::registry::{ResourceType, Special};

/// The body of a DELETE.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub orphan: bool,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

impl DeleteOptions {
    pub fn from_body(v: &Value) -> DeleteOptions {
        DeleteOptions {
            orphan: v["propagationPolicy"] == "Orphan" || v["orphanDependents"] == true,
            precondition_uid: v
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_string),
            precondition_rv: v
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }
}

impl State {
    /// DELETE: removes the object, or only marks it while finalizers remain.
    pub fn delete(
        &mut self,
        rt: &Arc<ResourceType>,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let old = self.get(rt, ns, name)?;
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&old, "uid")
        {
            let why = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(&old, "uid").unwrap_or_default()
            );
            return Err(ApiError::conflict(&rt.group, &rt.plural, name, &why));
        }
        if let Some(rv) = &opts.precondition_rv
            && Some(rv.as_str()) != meta_str(&old, "resourceVersion")
        {
            let why = format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta_str(&old, "resourceVersion").unwrap_or_default()
            );
            return Err(ApiError::conflict(&rt.group, &rt.plural, name, &why));
        }
        let needs_wait = !finalizers_empty(&old) || rt.special == Special::Namespace;
        if needs_wait {
            if old["metadata"].get("deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut marked = (*old).clone();
            marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if rt.has_generation {
                let generation = old["metadata"]["generation"].as_i64().unwrap_or(0);
                marked["metadata"]["generation"] = json!(generation + 1);
            }
            if rt.special == Special::Namespace {
                marked["status"]["phase"] = json!("Terminating");
            }
            if dry_run {
                return Ok(Arc::new(marked));
            }
            let stored = self.put(rt, marked);
            if rt.special == Special::Namespace {
                self.empty_namespace(name);
                return Ok(self.get(rt, "", name).unwrap_or(stored));
            }
            return Ok(stored);
        }
        if dry_run {
            return Ok(old);
        }
        let gone = rt.view(&self.remove_object(&rt.store_id(), rt.to_storage((*old).clone())));
        if !opts.orphan {
            self.collect_garbage(meta_str(&gone, "uid").unwrap_or_default());
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::{PatchKind, Subresource, WriteOptions, state_with_crd};

    #[test]
    fn finalizers_hold_deletion_until_removed() {
        let (mut s, wf) = state_with_crd();
        let o = WriteOptions::default();
        s.create(
            &wf,
            "v1",
            "default",
            json!({"metadata": {"name": "a", "finalizers": ["x/y"]}}),
            o,
        )
        .unwrap();
        let marked = s.delete(&wf, "default", "a", &DeleteOptions::default(), false).unwrap();
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        assert!(s.get(&wf, "default", "a").is_ok());
        let patch = json!([{"op": "test", "path": "/metadata/finalizers", "value": ["x/y"]},
            {"op": "replace", "path": "/metadata/finalizers", "value": []}]);
        s.patch(&wf, "v1", "default", "a", PatchKind::Json, &patch, Subresource::Main, o)
            .unwrap();
        assert_eq!(s.get(&wf, "default", "a").unwrap_err().code, 404);
    }
}
