//! Running a command that changes a deployment under its lease (through
//! [`lyra_state::lease::run_under_lease`]), with the messages and exit code (3) that tell a
//! person or a script who holds it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_state::lease::{self, LeaseError, LeaseOptions, Leased};
use lyra_state::{Lease, Store};

use crate::args::LockArgs;
use crate::exit::{Exit, kind};
use crate::output::{lease_json, lease_text, time_text};
use crate::{signals, warn};

/// Runs `run` under the lease on `deployment` for `operation`, waiting up to
/// `--lock-timeout` for it (a Ctrl-C, which sets `cancel`, ends the wait). While held, a
/// second Ctrl-C releases it; if it is lost anyway, `cancel` is set so the run stops
/// scheduling, and the run's writes are refused. Returns what `run` returned, and whether the
/// lease was still ours at the end: `false` when it expired or was broken while we ran, so
/// someone else may have changed the deployment meanwhile.
pub async fn under_lease<T, F, Fut>(
    store: &Arc<dyn Store>,
    deployment: &str,
    operation: &str,
    lock: &LockArgs,
    cancel: &Arc<AtomicBool>,
    run: F,
) -> Result<(T, bool), Exit>
where
    F: FnOnce(Leased) -> Fut,
    Fut: Future<Output = T>,
{
    let options = options(operation, lock);
    let on_wait = |holder: &Lease| {
        warn(&format!(
            "waiting up to {} for the lease on '{deployment}': {}\n",
            humantime::format_duration(lock.lock_timeout.unwrap_or_default()),
            lease_text(holder)
        ));
    };
    let ran = lease::run_under_lease(store, deployment, &options, cancel, on_wait, |leased| async move {
        let _abort = signals::hold(store, leased.lease());
        if let Some(ended) = leased.took_over() {
            warn_took_over(deployment, ended);
        }
        run(leased).await
    })
    .await
    .map_err(|e| refused(deployment, e))?;
    Ok(ended(ran, deployment))
}

/// What a run under a lease returned, and whether the lease was ours to the end. Failing to
/// release only means the lease will expire instead: a warning, not a failure.
fn ended<T>(ran: lease::Ran<T>, deployment: &str) -> (T, bool) {
    if let Err(e) = &ran.released {
        warn(&format!(
            "warning: could not release the lease on '{deployment}' ({e}); it expires by itself\n"
        ));
    }
    let kept = !ran.lost();
    (ran.value, kept)
}

fn options(operation: &str, lock: &LockArgs) -> LeaseOptions {
    LeaseOptions {
        owner: crate::actor(),
        operation: operation.to_owned(),
        ttl: lock.lease_ttl,
        wait: lock.lock_timeout,
        // Some commands record more than one run under one lease (a refresh, then an apply).
        release_at_finish: false,
        name_holder: true,
    }
}

/// Says that the lease was taken over from a process that ended holding it.
fn warn_took_over(deployment: &str, ended: &Lease) {
    let pid = lease::holder_pid(ended)
        .map(|pid| format!("pid {pid}, "))
        .unwrap_or_default();
    warn(&format!(
        "warning: took over the lease on '{deployment}': its holder, {} ({pid}{} since {}), \
         ended on this machine without releasing it\n",
        ended.owner,
        ended.operation,
        time_text(ended.since)
    ));
}

/// A lease taken before its command is ready to run ([`take_if_free`]), on the list a second
/// signal releases.
pub struct Early {
    held: lease::HeldLease,
    _abort: signals::Registration,
}

/// Takes the lease on `deployment` if it is free now, for a command that reads the state
/// under it while it still prepares its run; then [`under_early`] or [`give_back`]. None when
/// someone holds it or the store failed: the command goes on to [`under_lease`], which waits
/// and reports as asked, once the command is ready. Prints nothing, unless it took the lease
/// over from a process that ended holding it.
pub async fn take_if_free(
    store: &Arc<dyn Store>,
    deployment: &str,
    operation: &str,
    lock: &LockArgs,
    cancel: &Arc<AtomicBool>,
) -> Option<Early> {
    let options = LeaseOptions {
        wait: None,
        ..options(operation, lock)
    };
    let held = lease::acquire(Arc::clone(store), deployment, &options, Arc::clone(cancel))
        .await
        .ok()?;
    if let Some(ended) = held.took_over() {
        warn_took_over(deployment, ended);
    }
    let abort = signals::hold(store, held.lease());
    Some(Early { held, _abort: abort })
}

/// [`under_lease`] with a lease [`take_if_free`] took.
pub async fn under_early<T, F, Fut>(early: Early, deployment: &str, run: F) -> (T, bool)
where
    F: FnOnce(Leased) -> Fut,
    Fut: Future<Output = T>,
{
    let Early { held, _abort } = early;
    ended(lease::run_under_held(held, run).await, deployment)
}

/// Releases a lease [`take_if_free`] took for a run that will not happen (its workflow is
/// invalid). Failing only means it expires by itself.
pub async fn give_back(early: Early) {
    let _ = early.held.release().await;
}

fn refused(deployment: &str, e: LeaseError) -> Exit {
    let locked = |holder: &Lease, message: String| {
        Exit::new(Exit::LOCKED, kind::LOCKED, format!("{message}: {}", lease_text(holder)))
            .with("deployment", deployment)
            .with("lease", lease_json(holder))
            .hint(&format!(
                "wait for it with --lock-timeout DURATION, or, if that run is gone for good, \
                 break the lease with `lyra state unlock {deployment} --force`"
            ))
    };
    match e {
        LeaseError::Held(holder) => locked(&holder, format!("deployment '{deployment}' is locked")),
        LeaseError::TimedOut { holder, waited } => locked(
            &holder,
            format!(
                "deployment '{deployment}' is still locked after waiting {}",
                humantime::format_duration(std::time::Duration::from_secs(waited.as_secs()))
            ),
        ),
        LeaseError::Cancelled(_) => {
            Exit::interrupted(format!("interrupted while waiting for the lease on '{deployment}'"))
                .with("deployment", deployment)
        }
        LeaseError::Store(e) => Exit::state(format!("taking the lease on '{deployment}': {e}")),
    }
}

/// The run's lease was lost (the renewer saw it, or a fenced write was refused): exit 1,
/// kind `lease_lost`, naming the deployment.
pub fn lease_lost(deployment: &str) -> Exit {
    Exit::new(
        Exit::FAILURE,
        kind::LEASE_LOST,
        format!(
            "the lease on '{deployment}' was lost during the run (it expired or was broken), so the run \
             stopped early; another run may have changed the deployment since: check `lyra history {deployment}`"
        ),
    )
    .with("deployment", deployment)
}
