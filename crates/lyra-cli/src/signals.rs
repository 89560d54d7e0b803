//! Ctrl-C (SIGINT), SIGTERM and SIGHUP.
//!
//! The first signal sets the command's cancel flag: the engine starts no more steps, lets
//! running ones finish and be recorded, and the command exits 130. The second aborts at once,
//! but first releases the leases this process holds (within [`RELEASE_WITHIN`]), so the next
//! run is not refused for the lease's time to live; steps that were running are left as
//! `pending` records, which the next run resolves. A lease that cannot be released in time
//! (an unreachable store) still expires by itself.
//!
//! This is process-wide by nature (there is one set of signal handlers), hence the statics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lyra_state::{Lease, Store};

use crate::args::Output;
use crate::exit::Exit;
use crate::warn;

/// How long the second signal waits for the leases to be released before exiting anyway.
pub const RELEASE_WITHIN: Duration = Duration::from_millis(1500);

/// A lease held right now: registration id, its store, the lease.
type Held = (u64, Arc<dyn Store>, Lease);
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Starts listening: the first signal sets `cancel`, the second aborts (see the module docs).
/// Under `-o json` the abort prints the error document, unless a document was printed already.
pub fn install(cancel: Arc<AtomicBool>, output: Output) {
    tokio::spawn(async move {
        let Some(mut signals) = Signals::new() else {
            return;
        };
        let name = signals.next().await;
        cancel.store(true, Ordering::SeqCst);
        warn(&format!(
            "\ninterrupted ({name}): waiting for running steps to finish and be recorded \
             (send it again to abort at once)\n"
        ));
        let name = signals.next().await;
        abort(name, output).await;
    });
}

/// Keeps `lease` on the list the second signal releases, until the guard is dropped.
pub fn hold(store: &Arc<dyn Store>, lease: &Lease) -> Registration {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    held().push((id, Arc::clone(store), lease.clone()));
    Registration(id)
}

/// A lease on the abort list; dropping it takes the lease off.
#[derive(Debug)]
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        held().retain(|(id, ..)| *id != self.0);
    }
}

fn held() -> std::sync::MutexGuard<'static, Vec<Held>> {
    // A panic elsewhere while holding the list leaves it usable: it is only a list.
    HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn abort(signal: &str, output: Output) -> ! {
    let leases: Vec<(Arc<dyn Store>, Lease)> = held().iter().map(|(_, s, l)| (Arc::clone(s), l.clone())).collect();
    let releases = leases.iter().map(|(store, lease)| async move {
        let released = tokio::time::timeout(RELEASE_WITHIN, store.release_lease(lease)).await;
        (lease, matches!(released, Ok(Ok(_))))
    });
    let mut lines = Vec::new();
    // Side by side: the whole abort waits at most one timeout.
    for (lease, released) in futures::future::join_all(releases).await {
        lines.push(if released {
            format!("released the lease on '{}'", lease.deployment)
        } else {
            format!(
                "could not release the lease on '{}' in time; it expires by itself at {}",
                lease.deployment,
                crate::output::time_text(lease.expires)
            )
        });
    }
    let mut message = format!("aborted by a second {signal}");
    if !lines.is_empty() {
        message.push_str(&format!(
            "; {}; steps that were running are recorded as pending, and the next run resolves them",
            lines.join("; ")
        ));
    }
    let exit = Exit::interrupted(message);
    warn(&format!("{}\n", exit.human()));
    if output == Output::Json && !crate::printed() {
        let _ = crate::json(&exit.document());
    }
    std::process::exit(i32::from(Exit::INTERRUPTED))
}

/// The signals that interrupt a command.
struct Signals {
    #[cfg(unix)]
    streams: Vec<(&'static str, tokio::signal::unix::Signal)>,
}

impl Signals {
    #[cfg(unix)]
    fn new() -> Option<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [
            ("Ctrl-C (SIGINT)", SignalKind::interrupt()),
            ("SIGTERM", SignalKind::terminate()),
            ("SIGHUP", SignalKind::hangup()),
        ];
        let streams = kinds
            .into_iter()
            .filter_map(|(name, kind)| signal(kind).ok().map(|s| (name, s)))
            .collect();
        Some(Signals { streams })
    }

    #[cfg(not(unix))]
    fn new() -> Option<Signals> {
        Some(Signals {})
    }

    /// Waits for the next signal; its name.
    #[cfg(unix)]
    async fn next(&mut self) -> &'static str {
        std::future::poll_fn(|cx| {
            for (name, s) in &mut self.streams {
                if s.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*name);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    #[cfg(not(unix))]
    async fn next(&mut self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
