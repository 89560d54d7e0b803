//! Wiring the reconcile core to kube-runtime: a `Controller` per watched namespace (or one
//! for all), the `lyra.dev/cleanup` finalizer, status written with merge patches on the
//! status subresource, events through [`EventPublisher`].
//!
//! The finalizer is handled here rather than by kube's `finalizer` helper: removing it must
//! treat "the object is gone" as success (a reconcile queued before the removal sees the
//! object as the watch cache last held it), and must never touch a newer object that took
//! the same name (every finalizer patch tests the uid).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt as _};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Predicate as _, PredicateConfig, WatchStreamExt as _, predicates};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use crate::crd::{FINALIZER, Workflow, WorkflowStatus};
use crate::events::EventPublisher;
use crate::reconcile::{Job, Next, Note, ReconcileError, ReportError, Reporter, Runtime};
use crate::status::merge_patch;

/// The field manager and event reporter name.
pub const MANAGER: &str = "lyra-controller";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object has no namespace, name or uid")]
    Unnamed,
    #[error("failed to apply: {0}")]
    Apply(#[source] ReconcileError),
    #[error("failed to clean up: {0}")]
    Cleanup(#[source] ReconcileError),
    #[error("failed to add the finalizer: {0}")]
    AddFinalizer(#[source] kube::Error),
    #[error("failed to remove the finalizer: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("failed to write the status: {0}")]
    Status(#[source] kube::Error),
}

impl Error {
    fn reconcile_error(&self) -> Option<&ReconcileError> {
        match self {
            Error::Apply(r) | Error::Cleanup(r) => Some(r),
            _ => None,
        }
    }

    /// When to try again, if the error says.
    fn retry_after(&self) -> Option<Duration> {
        match self.reconcile_error()? {
            ReconcileError::Retry { after, .. } | ReconcileError::Wait(after) => Some(*after),
            ReconcileError::Report(_) => None,
        }
    }

    fn is_wait(&self) -> bool {
        matches!(self.reconcile_error(), Some(ReconcileError::Wait(_)))
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub runtime: Arc<Runtime>,
    pub events: EventPublisher,
    /// Finalizers this controller added, so that their watch events trigger nothing.
    pub(crate) own: Arc<OwnWrites>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// `instance` names this replica in events (e.g. the pod name).
    pub fn new(client: Client, runtime: Arc<Runtime>, instance: Option<String>) -> Context {
        Context {
            events: EventPublisher::new(client.clone(), MANAGER, instance),
            client,
            runtime,
            own: Arc::default(),
        }
    }
}

/// Which objects to watch, and how many to reconcile at once.
#[derive(Debug, Clone, Default)]
pub struct ControllerConfig {
    /// Empty: every namespace.
    pub namespaces: Vec<String>,
    /// Reconciles at once per watched namespace (0: unbounded).
    pub concurrency: u16,
}

/// Fails with a hint when the Workflow CRD is not installed (or not readable).
pub async fn check_crd(client: &Client, config: &ControllerConfig) -> Result<(), String> {
    let apis: Vec<Api<Workflow>> = if config.namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        config
            .namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    for api in apis {
        if let Err(e) = api.list(&ListParams::default().limit(1)).await {
            return Err(match &e {
                kube::Error::Api(s) if s.is_not_found() => format!(
                    "the Workflow CRD (workflows.lyra.dev) is not installed: run `lyra crd | kubectl apply -f -` ({e})"
                ),
                _ => format!("cannot list Workflow objects: {e}"),
            });
        }
    }
    Ok(())
}

/// Runs the controllers until `shutdown` turns true, then stops taking work, interrupts the
/// runs in progress cleanly (running steps finish and are recorded, leases are released)
/// and returns when they are done.
pub async fn run(ctx: Arc<Context>, config: ControllerConfig, shutdown: watch::Receiver<bool>) {
    let apis: Vec<Api<Workflow>> = if config.namespaces.is_empty() {
        vec![Api::all(ctx.client.clone())]
    } else {
        config
            .namespaces
            .iter()
            .map(|ns| Api::namespaced(ctx.client.clone(), ns))
            .collect()
    };
    let runtime = Arc::clone(&ctx.runtime);
    let mut stop = shutdown.clone();
    let interrupter = tokio::spawn(async move {
        if stop.wait_for(|down| *down).await.is_ok() {
            runtime.shut_down();
        }
    });
    let controllers = apis.into_iter().map(|api| {
        let mut rx = shutdown.clone();
        let trigger = async move {
            let _ = rx.wait_for(|down| *down).await;
        };
        let (reader, trigger_on) = spec_changes(api, (), Arc::clone(&ctx.own));
        let turns = Turns::new(config.concurrency, reader.clone());
        Controller::for_stream(trigger_on, reader)
            .with_config(controller::Config::default().concurrency(0))
            .graceful_shutdown_on(trigger)
            .run(
                move |wf, ctx| turns.clone().reconcile(wf, (), ctx, reconcile),
                error_policy,
                Arc::clone(&ctx),
            )
            .for_each(|result| async move { log_result(result) })
    });
    futures::future::join_all(controllers).await;
    interrupter.abort();
}

/// Reconciles at once, handed out in the order they were asked for. kube's own limit parks
/// the objects waiting for a slot in a hash set, taken in no particular order and scanned
/// on every poll: under a burst the first object to arrive could be among the last
/// reconciled, and each start cost a pass over all the waiting. So kube runs every reconcile
/// at once (it still never runs two of one object) and each waits here, first come first
/// served, holding only the small future that waits: the reconcile proper is made (and
/// boxed) once its turn comes.
pub(crate) struct Turns<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// None: unbounded.
    permits: Option<Arc<tokio::sync::Semaphore>>,
    cache: reflector::Store<K>,
}

impl<K: Resource + 'static> Clone for Turns<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn clone(&self) -> Self {
        Turns {
            permits: self.permits.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<K> Turns<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// `concurrency` 0: unbounded.
    pub(crate) fn new(concurrency: u16, cache: reflector::Store<K>) -> Turns<K> {
        Turns {
            permits: (concurrency > 0).then(|| Arc::new(tokio::sync::Semaphore::new(concurrency.into()))),
            cache,
        }
    }

    /// Waits for `obj`'s turn; answers the turn (held until dropped) and the object as the
    /// watch cache has it then, which may be newer than the one queued. None: the object
    /// went meanwhile.
    pub(crate) async fn take(
        &self,
        obj: Arc<K>,
        dyntype: K::DynamicType,
    ) -> Option<(Option<tokio::sync::OwnedSemaphorePermit>, Arc<K>)> {
        let Some(permits) = &self.permits else {
            return Some((None, obj));
        };
        // Never closed, so this only waits.
        let turn = Arc::clone(permits).acquire_owned().await.ok();
        let latest = self.cache.get(&ObjectRef::from_obj_with(obj.as_ref(), dyntype))?;
        Some((turn, latest))
    }

    /// `reconcile` of `obj` in its turn; nothing to do for an object gone meanwhile.
    pub(crate) async fn reconcile<C, Fut>(
        self,
        obj: Arc<K>,
        dyntype: K::DynamicType,
        ctx: Arc<C>,
        reconcile: impl FnOnce(Arc<K>, Arc<C>) -> Fut,
    ) -> Result<Action, Error>
    where
        Fut: Future<Output = Result<Action, Error>>,
    {
        let Some((_turn, obj)) = self.take(obj, dyntype).await else {
            return Ok(Action::await_change());
        };
        Box::pin(reconcile(obj, ctx)).await
    }
}

/// What the trigger looks at in an object: a change to any of it is a reason to reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Asks {
    generation: Option<i64>,
    annotations: std::collections::BTreeMap<String, String>,
    finalizers: Vec<String>,
    deleting: bool,
}

impl Asks {
    fn of(meta: &kube::api::ObjectMeta) -> Asks {
        Asks {
            generation: meta.generation,
            annotations: meta.annotations.clone().unwrap_or_default(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }
}

/// The finalizers this controller is adding, by object uid, each with what the object asks
/// for once it is on. The watch event of that very write is dropped from the trigger: the
/// reconcile that added the finalizer goes on to apply, so the event would only start a
/// second, idle reconcile of every new object. An event that differs in anything else (a
/// user's edit in between) still triggers.
#[derive(Debug, Default)]
pub(crate) struct OwnWrites(std::sync::Mutex<std::collections::HashMap<String, Asks>>);

impl OwnWrites {
    fn expect(&self, uid: &str, asks: Asks) {
        self.0.lock().expect("own writes lock").insert(uid.to_owned(), asks);
    }

    fn forget(&self, uid: &str) {
        self.0.lock().expect("own writes lock").remove(uid);
    }

    /// Whether `meta` is the result of a write this controller expects, and so no reason to
    /// reconcile. An event showing the write done some other way ends the expectation.
    fn is_own(&self, meta: &kube::api::ObjectMeta) -> bool {
        let Some(uid) = meta.uid.as_deref() else { return false };
        let mut own = self.0.lock().expect("own writes lock");
        let Some(expected) = own.get(uid) else { return false };
        let asks = Asks::of(meta);
        if asks == *expected {
            own.remove(uid);
            return true;
        }
        // The finalizer we added (the last one expected) is on, in an object unlike the one
        // expected: whatever happened, the event that matches can no longer come.
        if expected
            .finalizers
            .last()
            .is_some_and(|ours| asks.finalizers.contains(ours))
        {
            own.remove(uid);
        }
        false
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().expect("own writes lock").len()
    }
}

/// The objects of `api` as a controller's trigger: each when what it asks for changes (its
/// generation, annotations, finalizers or deletion), not when its status is written, which
/// is our own doing, nor when the change is our adding the finalizer (see [`OwnWrites`]).
/// So an object's status writes cause no reconcile of it; its periodic refreshes and
/// retries are the controller's schedule, not watch events. Also the cache the reconciles
/// read (kept up to date with every event, status writes included).
pub(crate) fn spec_changes<K>(
    api: Api<K>,
    dyntype: K::DynamicType,
    own: Arc<OwnWrites>,
) -> (
    reflector::Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dyntype);
    let reader = writer.as_reader();
    let deletion = |o: &K| {
        o.meta()
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0.as_millisecond().unsigned_abs())
    };
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::annotations)
                .combine(predicates::finalizers)
                .combine(deletion),
            PredicateConfig::default(),
        )
        // After the predicates, which must see every change to know the next one.
        .try_filter(move |o| std::future::ready(!own.is_own(o.meta())));
    (reader, stream)
}

