//! Holding a deployment's lease for the length of a run.
//!
//! The CLI and the controller call [`acquire`] before applying, deleting or editing a
//! deployment's state, and [`HeldLease::release`] afterwards. While held, a background task
//! renews the lease every third of its time to live. If the lease is lost — broken by
//! `lyra state unlock --force`, or not renewed in time so that it expired and may be taken —
//! the task sets the caller's `lost` flag (the CLI passes its cancel flag, so the engine stops
//! starting steps) and logs a warning. `lyra plan` never takes a lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use lyra_core::state::{Lease, LeaseGrant, LeaseRequest, StateStore, StoreError};
use tokio::task::JoinHandle;

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
}

impl LeaseOptions {
    /// Options with the default time to live, refusing at once if the lease is held.
    pub fn new(owner: impl Into<String>, operation: impl Into<String>) -> LeaseOptions {
        LeaseOptions {
            owner: owner.into(),
            operation: operation.into(),
            ttl: DEFAULT_TTL,
            wait: None,
        }
    }
}

/// Why a lease was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Someone else holds it, and the caller did not want to wait.
    #[error("deployment {:?} is locked: {}", .0.deployment, describe(.0))]
    Held(Lease),
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
            LeaseError::Store(_) => None,
        }
    }
}

/// "alice@laptop is running apply since 2026-05-01T10:00:00Z (lease expires 2026-05-01T10:00:30Z)"
pub fn describe(lease: &Lease) -> String {
    format!(
        "{} is running {} since {} (lease expires {})",
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
    store: Arc<dyn StateStore>,
    lease: Lease,
    renewer: JoinHandle<()>,
}

impl std::fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLease")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl HeldLease {
    /// The lease as acquired (renewals move its expiry; owner, since and token stay).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Stops renewing and releases the lease, unless it was lost meanwhile.
    pub async fn release(mut self) -> Result<(), StoreError> {
        self.renewer.abort();
        // Wait for the renewer to stop, so no renewal runs after the release (it would find
        // nothing to renew anyway: renewals need the token's row).
        let _ = (&mut self.renewer).await;
        self.store.release_lease(&self.lease).await
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// Takes `deployment`'s lease, waiting for it up to `options.wait`, and keeps renewing it
/// until the returned [`HeldLease`] is released or dropped. `lost` is set if the lease is lost
/// while held.
pub async fn acquire(
    store: Arc<dyn StateStore>,
    deployment: &str,
    options: &LeaseOptions,
    lost: Arc<AtomicBool>,
) -> Result<HeldLease, LeaseError> {
    let ttl_ms = i64::try_from(options.ttl.as_millis()).unwrap_or(i64::MAX);
    let request = LeaseRequest {
        deployment: deployment.to_owned(),
        owner: options.owner.clone(),
        operation: options.operation.clone(),
        token: new_token(),
        ttl_ms,
    };
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        // Taken before the call: the lease lasts `ttl` from some moment after this.
        let asked = Instant::now();
        match store.acquire_lease(&request).await? {
            LeaseGrant::Acquired(lease) => {
                let renewer = tokio::spawn(renew(Arc::clone(&store), lease.clone(), options.ttl, asked, lost));
                return Ok(HeldLease { store, lease, renewer });
            }
            LeaseGrant::Held(holder) => {
                let Some(wait) = options.wait else {
                    return Err(LeaseError::Held(holder));
                };
                let waited = started.elapsed();
                if waited >= wait {
                    return Err(LeaseError::TimedOut { holder, waited });
                }
                tokio::time::sleep(backoff.min(wait - waited)).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// 128 random bits: only the holder knows its token.
fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Renews every `ttl / 3` until aborted or the lease is lost.
async fn renew(
    store: Arc<dyn StateStore>,
    mut lease: Lease,
    ttl: Duration,
    mut renewed: Instant,
    lost: Arc<AtomicBool>,
) {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let period = ttl / 3;
    loop {
        tokio::time::sleep(period).await;
        let asked = Instant::now();
        match store.renew_lease(&lease, ttl_ms).await {
            Ok(Some(next)) => {
                lease = next;
                renewed = asked;
            }
            Ok(None) => {
                tracing::warn!(
                    deployment = %lease.deployment,
                    "lost the lease on deployment {:?}: it was broken or taken over; stopping",
                    lease.deployment
                );
                lost.store(true, Ordering::SeqCst);
                return;
            }
            Err(error) => {
                // The lease counts as lost if it may expire before the next attempt: someone
                // else could take it then.
                if renewed.elapsed() + period >= ttl {
                    tracing::warn!(
                        deployment = %lease.deployment,
                        %error,
                        "lost the lease on deployment {:?}: could not renew it for {}; stopping",
                        lease.deployment,
                        humantime::format_duration(ttl)
                    );
                    lost.store(true, Ordering::SeqCst);
                    return;
                }
                tracing::warn!(deployment = %lease.deployment, %error, "could not renew the lease; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests;
