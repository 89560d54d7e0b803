//! The conformance suite on both backends: one test per check per backend
//! (`tests::sqlite::<check>`, `tests::postgres::<check>`).
//!
//! Postgres tests each get a fresh schema ([`PgTestDb`]), dropped afterwards; if the server is
//! unreachable they skip with a message, or fail when `CI=true`.

use crate::conformance as c;
use crate::testing::PgTestDb;
use crate::{PostgresStore, SqliteStore};

/// Calls `$backend!` with every check (and its extra argument, if any).
macro_rules! for_each_check {
    ($backend:ident) => {
        $backend! {
            load_unknown_is_none;
            begin_run_creates_deployment;
            workflow_follows_applies;
            resource_round_trip;
            replace_resource;
            remove_resource;
            resources_sorted_by_step_id;
            deployments_are_isolated;
            list_sorted_with_counts_and_last_run;
            history_newest_first;
            finish_run_records_end;
            unfinished_run_has_no_outcome;
            finish_run_misuse_is_rejected;
            history_survives_resource_removal;
            concurrent_puts_all_land(1000);
            concurrent_mixed_writes;
            pending_round_trip;
            notes_and_operations_round_trip;
            lease_lifecycle;
            lease_expires;
            break_lease_returns_holder;
            leases_are_per_deployment;
            concurrent_acquires_one_winner(32);
            export_import_round_trip;
            import_replaces_resources;
            drop_deployment_removes_everything;
            values_at_the_limit_round_trip;
            too_deep_values_are_refused;
        }
    };
}

macro_rules! sqlite_checks {
    ($($name:ident $(($arg:expr))?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = SqliteStore::open(&dir.path().join("state.db")).await.expect("open");
            c::$name(&store $(, $arg)?).await;
            store.close().await.expect("close");
        }
    )*};
}

macro_rules! postgres_checks {
    ($($name:ident $(($arg:expr))?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(db) = PgTestDb::create(stringify!($name)).await else {
                return;
            };
            let store = PostgresStore::connect(db.url()).await.expect("connect");
            c::$name(&store $(, $arg)?).await;
            store.close().await;
        }
    )*};
}

mod sqlite {
    use super::*;

    for_each_check!(sqlite_checks);
}

mod postgres {
    use super::*;

    for_each_check!(postgres_checks);
}
