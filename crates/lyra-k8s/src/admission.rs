//! Admission: whether the API server should store a `Workflow` or `WorkflowDefinition`,
//! decided by the same code that reconciles them, so `kubectl apply` refuses what the
//! controller would only mark `Stalled`, in the controller's own words.
//!
//! - A `Workflow` is judged by [`Job::from_workflow`], [`parse_interval`] and
//!   [`Runtime::prepare`](crate::reconcile::Runtime): its workflow found on the load path and
//!   valid (inline ones by field path), `spec.data` bound to its parameters, nesting within
//!   [`crate::free`]'s limit. Only input problems are refused (the terminal reasons); what may
//!   appear later without the object changing (a Secret, the state store) is not looked at.
//! - A `WorkflowDefinition` is judged by the registrar's checks ([`crate::registrar`]): a
//!   readable reference, a package that loads and makes a CRD, a kind no one else owns, and
//!   no breaking schema change without `lyra.dev/allow-breaking`. A registry that cannot be
//!   reached in time lets the definition in, with a warning: the registrar retries it, and a
//!   registry outage should not block every `kubectl apply`.
//! - Always allowed: DELETE (and CONNECT), subresources (`status`), updates that change no
//!   `spec` (finalizers, labels, annotations: the controller never blocks itself), and
//!   objects being deleted. A dry run is judged like any request (nothing here has effects).
//!
//! Objects are read leniently on purpose: `metadata` without `managedFields` and `spec` kept
//! unparsed ([`Object`]), because the API server accepts nesting far deeper than serde_json
//! reads into a `Value`, and such an object must get a denial naming where, not a failed
//! webhook call.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{ApiResource, DynamicObject, DynamicResourceScope, TypeMeta};
use kube::{Api, Client, Resource};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::crd::{Workflow, WorkflowSpec};
use crate::definition::{WorkflowDefinition, WorkflowDefinitionSpec, WorkflowDefinitionStatus, allows_breaking};
use crate::reason::Failure;
use crate::reconcile::{Job, Runtime, parse_interval};
use crate::registrar::{self, Packages, Refusal};
use crate::retry::ErrorClass;
use crate::status::{CONDITION_MESSAGE_LIMIT, clip_lines};

/// How long a `WorkflowDefinition`'s package (and the CRD it would replace) may take to
/// fetch: well within the webhook's `timeoutSeconds` (10 by default).
pub const PACKAGE_TIMEOUT: Duration = Duration::from_secs(6);

/// An object as admission reads it: the metadata it needs, the spec (and status) unparsed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Object {
    #[serde(default, deserialize_with = "lean_metadata")]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Box<RawValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Box<RawValue>>,
}

/// The metadata admission reads. Unknown fields (`managedFields`, whose nesting follows the
/// spec's) are skipped by serde_json without recursion.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    generation: Option<i64>,
    resource_version: Option<String>,
    annotations: Option<std::collections::BTreeMap<String, String>>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
}

fn lean_metadata<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = LeanMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        generate_name: m.generate_name,
        namespace: m.namespace,
        uid: m.uid,
        generation: m.generation,
        resource_version: m.resource_version,
        annotations: m.annotations,
        labels: m.labels,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        ..ObjectMeta::default()
    })
}

impl Resource for Object {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The request of an `AdmissionReview`.
pub type Request = AdmissionRequest<Object>;

/// An `AdmissionReview` as sent. kube's own type flattens its `TypeMeta`, which makes serde
/// buffer the whole document recursively (and fail on deep objects); this one does not.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    api_version: String,
    kind: String,
    request: Option<Request>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("not an AdmissionReview: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

/// Reads an `AdmissionReview` (`admission.k8s.io/v1`) from its JSON body.
pub fn parse_review(body: &[u8]) -> Result<Request, ReviewError> {
    let envelope: Envelope = serde_json::from_slice(body)?;
    let mut request = envelope.request.ok_or(ReviewError::NoRequest)?;
    // The response must name the review's own version and kind.
    request.types = TypeMeta {
        api_version: envelope.api_version,
        kind: envelope.kind,
    };
    Ok(request)
}

/// What admission decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let in; the warnings are shown to the client (`kubectl` prints them).
    Allowed {
        warnings: Vec<String>,
    },
    Denied(String),
}

impl Verdict {
    pub fn allowed() -> Verdict {
        Verdict::Allowed { warnings: Vec::new() }
    }

    fn warn(warning: String) -> Verdict {
        Verdict::Allowed {
            warnings: vec![warning],
        }
    }

    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allowed { .. })
    }
}

