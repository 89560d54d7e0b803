//! `Kubernetes::Object`: any Kubernetes object, given whole as a manifest, shaped after
//! Terraform's `kubernetes_manifest`.
//!
//! - Create and update are a server-side apply (`application/apply-patch+yaml`) of `manifest`
//!   as field manager `field_manager` (default `lyra`), forced when `force_conflicts`. The
//!   kind's resource and scope come from the server's discovery, so custom resources work as
//!   soon as their CRD is served. Every applied object gets the annotations
//!   `lyra.dev/deployment` and `lyra.dev/step`, and the host's owner labels
//!   ([`crate::ProvidersConfig::kubernetes_owner_labels`]) when it has some. With `wait`, the
//!   operation then polls the object until it is as waited for (see `wait.rs`), within
//!   `wait.timeout`.
//! - Read returns as `manifest` the live object projected onto the shape of the manifest last
//!   applied: for each key it sets, the live value (maps recursively, lists whole), so a field
//!   changed out of band shows as drift while server defaults, status and what other managers
//!   add never do; the annotations and labels Lyra adds are left out. `object` is the whole
//!   live object without `metadata.managedFields` (and, for a Secret, without its `data` and
//!   `stringData`, so a Secret's values are not copied into the state in the clear). Values
//!   the server rewrites (a quantity `cpu: 0.5` kept as `500m`) show as drift until the
//!   manifest says them as the server does, as with Terraform.
//! - A change of `apiVersion`'s group, `kind`, `metadata.name` or `metadata.namespace`
//!   replaces the object ([`KubernetesProvider::replace_reasons`]).
//! - Delete uses `delete_propagation` (default `Foreground`) and, unless `wait_for_deletion`
//!   is false, waits until the object is gone (finalizers run), within `wait.timeout` or 5m.
//! - The external id is `<apiVersion>/<kind>/<namespace>/<name>`, the namespace empty for
//!   cluster-scoped kinds; lookup finds an object by that natural key and adopts it.
//!
//! Secrets: a Secret's manifest should be built from Sensitive values (the engine then keeps
//! the attribute secret); the provider redacts a Secret's values from the API's error
//! messages, and never copies them into `object`.
//!
//! Configuration (`providers: {Kubernetes: {...}}`, see `config.rs`): `config_path`,
//! `config_context`, `kubeconfig` (inline, sensitive) and `namespace`; by default
//! `$KUBECONFIG`, `~/.kube/config`, then the in-cluster service account.

mod config;
mod wait;

#[cfg(test)]
mod tests;

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};

use config::{Clients, Settings};
use wait::Wait;

/// The canonical type name.
pub const OBJECT: &str = "Kubernetes::Object";
/// The configuration schema's name: the namespace.
pub const NAMESPACE: &str = "Kubernetes";

const MANIFEST: &str = "manifest";
const WAIT: &str = "wait";
const DELETE_PROPAGATION: &str = "delete_propagation";
const WAIT_FOR_DELETION: &str = "wait_for_deletion";
const FIELD_MANAGER: &str = "field_manager";
const FORCE_CONFLICTS: &str = "force_conflicts";
const LIVE: &str = "object";

/// The annotations every applied object carries: who made it.
pub const DEPLOYMENT_ANNOTATION: &str = "lyra.dev/deployment";
pub const STEP_ANNOTATION: &str = "lyra.dev/step";

const DEFAULT_FIELD_MANAGER: &str = "lyra";
/// How often a wait looks at the object again.
const POLL: Duration = Duration::from_millis(200);
/// Secret values shorter than this are not redacted from messages: a two-letter value would
/// garble every message, and is no secret worth the name.
const MIN_REDACTED: usize = 4;

use crate::OwnerLabels;

/// The provider of `Kubernetes::Object`.
pub struct KubernetesProvider {
    owner_labels: Option<OwnerLabels>,
    tenancy: Option<crate::TenantOf>,
    clients: Clients,
}

impl std::fmt::Debug for KubernetesProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesProvider")
            .field("owner_labels", &self.owner_labels.is_some())
            .finish_non_exhaustive()
    }
}

