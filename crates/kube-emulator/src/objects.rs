//! What a write means, independent of HTTP: create, update (PUT), the four patch types,
//! delete with finalizers, and their side effects (CRD registration, namespace termination,
//! ownerReference garbage collection). All of it runs under the server's one lock.

use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use base64::Engine as _;
use regex::Regex;
use serde_json::{Map, Value, json};

use crate::crd;
use crate::errors::{ApiError, FieldError};
use crate::registry::{Registry, ResourceType, Special};
use crate::store::Store;

/// The most bytes all of an object's annotations may hold, keys included (the apiserver's
/// `TotalAnnotationSizeLimitB`). kubectl's client-side apply copies the whole object into its
/// `last-applied-configuration` annotation, so this is what limits a `kubectl apply`.
pub const ANNOTATIONS_LIMIT: usize = 256 * 1024;
/// etcd's default `--max-request-bytes` (1.5 MiB): the most a stored object may weigh. The
/// emulator counts the object's JSON; etcd counts its request, a few bytes more.
pub const OBJECT_LIMIT: usize = 1536 * 1024;

/// The namespaces a fresh cluster has.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            dry_run: false,
            field_validation: FieldValidation::Warn,
        }
    }
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    /// Strategic merge, served as a merge patch (lists are replaced, not merged by key).
    Strategic,
    /// Server-side apply, served as create-or-merge (no field ownership).
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

pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj["metadata"][field].as_str().filter(|s| !s.is_empty())
}

fn finalizers_empty(obj: &Value) -> bool {
    obj["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty)
}

/// Whether anything other than `metadata` (and `status`, when it is a subresource) differs.
fn spec_changed(old: &Value, new: &Value, status_is_subresource: bool) -> bool {
    let skip = |k: &str| k == "metadata" || (status_is_subresource && k == "status");
    let empty = Map::new();
    let (o, n) = (old.as_object().unwrap_or(&empty), new.as_object().unwrap_or(&empty));
    o.iter().filter(|(k, _)| !skip(k)).any(|(k, v)| n.get(k) != Some(v))
        || n.keys().filter(|k| !skip(k)).any(|k| !o.contains_key(k))
}

static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").expect("valid regex")
});
static DNS_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").expect("valid regex"));

