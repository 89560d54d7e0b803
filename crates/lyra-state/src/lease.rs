//! Holding a deployment's lease for the length of a run.
//!
//! [`run_under_lease`] is the one way to run under a lease, for the CLI (apply, delete, state
//! edits) and the controller (apply, cleanup) alike: take the lease (waiting for it if asked),
//! run the caller's closure, release the lease and say whether it was still ours. While held, a
//! background task renews the lease every third of its time to live. If the lease is lost —
//! broken by `lyra state unlock --force`, or not renewed in time so that it expired and may be
//! taken — the task marks the held lease lost, sets the run's cancel flag (so the engine starts
//! no more steps) and logs a warning. Whatever the renewer sees, the run's writes go through
//! [`Fenced`], which the store refuses once the lease is no longer current: a holder paused
//! past its time to live cannot record over the run that took its lease. `lyra plan` never
//! takes a lease.
//!
//! A lease whose holder was a process on this machine that has ended (`kill -9`, a crash) is
//! taken over at once rather than after its time to live: tokens name their process (see
//! `holder`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use lyra_core::state::{DeploymentState, Recorder, ResourceRecord, RunEnd, RunId, RunStart, StoreError};
use tokio::task::JoinHandle;

use crate::{Fence, Lease, LeaseGrant, LeaseRequest, Store};

pub(crate) mod holder;

/// The default time to live: how long a crashed holder blocks others.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How to take a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Who takes it: `user@host` for the CLI, `controller/<namespace>/<name>` for the controller.
    pub owner: String,
    /// What the holder is doing: `apply`, `delete`, `state rm`, …
    pub operation: String,
    /// How long the lease outlives its last renewal.
    pub ttl: Duration,
    /// `--lock-timeout`: how long to wait for another holder. `None` refuses at once.
    pub wait: Option<Duration>,
    /// The run under the lease records one run and writes nothing after its finish, so the
    /// finish may release the lease in the same write ([`crate::FencedWrites::finish_run_and_release`]):
    /// one round trip fewer per run, where the store can. A write after that finish is
    /// refused as one under a lost lease.
    pub release_at_finish: bool,
    /// Name this process in the lease's token, so that a process on this machine that finds
    /// it ended takes the lease over at once (the CLI: a run killed with `kill -9` does not
    /// hold up the next for the time to live). A controller replica does not: its successor
    /// runs in another pod, which could not tell, and waits for the time to live anyway.
    pub name_holder: bool,
}

impl LeaseOptions {
    /// Options with the default time to live, refusing at once if the lease is held.
    pub fn new(owner: impl Into<String>, operation: impl Into<String>) -> LeaseOptions {
        LeaseOptions {
            owner: owner.into(),
            operation: operation.into(),
            ttl: DEFAULT_TTL,
            wait: None,
            release_at_finish: false,
            name_holder: false,
        }
    }
}

/// Why a lease was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone else holds it, and the caller did not want to wait.
    #[error("deployment {:?} is locked: {}", .0.deployment, describe(.0))]
    Held(Lease),
    /// The run was cancelled (Ctrl-C, shutdown) while waiting for the lease.
    #[error("interrupted while waiting for the lease on deployment {0:?}")]
    Cancelled(String),
    /// Someone else still held it when the wait ran out.
    #[error(
        "deployment {:?} is still locked after waiting {}: {}",
        holder.deployment,
        humantime::format_duration(Duration::from_secs(waited.as_secs())),
        describe(holder)
    )]
    TimedOut { holder: Lease, waited: Duration },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LeaseError {
    /// The holder, when the lease is held by someone else.
    pub fn holder(&self) -> Option<&Lease> {
        match self {
            LeaseError::Held(holder) | LeaseError::TimedOut { holder, .. } => Some(holder),
            LeaseError::Store(_) | LeaseError::Cancelled(_) => None,
        }
    }
}

/// "alice@laptop is running apply since 2026-05-01T10:00:00Z (pid 4242, lease expires
/// 2026-05-01T10:00:30Z)"; the pid when the lease names its process.
pub fn describe(lease: &Lease) -> String {
    let pid = holder_pid(lease).map(|pid| format!("pid {pid}, ")).unwrap_or_default();
    format!(
        "{} is running {} since {} ({pid}lease expires {})",
        lease.owner,
        lease.operation,
        utc(lease.since),
        utc(lease.expires)
    )
}

/// A Unix-millisecond time as an RFC 3339 UTC timestamp, to the second.
pub fn utc(ms: i64) -> String {
    let time = match u64::try_from(ms) {
        Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => UNIX_EPOCH,
    };
    humantime::format_rfc3339_seconds(time).to_string()
}

