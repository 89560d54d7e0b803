//! Registration: a `WorkflowDefinition` becomes a CRD of its own, and the objects of that kind
//! are run by the same core as `Workflow`s ([`crate::controller::drive`]).
//!
//! The definition reconciler resolves the package (a tag once, at registration: the pinned
//! reference is kept in `status.package`), loads it, generates the CRD ([`crate::kind`]) and
//! applies it server-side, refusing a kind another definition owns and an upgrade that breaks
//! the schema. Once the CRD is established, a kube-runtime controller over `DynamicObject`s
//! of that kind runs in this process (started at run time, no restart); a new package digest
//! re-reconciles every object. The CRD carries its owner as an annotation, not an
//! ownerReference, so deleting a definition never cascades to the objects and what they
//! deployed: deletion waits until no object is left, then removes the CRD.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSONSchemaProps};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use lyra_core::diag::Sources;
use lyra_core::model::Workflow as Model;
use lyra_package::{Package, Reference, RegistryOptions};
use tokio::sync::watch;

use crate::controller::{self as wiring, Context, ControllerConfig, Error, MANAGER};
use crate::crd::WorkflowStatus;
use crate::definition::{
    DEFINITION_FINALIZER, SchemaChangeSummary, WorkflowDefinition, WorkflowDefinitionStatus, allows_breaking,
};
use crate::kind::{self, DEFINITION_ANNOTATION as OWNER_ANNOTATION, InstanceSpec, KindNames, PackageInfo};
use crate::reason::Reason;
use crate::reconcile::{Job, Note, ObjectKey, Origin, PackageRef, WorkflowRef, diagnostics_text};
use crate::status::{READY, STALLED, set_condition};

/// On a generated CRD: the pinned package it was generated from, so a restarted controller
/// serves what the CRD says even while an upgrade is refused.
pub const PACKAGE_ANNOTATION: &str = "lyra.dev/package";

/// How often a Ready definition is looked at again (its instance count).
const RECHECK: Duration = Duration::from_secs(30);
/// How often a deletion that waits for instances looks again.
const DELETION_POLL: Duration = Duration::from_secs(3);

/// What a served kind runs now.
#[derive(Debug)]
pub struct Served {
    pub package: Arc<Package>,
    pub main: Arc<Model>,
}

struct KindHandle {
    definition: String,
    current: watch::Sender<Arc<Served>>,
    task: tokio::task::JoinHandle<()>,
}

/// The definition reconciler's shared state: the kinds served by this process.
pub struct Registrar {
    ctx: Arc<Context>,
    kinds: Mutex<HashMap<String, KindHandle>>,
    packages: Arc<Packages>,
    /// Where objects of registered kinds are watched, and how many are reconciled at once,
    /// as for `Workflow`s.
    config: ControllerConfig,
    shutdown: watch::Receiver<bool>,
}

impl std::fmt::Debug for Registrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registrar").finish_non_exhaustive()
    }
}

/// How far a registration got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Registered {
    /// The CRD is applied, not established yet: look again soon.
    Establishing,
    /// The kind is served.
    Served,
}

/// Why a registration is not (yet) served.
pub(crate) enum Refusal {
    /// Terminal until the definition (or the cluster) changes.
    Stalled(Reason, String),
    /// Will pass by itself; try again.
    Retry(Reason, String),
}