fn validate_name(rt: &ResourceType, name: &str) -> Option<FieldError> {
    let v = json!(name);
    if rt.special == Special::Namespace {
        if name.len() > 63 || !DNS_LABEL.is_match(name) {
            return Some(FieldError::invalid(
                "metadata.name",
                &v,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            ));
        }
    } else if name.len() > 253 || !DNS_SUBDOMAIN.is_match(name) {
        return Some(FieldError::invalid(
            "metadata.name",
            &v,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
    }
    None
}

fn validate_annotations(obj: &Value) -> Option<FieldError> {
    let total: usize = obj["metadata"]["annotations"]
        .as_object()?
        .iter()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    (total > ANNOTATIONS_LIMIT).then(|| FieldError::too_long("metadata.annotations", ANNOTATIONS_LIMIT as u64))
}

/// What etcd refuses to store.
fn check_stored_size(obj: &Value) -> Result<(), ApiError> {
    let size = serde_json::to_vec(obj).map_or(0, |v| v.len());
    if size > OBJECT_LIMIT {
        return Err(ApiError::etcd_request_too_large());
    }
    Ok(())
}

fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| CHARS[*b as usize % CHARS.len()] as char)
        .collect()
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

    /// Everything every write does to the new object: kind-specific defaults, pruning,
    /// defaulting and validation against the version's schema.
    fn admit(
        &self,
        rt: &ResourceType,
        version: &str,
        old: Option<&Value>,
        obj: &mut Value,
        opts: WriteOptions,
    ) -> Result<Vec<String>, ApiError> {
        obj["apiVersion"] = json!(rt.api_version(version));
        obj["kind"] = json!(rt.kind);
        let name = meta_str(obj, "name").unwrap_or_default().to_string();
        let mut warnings = Vec::new();
        let mut errs = Vec::new();
        match rt.special {
            Special::Secret => {
                if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
                    for (k, v) in sd {
                        let encoded = base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap_or_default());
                        obj["data"][k] = json!(encoded);
                    }
                }
                if obj.get("type").is_none_or(Value::is_null) {
                    obj["type"] = json!("Opaque");
                }
            }
            Special::Namespace => {
                if obj.pointer("/spec/finalizers").is_none() {
                    obj["spec"]["finalizers"] = json!(["kubernetes"]);
                }
                let terminating = old.is_some_and(|o| o["status"]["phase"] == "Terminating");
                obj["status"]["phase"] = json!(if terminating { "Terminating" } else { "Active" });
            }
            Special::Crd => {
                crd::apply_defaults(obj);
                if let Err(e) = crd::resource_type(obj) {
                    errs.extend(e);
                }
                obj["status"] = crd::status(obj, old, &now_rfc3339());
            }
            Special::None => {}
        }
        if rt.group == "events.k8s.io" {
            errs.extend(crate::events::validate_events_v1(obj, old));
        }
        if let Some(schema) = rt.version(version).and_then(|v| v.schema.clone()) {
            let unknown = schema.prune(obj, true);
            if !unknown.is_empty() {
                let described: Vec<String> = unknown.iter().map(|f| format!("unknown field {f:?}")).collect();
                match opts.field_validation {
                    FieldValidation::Strict => {
                        return Err(ApiError::bad_request(format!(
                            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                            described.join(", "),
                            kind = rt.kind,
                        )));
                    }
                    FieldValidation::Warn => warnings = described,
                    FieldValidation::Ignore => {}
                }
            }
            schema.apply_defaults(obj);
            errs.extend(schema.validate(obj));
        }
        if let Some(e) = validate_annotations(obj) {
            errs.insert(0, e);
        }
        if let Some(e) = validate_name(rt, &name) {
            errs.insert(0, e);
        }
        if !errs.is_empty() {
            return Err(rt.invalid(&name, &errs));
        }
        Ok(warnings)
    }

    pub fn create(
        &mut self,
        rt: &Arc<ResourceType>,
        version: &str,
        ns: &str,
        mut obj: Value,
        opts: WriteOptions,
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
        if rt.status_subresource
            && rt.special == Special::None
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        let warnings = self.admit(rt, version, None, &mut obj, opts)?;
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

    /// Registers the kind a CRD defines whenever the CRD is written.
    fn after_write(&mut self, rt: &ResourceType, stored: &Value) {
        if rt.special == Special::Crd
            && let Ok(t) = crd::resource_type(stored)
        {
            self.registry.upsert(t);
        }
    }

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
        self.replace(rt, version, ns, name, old, body, sub, opts)
    }

    /// The shared tail of PUT and PATCH: `body` is the full new object.
    #[allow(clippy::too_many_arguments)]
    fn replace(
        &mut self,
        rt: &Arc<ResourceType>,
        version: &str,
        ns: &str,
        name: &str,
        old: Arc<Value>,
        body: Value,
        sub: Subresource,
        opts: WriteOptions,
    ) -> Result<Written, ApiError> {
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
                match body.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        n.as_object_mut().map(|m| m.remove("status"));
                    }
                }
                n
            }
            Subresource::Main => {
                let mut n = body;
                if !n["metadata"].is_object() {
                    n["metadata"] = json!({});
                }
                if rt.status_subresource && rt.special == Special::None {
                    match old.get("status") {
                        Some(s) => n["status"] = s.clone(),
                        None => {
                            n.as_object_mut().map(|m| m.remove("status"));
                        }
                    }
                }
                // Server-owned metadata is kept from the stored object.
                let meta = n["metadata"].as_object_mut().expect("metadata is an object");
                for key in [
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "namespace",
                    "name",
                ] {
                    match old["metadata"].get(key) {
                        Some(v) => meta.insert(key.into(), v.clone()),
                        None => meta.remove(key),
                    };
                }
                meta.remove("managedFields");
                n
            }
        };
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        let warnings = self.admit(rt, version, Some(&old), &mut new, opts)?;
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
                return self.create(rt, version, ns, body, opts);
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
                json_patch::merge(&mut doc, patch);
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
        self.replace(rt, version, ns, name, old, doc, sub, opts)
    }

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

    /// Removes an object for good, with the side effects of its kind; `id` is a store key and
    /// `last` is in its stored form.
    fn remove_object(&mut self, id: &str, last: Value) -> Arc<Value> {
        let gone = self.store.remove(id, last);
        let rt = self.registry.by_id(id);
        match rt.as_ref().map(|t| t.special) {
            Some(Special::Crd) => {
                // Unregister the kind and drop its objects (finalizers or not).
                let group = gone.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
                let plural = gone
                    .pointer("/spec/names/plural")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let kind_id = crate::errors::qualified_resource(group, plural);
                self.registry.remove(&kind_id);
                for obj in self.store.all_of(&kind_id) {
                    self.store.remove(&kind_id, (*obj).clone());
                }
            }
            Some(Special::Namespace) => {}
            _ => {
                if let Some(ns) = meta_str(&gone, "namespace") {
                    self.finish_namespace_if_empty(ns);
                }
            }
        }
        gone
    }

    /// Deletes everything in a terminating namespace, then the namespace once it is empty.
    fn empty_namespace(&mut self, ns: &str) {
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
    fn collect_garbage(&mut self, uid: &str) {
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
    use super::*;

    fn state_with_crd() -> (State, Arc<ResourceType>) {
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

    #[test]
    fn generation_moves_only_with_the_spec_and_status_only_through_its_subresource() {
        let (mut s, wf) = state_with_crd();
        let o = WriteOptions::default();
        let created = s
            .create(
                &wf,
                "v1",
                "default",
                json!({"metadata": {"name": "a"}, "spec": {"replicas": 1}, "status": {"phase": "x"}}),
                o,
            )
            .unwrap();
        assert_eq!(created.object["metadata"]["generation"], 1);
        assert!(created.object.get("status").is_none());
        let labelled = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"metadata": {"labels": {"k": "v"}}}),
                Subresource::Main,
                o,
            )
            .unwrap();
        assert_eq!(labelled.object["metadata"]["generation"], 1);
        let status = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"status": {"phase": "Ready"}, "spec": {"replicas": 4}}),
                Subresource::Status,
                o,
            )
            .unwrap();
        assert_eq!(status.object["status"]["phase"], "Ready");
        assert_eq!(status.object["spec"]["replicas"], 1);
        let spec = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"spec": {"replicas": 2}, "status": null}),
                Subresource::Main,
                o,
            )
            .unwrap();
        assert_eq!(spec.object["metadata"]["generation"], 2);
        assert_eq!(spec.object["status"]["phase"], "Ready");
        let rv = spec.object["metadata"]["resourceVersion"].clone();
        let again = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"spec": {"replicas": 2}}),
                Subresource::Main,
                o,
            )
            .unwrap();
        assert_eq!(
            again.object["metadata"]["resourceVersion"], rv,
            "a no-op patch writes nothing"
        );
        let invalid = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"spec": {"replicas": 9}}),
                Subresource::Main,
                o,
            )
            .unwrap_err();
        assert_eq!(invalid.code, 422);
    }

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

    #[test]
    fn size_limits_are_the_apiservers() {
        let (mut s, wf) = state_with_crd();
        let o = WriteOptions::default();
        let annotated = |bytes: usize| json!({"metadata": {"name": "a", "annotations": {"k": "x".repeat(bytes)}}});
        let e = s
            .create(&wf, "v1", "default", annotated(ANNOTATIONS_LIMIT), o)
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Workflow.lyra.example.com \"a\" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes"
        );
        s.create(&wf, "v1", "default", annotated(ANNOTATIONS_LIMIT - 1), o)
            .unwrap();

        // A big status on an object that fits: etcd refuses the write, the object stays.
        let status = json!({"status": {"phase": "x".repeat(OBJECT_LIMIT)}});
        let e = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &status,
                Subresource::Status,
                o,
            )
            .unwrap_err();
        assert_eq!((e.code, e.reason), (500, ""));
        assert_eq!(e.message, "etcdserver: request is too large");
        assert_eq!(e.to_status().get("reason"), None);
        assert!(s.get(&wf, "default", "a").unwrap().get("status").is_none());
        let cm = s.registry.find("", "v1", "configmaps").unwrap();
        let big = json!({"metadata": {"name": "b"}, "data": {"k": "x".repeat(OBJECT_LIMIT)}});
        assert_eq!(s.create(&cm, "v1", "default", big, o).unwrap_err().code, 500);
        let fits = json!({"metadata": {"name": "b"}, "data": {"k": "x".repeat(OBJECT_LIMIT - 1000)}});
        s.create(&cm, "v1", "default", fits, o).unwrap();
    }

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