impl KubernetesProvider {
    /// `owner_labels`: labels to add to every applied object, from the deployment's name
    /// ([`crate::ProvidersConfig::kubernetes_owner_labels`]).
    pub fn new(owner_labels: Option<OwnerLabels>) -> Self {
        KubernetesProvider {
            owner_labels,
            tenancy: None,
            clients: Clients::default(),
        }
    }

    /// Confines each deployment that `tenancy` gives a namespace to that namespace, when it
    /// uses the program's own credentials ([`crate::ProvidersConfig::kubernetes_tenancy`]).
    #[must_use]
    pub fn confined(mut self, tenancy: Option<crate::TenantOf>) -> Self {
        self.tenancy = tenancy;
        self
    }

    /// The labels and annotations this provider adds to what `cx` applies.
    fn added(&self, cx: &OpContext<'_>) -> Added {
        Added {
            labels: self.owner_labels.map(|f| f(cx.deployment)).unwrap_or_default(),
            annotations: vec![
                (DEPLOYMENT_ANNOTATION.to_owned(), cx.deployment.to_owned()),
                (STEP_ANNOTATION.to_owned(), cx.step_id.to_owned()),
            ],
        }
    }

    /// The client for `cx`'s configuration, and the configuration.
    async fn client(&self, cx: &OpContext<'_>) -> Result<(Client, Settings), ProviderError> {
        let mut settings = Settings::from_config(cx.config)?;
        if let Some(tenant) = self.tenancy.and_then(|f| f(cx.deployment)) {
            settings.confine(&tenant)?;
        }
        Ok((self.clients.get(&settings).await?, settings))
    }

    /// Applies `desired` (its manifest, as `cx`'s step) and waits as it says.
    async fn apply(
        &self,
        cx: &OpContext<'_>,
        desired: &Map,
        existing: Option<&ObjectRef>,
    ) -> Result<(ObjectRef, Map), ProviderError> {
        let manifest = manifest_of(desired)?;
        let id = Identity::of(manifest)?;
        let options = Options::of(desired)?;
        let wait = Wait::parse(desired.get(WAIT), id.group(), &id.kind)?;
        let secrets = secret_values(manifest);
        let (client, settings) = self.client(cx).await?;
        let (oref, ar) = resolve(&client, &id, &settings, &secrets).await?;
        let oref = oref.ok_or_else(|| not_served(&id))?;
        if let Some(old) = existing
            && !old.same_object(&oref)
        {
            return Err(ProviderError::InvalidValue {
                attribute: MANIFEST.to_owned(),
                message: format!(
                    "{} would become {}: moving an object to another namespace, name or kind \
                     needs a replace (set metadata.namespace explicitly)",
                    old.describe(),
                    oref.describe()
                ),
            });
        }
        let mut body = Value::Object(manifest.clone());
        if let Some(ns) = &oref.namespace {
            body["metadata"]["namespace"] = Value::String(ns.clone());
        }
        self.added(cx).apply_to(&mut body);
        let mut params = PatchParams::apply(&options.field_manager);
        if options.force_conflicts {
            params = params.force();
        }
        let api = api(&client, &ar, oref.namespace.as_deref());
        let applied = api
            .patch(&oref.name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| api_error(e, &format!("apply {}", oref.describe()), &secrets))?;
        let mut live = to_value(&applied)?;
        if let Some(wait) = wait.filter(Wait::waits) {
            live = wait_for(&api, &oref, &wait, &secrets).await?;
        }
        Ok((oref, self.actual(cx, desired, manifest, &live)))
    }

    /// The actual state: `settings`' own attributes, the live object projected onto
    /// `applied`, and the live object.
    fn actual(&self, cx: &OpContext<'_>, settings: &Map, applied: &Map, live: &Value) -> Map {
        let mut actual: Map = settings
            .iter()
            .filter(|(k, _)| *k != MANIFEST && *k != LIVE)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        actual.insert(MANIFEST.to_owned(), project_manifest(applied, live, &self.added(cx)));
        actual.insert(LIVE.to_owned(), live_object(live));
        actual
    }
}

/// What the provider adds to each applied object.
struct Added {
    labels: Vec<(String, String)>,
    annotations: Vec<(String, String)>,
}

