//! POST: a new object, with its name, server-owned metadata and namespace checked.

use std::sync::Arc;

use serde_json::{Value, json};

use super::admission::admit;
use super::limits::check_stored_size;
use super::managed::{self, Writer};
use super::subresource::status_is_separate;
use super::{State, Subresource, WriteOptions, Written, meta_str, now_rfc3339, shape};
use crate::errors::{ApiError, FieldError};
use crate::registry::{ResourceType, Special};

/// The suffix `generateName` gets: five characters, as the apiserver's.
fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| CHARS[*b as usize % CHARS.len()] as char)
        .collect()
}

impl State {
    /// A namespaced object may only be created in an existing, non-terminating namespace.
    fn check_namespace(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        let Some(obj) = self.store.get("namespaces", "", ns) else {
            return Err(ApiError::not_found("", "namespaces", ns));
        };
        if obj["metadata"].get("deletionTimestamp").is_some() {
            let what = crate::errors::qualified_resource(&rt.group, &rt.plural);
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "{what} {name:?} is forbidden: unable to create new content in namespace {ns} because it is being terminated"
                ),
            ));
        }
        Ok(())
    }

    /// POST: creates `obj` in `ns` (ignored for cluster-scoped kinds).
    pub fn create(
        &mut self,
        rt: &Arc<ResourceType>,
        version: &str,
        ns: &str,
        obj: Value,
        opts: WriteOptions,
    ) -> Result<Written, ApiError> {
        self.create_owned(rt, version, ns, obj, opts, false)
    }

    /// A create; `applied`: by server-side apply, `obj` being the applied configuration,
    /// whose fields its manager then owns as applied.
    pub(super) fn create_owned(
        &mut self,
        rt: &Arc<ResourceType>,
        version: &str,
        ns: &str,
        mut obj: Value,
        opts: WriteOptions,
        applied: bool,
    ) -> Result<Written, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        }
        // The kind may have been unregistered (its CRD deleted) since the request was routed.
        if self.registry.by_id(&rt.id()).is_none_or(|t| t.crd_uid != rt.crd_uid) {
            return Err(ApiError::no_such_path());
        }
        if let Some(kind) = obj["kind"].as_str()
            && kind != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the kind of the resource ({})",
                rt.kind
            )));
        }
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        if rt.namespaced {
            match meta_str(&obj, "namespace") {
                Some(body_ns) if body_ns != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => obj["metadata"]["namespace"] = json!(ns),
            }
        } else if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        if meta_str(&obj, "name").is_none() {
            match meta_str(&obj, "generateName") {
                Some(prefix) => obj["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix())),
                None => {
                    return Err(rt.invalid(
                        "",
                        &[FieldError::required(
                            "metadata.name",
                            "name or generateName is required",
                        )],
                    ));
                }
            }
        }
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        self.check_namespace(rt, ns, &name)?;
        let meta = obj["metadata"].as_object_mut().expect("metadata is an object");
        for server_owned in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
        ] {
            meta.remove(server_owned);
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        if rt.has_generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        // The main endpoint of a kind with a status subresource drops `.status` on create.
        if status_is_separate(rt)
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        let config = applied.then(|| obj.clone());
        let warnings = admit(rt, version, None, &mut obj, opts)?;
        if !opts.manager.as_str().is_empty() {
            let api_version = rt.api_version(version);
            let who = Writer {
                manager: opts.manager.as_str(),
                api_version: &api_version,
                shape: shape(rt, Subresource::Main),
            };
            match &config {
                // Nobody owns anything yet: no conflict.
                Some(config) => managed::apply(None, &mut obj, config, &who, opts.force).unwrap_or_default(),
                None => managed::record_update(None, &mut obj, &who),
            }
        }
        if self.store.get(&rt.store_id(), ns, &name).is_some() {
            return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
        }
        if opts.dry_run {
            return Ok(Written {
                object: Arc::new(obj),
                created: true,
                warnings,
            });
        }
        check_stored_size(&obj)?;
        let stored = self.put(rt, obj);
        self.after_write(rt, &stored);
        if rt.special == Special::Namespace && self.store.get("serviceaccounts", &name, "default").is_none() {
            // What the service-account controller does in a real cluster.
            let sa_type = self
                .registry
                .find("", "v1", "serviceaccounts")
                .expect("serviceaccounts are built in");
            let sa = json!({ "metadata": { "name": "default" } });
            self.create(&sa_type, "v1", &name, sa, WriteOptions::default())?;
        }
        Ok(Written {
            object: stored,
            created: true,
            warnings,
        })
    }
}