impl Registrar {
    /// `config`: where objects of registered kinds are watched and how many at once.
    /// `packages` may be shared with admission, so a package is pulled once.
    pub fn new(
        ctx: Arc<Context>,
        packages: Arc<Packages>,
        config: ControllerConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Registrar {
        Registrar {
            ctx,
            kinds: Mutex::new(HashMap::new()),
            packages,
            config,
            shutdown,
        }
    }

    fn client(&self) -> Client {
        self.ctx.client.clone()
    }

    /// Runs the definition reconciler until `shutdown`; the kinds' controllers stop with it.
    pub async fn run(self: Arc<Self>) {
        let api: Api<WorkflowDefinition> = Api::all(self.client());
        // Without the CRD, every watch would fail: say so once, and serve Workflows only.
        if let Err(kube::Error::Api(s)) = api.list_metadata(&ListParams::default().limit(1)).await
            && s.is_not_found()
        {
            tracing::warn!(
                "the WorkflowDefinition CRD (workflowdefinitions.lyra.dev) is not installed: registration is off; install it with `lyra crd | kubectl apply -f -` and restart"
            );
            return;
        }
        let mut rx = self.shutdown.clone();
        let trigger = async move {
            let _ = rx.wait_for(|down| *down).await;
        };
        Controller::new(api, watcher::Config::default())
            .graceful_shutdown_on(trigger)
            .run(reconcile_definition, definition_error_policy, Arc::clone(&self))
            .for_each(|result| async move {
                match result {
                    Ok((obj, _)) => tracing::debug!(definition = %obj.name, "reconciled"),
                    Err(e) => tracing::warn!(error = %e, "definition reconcile failed"),
                }
            })
            .await;
        let handles: Vec<_> = self
            .kinds
            .lock()
            .expect("kinds lock")
            .drain()
            .map(|(_, h)| h.task)
            .collect();
        for task in handles {
            let _ = task.await;
        }
    }

    /// Registers (or upgrades) the definition's kind; fills in `status` as it goes.
    async fn register(
        &self,
        def: &WorkflowDefinition,
        status: &mut WorkflowDefinitionStatus,
    ) -> Result<Registered, Refusal> {
        let name = def.name_any();
        let spec = &def.spec;
        let crd_name = spec.crd_name();
        check_names_kept(def, status)?;
        // A tag is resolved once: later reconciles of the same generation use the pin.
        let text = match &status.package {
            Some(pinned) if status.observed_generation == def.metadata.generation => pinned.clone(),
            _ => spec.package.clone(),
        };
        let reference = parse_reference(&text)?;
        let package = self.packages.get(&reference).await?;
        let pinned = reference.pinned(&package.digest).to_string();
        status.package = Some(pinned.clone());
        let main = load(&package, &self.ctx.runtime)?;
        let crd = desired_crd(def, &package, &main, &pinned)?;

        let crds: Api<CustomResourceDefinition> = Api::all(self.client());
        let existing = crds.get_opt(&crd_name).await.map_err(api_refusal)?;
        if let Some(existing) = &existing {
            check_owner(def, existing)?;
            let old_digest = existing.annotations().get(kind::DIGEST_ANNOTATION).cloned();
            let old_pinned = existing.annotations().get(PACKAGE_ANNOTATION).cloned();
            if let Some(changes) = schema_changes(existing, &crd, &package) {
                let breaking = breaking_lines(&changes);
                if !breaking.is_empty() && !allows_breaking(def) {
                    status.breaking_changes = breaking.clone();
                    // The kind keeps being served from the package its CRD was made from.
                    if let Some(old) = old_pinned {
                        self.serve_from_crd(&name, existing, &old).await;
                    }
                    return Err(breaking_refusal(def, &pinned, &breaking));
                }
                status.last_schema_change = Some(SchemaChangeSummary {
                    time: Time(Timestamp::now()),
                    from_digest: old_digest,
                    to_digest: package.digest.clone(),
                    changes: changes
                        .iter()
                        .map(|c| format!("{}: {}", c.path, c.description))
                        .collect(),
                });
            }
        }
        status.breaking_changes.clear();
        let applied = crds
            .patch(&crd_name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd))
            .await
            .map_err(api_refusal)?;
        // The kind is this definition's from now on (its names can no longer change).
        status.crd_name = Some(crd_name.clone());
        status.digest = Some(package.digest.clone());
        status.version = Some(package.manifest.version.clone());
        if !established(&applied) {
            status.message = Some(format!(
                "waiting for CustomResourceDefinition {crd_name} to be established"
            ));
            return Ok(Registered::Establishing);
        }
        let resource = api_resource(&applied);
        self.serve(&name, &crd_name, resource.clone(), Served { package, main });
        let instances = Api::<DynamicObject>::all_with(self.client(), &resource)
            .list_metadata(&ListParams::default())
            .await
            .map_err(api_refusal)?;
        status.instances = Some(i32::try_from(instances.items.len()).unwrap_or(i32::MAX));
        status.message = Some(format!("serving kind {} ({crd_name}) from {pinned}", spec.kind));
        Ok(Registered::Served)
    }