/// A lease this process holds and keeps renewing. Dropping it stops the renewals (the lease
/// then expires after its time to live); [`HeldLease::release`] frees it at once.
pub struct HeldLease {
    store: Arc<dyn Store>,
    lease: Lease,
    /// Set by the renewer when the lease is lost; only ever set, never cleared.
    lost: Arc<AtomicBool>,
    renewal: Arc<Renewal>,
    release_at_finish: bool,
    /// The lease of an ended process this one took over to get here.
    took_over: Option<Lease>,
}

/// The renewer of a held lease, shared with the recorder when a run's finish releases the
/// lease ([`LeaseOptions::release_at_finish`]).
struct Renewal {
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Set once a finish released the lease.
    released: AtomicBool,
}

impl Renewal {
    fn task(&self) -> Option<JoinHandle<()>> {
        self.task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Stops renewing, and waits until no renewal runs: one after a release would find the
    /// lease gone and call it lost.
    async fn stop(&self) {
        if let Some(task) = self.task() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl std::fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLease")
            .field("lease", &self.lease)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

/// Whether a released lease was still ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Held to the end, and now free.
    Kept,
    /// Lost while held: it expired and was taken, or was broken. Someone else may have
    /// changed the deployment meanwhile (though not through this holder's fenced writes).
    Lost,
}

impl HeldLease {
    /// The lease as acquired (renewals move its expiry; owner, since and token stay).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether the renewer found the lease lost. Not set by a cancel: a run the user
    /// interrupted still holds its lease.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The lease this one was taken over from: its holder was a process on this machine that
    /// had ended (killed or crashed) before its lease expired.
    pub fn took_over(&self) -> Option<&Lease> {
        self.took_over.as_ref()
    }

    /// What the run records through: the store's writes, fenced by this lease.
    pub fn recorder(&self) -> Fenced {
        Fenced {
            store: Arc::clone(&self.store),
            fence: Fence::from(&self.lease),
            releases: self.release_at_finish.then(|| Arc::clone(&self.renewal)),
        }
    }

    /// Stops renewing and releases the lease (unless the run's finish did), saying whether
    /// it was still ours.
    pub async fn release(self) -> Result<Released, StoreError> {
        self.renewal.stop().await;
        let ours = self.renewal.released.load(Ordering::SeqCst) || self.store.release_lease(&self.lease).await?;
        Ok(if ours && !self.is_lost() {
            Released::Kept
        } else {
            Released::Lost
        })
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if let Some(task) = self.renewal.task() {
            task.abort();
        }
    }
}

/// The [`Recorder`] of a run under a lease: every write is made only while the lease is still
/// the deployment's (see [`crate::FencedWrites`]), and fails with
/// [`lyra_core::state::StoreErrorKind::LeaseLost`] otherwise.
#[derive(Clone)]
pub struct Fenced {
    store: Arc<dyn Store>,
    fence: Fence,
    /// Set when the run's finish releases the lease.
    releases: Option<Arc<Renewal>>,
}

impl std::fmt::Debug for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fenced")
            .field("deployment", &self.fence.deployment)
            .finish_non_exhaustive()
    }
}

impl Fenced {
    /// Refuses writes to a deployment other than the lease's: the lease fences one deployment.
    fn check(&self, deployment: &str) -> Result<(), StoreError> {
        if deployment == self.fence.deployment {
            return Ok(());
        }
        Err(StoreError::new(
            lyra_core::state::StoreErrorKind::Other,
            format!(
                "a run under the lease on {:?} cannot write to deployment {deployment:?}",
                self.fence.deployment
            ),
        ))
    }
}

#[async_trait]
impl Recorder for Fenced {
    fn store_id(&self) -> &str {
        self.store.store_id()
    }

    async fn load(&self, deployment: &str) -> Result<Option<DeploymentState>, StoreError> {
        self.store.load(deployment).await
    }

    async fn begin_run(&self, run: &RunStart) -> Result<RunId, StoreError> {
        self.check(&run.deployment)?;
        self.store.begin_run_fenced(&self.fence, run).await
    }

    async fn put_resource(&self, deployment: &str, record: &ResourceRecord) -> Result<(), StoreError> {
        self.check(deployment)?;
        self.store.put_resource_fenced(&self.fence, record).await
    }

    async fn remove_resource(&self, deployment: &str, step_id: &str) -> Result<(), StoreError> {
        self.check(deployment)?;
        self.store.remove_resource_fenced(&self.fence, step_id).await
    }