impl Added {
    fn apply_to(&self, body: &mut Value) {
        for (field, pairs) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if pairs.is_empty() {
                continue;
            }
            let meta = &mut body["metadata"];
            if !meta[field].is_object() {
                meta[field] = Value::Object(Map::new());
            }
            for (k, v) in pairs {
                meta[field][k] = Value::String(v.clone());
            }
        }
    }
}

/// `manifest` of a desired state.
fn manifest_of(desired: &Map) -> Result<&Map, ProviderError> {
    match desired.get(MANIFEST) {
        Some(Value::Object(m)) => Ok(m),
        None | Some(Value::Null) => Err(invalid_manifest("is required".to_owned())),
        Some(other) => Err(invalid_manifest(format!("expects a hash, got {}", kind_of(other)))),
    }
}

fn invalid_manifest(message: String) -> ProviderError {
    ProviderError::InvalidValue {
        attribute: MANIFEST.to_owned(),
        message,
    }
}

/// The settings beside the manifest.
struct Options {
    field_manager: String,
    force_conflicts: bool,
}

impl Options {
    fn of(desired: &Map) -> Result<Options, ProviderError> {
        let field_manager = match desired.get(FIELD_MANAGER) {
            None | Some(Value::Null) => DEFAULT_FIELD_MANAGER.to_owned(),
            Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= 128 => s.clone(),
            Some(_) => {
                return Err(ProviderError::InvalidValue {
                    attribute: FIELD_MANAGER.to_owned(),
                    message: "expects a name of 1 to 128 characters".to_owned(),
                });
            }
        };
        let force_conflicts = boolean(desired, FORCE_CONFLICTS, false)?;
        boolean(desired, WAIT_FOR_DELETION, true)?;
        propagation(desired)?;
        wait::timeout(desired.get(WAIT))?;
        Ok(Options {
            field_manager,
            force_conflicts,
        })
    }
}

fn boolean(state: &Map, name: &str, default: bool) -> Result<bool, ProviderError> {
    match state.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ProviderError::InvalidValue {
            attribute: name.to_owned(),
            message: format!("expects a Boolean, got {}", kind_of(other)),
        }),
    }
}

fn propagation(state: &Map) -> Result<PropagationPolicy, ProviderError> {
    match state.get(DELETE_PROPAGATION) {
        None | Some(Value::Null) => Ok(PropagationPolicy::Foreground),
        Some(Value::String(s)) if s == "Foreground" => Ok(PropagationPolicy::Foreground),
        Some(Value::String(s)) if s == "Background" => Ok(PropagationPolicy::Background),
        Some(Value::String(s)) if s == "Orphan" => Ok(PropagationPolicy::Orphan),
        Some(_) => Err(ProviderError::InvalidValue {
            attribute: DELETE_PROPAGATION.to_owned(),
            message: "expects Foreground, Background or Orphan".to_owned(),
        }),
    }
}

/// What a manifest says the object is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    api_version: String,
    kind: String,
    /// `metadata.namespace`, if the manifest gives one.
    namespace: Option<String>,
    name: String,
}

impl Identity {
    fn of(manifest: &Map) -> Result<Identity, ProviderError> {
        let text = |v: Option<&Value>, what: &str| -> Result<String, ProviderError> {
            match v {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                None | Some(Value::Null) => Err(invalid_manifest(format!("has no {what}"))),
                Some(Value::String(_)) => Err(invalid_manifest(format!("has an empty {what}"))),
                Some(other) => Err(invalid_manifest(format!(
                    "{what} must be a string, got {}",
                    kind_of(other)
                ))),
            }
        };
        let api_version = text(manifest.get("apiVersion"), "apiVersion")?;
        let kind = text(manifest.get("kind"), "kind")?;
        let meta = manifest.get("metadata");
        if meta.is_some_and(|m| !m.is_object()) {
            return Err(invalid_manifest("metadata must be a hash".to_owned()));
        }
        let name = text(meta.and_then(|m| m.get("name")), "metadata.name")?;
        let namespace = match meta.and_then(|m| m.get("namespace")) {
            None | Some(Value::Null) => None,
            ns => Some(text(ns, "metadata.namespace")?),
        };
        let bad = |s: &str| s.contains('/') || s.trim() != s;
        if bad(&kind) || bad(&name) || namespace.as_deref().is_some_and(bad) || api_version.matches('/').count() > 1 {
            return Err(invalid_manifest(
                "apiVersion is group/version or version, and kind, metadata.name and metadata.namespace \
                 hold no '/' nor spaces"
                    .to_owned(),
            ));
        }
        Ok(Identity {
            api_version,
            kind,
            namespace,
            name,
        })
    }

    fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(g, _)| g)
    }

    fn gvk(&self) -> GroupVersionKind {
        let (group, version) = self.api_version.rsplit_once('/').unwrap_or(("", &self.api_version));
        GroupVersionKind::gvk(group, version, &self.kind)
    }
}

/// One object on the server: what the external id says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ObjectRef {
    api_version: String,
    kind: String,
    /// `None` for cluster-scoped kinds.
    namespace: Option<String>,
    name: String,
}

impl ObjectRef {
    /// `<apiVersion>/<kind>/<namespace>/<name>`.
    fn id(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.api_version,
            self.kind,
            self.namespace.as_deref().unwrap_or_default(),
            self.name
        )
    }

    fn parse(id: &str) -> Result<ObjectRef, ProviderError> {
        let bad = || ProviderError::Other(format!("'{id}' is not a {OBJECT} id (apiVersion/kind/namespace/name)"));
        // From the right: the apiVersion alone may hold a '/'.
        let mut parts = id.rsplitn(4, '/');
        let (Some(name), Some(namespace), Some(kind), Some(api_version)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if name.is_empty() || kind.is_empty() || api_version.is_empty() {
            return Err(bad());
        }
        Ok(ObjectRef {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
            name: name.to_owned(),
        })
    }

    fn identity(&self) -> Identity {
        Identity {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The same object, perhaps through another version of its group.
    fn same_object(&self, other: &ObjectRef) -> bool {
        self.identity().group() == other.identity().group()
            && self.kind == other.kind
            && self.namespace == other.namespace
            && self.name == other.name
    }

    /// `apps/v1 Deployment default/web`, `v1 Namespace team`.
    fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {} {ns}/{}", self.api_version, self.kind, self.name),
            None => format!("{} {} {}", self.api_version, self.kind, self.name),
        }
    }
}

/// Where `id` lives on the server: its resource (plural, scope) by discovery, its namespace
/// (the configured one when a namespaced manifest names none). `None` when the server does
/// not serve the kind (no such group, version or kind: its CRD is not installed).
async fn resolve(
    client: &Client,
    id: &Identity,
    settings: &Settings,
    secrets: &[String],
) -> Result<(Option<ObjectRef>, ApiResource), ProviderError> {
    let gvk = id.gvk();
    let (ar, caps) = match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(found) => found,
        Err(kube::Error::Discovery(_)) => return Ok((None, ApiResource::from_gvk(&gvk))),
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok((None, ApiResource::from_gvk(&gvk))),
        Err(e) => {
            return Err(api_error(
                e,
                &format!("discover {} {}", id.api_version, id.kind),
                secrets,
            ));
        }
    };
    if let Some(tenant) = &settings.confined {
        let elsewhere = match caps.scope {
            Scope::Namespaced => id
                .namespace
                .as_ref()
                .filter(|ns| *ns != tenant)
                .map(|ns| format!("namespace '{ns}'")),
            Scope::Cluster => Some(format!("{} objects, which are cluster-scoped,", id.kind)),
        };
        if let Some(what) = elsewhere {
            return Err(invalid_manifest(format!(
                "a workflow of namespace '{tenant}' manages objects in '{tenant}' only, not {what} \
                 (the controller confines workflows to their namespace unless started with \
                 --kubernetes-any-namespace)"
            )));
        }
    }
    let namespace = match caps.scope {
        Scope::Namespaced => Some(id.namespace.clone().unwrap_or_else(|| settings.namespace.clone())),
        Scope::Cluster if id.namespace.is_some() => {
            return Err(invalid_manifest(format!(
                "{} is cluster-scoped: its manifest takes no metadata.namespace",
                id.kind
            )));
        }
        Scope::Cluster => None,
    };
    let oref = ObjectRef {
        api_version: id.api_version.clone(),
        kind: id.kind.clone(),
        namespace,
        name: id.name.clone(),
    };
    Ok((Some(oref), ar))
}