/// Logs what a controller did with one object: a wait for a lease is routine, a failure is
/// a warning. Shared by `Workflow`s and registered kinds.
pub(crate) fn log_result<K>(result: Result<(ObjectRef<K>, Action), controller::Error<Error, watcher::Error>>)
where
    K: Resource,
    ObjectRef<K>: std::fmt::Display,
{
    match result {
        Ok((obj, _)) => tracing::debug!(object = %obj, "reconciled"),
        Err(controller::Error::ReconcilerFailed(e, obj)) if e.is_wait() => {
            tracing::debug!(object = %obj, "{e}");
        }
        Err(controller::Error::ReconcilerFailed(e, obj)) => {
            tracing::warn!(object = %obj, error = %e, "reconcile failed");
        }
        Err(controller::Error::ObjectNotFound(obj)) => {
            tracing::debug!(object = %obj, "object gone before its reconcile");
        }
        Err(e) => tracing::warn!(error = %e, "controller error"),
    }
}

async fn reconcile(wf: Arc<Workflow>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&wf, &ctx).await;
    let label = match &result {
        Ok(_) => "ok",
        Err(e) if e.is_wait() => "waiting",
        Err(_) => "error",
    };
    ctx.runtime.metrics().reconciled(label, started.elapsed());
    result
}

