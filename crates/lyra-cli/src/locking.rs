//! Taking a deployment's lease around a command that changes it, with the messages and exit
//! code (3) that tell a person or a script who holds it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_core::state::{Lease, StateStore};
use lyra_state::lease::{self, HeldLease, LeaseError, LeaseOptions};

use crate::args::LockArgs;
use crate::exit::{Exit, kind};
use crate::output::{lease_json, lease_text};
use crate::{signals, warn};

/// A lease this command holds: renewed while held, and released by a second Ctrl-C too.
#[derive(Debug)]
pub struct Held {
    lease: HeldLease,
    _abort: signals::Registration,
}

/// Takes the lease on `deployment` for `operation`, waiting up to `--lock-timeout` (a Ctrl-C
/// ends the wait). While it is held it is renewed; if it is lost anyway, `cancel` is set so
/// the run stops scheduling.
pub async fn take(
    store: &Arc<dyn StateStore>,
    deployment: &str,
    operation: &str,
    lock: &LockArgs,
    cancel: Arc<AtomicBool>,
) -> Result<Held, Exit> {
    tokio::select! {
        taken = acquire(store, deployment, operation, lock, cancel) => {
            let lease = taken?;
            let abort = signals::hold(store, lease.lease());
            Ok(Held { lease, _abort: abort })
        }
        () = signals::interrupted() => Err(Exit::interrupted(format!(
            "interrupted while waiting for the lease on '{deployment}'"
        ))
        .with("deployment", deployment)),
    }
}

async fn acquire(
    store: &Arc<dyn StateStore>,
    deployment: &str,
    operation: &str,
    lock: &LockArgs,
    cancel: Arc<AtomicBool>,
) -> Result<HeldLease, Exit> {
    let mut options = LeaseOptions {
        owner: crate::actor(),
        operation: operation.to_owned(),
        ttl: lock.lease_ttl,
        wait: None,
    };
    match lease::acquire(Arc::clone(store), deployment, &options, Arc::clone(&cancel)).await {
        Ok(held) => return Ok(held),
        Err(LeaseError::Held(holder)) if lock.lock_timeout.is_some() => {
            warn(&format!(
                "waiting up to {} for the lease on '{deployment}': {}\n",
                humantime::format_duration(lock.lock_timeout.unwrap_or_default()),
                lease_text(&holder)
            ));
        }
        Err(e) => return Err(refused(deployment, e)),
    }
    options.wait = lock.lock_timeout;
    lease::acquire(Arc::clone(store), deployment, &options, cancel)
        .await
        .map_err(|e| refused(deployment, e))
}

/// Releases the lease. `false` when it was no longer ours: it expired or was broken while we
/// ran, so someone else may have changed the deployment meanwhile. Failing to release only
/// means the lease will expire instead, which is worth a warning, not a failure.
pub async fn release(store: &Arc<dyn StateStore>, held: Held) -> bool {
    let Held { lease: held, _abort } = held;
    let ours = held.lease().clone();
    // Renewing answers "is it still ours?" atomically; only the holder knows the token.
    let kept = match store.renew_lease(&ours, 1_000).await {
        Ok(renewed) => renewed.is_some(),
        // Cannot tell; the release below reports the store problem.
        Err(_) => true,
    };
    if let Err(e) = held.release().await {
        warn(&format!(
            "warning: could not release the lease on '{}' ({e}); it expires by itself\n",
            ours.deployment
        ));
    }
    kept
}

/// Forgets a lease that is gone with its deployment (`state migrate` drops both): nothing is
/// left to release.
pub fn forget(held: Held) {
    drop(held);
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
        LeaseError::Store(e) => Exit::state(format!("taking the lease on '{deployment}': {e}")),
    }
}