fn not_served(id: &Identity) -> ProviderError {
    ProviderError::Other(format!(
        "the API server does not serve kind {} of apiVersion {} (is its CRD installed?)",
        id.kind, id.api_version
    ))
}

fn api(client: &Client, ar: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

fn to_value(obj: &DynamicObject) -> Result<Value, ProviderError> {
    serde_json::to_value(obj).map_err(|e| ProviderError::Other(format!("cannot read the server's object: {e}")))
}

/// GET: the live object, `None` when it is not there.
async fn get(api: &Api<DynamicObject>, oref: &ObjectRef, secrets: &[String]) -> Result<Option<Value>, ProviderError> {
    match api.get_opt(&oref.name).await {
        Ok(Some(obj)) => Ok(Some(to_value(&obj)?)),
        Ok(None) => Ok(None),
        Err(e) => Err(api_error(e, &format!("read {}", oref.describe()), secrets)),
    }
}

/// Polls `oref` until it is as `wait` says, within its timeout: the live object then.
async fn wait_for(
    api: &Api<DynamicObject>,
    oref: &ObjectRef,
    wait: &Wait,
    secrets: &[String],
) -> Result<Value, ProviderError> {
    let mut last = String::from("not read yet");
    let poll = async {
        loop {
            match get(api, oref, secrets).await {
                Ok(Some(live)) => match wait.check(&live) {
                    Ok(()) => return Ok(live),
                    Err(why) => last = why,
                },
                Ok(None) => last = "the object is gone".to_owned(),
                // A server restarting or a connection dropped mid-wait: the wait goes on.
                Err(e) if e.is_retryable() => last = e.to_string(),
                Err(e) => return Err(e),
            }
            tokio::time::sleep(POLL).await;
        }
    };
    match tokio::time::timeout(wait.timeout, poll).await {
        Ok(result) => result,
        Err(_) => Err(ProviderError::Other(format!(
            "timed out after {} waiting for {} to {}; last seen: {last}",
            humantime::format_duration(wait.timeout),
            oref.describe(),
            wait.describe()
        ))),
    }
}

/// A map of the live value at each key `applied` sets (recursively for maps); lists and
/// scalars are the live ones whole. `None` when `live` lacks the key.
fn project(applied: &Value, live: &Value) -> Value {
    match (applied, live) {
        (Value::Object(a), Value::Object(l)) => {
            let mut out = Map::new();
            for (k, av) in a {
                match l.get(k) {
                    Some(lv) => {
                        out.insert(k.clone(), project(av, lv));
                    }
                    // Applying null removes the field: it is as asked when absent.
                    None if av.is_null() => {
                        out.insert(k.clone(), Value::Null);
                    }
                    None => {}
                }
            }
            Value::Object(out)
        }
        _ => live.clone(),
    }
}

/// `project` of the manifest last applied, with what the provider adds (its labels and
/// annotations, which the manifest may name too) as the manifest says, and a Secret's
/// `stringData` read back from the `data` the server keeps it in.
fn project_manifest(applied: &Map, live: &Value, added: &Added) -> Value {
    let applied_value = Value::Object(applied.clone());
    let mut out = project(&applied_value, live);
    for (field, pairs) in [("labels", &added.labels), ("annotations", &added.annotations)] {
        for (k, _) in pairs {
            if let Some(v) = applied_value.pointer(&format!("/metadata/{field}/{}", escape(k)))
                && let Some(Value::Object(m)) = out.pointer_mut(&format!("/metadata/{field}"))
            {
                m.insert(k.clone(), v.clone());
            }
        }
    }
    if is_secret(applied)
        && let Some(Value::Object(string_data)) = applied.get("stringData")
    {
        let mut back = Map::new();
        for k in string_data.keys() {
            let from_data = live
                .pointer(&format!("/data/{}", escape(k)))
                .and_then(Value::as_str)
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .and_then(|b| String::from_utf8(b).ok());
            let kept = live.pointer(&format!("/stringData/{}", escape(k))).cloned();
            if let Some(v) = from_data.map(Value::String).or(kept) {
                back.insert(k.clone(), v);
            }
        }
        if let Value::Object(o) = &mut out {
            o.insert("stringData".to_owned(), Value::Object(back));
        }
    }
    out
}

/// A key as a JSON pointer segment.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn is_secret(manifest: &Map) -> bool {
    manifest.get("kind").and_then(Value::as_str) == Some("Secret")
        && manifest.get("apiVersion").and_then(Value::as_str) == Some("v1")
}

