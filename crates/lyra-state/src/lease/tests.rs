//! The lease keeper against a real (SQLite) store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Store;
use tempfile::TempDir;

use super::{LeaseError, LeaseOptions, Released, acquire, run_under_lease};
use crate::SqliteStore;

async fn store() -> (TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("state.db")).await.expect("open");
    (dir, Arc::new(store))
}

fn options(owner: &str, ttl_ms: u64) -> LeaseOptions {
    LeaseOptions {
        ttl: Duration::from_millis(ttl_ms),
        name_holder: true,
        ..LeaseOptions::new(owner, "apply")
    }
}

fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

#[tokio::test]
async fn refused_at_once_naming_the_holder() {
    let (_dir, store) = store().await;
    let held = acquire(store.clone(), "web", &options("alice@laptop", 30_000), flag())
        .await
        .expect("first takes it");
    assert_eq!(held.lease().owner, "alice@laptop");
    let (random, _process) = held.lease().token.split_once('~').unwrap_or((&held.lease().token, ""));
    assert_eq!(random.len(), 32);
    assert!(held.took_over().is_none());

    let err = acquire(store.clone(), "web", &LeaseOptions::new("bob@host", "delete"), flag())
        .await
        .expect_err("second is refused");
    let LeaseError::Held(holder) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(holder.owner, "alice@laptop");
    let message = err.to_string();
    for part in [
        "\"web\"",
        "alice@laptop",
        "apply",
        &super::utc(held.lease().since),
        "expires",
    ] {
        assert!(message.contains(part), "{message} lacks {part}");
    }
    assert!(
        message.contains('T') && message.contains('Z'),
        "UTC timestamps: {message}"
    );

    // Another deployment is free.
    acquire(store.clone(), "db", &LeaseOptions::new("bob@host", "apply"), flag())
        .await
        .expect("other deployment");
    held.release().await.expect("release");
    acquire(store, "web", &LeaseOptions::new("bob@host", "apply"), flag())
        .await
        .expect("free after release");
}

#[tokio::test]
async fn renewals_keep_it_past_its_ttl() {
    let (_dir, store) = store().await;
    let lost = flag();
    let held = acquire(store.clone(), "web", &options("alice@laptop", 150), lost.clone())
        .await
        .expect("acquire");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let err = acquire(store.clone(), "web", &options("bob@host", 150), flag())
        .await
        .expect_err("still held");
    let current = err.holder().expect("holder");
    assert_eq!(current.since, held.lease().since);
    assert!(current.expires > held.lease().expires, "renewed");
    assert!(!lost.load(Ordering::SeqCst));
}

#[tokio::test]
async fn dropping_stops_renewals() {
    let (_dir, store) = store().await;
    let held = acquire(store.clone(), "web", &options("alice@laptop", 150), flag())
        .await
        .expect("acquire");
    drop(held);
    tokio::time::sleep(Duration::from_millis(400)).await;
    acquire(store, "web", &options("bob@host", 150), flag())
        .await
        .expect("expired once no longer renewed");
}

#[tokio::test]
async fn waits_then_gets_it() {
    let (_dir, store) = store().await;
    let held = acquire(store.clone(), "web", &options("alice@laptop", 30_000), flag())
        .await
        .expect("acquire");
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.expect("release");
    });
    let waiting = LeaseOptions {
        wait: Some(Duration::from_secs(10)),
        ..LeaseOptions::new("bob@host", "apply")
    };
    let started = std::time::Instant::now();
    let got = acquire(store, "web", &waiting, flag()).await.expect("waited for it");
    assert_eq!(got.lease().owner, "bob@host");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    releaser.await.expect("releaser");
}

#[tokio::test]
async fn wait_times_out() {
    let (_dir, store) = store().await;
    let _held = acquire(store.clone(), "web", &options("alice@laptop", 30_000), flag())
        .await
        .expect("acquire");
    let waiting = LeaseOptions {
        wait: Some(Duration::from_millis(400)),
        ..LeaseOptions::new("bob@host", "apply")
    };
    let err = acquire(store, "web", &waiting, flag()).await.expect_err("times out");
    let LeaseError::TimedOut { holder, waited } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(holder.owner, "alice@laptop");
    assert!(*waited >= Duration::from_millis(400), "{waited:?}");
    assert!(err.to_string().contains("still locked after waiting"), "{err}");
}

