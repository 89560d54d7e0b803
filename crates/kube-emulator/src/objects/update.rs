//! PUT, and the tail every update shares with PATCH: the new object is admitted, its
//! generation moves only when more than metadata (and a separate status) changed, and a
//! write that changes nothing writes nothing.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::admission::admit;
use super::limits::check_stored_size;
use super::managed::{self, Writer};
use super::subresource::{Subresource, copy_status, status_is_separate};
use super::{State, WriteOptions, Written, finalizers_empty, meta_str, shape};
use crate::errors::{ApiError, FieldError};
use crate::registry::ResourceType;

/// Metadata the server owns: an update keeps the stored object's.
const SERVER_OWNED_METADATA: [&str; 7] = [
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "namespace",
    "name",
];

/// Who owns what an update writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ownership {
    /// A PUT or a non-apply patch: its manager owns what it sets or changes.
    Update,
    /// A server-side apply, whose managedFields `body` carries.
    Applied,
}

/// Whether anything other than `metadata` (and `status`, when it is a subresource) differs.
fn spec_changed(old: &Value, new: &Value, status_is_subresource: bool) -> bool {
    let skip = |k: &str| k == "metadata" || (status_is_subresource && k == "status");
    let empty = Map::new();
    let (o, n) = (old.as_object().unwrap_or(&empty), new.as_object().unwrap_or(&empty));
    o.iter().filter(|(k, _)| !skip(k)).any(|(k, v)| n.get(k) != Some(v))
        || n.keys().filter(|k| !skip(k)).any(|k| !o.contains_key(k))
}

impl State {
    /// PUT: `body` replaces the object (or, for `Subresource::Status`, its status).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        rt: &Arc<ResourceType>,
        version: &str,
        ns: &str,
        name: &str,
        body: Value,
        sub: Subresource,
        opts: WriteOptions,
    ) -> Result<Written, ApiError> {
        let old = self.get(rt, ns, name)?;
        if !body.is_object() {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        }
        match meta_str(&body, "resourceVersion") {
            Some(rv) if Some(rv) != meta_str(&old, "resourceVersion") => {
                return Err(ApiError::stale(&rt.group, &rt.plural, name));
            }
            Some(_) => {}
            // Custom resources do not allow unconditional updates; built-in kinds mostly do.
            None if rt.crd_uid.is_some() => {
                return Err(rt.invalid(
                    name,
                    &[FieldError::invalid(
                        "metadata.resourceVersion",
                        &json!("0x0"),
                        "must be specified for an update",
                    )],
                ));
            }
            None => {}
        }
        self.replace(rt, version, ns, name, old, body, sub, opts, Ownership::Update)
    }

    /// The shared tail of PUT and PATCH: `body` is the full new object.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replace(
        &mut self,
        rt: &Arc<ResourceType>,
        version: &str,
        ns: &str,
        name: &str,
        old: Arc<Value>,
        body: Value,
        sub: Subresource,
        opts: WriteOptions,
        ownership: Ownership,
    ) -> Result<Written, ApiError> {
        // What a client sends is not taken (kubectl replace sends what it read); an apply
        // computed the new managedFields already.
        let managed_fields = match ownership {
            Ownership::Applied => body["metadata"].get("managedFields").cloned(),
            Ownership::Update => old["metadata"].get("managedFields").cloned(),
        };
        if let Some(body_name) = meta_str(&body, "name")
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if rt.namespaced
            && let Some(body_ns) = meta_str(&body, "namespace")
            && body_ns != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut new = match sub {
            Subresource::Status => {
                let mut n = (*old).clone();
                copy_status(&body, &mut n);
                n
            }
            Subresource::Main => {
                let mut n = body;
                if !n["metadata"].is_object() {
                    n["metadata"] = json!({});
                }
                if status_is_separate(rt) {
                    copy_status(&old, &mut n);
                }
                let meta = n["metadata"].as_object_mut().expect("metadata is an object");
                for key in SERVER_OWNED_METADATA {
                    match old["metadata"].get(key) {
                        Some(v) => meta.insert(key.into(), v.clone()),
                        None => meta.remove(key),
                    };
                }
                n
            }
        };
        match managed_fields {
            Some(m) => new["metadata"]["managedFields"] = m,
            None => {
                new["metadata"].as_object_mut().map(|m| m.remove("managedFields"));
            }
        }
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        let warnings = admit(rt, version, Some(&old), &mut new, opts)?;
        if ownership == Ownership::Update {
            let api_version = rt.api_version(version);
            let who = Writer {
                manager: opts.manager.as_str(),
                api_version: &api_version,
                shape: shape(rt, sub),
            };
            managed::record_update(Some(&old), &mut new, &who);
        }
        if rt.has_generation && spec_changed(&old, &new, rt.status_subresource) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(0);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        let mut old_view = (*old).clone();
        old_view["apiVersion"] = new["apiVersion"].clone();
        if new == old_view {
            // A no-op write changes nothing, not even the resourceVersion, and sends no event.
            return Ok(Written {
                object: Arc::new(new),
                created: false,
                warnings,
            });
        }
        if opts.dry_run {
            return Ok(Written {
                object: Arc::new(new),
                created: false,
                warnings,
            });
        }
        if new["metadata"].get("deletionTimestamp").is_some() && finalizers_empty(&new) {
            let gone = self.remove_object(&rt.store_id(), rt.to_storage(new));
            return Ok(Written {
                object: rt.view(&gone),
                created: false,
                warnings,
            });
        }
        check_stored_size(&new)?;
        let stored = self.put(rt, new);
        self.after_write(rt, &stored);
        Ok(Written {
            object: stored,
            created: false,
            warnings,
        })
    }
}