    /// Serves the kind from the package its CRD names (after a restart, while an upgrade is
    /// refused), unless it is served already.
    async fn serve_from_crd(&self, definition: &str, crd: &CustomResourceDefinition, pinned: &str) {
        let crd_name = crd.name_any();
        if self.kinds.lock().expect("kinds lock").contains_key(&crd_name) {
            return;
        }
        let Ok(reference) = Reference::parse(pinned) else {
            return;
        };
        let Ok(package) = self.packages.get(&reference).await else {
            return;
        };
        let Ok(main) = load(&package, &self.ctx.runtime) else {
            return;
        };
        self.serve(definition, &crd_name, api_resource(crd), Served { package, main });
    }

    /// Starts the kind's controller, or points the running one at a new package (every
    /// object is then reconciled again).
    fn serve(&self, definition: &str, crd_name: &str, resource: ApiResource, served: Served) {
        let mut kinds = self.kinds.lock().expect("kinds lock");
        if let Some(h) = kinds.get(crd_name)
            && !h.task.is_finished()
        {
            if h.current.borrow().package.digest != served.package.digest {
                tracing::info!(kind = %crd_name, digest = %served.package.digest, "upgrading the kind's objects");
                h.current.send_replace(Arc::new(served));
            }
            return;
        }
        tracing::info!(kind = %crd_name, digest = %served.package.digest, "serving a registered kind");
        let (tx, rx) = watch::channel(Arc::new(served));
        let kind_ctx = Arc::new(KindContext {
            ctx: Arc::clone(&self.ctx),
            resource,
            served: rx.clone(),
        });
        let task = tokio::spawn(run_kind(kind_ctx, rx, self.config.clone(), self.shutdown.clone()));
        kinds.insert(
            crd_name.to_owned(),
            KindHandle {
                definition: definition.to_owned(),
                current: tx,
                task,
            },
        );
    }

    /// Deletion: waits while objects of the kind exist (`Ok(Some(how many))`), then removes
    /// the CRD (`Ok(None)`: the finalizer may go).
    async fn unregister(
        &self,
        def: &WorkflowDefinition,
        status: &mut WorkflowDefinitionStatus,
    ) -> Result<Option<usize>, Refusal> {
        let name = def.name_any();
        let crd_name = status.crd_name.clone().unwrap_or_else(|| def.spec.crd_name());
        let crds: Api<CustomResourceDefinition> = Api::all(self.client());
        let Some(crd) = crds.get_opt(&crd_name).await.map_err(api_refusal)? else {
            self.stop(&crd_name, &name);
            return Ok(None);
        };
        // Never another definition's CRD (this one was refused it).
        if crd.annotations().get(OWNER_ANNOTATION) != Some(&name) {
            return Ok(None);
        }
        let instances = Api::<DynamicObject>::all_with(self.client(), &api_resource(&crd))
            .list_metadata(&ListParams::default())
            .await
            .map_err(api_refusal)?;
        let left = instances.items.len();
        status.instances = Some(i32::try_from(left).unwrap_or(i32::MAX));
        if left > 0 {
            return Ok(Some(left));
        }
        self.stop(&crd_name, &name);
        match crds.delete(&crd_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(api_refusal(e)),
        }
        Ok(None)
    }

    fn stop(&self, crd_name: &str, definition: &str) {
        let mut kinds = self.kinds.lock().expect("kinds lock");
        if kinds.get(crd_name).is_some_and(|h| h.definition == definition)
            && let Some(h) = kinds.remove(crd_name)
        {
            h.task.abort();
        }
    }
}

/// Packages pulled through a registry, kept by digest (a digest is its content).
pub struct Packages {
    registry: RegistryOptions,
    cache: Mutex<HashMap<String, Arc<Package>>>,
}