/// The live object for `object`: without `metadata.managedFields` (bulky, and nobody's
/// business), and without a Secret's values.
fn live_object(live: &Value) -> Value {
    let mut out = live.clone();
    if let Some(Value::Object(meta)) = out.get_mut("metadata") {
        meta.remove("managedFields");
    }
    if let Value::Object(o) = &mut out
        && is_secret(o)
    {
        o.remove("data");
        o.remove("stringData");
    }
    out
}

/// A Secret manifest's values (and their other encoding), to redact from messages.
fn secret_values(manifest: &Map) -> Vec<String> {
    if !is_secret(manifest) {
        return Vec::new();
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    let strings = |field: &str| -> Vec<String> {
        manifest
            .get(field)
            .and_then(Value::as_object)
            .map(|m| m.values().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    for v in strings("data") {
        if let Some(plain) = b64.decode(&v).ok().and_then(|b| String::from_utf8(b).ok()) {
            out.push(plain);
        }
        out.push(v);
    }
    for v in strings("stringData") {
        out.push(b64.encode(&v));
        out.push(v);
    }
    out.retain(|s| s.len() >= MIN_REDACTED);
    // Longest first, so that a value containing another is redacted whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

fn redact(message: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(message.to_owned(), |m, s| m.replace(s.as_str(), "(sensitive)"))
}

/// An API failure as the provider reports it: the server's own message, which names what is
/// wrong; invalid manifests are not retryable, the rest (conflicts on resourceVersion,
/// server errors, connections) is.
fn api_error(e: kube::Error, doing: &str, secrets: &[String]) -> ProviderError {
    match e {
        kube::Error::Api(status) => {
            let message = redact(&status.message, secrets);
            match status.code {
                400 | 422 => ProviderError::InvalidValue {
                    attribute: MANIFEST.to_owned(),
                    message: format!("{doing}: {message}"),
                },
                409 if status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == "FieldManagerConflict"))
                    || message.starts_with("Apply failed") =>
                {
                    let mut managers: Vec<String> = status
                        .details
                        .iter()
                        .flat_map(|d| &d.causes)
                        .filter_map(|c| c.message.split('"').nth(1).map(str::to_owned))
                        .collect();
                    managers.dedup();
                    let who = if managers.is_empty() {
                        "another field manager".to_owned()
                    } else {
                        format!(
                            "field manager {}",
                            managers
                                .iter()
                                .map(|m| format!("\"{m}\""))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    };
                    ProviderError::Other(format!(
                        "{doing}: {message}. These fields belong to {who}: set force_conflicts: true \
                         to take them over, or leave them out of the manifest"
                    ))
                }
                _ => ProviderError::Other(format!("{doing}: {message} ({}, {})", status.code, status.reason)),
            }
        }
        other => ProviderError::Other(format!("{doing}: {}", redact(&other.to_string(), secrets))),
    }
}

/// The string at `pointer` in a manifest.
fn manifest_part<'a>(manifest: Option<&'a Value>, pointer: &str) -> Option<&'a str> {
    manifest?.pointer(pointer)?.as_str()
}

#[async_trait]
impl Provider for KubernetesProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        let any_hash = || Type::hash(Type::String, Type::Any);
        vec![
            ResourceSchema::new(
                OBJECT,
                vec![
                    AttributeSchema::new(MANIFEST, any_hash()).required().doc(
                        "The whole object: apiVersion, kind, metadata.name, metadata.namespace \
                         (namespaced kinds; default: the provider's namespace) and the rest. Applied \
                         server-side; read back as the live values of the fields it sets. A change of \
                         the API group, kind, name or namespace replaces the object. Build a Secret's \
                         from Sensitive values.",
                    ),
                    AttributeSchema::new(WAIT, Type::optional(any_hash())).doc(
                        "What to wait for after applying: {for: Ready} (a finished rollout, a Ready \
                         condition, no status at all), {for: Rollout} (Deployments, StatefulSets, \
                         DaemonSets), {condition: {type: X, status: \"True\"}}, {fields: \
                         {\"status.phase\": Active}}; and timeout (default 5m, also bounds a delete's wait).",
                    ),
                    AttributeSchema::new(
                        DELETE_PROPAGATION,
                        Type::optional(Type::Enum(vec![
                            "Foreground".to_owned(),
                            "Background".to_owned(),
                            "Orphan".to_owned(),
                        ])),
                    )
                    .doc("How a delete treats the object's dependents (default Foreground)."),
                    AttributeSchema::new(WAIT_FOR_DELETION, Type::optional(Type::Boolean))
                        .doc("Whether a delete waits until the object is gone, finalizers done (default true)."),
                    AttributeSchema::new(FIELD_MANAGER, Type::optional(Type::String))
                        .doc("The server-side apply field manager (default lyra)."),
                    AttributeSchema::new(FORCE_CONFLICTS, Type::optional(Type::Boolean))
                        .doc("Take over fields another field manager owns instead of failing (default false)."),
                    AttributeSchema::new(LIVE, any_hash()).computed().doc(
                        "The live object as the server returned it, without metadata.managedFields \
                         (and without a Secret's data and stringData).",
                    ),
                ],
            )
            .doc(
                "Any Kubernetes object, applied server-side from a manifest, like Terraform's \
                 kubernetes_manifest. Id: apiVersion/kind/namespace/name.",
            ),
        ]
    }

    fn config_schemas(&self) -> Vec<ResourceSchema> {
        let text = || Type::optional(Type::String);
        vec![
            ResourceSchema::new(
                NAMESPACE,
                vec![
                    AttributeSchema::new(config::CONFIG_PATH, text())
                        .doc("A kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)."),
                    AttributeSchema::new(config::CONFIG_CONTEXT, text())
                        .doc("The kubeconfig context to use (default: its current context)."),
                    AttributeSchema::new(
                        config::KUBECONFIG,
                        Type::optional(Type::Sensitive(Box::new(Type::String))),
                    )
                    .sensitive()
                    .doc("An inline kubeconfig document (e.g. from a Secret), instead of config_path."),
                    AttributeSchema::new(config::NAMESPACE, text())
                        .doc("The namespace of namespaced objects whose manifest names none (default \"default\")."),
                ],
            )
            .doc("The Kubernetes cluster and credentials Kubernetes::Object uses."),
        ]
    }

    fn replace_reasons(&self, _type_name: &str, desired: &Map, actual: &Map) -> Vec<String> {
        let (want, have) = (desired.get(MANIFEST), actual.get(MANIFEST));
        let group = |m: Option<&Value>| {
            manifest_part(m, "/apiVersion").map(|v| v.rsplit_once('/').map_or("", |(g, _)| g).to_owned())
        };
        let mut reasons = Vec::new();
        if group(want) != group(have) {
            reasons.push(format!("{MANIFEST}.apiVersion"));
        }
        for (pointer, path) in [("/kind", "kind"), ("/metadata/name", "metadata.name")] {
            if manifest_part(want, pointer) != manifest_part(have, pointer) {
                reasons.push(format!("{MANIFEST}.{path}"));
            }
        }
        // A namespace left out of the manifest is the configured one, unknown here: update
        // refuses to move the object if that turns out to be another one.
        let live_ns =
            manifest_part(actual.get(LIVE), "/metadata/namespace").or(manifest_part(have, "/metadata/namespace"));
        if let Some(ns) = manifest_part(want, "/metadata/namespace")
            && live_ns.is_some_and(|l| l != ns)
        {
            reasons.push(format!("{MANIFEST}.metadata.namespace"));
        }
        reasons
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let (oref, actual) = crate::cancellable(cx, self.apply(cx, desired, None)).await?;
        Ok(Created {
            external_id: oref.id(),
            actual,
        })
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        let oref = ObjectRef::parse(external_id)?;
        crate::cancellable(cx, async {
            let (client, settings) = self.client(cx).await?;
            let applied = prior.and_then(|p| p.get(MANIFEST)).and_then(Value::as_object);
            let secrets = applied.map(secret_values).unwrap_or_default();
            let (found, ar) = resolve(&client, &oref.identity(), &settings, &secrets).await?;
            if found.is_none() {
                // The kind is not served (its CRD was deleted): neither are its objects.
                return Ok(None);
            }
            let Some(live) = get(&api(&client, &ar, oref.namespace.as_deref()), &oref, &secrets).await? else {
                return Ok(None);
            };
            let empty = Map::new();
            let applied = applied
                .cloned()
                .unwrap_or_else(|| manifest_without_server_fields(&live));
            Ok(Some(self.actual(cx, prior.unwrap_or(&empty), &applied, &live)))
        })
        .await
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        _prior: &Map,
    ) -> Result<Map, ProviderError> {
        let existing = ObjectRef::parse(external_id)?;
        let (_, actual) = crate::cancellable(cx, self.apply(cx, desired, Some(&existing))).await?;
        Ok(actual)
    }

    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, prior: &Map) -> Result<(), ProviderError> {
        let oref = ObjectRef::parse(external_id)?;
        let policy = propagation(prior)?;
        let wait_for_deletion = boolean(prior, WAIT_FOR_DELETION, true)?;
        let timeout = wait::timeout(prior.get(WAIT))?;
        let secrets = prior
            .get(MANIFEST)
            .and_then(Value::as_object)
            .map(secret_values)
            .unwrap_or_default();
        crate::cancellable(cx, async {
            let (client, settings) = self.client(cx).await?;
            let (found, ar) = resolve(&client, &oref.identity(), &settings, &secrets).await?;
            if found.is_none() {
                return Ok(());
            }
            let api = api(&client, &ar, oref.namespace.as_deref());
            let params = DeleteParams {
                propagation_policy: Some(policy),
                ..DeleteParams::default()
            };
            match api.delete(&oref.name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
                Err(e) => return Err(api_error(e, &format!("delete {}", oref.describe()), &secrets)),
            }
            if !wait_for_deletion {
                return Ok(());
            }
            let mut last = None;
            let gone = async {
                loop {
                    match get(&api, &oref, &secrets).await {
                        Ok(None) => return Ok(()),
                        Ok(Some(live)) => last = Some(live),
                        // As in a wait: a passing failure does not end it.
                        Err(e) if e.is_retryable() => {}
                        Err(e) => return Err(e),
                    }
                    tokio::time::sleep(POLL).await;
                }
            };
            match tokio::time::timeout(timeout, gone).await {
                Ok(result) => result,
                Err(_) => {
                    let finalizers = last
                        .as_ref()
                        .and_then(|l| l.pointer("/metadata/finalizers"))
                        .map_or_else(|| "none".to_owned(), Value::to_string);
                    Err(ProviderError::Other(format!(
                        "timed out after {} waiting for {} to be deleted; its finalizers: {finalizers}",
                        humantime::format_duration(timeout),
                        oref.describe()
                    )))
                }
            }
        })
        .await
    }

    async fn lookup(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Lookup, ProviderError> {
        let manifest = manifest_of(desired)?;
        let id = Identity::of(manifest)?;
        let secrets = secret_values(manifest);
        crate::cancellable(cx, async {
            let (client, settings) = self.client(cx).await?;
            let (found, ar) = resolve(&client, &id, &settings, &secrets).await?;
            let Some(oref) = found else {
                return Ok(Lookup::Absent);
            };
            match get(&api(&client, &ar, oref.namespace.as_deref()), &oref, &secrets).await? {
                Some(live) => Ok(Lookup::Found(Created {
                    external_id: oref.id(),
                    actual: self.actual(cx, desired, manifest, &live),
                })),
                None => Ok(Lookup::Absent),
            }
        })
        .await
    }
}

/// A live object as a manifest, for a read without a prior manifest: without status and what
/// the server sets in metadata.
fn manifest_without_server_fields(live: &Value) -> Map {
    let mut out = match live_object(live) {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    out.remove("status");
    if let Some(Value::Object(meta)) = out.get_mut("metadata") {
        for k in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(k);
        }
    }
    out
}