async fn reconcile_inner(wf: &Workflow, ctx: &Context) -> Result<Action, Error> {
    let ns = wf.namespace().ok_or(Error::Unnamed)?;
    let api: Api<Workflow> = Api::namespaced(ctx.client.clone(), &ns);
    let status = wf.status.clone();
    drive(wf, api, &(), status.as_ref(), ctx, |_| async { Job::from_workflow(wf) }).await
}

/// One reconcile of an object the core runs (a `Workflow`, or an object of a registered
/// kind): the finalizer, then apply or cleanup, reporting to the object's status and events.
/// `job` builds the job once the finalizer is in place; it is told whether the object is
/// being deleted (a cleanup needs no input, so nothing is read for it).
pub(crate) async fn drive<K, F, Fut>(
    obj: &K,
    api: Api<K>,
    dt: &K::DynamicType,
    status: Option<&WorkflowStatus>,
    ctx: &Context,
    job: F,
) -> Result<Action, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync,
    F: FnOnce(bool) -> Fut,
    Fut: Future<Output = Option<Job>>,
{
    let finalizer_at = obj.finalizers().iter().position(|f| f == FINALIZER);
    let deleting = obj.meta().deletion_timestamp.is_some();
    let finalizer_at = match (finalizer_at, deleting) {
        // Not ours (any more): nothing to clean up.
        (None, true) => return Ok(Action::await_change()),
        // The finalizer goes on before anything is applied; once it is on, this reconcile
        // goes on to apply (waiting for the change it makes would be a round trip per object).
        (None, false) => {
            if !add_finalizer(&api, obj, FINALIZER, Some(&ctx.own)).await? {
                return Ok(Action::await_change());
            }
            obj.finalizers().len()
        }
        (Some(i), _) => i,
    };
    let Some(job) = job(deleting).await else {
        return Err(Error::Unnamed);
    };
    let reporter = KubeReporter {
        api: api.clone(),
        name: job.key.name.clone(),
        events: &ctx.events,
        reference: obj.object_ref(dt),
    };
    if !deleting {
        let next = ctx.runtime.apply(&job, status, &reporter).await.map_err(Error::Apply)?;
        return Ok(match next {
            Next::Requeue(d) => Action::requeue(d),
            Next::Done => Action::await_change(),
        });
    }
    match ctx
        .runtime
        .cleanup(&job, status, &reporter)
        .await
        .map_err(Error::Cleanup)?
    {
        Next::Done => {
            remove_finalizer(&api, obj, finalizer_at, FINALIZER).await?;
            Ok(Action::await_change())
        }
        Next::Requeue(d) => Ok(Action::requeue(d)),
    }
}