/// The `AdmissionReview` answering `req`.
pub fn response(req: &Request, verdict: Verdict) -> AdmissionReview<DynamicObject> {
    let mut response = AdmissionResponse::from(req);
    match verdict {
        Verdict::Allowed { warnings } if warnings.is_empty() => {}
        Verdict::Allowed { warnings } => response.warnings = Some(warnings),
        Verdict::Denied(message) => response = response.deny(message),
    }
    response.into_review()
}

/// The answer to a review that could not be read (no uid to answer with).
pub fn invalid(e: &ReviewError) -> AdmissionReview<DynamicObject> {
    AdmissionResponse::invalid(e).into_review()
}

/// The decisions, with what they need: the runtime (load path, providers' schemas) and, for
/// `WorkflowDefinition`s, the registry and the API server (the CRD a definition would change).
pub struct Admission {
    runtime: Arc<Runtime>,
    definitions: Option<Definitions>,
    package_timeout: Duration,
}

struct Definitions {
    client: Client,
    packages: Arc<Packages>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

impl Admission {
    /// Judges `Workflow`s only; `WorkflowDefinition`s are let in (see [`Admission::with_definitions`]).
    pub fn new(runtime: Arc<Runtime>) -> Admission {
        Admission {
            runtime,
            definitions: None,
            package_timeout: PACKAGE_TIMEOUT,
        }
    }

    /// Judges `WorkflowDefinition`s too, pulling packages through `registry`.
    pub fn with_definitions(mut self, client: Client, packages: Arc<Packages>) -> Admission {
        self.definitions = Some(Definitions { client, packages });
        self
    }

    pub fn with_package_timeout(mut self, timeout: Duration) -> Admission {
        self.package_timeout = timeout;
        self
    }

    /// The decision on one request.
    pub async fn review(&self, req: &Request) -> Verdict {
        if always_allowed(req) {
            return Verdict::allowed();
        }
        let verdict = match (req.kind.group.as_str(), req.kind.kind.as_str()) {
            ("lyra.dev", "Workflow") => self.workflow(req).await,
            ("lyra.dev", "WorkflowDefinition") => self.definition(req).await,
            // Not ours to judge (the webhook configuration sends only these two).
            _ => Verdict::allowed(),
        };
        match verdict {
            Verdict::Denied(m) => Verdict::Denied(clip_lines(&m, CONDITION_MESSAGE_LIMIT)),
            allowed => allowed,
        }
    }

    async fn workflow(&self, req: &Request) -> Verdict {
        let Some(object) = &req.object else {
            return Verdict::allowed();
        };
        let spec: WorkflowSpec = match parse_spec(object) {
            Ok(s) => s,
            Err(m) => return Verdict::Denied(m),
        };
        let mut wf = Workflow::new(&object_name(req, object), spec);
        wf.metadata.namespace = object.metadata.namespace.clone().or_else(|| req.namespace.clone());
        wf.metadata.uid = object.metadata.uid.clone();
        wf.metadata.generation = object.metadata.generation;
        let Some(job) = Job::from_workflow(&wf) else {
            return Verdict::allowed();
        };
        if let Err(m) = parse_interval(job.refresh_interval.as_deref()) {
            return Verdict::Denied(m);
        }
        match self.runtime.prepare(&job).await {
            Ok(_) => Verdict::allowed(),
            Err(failure) => judged(failure),
        }
    }

    async fn definition(&self, req: &Request) -> Verdict {
        let Some(defs) = &self.definitions else {
            return Verdict::allowed();
        };
        let Some(object) = &req.object else {
            return Verdict::allowed();
        };
        let spec: WorkflowDefinitionSpec = match parse_spec(object) {
            Ok(s) => s,
            Err(m) => return Verdict::Denied(m),
        };
        // The status is the controller's; one it cannot read is none.
        let status: WorkflowDefinitionStatus = object
            .status
            .as_ref()
            .and_then(|s| serde_json::from_str(s.get()).ok())
            .unwrap_or_default();
        let mut metadata = object.metadata.clone();
        metadata.name = Some(object_name(req, object));
        let def = WorkflowDefinition {
            metadata,
            spec,
            status: None,
        };
        match self.check_definition(defs, &def, &status).await {
            Ok(verdict) => verdict,
            Err(Refusal::Stalled(reason, m)) => judged(Failure::new(reason, m)),
            Err(Refusal::Retry(_, m)) => Verdict::warn(format!(
                "the package could not be checked now ({m}); the controller registers it when it can"
            )),
        }
    }