    async fn finish_run(&self, run: RunId, end: &RunEnd) -> Result<(), StoreError> {
        let Some(renewal) = &self.releases else {
            return self.store.finish_run_fenced(&self.fence, run, end).await;
        };
        // The run is over either way: the lease is released next if not now.
        renewal.stop().await;
        if self.store.finish_run_and_release(&self.fence, run, end).await? {
            renewal.released.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// What [`run_under_lease`] hands the caller's run: the lease, and the recorder fenced by it.
#[derive(Debug, Clone)]
pub struct Leased {
    lease: Lease,
    recorder: Fenced,
    lost: Arc<AtomicBool>,
    took_over: Option<Lease>,
}

impl Leased {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// See [`HeldLease::took_over`].
    pub fn took_over(&self) -> Option<&Lease> {
        self.took_over.as_ref()
    }

    /// The run's [`Recorder`]: give it to the engine.
    pub fn recorder(&self) -> &Fenced {
        &self.recorder
    }

    /// Whether the lease was lost so far.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

/// How a run under a lease ended: what the run returned, and whether the lease was ours to
/// the end.
#[derive(Debug)]
pub struct Ran<T> {
    pub value: T,
    /// `Err`: the release failed (the store is unreachable); the lease expires by itself.
    pub released: Result<Released, StoreError>,
}

impl<T> Ran<T> {
    /// Whether the lease was lost during the run. A failed release does not count: the
    /// renewer would have seen a lease it could not keep.
    pub fn lost(&self) -> bool {
        matches!(self.released, Ok(Released::Lost))
    }
}

/// Runs `run` under `deployment`'s lease: takes it (waiting up to `options.wait`, calling
/// `on_wait` with the holder once before waiting; a set `cancel` ends the wait), runs `run`
/// with it, releases it, and says whether it was still ours. While held, a lost lease sets
/// `cancel` so the engine stops. The one entry point for every run that changes a
/// deployment, in the CLI and the controller.
pub async fn run_under_lease<T, W, F, Fut>(
    store: &Arc<dyn Store>,
    deployment: &str,
    options: &LeaseOptions,
    cancel: &Arc<AtomicBool>,
    on_wait: W,
    run: F,
) -> Result<Ran<T>, LeaseError>
where
    W: FnOnce(&Lease),
    F: FnOnce(Leased) -> Fut,
    Fut: Future<Output = T>,
{
    let held = acquire_waiting(Arc::clone(store), deployment, options, Arc::clone(cancel), on_wait).await?;
    Ok(run_under_held(held, run).await)
}

/// [`run_under_lease`] with a lease taken beforehand ([`acquire`]): runs `run` with it,
/// releases it, and says whether it was still ours.
pub async fn run_under_held<T, F, Fut>(held: HeldLease, run: F) -> Ran<T>
where
    F: FnOnce(Leased) -> Fut,
    Fut: Future<Output = T>,
{
    let leased = Leased {
        lease: held.lease.clone(),
        recorder: held.recorder(),
        lost: Arc::clone(&held.lost),
        took_over: held.took_over.clone(),
    };
    let value = run(leased).await;
    let released = held.release().await;
    Ran { value, released }
}

/// Takes `deployment`'s lease, waiting for it up to `options.wait`, and keeps renewing it
/// until the returned [`HeldLease`] is released or dropped. If the lease is lost while held,
/// [`HeldLease::is_lost`] turns true and `cancel` is set.
pub async fn acquire(
    store: Arc<dyn Store>,
    deployment: &str,
    options: &LeaseOptions,
    cancel: Arc<AtomicBool>,
) -> Result<HeldLease, LeaseError> {
    acquire_waiting(store, deployment, options, cancel, |_| {}).await
}

async fn acquire_waiting(
    store: Arc<dyn Store>,
    deployment: &str,
    options: &LeaseOptions,
    cancel: Arc<AtomicBool>,
    on_wait: impl FnOnce(&Lease),
) -> Result<HeldLease, LeaseError> {
    let ttl_ms = i64::try_from(options.ttl.as_millis()).unwrap_or(i64::MAX);
    let request = LeaseRequest {
        deployment: deployment.to_owned(),
        owner: options.owner.clone(),
        operation: options.operation.clone(),
        token: new_token(options.name_holder),
        ttl_ms,
    };
    let mut took_over = None;
    // Polls 100ms, 200ms, … up to every second while someone else holds it.
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(1))
        .with_factor(2.0)
        .without_max_times()
        .build();
    let mut on_wait = Some(on_wait);
    let mut started = Instant::now();
    loop {
        // Taken before the call: the lease lasts `ttl` from some moment after this.
        let asked = Instant::now();
        match store.acquire_lease(&request).await? {
            LeaseGrant::Acquired(lease) => {
                let lost = Arc::new(AtomicBool::new(false));
                let renewer = tokio::spawn(renew(
                    Arc::clone(&store),
                    lease.clone(),
                    options.ttl,
                    asked,
                    Arc::clone(&lost),
                    cancel,
                ));
                return Ok(HeldLease {
                    store,
                    lease,
                    lost,
                    renewal: Arc::new(Renewal {
                        task: std::sync::Mutex::new(Some(renewer)),
                        released: AtomicBool::new(false),
                    }),
                    release_at_finish: options.release_at_finish,
                    took_over,
                });
            }
            // Broken only while that holder still has it, then taken as usual (by this process
            // or whoever asks first).
            LeaseGrant::Held(holder)
                if holder::has_ended(&holder.token)
                    && store.break_lease_held_by(deployment, &holder.token).await?.is_some() =>
            {
                tracing::warn!(
                    deployment = %deployment,
                    "took over the lease of {}, a process on this machine that has ended",
                    describe(&holder)
                );
                crate::admin::note_takeover(store.as_ref(), deployment, &options.owner, &holder).await?;
                took_over = Some(holder);
            }
            LeaseGrant::Held(holder) => {
                let Some(wait) = options.wait else {
                    return Err(LeaseError::Held(holder));
                };
                if let Some(on_wait) = on_wait.take() {
                    on_wait(&holder);
                    // The wait counts from when the caller was told about it.
                    started = Instant::now();
                }
                let waited = started.elapsed();
                if waited >= wait {
                    return Err(LeaseError::TimedOut { holder, waited });
                }
                let delay = delays.next().unwrap_or(Duration::from_secs(1)).min(wait - waited);
                if !sleep_unless_cancelled(delay, &cancel).await {
                    return Err(LeaseError::Cancelled(deployment.to_owned()));
                }
            }
        }
    }
}

/// Sleeps for `delay`, waking early when `cancel` is set. `false` if it was.
async fn sleep_unless_cancelled(delay: Duration, cancel: &AtomicBool) -> bool {
    const SLICE: Duration = Duration::from_millis(50);
    let until = Instant::now() + delay;
    loop {
        if cancel.load(Ordering::SeqCst) {
            return false;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        tokio::time::sleep(left.min(SLICE)).await;
    }
}

/// 128 random bits, which only the holder knows, then, if `named`, the holder's identity
/// (see [`holder`]).
fn new_token(named: bool) -> String {
    let random = rand::random::<u128>();
    if named {
        format!("{random:032x}{}", holder::token_suffix())
    } else {
        format!("{random:032x}")
    }
}

/// The PID of the process holding `lease`, when its token names one.
pub fn holder_pid(lease: &Lease) -> Option<u32> {
    holder::pid(&lease.token)
}

/// Renews every `ttl / 3` until aborted or the lease is lost; then marks it `lost` and sets
/// `cancel`.
async fn renew(
    store: Arc<dyn Store>,
    mut lease: Lease,
    ttl: Duration,
    mut renewed: Instant,
    lost: Arc<AtomicBool>,
    cancel: Arc<AtomicBool>,
) {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let period = ttl / 3;
    let give_up = |deployment: &str, why: String| {
        lost.store(true, Ordering::SeqCst);
        cancel.store(true, Ordering::SeqCst);
        tracing::warn!(deployment = %deployment, "{why}");
    };
    loop {
        tokio::time::sleep(period).await;
        let asked = Instant::now();
        match store.renew_lease(&lease, ttl_ms).await {
            Ok(Some(next)) => {
                lease = next;
                renewed = asked;
            }
            Ok(None) => {
                give_up(
                    &lease.deployment,
                    format!(
                        "lost the lease on deployment {:?}: it was broken or taken over; stopping",
                        lease.deployment
                    ),
                );
                return;
            }
            Err(error) => {
                // The lease counts as lost if it may expire before the next attempt: someone
                // else could take it then.
                if renewed.elapsed() + period >= ttl {
                    give_up(
                        &lease.deployment,
                        format!(
                            "lost the lease on deployment {:?}: could not renew it for {} ({error}); stopping",
                            lease.deployment,
                            humantime::format_duration(ttl)
                        ),
                    );
                    return;
                }
                tracing::warn!(deployment = %lease.deployment, %error, "could not renew the lease; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests;