/// A JSON patch from its JSON form (kube takes the `json_patch` crate's type).
fn json_patch(ops: serde_json::Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(ops).expect("a well-formed JSON patch"))
}

/// Adds `finalizer`, provided the object is still the one seen and nobody changed its
/// finalizers meanwhile (the apiserver does not deduplicate finalizers): `true` when this
/// call added it, `false` when the object is gone or changed (the reconcile of that change
/// does the rest). With `own`, the write's watch event is expected there, to trigger nothing.
pub(crate) async fn add_finalizer<K>(
    api: &Api<K>,
    wf: &K,
    finalizer: &str,
    own: Option<&OwnWrites>,
) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = wf.meta().name.as_deref().ok_or(Error::Unnamed)?;
    let uid = wf.meta().uid.as_deref().ok_or(Error::Unnamed)?;
    // Expected before the write (its event may come before its response); forgotten below
    // when this call did not add it.
    if let Some(own) = own {
        let mut after = Asks::of(wf.meta());
        after.finalizers.push(finalizer.to_owned());
        own.expect(uid, after);
    }
    let added = async {
        let finalizers = wf.finalizers();
        let (test, add) = if finalizers.is_empty() {
            (
                serde_json::Value::Null,
                serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}),
            )
        } else {
            (
                serde_json::json!(finalizers),
                serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}),
            )
        };
        let patch = json_patch(serde_json::json!([
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": "/metadata/finalizers", "value": test},
            add,
        ]));
        let refused = match api.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(false),
            // A failed `test`: the cache was behind (the finalizer may be there already).
            Err(e @ kube::Error::Api(_)) => e,
            Err(e) => return Err(Error::AddFinalizer(e)),
        };
        match api.get_opt(name).await {
            Ok(Some(now))
                if now.meta().uid.as_deref() == Some(uid) && !now.finalizers().iter().any(|f| f == finalizer) =>
            {
                Err(Error::AddFinalizer(refused))
            }
            // Gone, re-created, or already carrying it: the reconcile on that change does the rest.
            Ok(_) => Ok(false),
            Err(e) => Err(Error::AddFinalizer(e)),
        }
    }
    .await;
    if let Some(own) = own
        && !matches!(added, Ok(true))
    {
        own.forget(uid);
    }
    added
}