    /// The registrar's checks, in its order, without applying anything.
    async fn check_definition(
        &self,
        defs: &Definitions,
        def: &WorkflowDefinition,
        status: &WorkflowDefinitionStatus,
    ) -> Result<Verdict, Refusal> {
        registrar::check_names_kept(def, status)?;
        let reference = registrar::parse_reference(&def.spec.package)?;
        let timed_out = |what: &str| {
            Verdict::warn(format!(
                "{what} did not answer within {}s; the controller registers the definition when it can",
                self.package_timeout.as_secs()
            ))
        };
        let Ok(package) = tokio::time::timeout(self.package_timeout, defs.packages.get(&reference)).await else {
            return Ok(timed_out("the registry"));
        };
        let package = package?;
        let pinned = reference.pinned(&package.digest).to_string();
        let main = registrar::load(&package, &self.runtime)?;
        let crd = registrar::desired_crd(def, &package, &main, &pinned)?;
        let crds: Api<CustomResourceDefinition> = Api::all(defs.client.clone());
        let existing = match tokio::time::timeout(self.package_timeout, crds.get_opt(&def.spec.crd_name())).await {
            Err(_) => return Ok(timed_out("the API server")),
            Ok(Err(e)) => {
                return Ok(Verdict::warn(format!(
                    "the served kind could not be compared ({e}); the controller checks it when it registers"
                )));
            }
            Ok(Ok(existing)) => existing,
        };
        if let Some(existing) = &existing {
            registrar::check_owner(def, existing)?;
            if let Some(changes) = registrar::schema_changes(existing, &crd, &package) {
                let breaking = registrar::breaking_lines(&changes);
                if !breaking.is_empty() && !allows_breaking(def) {
                    return Err(registrar::breaking_refusal(def, &pinned, &breaking));
                }
            }
        }
        Ok(Verdict::allowed())
    }
}

/// A terminal failure is refused; anything else may pass by itself and is let in.
fn judged(failure: Failure) -> Verdict {
    if failure.class() == ErrorClass::Terminal {
        Verdict::Denied(format!("{}: {}", failure.reason, failure.message))
    } else {
        Verdict::warn(failure.message)
    }
}

/// The requests that are never refused, whatever the object holds.
fn always_allowed(req: &Request) -> bool {
    if !matches!(req.operation, Operation::Create | Operation::Update) || req.sub_resource.is_some() {
        return true;
    }
    let Some(object) = &req.object else { return true };
    // Finalizer removals and the like on an object going away.
    if object.metadata.deletion_timestamp.is_some() {
        return true;
    }
    req.operation == Operation::Update
        && req
            .old_object
            .as_ref()
            .is_some_and(|old| same_spec(&req.kind.kind, old, object))
}

/// Whether two objects of `kind` have the same `spec`: the same text (the API server writes
/// it the same way each time), or equal once read.
fn same_spec(kind: &str, old: &Object, new: &Object) -> bool {
    match (&old.spec, &new.spec) {
        (None, None) => true,
        (Some(a), Some(b)) if a.get() == b.get() => true,
        // As `Workflow` specs: free-form fields nested too deep stay text and compare as such.
        // Only for Workflows: another kind's spec would read as an empty `WorkflowSpec`.
        (Some(a), Some(b)) if kind == "Workflow" => match (
            serde_json::from_str::<WorkflowSpec>(a.get()),
            serde_json::from_str::<WorkflowSpec>(b.get()),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        },
        // Anything else nested too deep to read is judged.
        (Some(a), Some(b)) => match (
            serde_json::from_str::<serde_json::Value>(a.get()),
            serde_json::from_str::<serde_json::Value>(b.get()),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        },
        _ => false,
    }
}

/// The object's spec as `T` (an absent spec is an empty one).
fn parse_spec<T: serde::de::DeserializeOwned>(object: &Object) -> Result<T, String> {
    let text = object.spec.as_ref().map_or("{}", |s| s.get());
    serde_json::from_str(text).map_err(|e| format!("spec: {e}"))
}

/// The object's name; a create by `generateName` has none yet, so its prefix stands in.
fn object_name(req: &Request, object: &Object) -> String {
    object
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| Some(req.name.clone()).filter(|n| !n.is_empty()))
        .or_else(|| object.metadata.generate_name.as_ref().map(|g| format!("{g}x")))
        .unwrap_or_else(|| "unnamed".to_owned())
}

#[cfg(test)]
mod tests;
