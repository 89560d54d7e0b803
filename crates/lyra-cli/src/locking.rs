//! Taking a deployment's lease around a command that changes it, with the messages and exit
//! code (3) that tell a person or a script who holds it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_core::state::{Lease, StateStore};
use lyra_state::lease::{self, HeldLease, LeaseError, LeaseOptions};

use crate::args::LockArgs;
use crate::exit::Exit;
use crate::output::lease_text;
use crate::warn;

/// Takes the lease on `deployment` for `operation`, waiting up to `--lock-timeout`. While it is
/// held it is renewed; if it is lost anyway, `cancel` is set so the run stops scheduling.
pub async fn take(
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
pub async fn release(store: &Arc<dyn StateStore>, held: HeldLease) -> bool {
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

fn refused(deployment: &str, e: LeaseError) -> Exit {
    let holder_message = |holder: &Lease, prefix: String| {
        format!(
            "error: {prefix}: {}\n  \
             wait for it with --lock-timeout DURATION, or, if that run is gone for good, \
             break the lease with `lyra state unlock {deployment} --force`",
            lease_text(holder)
        )
    };
    match e {
        LeaseError::Held(holder) => Exit {
            code: Exit::LOCKED,
            message: Some(holder_message(&holder, format!("deployment '{deployment}' is locked"))),
        },
        LeaseError::TimedOut { holder, waited } => Exit {
            code: Exit::LOCKED,
            message: Some(holder_message(
                &holder,
                format!(
                    "deployment '{deployment}' is still locked after waiting {}",
                    humantime::format_duration(std::time::Duration::from_secs(waited.as_secs()))
                ),
            )),
        },
        LeaseError::Store(e) => Exit::failure(format!("state: taking the lease on '{deployment}': {e}")),
    }
}