/// Removes the finalizer at `index` once cleanup is done. The object being gone already, or
/// the name now belonging to another object, or the finalizer having been removed by someone
/// else, all mean the same: this object's finalizer is no longer there, which is the goal.
pub(crate) async fn remove_finalizer<K>(api: &Api<K>, wf: &K, index: usize, finalizer: &str) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = wf.meta().name.as_deref().ok_or(Error::Unnamed)?;
    let uid = wf.meta().uid.as_deref().ok_or(Error::Unnamed)?;
    let path = format!("/metadata/finalizers/{index}");
    let patch = json_patch(serde_json::json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]));
    let refused = match api.patch(name, &PatchParams::default(), &patch).await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            tracing::debug!(object = %name, "finalizer: the object is already gone");
            return Ok(());
        }
        // A failed `test`: the object changed since the cache saw it.
        Err(e @ kube::Error::Api(_)) => e,
        Err(e) => return Err(Error::RemoveFinalizer(e)),
    };
    match api.get_opt(name).await {
        Ok(None) => Ok(()),
        Ok(Some(now)) if now.meta().uid.as_deref() != Some(uid) || !now.finalizers().iter().any(|f| f == finalizer) => {
            Ok(())
        }
        // Still ours, at another index: the next reconcile (on that change) removes it.
        Ok(Some(_)) => Err(Error::RemoveFinalizer(refused)),
        Err(e) => Err(Error::RemoveFinalizer(e)),
    }
}

pub(crate) fn error_policy<K>(_obj: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    // Errors the core classified carry their backoff; anything else (the API server
    // refusing a patch) is retried soon, jittered so a burst does not come back at once:
    // in 5 to 10 s.
    let soon = crate::retry::Backoff {
        base: Duration::from_secs(10),
        max: Duration::from_secs(10),
    };
    Action::requeue(error.retry_after().unwrap_or_else(|| soon.delay(1)))
}

/// Reports to the API server: status by merge patch on the status subresource (only the
/// fields that changed, `null` for the ones removed), events through the publisher.
struct KubeReporter<'a, K> {
    api: Api<K>,
    name: String,
    events: &'a EventPublisher,
    reference: ObjectReference,
}

#[async_trait]
impl<K> Reporter for KubeReporter<'_, K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync,
{
    async fn write_status(&self, old: &WorkflowStatus, new: &WorkflowStatus) -> Result<(), ReportError> {
        let Some(patch) = merge_patch(&serde_json::to_value(old)?, &serde_json::to_value(new)?) else {
            return Ok(());
        };
        let body = serde_json::json!({ "status": patch });
        self.api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
        Ok(())
    }

