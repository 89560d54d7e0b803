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
            records_stream_in_step_order;
            records_dropped_part_way;
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
            concurrent_varied_puts_round_trip;
            pending_round_trip;
            notes_and_operations_round_trip;
            history_keeps_no_credentials;
            lease_lifecycle;
            lease_expires;
            break_lease_returns_holder;
            break_lease_held_by_its_process_only;
            leases_are_per_deployment;
            stale_lease_writes_are_refused;
            stale_and_current_writes_at_once;
            finish_and_release;
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

/// Opening without creating: commands that only read never leave a store behind.
mod existing {
    use std::path::Path;

    use crate::{Error, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore};

    fn is_no_state<T>(r: Result<T, Error>) -> bool {
        matches!(r, Err(Error::NoState { .. }))
    }

    #[tokio::test]
    async fn sqlite_missing_file_is_no_state_and_nothing_is_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("no/such/dir/state.db");
        let opened = SqliteStore::open_existing(&path, &SqliteOptions::default()).await;
        assert!(is_no_state(opened));
        assert!(!dir.path().join("no").exists(), "a directory was created");
        let url = path.display().to_string();
        match crate::open_existing(&url).await {
            Err(e) => assert_eq!(e.to_string(), format!("no state at {url}")),
            Ok(_) => panic!("opened a missing store"),
        }
        assert!(!dir.path().join("no").exists());
    }

    #[tokio::test]
    async fn sqlite_files_without_a_state_are_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.db");
        std::fs::write(&empty, b"").unwrap();
        assert!(is_no_state(
            SqliteStore::open_existing(&empty, &SqliteOptions::default()).await
        ));
        assert_eq!(
            std::fs::metadata(&empty).unwrap().len(),
            0,
            "the empty file was written"
        );

        // Another program's database: no Lyra tables are added to it.
        let foreign = dir.path().join("foreign.db");
        let sqlite = |path: &Path| {
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
        };
        {
            use sqlx::{ConnectOptions as _, Connection as _};
            let mut conn = sqlite(&foreign).connect().await.unwrap();
            sqlx::query("CREATE TABLE t (x INTEGER)")
                .execute(&mut conn)
                .await
                .unwrap();
            conn.close().await.unwrap();
        }
        let before = std::fs::read(&foreign).unwrap();
        assert!(is_no_state(
            SqliteStore::open_existing(&foreign, &SqliteOptions::default()).await
        ));
        assert_eq!(std::fs::read(&foreign).unwrap(), before, "the foreign database changed");

        let text = dir.path().join("text.db");
        std::fs::write(&text, b"not a database at all, but long enough to have a header\n").unwrap();
        assert!(matches!(
            SqliteStore::open_existing(&text, &SqliteOptions::default()).await,
            Err(Error::NotADatabase { .. })
        ));
    }

    #[tokio::test]
    async fn sqlite_existing_state_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        SqliteStore::open(&path).await.unwrap().close().await.unwrap();
        let store = SqliteStore::open_existing(&path, &SqliteOptions::default())
            .await
            .expect("an existing state opens");
        use crate::prelude::*;
        assert!(store.list().await.unwrap().is_empty());
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn postgres_missing_schema_or_tables_is_no_state_and_nothing_is_created() {
        let Some(db) = crate::testing::PgTestDb::create("existing_missing").await else {
            return;
        };
        let options = PostgresOptions::default();
        assert!(is_no_state(PostgresStore::connect_existing(db.url(), &options).await));
        // The schema was not created: a second look still finds nothing.
        let server = db.server_url().to_owned();
        let exists = |schema: String| {
            let server = server.clone();
            async move {
                use sqlx::Connection as _;
                let mut conn = sqlx::PgConnection::connect(&server).await.unwrap();
                let found: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                    .bind(schema)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
                let _ = conn.close().await;
                found
            }
        };
        assert!(!exists(db.schema().to_owned()).await, "the schema was created");
        {
            // A schema without Lyra's tables holds no state either, and gets none.
            use sqlx::Connection as _;
            let mut conn = sqlx::PgConnection::connect(db.server_url()).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {}", db.schema())))
                .execute(&mut conn)
                .await
                .unwrap();
            let _ = conn.close().await;
        }
        assert!(is_no_state(PostgresStore::connect_existing(db.url(), &options).await));
        PostgresStore::connect(db.url()).await.unwrap().close().await;
        PostgresStore::connect_existing(db.url(), &options)
            .await
            .expect("an existing state opens")
            .close()
            .await;
    }
}