#[tokio::test]
async fn broken_lease_sets_lost() {
    let (_dir, store) = store().await;
    let lost = flag();
    let held = acquire(store.clone(), "web", &options("alice@laptop", 150), lost.clone())
        .await
        .expect("acquire");
    let broken = store.break_lease("web").await.expect("break").expect("was held");
    assert_eq!(broken.token, held.lease().token);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !lost.load(Ordering::SeqCst) {
        assert!(std::time::Instant::now() < deadline, "loss not detected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Releasing a lost lease is fine, and does not free someone else's.
    acquire(store.clone(), "web", &options("bob@host", 30_000), flag())
        .await
        .expect("bob takes it");
    assert!(held.is_lost());
    assert_eq!(held.release().await.expect("release lost lease"), Released::Lost);
    assert_eq!(
        store.lease("web").await.expect("lease").map(|l| l.owner),
        Some("bob@host".to_owned())
    );
}

#[tokio::test]
async fn a_run_under_a_lease_records_through_it_and_releases_it() {
    use lyra_core::state::{Operation, Recorder as _, RunStart};
    let (_dir, store) = store().await;
    let cancel = flag();
    let ran = run_under_lease(
        &store,
        "web",
        &options("alice@laptop", 30_000),
        &cancel,
        |_| panic!("nothing to wait for"),
        |leased| async move {
            assert_eq!(leased.lease().owner, "alice@laptop");
            let start = RunStart {
                deployment: "web".to_owned(),
                workflow: None,
                operation: Operation::Apply,
                actor: "alice@laptop".to_owned(),
            };
            leased
                .recorder()
                .begin_run(&start)
                .await
                .expect("recorded under the lease")
        },
    )
    .await
    .expect("ran");
    assert_eq!(ran.released.as_ref().ok(), Some(&Released::Kept));
    assert!(!ran.lost());
    assert_eq!(store.history("web").await.expect("history")[0].id, ran.value);
    assert_eq!(store.lease("web").await.expect("lease"), None, "released");
    assert!(!cancel.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_run_that_loses_its_lease_is_told_and_cannot_record() {
    use lyra_core::state::{Operation, Recorder as _, RunStart, StoreErrorKind};
    let (_dir, store) = store().await;
    let cancel = flag();
    let broken = store.clone();
    let ran = run_under_lease(
        &store,
        "web",
        &options("alice@laptop", 150),
        &cancel,
        |_| {},
        |leased| async move {
            broken.break_lease("web").await.expect("break");
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !leased.is_lost() {
                assert!(std::time::Instant::now() < deadline, "loss not detected");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let start = RunStart {
                deployment: "web".to_owned(),
                workflow: None,
                operation: Operation::Apply,
                actor: "alice@laptop".to_owned(),
            };
            leased.recorder().begin_run(&start).await.expect_err("refused").kind
        },
    )
    .await
    .expect("ran");
    assert_eq!(ran.value, StoreErrorKind::LeaseLost);
    assert!(ran.lost());
    assert!(cancel.load(Ordering::SeqCst), "a lost lease stops the run");
    assert!(store.history("web").await.expect("history").is_empty());
}

#[tokio::test]
async fn a_cancel_ends_the_wait_for_a_lease() {
    let (_dir, store) = store().await;
    let _held = acquire(store.clone(), "web", &options("alice@laptop", 30_000), flag())
        .await
        .expect("acquire");
    let cancel = flag();
    let waiting = LeaseOptions {
        wait: Some(Duration::from_secs(60)),
        ..LeaseOptions::new("bob@host", "apply")
    };
    let canceller = cancel.clone();
    let err = run_under_lease(
        &store,
        "web",
        &waiting,
        &cancel,
        |_| canceller.store(true, Ordering::SeqCst),
        |_| async { panic!("never runs") },
    )
    .await
    .expect_err("cancelled");
    assert!(matches!(err, LeaseError::Cancelled(ref d) if d == "web"), "{err:?}");
}

/// A lease taken under `token` (as another process would have), left to expire in a minute.
async fn held_by(store: &Arc<dyn Store>, token: &str) {
    let request = crate::conformance::lease_request("web", "alice@laptop", token, 60_000);
    crate::conformance::acquired(store.as_ref(), &request).await;
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_lease_of_a_process_that_ended_is_taken_over_and_a_live_ones_is_not() {
    let (_dir, store) = store().await;
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let token = super::holder::token_naming(child.id());
    held_by(&store, &token).await;

    let err = acquire(store.clone(), "web", &options("bob@host", 30_000), flag())
        .await
        .expect_err("its holder is alive");
    let shown = token
        .split_once('~')
        .map(|(_, p)| format!("~{p}"))
        .expect("names a process");
    assert!(matches!(err, LeaseError::Held(ref h) if h.token == shown), "{err:?}");

    child.kill().expect("kill");
    child.wait().expect("wait");
    let held = acquire(store.clone(), "web", &options("bob@host", 30_000), flag())
        .await
        .expect("its holder ended");
    assert_eq!(held.lease().owner, "bob@host");
    assert_ne!(held.lease().token, token, "held under its own token");
    let from = held.took_over().expect("says whose lease it took");
    assert_eq!(
        (from.owner.as_str(), from.token.as_str()),
        ("alice@laptop", shown.as_str())
    );
    assert_eq!(super::holder_pid(from), Some(child.id()));
    assert_eq!(held.release().await.expect("release"), Released::Kept);
}

#[tokio::test]
async fn leases_whose_tokens_name_no_process_wait_for_their_ttl() {
    let (_dir, store) = store().await;
    // As older versions made them, or from another machine.
    for (token, shown) in [("0123456789abcdef0123456789abcdef", ""), ("r~ff.1.2.3", "~ff.1.2.3")] {
        held_by(&store, token).await;
        let err = acquire(store.clone(), "web", &options("bob@host", 30_000), flag())
            .await
            .expect_err("cannot tell whether its holder ended");
        assert!(matches!(err, LeaseError::Held(ref h) if h.token == shown), "{err:?}");
        store.break_lease("web").await.expect("break");
    }
}