    async fn publish(&self, note: Note) {
        // In the background: the reconcile does not wait for its events.
        self.events.send(note, self.reference.clone()).await;
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;

    fn meta(finalizers: &[&str], annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            uid: Some("u1".to_owned()),
            generation: Some(1),
            finalizers: (!finalizers.is_empty()).then(|| finalizers.iter().map(|f| (*f).to_owned()).collect()),
            annotations: (!annotations.is_empty()).then(|| {
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        }
    }

    fn expecting(own: &OwnWrites, before: &ObjectMeta) {
        let mut after = Asks::of(before);
        after.finalizers.push(FINALIZER.to_owned());
        own.expect("u1", after);
    }

    #[test]
    fn only_the_event_of_our_own_write_is_dropped() {
        let own = OwnWrites::default();
        expecting(&own, &meta(&[], &[]));
        // Someone else's change that the write came after: it triggers, and we still wait.
        assert!(!own.is_own(&meta(&["other"], &[])));
        assert_eq!(own.len(), 1);
        assert!(own.is_own(&meta(&[FINALIZER], &[])));
        // Once: the same object seen again (a relist) is news to nobody but is not ours.
        assert!(!own.is_own(&meta(&[FINALIZER], &[])));
        assert_eq!(own.len(), 0);
    }

    #[test]
    fn a_write_that_came_with_another_change_still_triggers() {
        let own = OwnWrites::default();
        expecting(&own, &meta(&[], &[]));
        // An annotation set between the cache's view and the write: the event carries both.
        assert!(!own.is_own(&meta(&[FINALIZER], &[("a", "b")])));
        assert_eq!(own.len(), 0, "the expected event can no longer come");
        // Another object, and one with no uid, are never ours.
        expecting(&own, &meta(&[], &[]));
        let other = ObjectMeta {
            uid: Some("u2".to_owned()),
            ..meta(&[FINALIZER], &[])
        };
        assert!(!own.is_own(&other));
        assert!(!own.is_own(&ObjectMeta::default()));
        assert_eq!(own.len(), 1);
    }

    #[test]
    fn another_finalizer_going_meanwhile_still_ends_the_wait() {
        let own = OwnWrites::default();
        expecting(&own, &meta(&["other"], &[]));
        // Someone removed their finalizer as ours went on: not the expected event, but ours
        // is on, so no later event can be the one expected.
        assert!(!own.is_own(&meta(&[FINALIZER], &[])));
        assert_eq!(own.len(), 0);
    }

    fn config_map(name: &str, version: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        k8s_openapi::api::core::v1::ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                resource_version: Some(version.to_owned()),
                ..ObjectMeta::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn turns_go_first_come_first_served_to_the_latest_object() {
        let mut writer = reflector::store::Writer::default();
        for name in ["a", "b", "c", "d"] {
            writer.apply_watcher_event(&watcher::Event::Apply(config_map(name, "1")));
        }
        let turns = Turns::new(1, writer.as_reader());
        let (first, _) = turns.take(Arc::new(config_map("a", "1")), ()).await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for name in ["d", "b", "c"] {
            let (turns, order) = (turns.clone(), Arc::clone(&order));
            waiting.push(tokio::spawn(async move {
                let (_turn, obj) = turns.take(Arc::new(config_map(name, "1")), ()).await.unwrap();
                order
                    .lock()
                    .unwrap()
                    .push((obj.name_any(), obj.resource_version().unwrap()));
            }));
            // Each queued before the next asks.
            tokio::task::yield_now().await;
        }
        // Changed while it waits: its turn brings the newer object.
        writer.apply_watcher_event(&watcher::Event::Apply(config_map("b", "2")));
        drop(first);
        for w in waiting {
            w.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let expected: Vec<(String, String)> = [("d", "1"), ("b", "2"), ("c", "1")]
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(order, expected);
    }

    #[tokio::test]
    async fn an_object_gone_while_it_waited_gets_no_turn() {
        let mut writer = reflector::store::Writer::default();
        writer.apply_watcher_event(&watcher::Event::Apply(config_map("a", "1")));
        let turns = Turns::new(1, writer.as_reader());
        let first = turns.take(Arc::new(config_map("a", "1")), ()).await.unwrap();
        let waiting = {
            let turns = turns.clone();
            tokio::spawn(async move { turns.take(Arc::new(config_map("a", "1")), ()).await.is_none() })
        };
        tokio::task::yield_now().await;
        writer.apply_watcher_event(&watcher::Event::Delete(config_map("a", "1")));
        drop(first);
        assert!(waiting.await.unwrap());
        // Unbounded: no wait and no look at the cache.
        let unbounded = Turns::new(0, writer.as_reader());
        assert!(unbounded.take(Arc::new(config_map("z", "1")), ()).await.is_some());
    }
}
