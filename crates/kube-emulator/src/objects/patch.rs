//! PATCH: merge, JSON (with the `test` kube-rs relies on), strategic (`strategic`) and
//! server-side apply (field ownership in `managed`).

use std::sync::Arc;

use serde_json::{Value, json};

use super::managed::{self, Writer};
use super::subresource::Subresource;
use super::update::Ownership;
use super::{State, WriteOptions, Written, meta_str, shape};
use crate::errors::ApiError;
use crate::registry::ResourceType;

/// A PATCH's type, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    /// Strategic merge (built-in kinds only): lists of objects merge by their key.
    Strategic,
    /// Server-side apply: merged in (lists of built-in kinds by key), then what the manager
    /// applied before and no longer does is removed (`managed`).
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Option<PatchKind> {
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchKind::Apply),
            _ => None,
        }
    }
}

/// The apiserver ignores managedFields a client sends on an apply (and so does the emulator
/// on every write).
fn strip_managed_fields(v: &mut Value) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
}

/// JSON patch, except that `test` of a missing member against `null` passes (kube-rs's
/// finalizer helper relies on it, and the apiserver allows it).
fn apply_json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops.as_array().ok_or("a JSON patch must be an array of operations")?;
    for op in ops {
        if op["op"] == "test" && op["value"].is_null() {
            let path = op["path"].as_str().ok_or("test operation without path")?;
            match doc.pointer(path) {
                None | Some(Value::Null) => continue,
                Some(_) => return Err(format!("testing value {path} failed: value did not match")),
            }
        }
        let one: json_patch::PatchOperation = serde_json::from_value(op.clone()).map_err(|e| e.to_string())?;
        json_patch::patch(doc, &[one]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl State {
    /// PATCH of any type; server-side apply creates a missing object.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rt: &Arc<ResourceType>,
        version: &str,
        ns: &str,
        name: &str,
        kind: PatchKind,
        patch: &Value,
        sub: Subresource,
        opts: WriteOptions,
    ) -> Result<Written, ApiError> {
        if kind == PatchKind::Strategic && rt.crd_uid.is_some() {
            return Err(ApiError::unsupported_media_type());
        }
        let old = match self.get(rt, ns, name).ok() {
            Some(o) => o,
            None if kind == PatchKind::Apply && sub == Subresource::Main => {
                let mut body = patch.clone();
                if meta_str(&body, "name").is_none() {
                    body["metadata"]["name"] = json!(name);
                }
                if meta_str(&body, "name") != Some(name) {
                    return Err(ApiError::bad_request(
                        "the name of the object does not match the name on the URL",
                    ));
                }
                strip_managed_fields(&mut body);
                return self.create_owned(rt, version, ns, body, opts, true);
            }
            None => return Err(rt.not_found(name)),
        };
        let mut doc = (*old).clone();
        doc["apiVersion"] = json!(rt.api_version(version));
        match kind {
            PatchKind::Merge | PatchKind::Strategic | PatchKind::Apply => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                let mut patch = patch.clone();
                strip_managed_fields(&mut patch);
                // An apply merges lists as it owns them: by key for built-in kinds, whole
                // for custom resources.
                if kind == PatchKind::Strategic || (kind == PatchKind::Apply && rt.crd_uid.is_none()) {
                    super::strategic::apply(&mut doc, &patch);
                } else {
                    json_patch::merge(&mut doc, &patch);
                }
                if kind == PatchKind::Apply {
                    let api_version = rt.api_version(version);
                    let who = Writer {
                        manager: opts.manager.as_str(),
                        api_version: &api_version,
                        shape: shape(rt, sub),
                    };
                    managed::apply(Some(&old), &mut doc, &patch, &who, opts.force)
                        .map_err(|c| ApiError::apply_conflicts(&rt.group, &rt.plural, name, &c))?;
                }
            }
            PatchKind::Json => apply_json_patch(&mut doc, patch).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?,
        }
        // A resourceVersion in the patch is a precondition, as in an update.
        if let Some(rv) = meta_str(&doc, "resourceVersion")
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::stale(&rt.group, &rt.plural, name));
        }
        let ownership = match kind {
            PatchKind::Apply => Ownership::Applied,
            _ => Ownership::Update,
        };
        self.replace(rt, version, ns, name, old, doc, sub, opts, ownership)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_patch_test_of_missing_member_against_null_passes() {
        let mut doc = json!({"metadata": {}});
        apply_json_patch(
            &mut doc,
            &json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}]),
        )
        .unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["f"]));
        assert!(
            apply_json_patch(
                &mut doc,
                &json!([{"op": "test", "path": "/metadata/finalizers", "value": null}])
            )
            .is_err()
        );
    }
}