impl Packages {
    pub fn new(registry: RegistryOptions) -> Packages {
        Packages {
            registry,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The package a reference names (a tag is asked for each time), pulled once per digest.
    pub(crate) async fn get(&self, reference: &Reference) -> Result<Arc<Package>, Refusal> {
        let digest = lyra_package::resolve_digest(reference, &self.registry)
            .await
            .map_err(package_refusal)?;
        if let Some(p) = self.cache.lock().expect("packages lock").get(&digest) {
            return Ok(Arc::clone(p));
        }
        let package = Arc::new(
            lyra_package::resolve(&reference.pinned(&digest), &self.registry)
                .await
                .map_err(package_refusal)?,
        );
        self.cache
            .lock()
            .expect("packages lock")
            .insert(package.digest.clone(), Arc::clone(&package));
        Ok(package)
    }
}

// The checks of a registration, each a pure function of the definition, its package and the
// CRD served: the registrar applies what passes them, admission refuses what does not.

/// A definition's kind, plural and group cannot change once registered: the old kind's
/// objects would be left without a controller.
pub(crate) fn check_names_kept(def: &WorkflowDefinition, status: &WorkflowDefinitionStatus) -> Result<(), Refusal> {
    let crd_name = def.spec.crd_name();
    match &status.crd_name {
        Some(registered) if *registered != crd_name => Err(Refusal::Stalled(
            Reason::InvalidSpec,
            format!(
                "this definition registered {registered}; its kind, plural and group cannot change (to {crd_name}); register the new kind with a definition of its own"
            ),
        )),
        _ => Ok(()),
    }
}

/// `spec.package` (or its pin) as a reference.
pub(crate) fn parse_reference(text: &str) -> Result<Reference, Refusal> {
    Reference::parse(text).map_err(|e| Refusal::Stalled(Reason::InvalidPackage, format!("spec.package: {e}")))
}

/// The CRD the definition registers with `package` (pinned as `pinned`), whose main workflow
/// is `main`.
pub(crate) fn desired_crd(
    def: &WorkflowDefinition,
    package: &Package,
    main: &Model,
    pinned: &str,
) -> Result<CustomResourceDefinition, Refusal> {
    let spec = &def.spec;
    let mut names = KindNames::new(&spec.kind, Some(spec.group()));
    names.plural = spec.plural.clone();
    if let Some(s) = &spec.singular {
        names.singular = s.clone();
    }
    names.short_names = spec.short_names.clone();
    for c in &spec.categories {
        if !names.categories.contains(c) {
            names.categories.push(c.clone());
        }
    }
    let info = PackageInfo {
        definition: def.name_any(),
        digest: package.digest.clone(),
        version: package.manifest.version.clone(),
    };
    let mut crd = kind::generate_crd(&names, main, &info)
        .map_err(|e| Refusal::Stalled(Reason::InvalidPackage, format!("package {pinned}: {e}")))?;
    crd.metadata.name = Some(spec.crd_name());
    crd.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(PACKAGE_ANNOTATION.to_owned(), pinned.to_owned());
    Ok(crd)
}

/// A CRD of that name exists: it must be this definition's.
pub(crate) fn check_owner(def: &WorkflowDefinition, existing: &CustomResourceDefinition) -> Result<(), Refusal> {
    let crd_name = def.spec.crd_name();
    match existing.annotations().get(OWNER_ANNOTATION) {
        Some(o) if *o == def.name_any() => Ok(()),
        Some(o) => Err(Refusal::Stalled(
            Reason::KindTaken,
            format!(
                "kind {} ({crd_name}) is already registered by WorkflowDefinition {o}; choose another kind, plural or group, or delete {o} first",
                def.spec.kind
            ),
        )),
        None => Err(Refusal::Stalled(
            Reason::KindTaken,
            format!(
                "CustomResourceDefinition {crd_name} exists and was not made by Lyra; choose another plural or group"
            ),
        )),
    }
}

/// How serving `crd` (from `package`) would change the schema `existing` serves; `None` when
/// `existing` was made from the same digest (the same digest under another tag is no change).
pub(crate) fn schema_changes(
    existing: &CustomResourceDefinition,
    crd: &CustomResourceDefinition,
    package: &Package,
) -> Option<Vec<kind::SchemaChange>> {
    let old_digest = existing.annotations().get(kind::DIGEST_ANNOTATION);
    (old_digest.map(String::as_str) != Some(package.digest.as_str()))
        .then(|| kind::schema_changes(&spec_of(existing), &spec_of(crd)))
}

/// The breaking changes among `changes`, as `path: what`.
pub(crate) fn breaking_lines(changes: &[kind::SchemaChange]) -> Vec<String> {
    changes
        .iter()
        .filter(|c| c.breaking)
        .map(|c| format!("{}: {}", c.path, c.description))
        .collect()
}

/// The refusal of an upgrade to `pinned` that breaks the kind's schema.
pub(crate) fn breaking_refusal(def: &WorkflowDefinition, pinned: &str, breaking: &[String]) -> Refusal {
    Refusal::Stalled(
        Reason::BreakingChange,
        format!(
            "the upgrade to {pinned} breaks the schema of kind {} ({} change(s)): {}; to apply it anyway, annotate the definition with lyra.dev/allow-breaking=true (or run lyra register --allow-breaking)",
            def.spec.kind,
            breaking.len(),
            breaking.join("; ")
        ),
    )
}

/// Loads and validates the package's main workflow (calls resolve within the package).
pub(crate) fn load(package: &Package, runtime: &crate::reconcile::Runtime) -> Result<Arc<Model>, Refusal> {
    let mut sources = Sources::default();
    lyra_core::program::load(
        &package.manifest.name,
        package.main(),
        &mut package.source(),
        &mut sources,
        runtime.schemas(),
    )
    .map(|p| p.main)
    .map_err(|d| {
        Refusal::Stalled(
            Reason::InvalidPackage,
            format!(
                "package {} is not a valid workflow:\n{}",
                package.pinned_name(),
                diagnostics_text(&d, &sources, &Origin::default())
            ),
        )
    })
}

fn package_refusal(e: lyra_package::Error) -> Refusal {
    use lyra_package::Error as E;
    match e {
        E::Unreachable { .. } | E::Registry { .. } | E::Io { .. } => {
            Refusal::Retry(Reason::PackageUnavailable, e.to_string())
        }
        other => Refusal::Stalled(Reason::InvalidPackage, other.to_string()),
    }
}

fn api_refusal(e: kube::Error) -> Refusal {
    Refusal::Retry(Reason::PackageUnavailable, format!("Kubernetes API: {e}"))
}

/// The `spec` schema a CRD serves (empty if it has none).
fn spec_of(crd: &CustomResourceDefinition) -> JSONSchemaProps {
    kind::served_spec_schema(crd).cloned().unwrap_or_default()
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
}

/// How kube addresses objects of the CRD's kind.
pub(crate) fn api_resource(crd: &CustomResourceDefinition) -> ApiResource {
    let version = crd.spec.versions.first().map_or("v1alpha1", |v| v.name.as_str());
    ApiResource {
        group: crd.spec.group.clone(),
        version: version.to_owned(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

async fn reconcile_definition(def: Arc<WorkflowDefinition>, reg: Arc<Registrar>) -> Result<Action, Error> {
    let api: Api<WorkflowDefinition> = Api::all(reg.client());
    let deleting = def.metadata.deletion_timestamp.is_some();
    let finalizer_at = def.finalizers().iter().position(|f| f == DEFINITION_FINALIZER);
    let finalizer_at = match (finalizer_at, deleting) {
        (None, true) => return Ok(Action::await_change()),
        (None, false) => {
            wiring::add_finalizer(&api, &*def, DEFINITION_FINALIZER, None).await?;
            return Ok(Action::await_change());
        }
        (Some(i), _) => i,
    };
    let old = def.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let now = Time(Timestamp::now());
    let generation = def.metadata.generation;
    let reference = def.object_ref(&());
    let publish = |warning: bool, reason: Reason, action: &str, message: String| {
        let note = Note {
            warning,
            reason,
            action: action.to_owned(),
            message,
            resource: None,
        };
        let reference = reference.clone();
        let reg = Arc::clone(&reg);
        async move {
            if let Err(e) = reg.ctx.events.publish(&note, &reference).await {
                tracing::warn!(reason = %note.reason, error = %e, "could not publish an event");
            }
        }
    };
    if deleting {
        let action = match reg.unregister(&def, &mut status).await {
            Ok(Some(left)) => {
                let kind = &def.spec.kind;
                let message = format!(
                    "deletion waits for {left} object(s) of kind {kind}; delete them first (kubectl delete {}.{} --all -A); their resources are never deleted with the definition",
                    def.spec.plural,
                    def.spec.group()
                );
                set_condition(
                    &mut status.conditions,
                    READY,
                    false,
                    Reason::WaitingForInstances.as_str(),
                    &message,
                    generation,
                    &now,
                );
                if status.instances != old.instances || old.message.as_deref() != Some(message.as_str()) {
                    publish(true, Reason::WaitingForInstances, "Delete", message.clone()).await;
                }
                status.message = Some(message);
                Action::requeue(DELETION_POLL)
            }
            Ok(None) => {
                wiring::remove_finalizer(&api, &*def, finalizer_at, DEFINITION_FINALIZER).await?;
                return Ok(Action::await_change());
            }
            Err(Refusal::Retry(reason, m) | Refusal::Stalled(reason, m)) => {
                set_condition(
                    &mut status.conditions,
                    READY,
                    false,
                    reason.as_str(),
                    &m,
                    generation,
                    &now,
                );
                status.message = Some(m);
                Action::requeue(DELETION_POLL)
            }
        };
        write_status(&api, &def, &old, &status).await?;
        return Ok(action);
    }
    let action = match reg.register(&def, &mut status).await {
        Ok(registered) => {
            let served = registered == Registered::Served;
            let action = if served {
                Action::requeue(RECHECK)
            } else {
                Action::requeue(Duration::from_secs(1))
            };
            let message = status.message.clone().unwrap_or_default();
            set_condition(
                &mut status.conditions,
                READY,
                served,
                if served {
                    Reason::Registered.as_str()
                } else {
                    Reason::Progressing.as_str()
                },
                &message,
                generation,
                &now,
            );
            set_condition(
                &mut status.conditions,
                STALLED,
                false,
                Reason::Registered.as_str(),
                "",
                generation,
                &now,
            );
            if served && (old.digest != status.digest || !is_true(&old, READY)) {
                publish(false, Reason::Registered, "Register", message).await;
            }
            action
        }
        Err(refusal) => {
            // A stall waits for the definition to change; a retry passes by itself.
            let (reason, m, stalled, after) = match refusal {
                Refusal::Stalled(reason, m) => (reason, m, true, RECHECK),
                Refusal::Retry(reason, m) => (reason, m, false, Duration::from_secs(5)),
            };
            set_condition(
                &mut status.conditions,
                READY,
                false,
                reason.as_str(),
                &m,
                generation,
                &now,
            );
            if stalled {
                set_condition(
                    &mut status.conditions,
                    STALLED,
                    true,
                    reason.as_str(),
                    &m,
                    generation,
                    &now,
                );
            }
            if old.message.as_deref() != Some(m.as_str()) {
                publish(true, reason, "Register", m.clone()).await;
            }
            status.message = Some(crate::status::one_line(&m));
            Action::requeue(after)
        }
    };
    status.observed_generation = generation;
    write_status(&api, &def, &old, &status).await?;
    Ok(action)
}

fn is_true(status: &WorkflowDefinitionStatus, type_: &str) -> bool {
    status.conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

async fn write_status(
    api: &Api<WorkflowDefinition>,
    def: &WorkflowDefinition,
    old: &WorkflowDefinitionStatus,
    new: &WorkflowDefinitionStatus,
) -> Result<(), Error> {
    let to_json = |s| serde_json::to_value(s).unwrap_or_default();
    let Some(patch) = crate::status::merge_patch(&to_json(old), &to_json(new)) else {
        return Ok(());
    };
    let body = serde_json::json!({ "status": patch });
    match api
        .patch_status(&def.name_any(), &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Status(e)),
    }
}

fn definition_error_policy(_def: Arc<WorkflowDefinition>, _error: &Error, _reg: Arc<Registrar>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// What the controller of one registered kind shares.
struct KindContext {
    ctx: Arc<Context>,
    resource: ApiResource,
    served: watch::Receiver<Arc<Served>>,
}

/// The controllers of one registered kind (one per watched namespace, or one for all), until
/// shutdown (or aborted when the kind goes).
async fn run_kind(
    kind: Arc<KindContext>,
    served: watch::Receiver<Arc<Served>>,
    config: ControllerConfig,
    shutdown: watch::Receiver<bool>,
) {
    let client = kind.ctx.client.clone();
    let namespaces = &config.namespaces;
    let apis: Vec<Api<DynamicObject>> = if namespaces.is_empty() {
        vec![Api::all_with(client, &kind.resource)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced_with(client.clone(), ns, &kind.resource))
            .collect()
    };
    let controllers = apis.into_iter().map(|api| {
        // Every new package re-reconciles every object.
        let upgrades = futures::stream::unfold(served.clone(), |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        });
        let mut rx = shutdown.clone();
        let trigger = async move {
            let _ = rx.wait_for(|down| *down).await;
        };
        let (reader, trigger_on) = wiring::spec_changes(api, kind.resource.clone(), Arc::clone(&kind.ctx.own));
        let turns = wiring::Turns::new(config.concurrency, reader.clone());
        Controller::for_stream_with(trigger_on, reader, kind.resource.clone())
            .with_config(controller::Config::default().concurrency(0))
            .reconcile_all_on(upgrades)
            .graceful_shutdown_on(trigger)
            .run(
                move |obj, kind| {
                    let dyntype = kind.resource.clone();
                    turns.clone().reconcile(obj, dyntype, kind, reconcile_instance)
                },
                instance_error_policy,
                Arc::clone(&kind),
            )
            .for_each(|result| async move { wiring::log_result(result) })
    });
    futures::future::join_all(controllers).await;
}

fn instance_error_policy(obj: Arc<DynamicObject>, error: &Error, kind: Arc<KindContext>) -> Action {
    wiring::error_policy(obj, error, Arc::clone(&kind.ctx))
}

async fn reconcile_instance(obj: Arc<DynamicObject>, kind: Arc<KindContext>) -> Result<Action, Error> {
    let ns = obj.namespace().ok_or(Error::Unnamed)?;
    let api = Api::<DynamicObject>::namespaced_with(kind.ctx.client.clone(), &ns, &kind.resource);
    // A status the core cannot read (edited by hand) is started afresh.
    let status: Option<WorkflowStatus> = obj
        .data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok());
    let served = Arc::clone(&kind.served.borrow());
    let client = kind.ctx.client.clone();
    let resource = kind.resource.clone();
    let object = Arc::clone(&obj);
    wiring::drive(
        &*obj,
        api,
        &kind.resource,
        status.as_ref(),
        &kind.ctx,
        |deleting| async move { instance_job(&object, &resource, &served, deleting, &client).await },
    )
    .await
}

/// The job an object of a registered kind asks for: its spec read by the kind's schema,
/// Secrets read for the sensitive parameters (not when deleting: a cleanup reads no input).
async fn instance_job(
    obj: &DynamicObject,
    resource: &ApiResource,
    served: &Served,
    deleting: bool,
    client: &Client,
) -> Option<Job> {
    let ns = obj.metadata.namespace.clone()?;
    let name = obj.metadata.name.clone()?;
    let key = ObjectKey::of_kind(format!("{}.{}", resource.plural, resource.group), &ns, name);
    let spec = obj.data.get("spec").cloned().unwrap_or_else(|| serde_json::json!({}));
    let mut job = Job {
        key,
        uid: obj.metadata.uid.clone(),
        generation: obj.metadata.generation,
        workflow: Ok(WorkflowRef::Package(PackageRef(Arc::clone(&served.package)))),
        data: None,
        refresh_interval: None,
        deletion_policy: Default::default(),
        suspend: false,
        approval: Default::default(),
        drift_policy: Default::default(),
        approved: crate::reconcile::approved(&obj.metadata),
        requested_at: crate::reconcile::requested_at(&obj.metadata),
        unavailable: None,
    };
    let parsed = match InstanceSpec::parse(&served.main, &spec) {
        Ok(p) => p,
        Err(m) => {
            job.workflow = Err(m);
            return Some(job);
        }
    };
    job.deletion_policy = parsed.deletion_policy;
    job.suspend = parsed.suspend;
    job.approval = parsed.approval;
    job.drift_policy = parsed.drift_policy;
    job.refresh_interval = parsed.refresh_interval.clone();
    let mut parsed = parsed;
    if !deleting {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        for r in parsed.secret_refs.clone() {
            match read_secret(&secrets, &r.name, &r.key).await {
                Ok(value) => parsed.insert_secret(&r, value),
                Err(m) => {
                    job.unavailable = Some(format!("spec.{}.secretKeyRef: {m}", r.param));
                    return Some(job);
                }
            }
        }
    }
    if lyra_core::names::check_deployment_name(&job.key.deployment()).is_err() {
        job.workflow = Err(format!("deployment name {:?} is not allowed", job.key.deployment()));
    }
    job.data = Some(parsed.data);
    Some(job)
}

/// A Secret's value as text. Never put the value in an error.
pub(crate) async fn read_secret(api: &Api<Secret>, name: &str, key: &str) -> Result<String, String> {
    let secret = match api.get_opt(name).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(format!("Secret {name} not found in the object's namespace")),
        Err(e) => return Err(format!("reading Secret {name}: {e}")),
    };
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return String::from_utf8(v.0.clone()).map_err(|_| format!("Secret {name} key {key} is not UTF-8 text"));
    }
    if let Some(v) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
        return Ok(v.clone());
    }
    Err(format!("Secret {name} has no key {key}"))
}
