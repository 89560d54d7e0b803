//! Against the real server: `LYRA_TEST_POSTGRES_URL`, or postgres://postgres@127.0.0.1:5432/test.
//! Unreachable, the tests skip (saying so), unless `CI=true`, where they fail.

// A test helper: says on the terminal why a test is skipped.
#![allow(clippy::print_stderr)]

use std::time::Duration;

use lyra_core::provider::{Lookup, OpContext, Provider, ProviderError};
use lyra_core::value::{Map, Value};
use serde_json::json;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgPool};

use super::*;
use crate::test_support::map;

fn test_url() -> String {
    std::env::var("LYRA_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A pool for out-of-band changes, or `None` (skip) when the server is unreachable.
async fn server(test: &str) -> Option<PgPool> {
    let url = test_url();
    let error = match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&url)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            return Some(PgPool::connect(&url).await.expect("connect again"));
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_owned(),
    };
    let shown = redact_url(&url);
    assert!(
        !in_ci(),
        "{test}: Postgres at {shown} is unreachable ({error}), and CI=true forbids skipping"
    );
    eprintln!("skipping {test}: Postgres at {shown} is unreachable ({error}); set CI=true to make this fail");
    None
}

fn config_of(url: &str) -> Map {
    map(json!({ "url": url }))
}

fn cx_with(type_name: &'static str, config: Map) -> OpContext<'static> {
    let mut cx = crate::test_support::cx(type_name);
    cx.config = Box::leak(Box::new(config));
    cx
}

fn cx(type_name: &'static str) -> OpContext<'static> {
    cx_with(type_name, config_of(&test_url()))
}

/// A name no other test (or run) uses.
fn unique(prefix: &str) -> String {
    format!("lyra_{prefix}_{:08x}", rand::random::<u32>())
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The attributes `desired` sets, as `actual` has them: what the engine diffs.
fn assert_no_drift(desired: &Map, actual: &Map) {
    for (k, v) in desired {
        assert_eq!(actual.get(k), Some(v), "attribute {k} drifted: {actual:?}");
    }
}

/// Drops roles and databases a failed test left behind.
async fn cleanup(pool: &PgPool, roles: &[&str], databases: &[&str]) {
    for d in databases {
        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            ident(d)
        )))
        .execute(pool)
        .await;
    }
    for r in roles {
        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
            "DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {0}) THEN \
             EXECUTE 'REASSIGN OWNED BY ' || quote_ident({0}) || ' TO CURRENT_USER'; \
             EXECUTE 'DROP OWNED BY ' || quote_ident({0}); END IF; END $$; DROP ROLE IF EXISTS {1}",
            literal(r),
            ident(r)
        )))
        .execute(pool)
        .await;
    }
}

const NASTY_PASSWORD: &str = "it's a \\'quoted\\' p\"a$$word\\";

#[test]
fn urls_are_redacted() {
    assert_eq!(
        redact_url("postgres://bob:s3cr%40t@db:5432/app?sslmode=require&password=x"),
        "postgres://bob:***@db:5432/app?sslmode=require&password=***"
    );
    assert_eq!(redact_url("postgres://bob@db/app"), "postgres://bob@db/app");
    assert_eq!(redact_url("postgres://db"), "postgres://db");
    assert_eq!(redact_url("not a url"), "not a url");
}

#[test]
fn identifiers_and_literals_are_quoted() {
    assert_eq!(ident("a\"b"), "\"a\"\"b\"");
    assert_eq!(literal("it's \\"), "E'it''s \\\\'");
}

#[test]
fn urls_for_other_databases_keep_the_server_and_credentials() {
    let s = Server::from_config(&config_of("postgres://bob:pw@db:5432/app?sslmode=disable")).unwrap();
    let other = s.for_database("my db/x").unwrap();
    assert_eq!(other.url, "postgres://bob:pw@db:5432/my%20db%2Fx?sslmode=disable");
    assert_eq!(other.database().as_deref(), Some("my db/x"));
}

#[tokio::test]
async fn bad_configuration_is_a_config_error_without_secrets() {
    let p = PostgresProvider::new();
    let desired = map(json!({"name": "x"}));
    let err = p
        .create(&cx_with(ROLE, map(json!({"url": 5}))), &desired)
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err:?}");
    let err = p
        .create(&cx_with(ROLE, map(json!({"url": "mysql://u:hunter2@h/db"}))), &desired)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if !m.contains("hunter2") && m.contains("***")),
        "{err:?}"
    );
    let err = p
        .create(
            &cx_with(ROLE, map(json!({"url": test_url(), "max_connections": 0}))),
            &desired,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err:?}");
    if std::env::var_os("DATABASE_URL").is_none() {
        let err = p.create(&cx_with(ROLE, Map::new()), &desired).await.unwrap_err();
        assert!(
            matches!(&err, ProviderError::Config(m) if m.contains("DATABASE_URL")),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_server_is_retryable_and_its_password_is_never_shown() {
    let p = PostgresProvider::new();
    // Nothing listens on port 1.
    let cx = cx_with(ROLE, config_of("postgres://postgres:hunter2@127.0.0.1:1/test"));
    let err = p.read(&cx, "somebody", None).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("postgres://postgres:***@127.0.0.1:1/test"), "{text}");
}

#[tokio::test]
async fn a_cancelled_create_stops_and_makes_nothing() {
    let Some(pool) = server("a_cancelled_create_stops_and_makes_nothing").await else {
        return;
    };
    let p = PostgresProvider::new();
    let name = unique("cancel");
    let cx = cx(ROLE);
    cx.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = p.create(&cx, &map(json!({"name": name}))).await.unwrap_err();
    assert!(matches!(err, ProviderError::Cancelled), "{err:?}");
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_roles WHERE rolname = $1")
        .bind(&name)
        .fetch_optional(&pool)
        .await
        .unwrap();
    assert_eq!(found, None);
    cleanup(&pool, &[&name], &[]).await;
}

#[tokio::test]
async fn role_lifecycle() {
    let Some(pool) = server("role_lifecycle").await else {
        return;
    };
    let p = PostgresProvider::new();
    let name = unique("role");
    let group_a = unique("group_a");
    let group_b = unique("group_b");
    let other_db = unique("roledb");
    let table = unique("owned");
    exec(
        &pool,
        &format!("CREATE ROLE {}; CREATE ROLE {}", ident(&group_a), ident(&group_b)),
    )
    .await;
    // On a task of its own, so the cleanup below runs even when it panics.
    let result = tokio::spawn({
        let (pool, name, group_a, group_b, other_db, table) = (
            pool.clone(),
            name.clone(),
            group_a.clone(),
            group_b.clone(),
            other_db.clone(),
            table.clone(),
        );
        async move {
            let desired = map(json!({
                "name": name,
                "login": true,
                "password": NASTY_PASSWORD,
                "connection_limit": 5,
                "valid_until": "2030-01-01",
                "roles": [group_b, group_a],
            }));
            let created = p.create(&cx(ROLE), &desired).await.unwrap();
            assert_eq!(created.external_id, name);
            assert_no_drift(&desired, &created.actual);
            assert_eq!(created.actual["inherit"], json!(true));
            assert_eq!(created.actual["superuser"], json!(false));
            let has_password: bool =
                sqlx::query_scalar("SELECT rolpassword IS NOT NULL FROM pg_authid WHERE rolname = $1")
                    .bind(&name)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert!(has_password);

            // No drift.
            let read = p.read(&cx(ROLE), &name, Some(&created.actual)).await.unwrap().unwrap();
            assert_eq!(read, created.actual);

            // Update in place: flags, limit, expiry removed, one membership less, password changed.
            let desired = map(json!({
                "name": name,
                "login": true,
                "password": "new one",
                "create_database": true,
                "connection_limit": 10,
                "roles": [group_a],
            }));
            let updated = p.update(&cx(ROLE), &name, &desired, &created.actual).await.unwrap();
            assert_no_drift(&desired, &updated);
            assert_eq!(updated["valid_until"], Value::Null);
            let read = p.read(&cx(ROLE), &name, Some(&updated)).await.unwrap().unwrap();
            assert_eq!(read, updated);

            // Drift, made out of band, shows.
            exec(
                &pool,
                &format!(
                    "ALTER ROLE {0} CONNECTION LIMIT 3 NOCREATEDB VALID UNTIL '2031-06-01 00:00:00+00'; GRANT {1} TO {0}",
                    ident(&name),
                    ident(&group_b)
                ),
            )
            .await;
            let drifted = p.read(&cx(ROLE), &name, Some(&updated)).await.unwrap().unwrap();
            assert_eq!(drifted["connection_limit"], json!(3));
            assert_eq!(drifted["create_database"], json!(false));
            let valid_until = drifted["valid_until"].as_str().unwrap();
            assert!(valid_until.starts_with("2031-06-01"), "{valid_until}");
            assert_eq!(drifted["roles"], json!([group_a, group_b]));
            // ...and the update corrects it, revoking what was granted out of band.
            let fixed = p.update(&cx(ROLE), &name, &desired, &drifted).await.unwrap();
            assert_no_drift(&desired, &fixed);

            // A new name is a replace: the schema says so.
            let schemas = p.schemas();
            let schema = schemas.iter().find(|s| s.name == ROLE).unwrap();
            assert!(schema.attribute("name").unwrap().immutable);
            assert!(schema.is_secret("password"));

            // The role owns a table here and one in another database, and holds a privilege.
            exec(&pool, &format!("CREATE DATABASE {}", ident(&other_db))).await;
            exec(
                &pool,
                &format!(
                    "CREATE TABLE public.{0} (id int); ALTER TABLE public.{0} OWNER TO {1}; \
                 GRANT CONNECT ON DATABASE {2} TO {1}",
                    ident(&table),
                    ident(&name),
                    ident(&other_db)
                ),
            )
            .await;
            let other_url = Server::from_config(&config_of(&test_url()))
                .unwrap()
                .for_database(&other_db)
                .unwrap()
                .url;
            let other = PgPool::connect(&other_url).await.unwrap();
            exec(
                &other,
                &format!("CREATE TABLE t (id int); ALTER TABLE t OWNER TO {}", ident(&name)),
            )
            .await;
            other.close().await;

            p.delete(&cx(ROLE), &name, &fixed).await.unwrap();
            assert_eq!(p.read(&cx(ROLE), &name, Some(&fixed)).await.unwrap(), None);
            p.delete(&cx(ROLE), &name, &fixed).await.unwrap();
            let owner: String = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT tableowner::text FROM pg_tables WHERE schemaname = 'public' AND tablename = {}",
                literal(&table)
            )))
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(owner, "postgres", "reassigned to the provider's user");
            let other = PgPool::connect(&other_url).await.unwrap();
            let owner: String = sqlx::query_scalar("SELECT tableowner::text FROM pg_tables WHERE tablename = 't'")
                .fetch_one(&other)
                .await
                .unwrap();
            assert_eq!(owner, "postgres", "reassigned in the other database too");
            let db_owner: String =
                sqlx::query_scalar("SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1")
                    .bind(&other_db)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(db_owner, "postgres", "the database it owned too");
            other.close().await;
        }
    })
    .await;
    exec(&pool, &format!("DROP TABLE IF EXISTS public.{}", ident(&table))).await;
    cleanup(&pool, &[&name, &group_a, &group_b], &[&other_db]).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

#[tokio::test]
async fn role_lookup_after_a_lost_create_finds_it_by_name() {
    let Some(pool) = server("role_lookup_after_a_lost_create_finds_it_by_name").await else {
        return;
    };
    let p = PostgresProvider::new();
    let name = unique("lost");
    let desired = map(json!({"name": name, "login": true, "password": NASTY_PASSWORD, "connection_limit": 4}));
    assert!(matches!(p.lookup(&cx(ROLE), &desired).await.unwrap(), Lookup::Absent));
    // The create whose result is "lost".
    p.create(&cx(ROLE), &desired).await.unwrap();
    match p.lookup(&cx(ROLE), &desired).await.unwrap() {
        Lookup::Found(c) => {
            assert_eq!(c.external_id, name);
            assert_eq!(c.actual["connection_limit"], json!(4));
            assert_eq!(c.actual["login"], json!(true));
            // Unknown, so the engine's update sets it again.
            assert_eq!(c.actual["password"], Value::Null);
        }
        other => panic!("{other:?}"),
    }
    cleanup(&pool, &[&name], &[]).await;
}

#[tokio::test]
async fn role_passwords_never_show_in_errors() {
    let Some(pool) = server("role_passwords_never_show_in_errors").await else {
        return;
    };
    let p = PostgresProvider::new();
    let name = unique("secret");
    // The literal means the password exactly, backslashes and quotes included.
    let same: bool = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {} = $1", literal(NASTY_PASSWORD))))
        .bind(NASTY_PASSWORD)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(same);
    // Fails after CREATE ROLE, inside its transaction: no such group.
    let desired = map(json!({"name": name, "password": NASTY_PASSWORD, "roles": ["lyra_no_such_group"]}));
    let err = p.create(&cx(ROLE), &desired).await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("lyra_no_such_group"), "{text}");
    assert!(!text.contains(NASTY_PASSWORD) && !text.contains("word"), "{text}");
    assert!(
        matches!(p.lookup(&cx(ROLE), &desired).await.unwrap(), Lookup::Absent),
        "rolled back"
    );

    let created = p
        .create(&cx(ROLE), &map(json!({"name": name, "password": NASTY_PASSWORD})))
        .await
        .unwrap();
    // The prior value is all read returns of it.
    let read = p.read(&cx(ROLE), &name, Some(&created.actual)).await.unwrap().unwrap();
    assert_eq!(read["password"], json!(NASTY_PASSWORD));
    let read = p.read(&cx(ROLE), &name, None).await.unwrap().unwrap();
    assert_eq!(read["password"], Value::Null);
    // A second create of the same name fails; its error does not hold the password.
    let err = p
        .create(&cx(ROLE), &map(json!({"name": name, "password": NASTY_PASSWORD})))
        .await
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("already exists"), "{text}");
    assert!(!text.contains("word"), "{text}");
    cleanup(&pool, &[&name], &[]).await;
}

#[tokio::test]
async fn database_lifecycle() {
    let Some(pool) = server("database_lifecycle").await else {
        return;
    };
    let p = PostgresProvider::new();
    let name = unique("db");
    let owner = unique("owner");
    exec(&pool, &format!("CREATE ROLE {}", ident(&owner))).await;
    // On a task of its own, so the cleanup below runs even when it panics.
    let result = tokio::spawn({
        let (pool, name, owner) = (pool.clone(), name.clone(), owner.clone());
        async move {
            let desired = map(json!({
                "name": name,
                "encoding": "utf8",
                "lc_collate": "C",
                "lc_ctype": "C",
                "connection_limit": 5,
            }));
            let created = p.create(&cx(DATABASE), &desired).await.unwrap();
            assert_eq!(created.external_id, name);
            assert_no_drift(&desired, &created.actual);
            assert_eq!(created.actual["owner"], json!("postgres"));
            assert_eq!(created.actual["template"], json!("template0"));
            assert_eq!(created.actual["allow_connections"], json!(true));
            let encoding: String =
                sqlx::query_scalar("SELECT pg_encoding_to_char(encoding)::text FROM pg_database WHERE datname = $1")
                    .bind(&name)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert_eq!(encoding, "UTF8");

            let read = p
                .read(&cx(DATABASE), &name, Some(&created.actual))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(read, created.actual);

            // Update in place: owner and limit.
            let mut desired = desired;
            desired.insert("owner".into(), json!(owner));
            desired.insert("connection_limit".into(), json!(7));
            // A template cannot be dropped as such: delete must handle it.
            desired.insert("is_template".into(), json!(true));
            let updated = p.update(&cx(DATABASE), &name, &desired, &created.actual).await.unwrap();
            assert_no_drift(&desired, &updated);

            // Drift.
            exec(&pool, &format!("ALTER DATABASE {} CONNECTION LIMIT 2", ident(&name))).await;
            let drifted = p.read(&cx(DATABASE), &name, Some(&updated)).await.unwrap().unwrap();
            assert_eq!(drifted["connection_limit"], json!(2));

            let schemas = p.schemas();
            let schema = schemas.iter().find(|s| s.name == DATABASE).unwrap();
            for a in ["name", "template", "encoding", "lc_collate", "lc_ctype"] {
                assert!(schema.attribute(a).unwrap().immutable, "{a}");
            }

            // Lookup after a lost create.
            match p.lookup(&cx(DATABASE), &desired).await.unwrap() {
                Lookup::Found(c) => {
                    assert_eq!(c.external_id, name);
                    assert_eq!(c.actual["owner"], json!(owner));
                }
                other => panic!("{other:?}"),
            }

            // Delete while someone is connected to it.
            let url = Server::from_config(&config_of(&test_url()))
                .unwrap()
                .for_database(&name)
                .unwrap()
                .url;
            let mut conn = PgConnection::connect(&url).await.unwrap();
            p.delete(&cx(DATABASE), &name, &drifted).await.unwrap();
            assert!(
                sqlx::query("SELECT 1").execute(&mut conn).await.is_err(),
                "its session was ended"
            );
            assert_eq!(p.read(&cx(DATABASE), &name, Some(&drifted)).await.unwrap(), None);
            p.delete(&cx(DATABASE), &name, &drifted).await.unwrap();
            assert!(matches!(
                p.lookup(&cx(DATABASE), &desired).await.unwrap(),
                Lookup::Absent
            ));
        }
    })
    .await;
    cleanup(&pool, &[&owner], &[&name]).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Whether `role` holds `privilege` on `database` (asked of the server, not of the provider).
async fn has_database_privilege(pool: &PgPool, role: &str, database: &str, privilege: &str) -> bool {
    sqlx::query_scalar("SELECT has_database_privilege($1, $2, $3)")
        .bind(role)
        .bind(database)
        .bind(privilege)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn grant_on_a_database_lifecycle() {
    let Some(pool) = server("grant_on_a_database_lifecycle").await else {
        return;
    };
    let p = PostgresProvider::new();
    let role = unique("grantee");
    let db = unique("grantdb");
    exec(&pool, &format!("CREATE ROLE {}", ident(&role))).await;
    exec(&pool, &format!("CREATE DATABASE {}", ident(&db))).await;
    // The default lets PUBLIC connect: take it away, so only the grant gives CONNECT.
    exec(&pool, &format!("REVOKE ALL ON DATABASE {} FROM PUBLIC", ident(&db))).await;
    // On a task of its own, so the cleanup below runs even when it panics.
    let result = tokio::spawn({
        let (pool, role, db) = (pool.clone(), role.clone(), db.clone());
        async move {
        let desired = map(json!({"role": role, "database": db, "object_type": "database", "privileges": ["CONNECT", "temp"]}));
        let created = p.create(&cx(GRANT), &desired).await.unwrap();
        assert_eq!(created.external_id, format!("{role}/{db}//database"));
        assert_no_drift(&desired, &created.actual);
        assert!(has_database_privilege(&pool, &role, &db, "CONNECT").await);
        assert!(!has_database_privilege(&pool, &role, &db, "CREATE").await);
        let read = p.read(&cx(GRANT), &created.external_id, Some(&created.actual)).await.unwrap().unwrap();
        assert_eq!(read, created.actual);
        // Without a record, from the id alone.
        let bare = p.read(&cx(GRANT), &created.external_id, None).await.unwrap().unwrap();
        assert_eq!(bare["privileges"], json!(["CONNECT", "TEMPORARY"]));

        // Update in place: revoke all, grant the new set.
        let desired = map(json!({"role": role, "database": db, "object_type": "database", "privileges": ["CONNECT", "CREATE"]}));
        let updated = p.update(&cx(GRANT), &created.external_id, &desired, &created.actual).await.unwrap();
        assert_no_drift(&desired, &updated);
        assert!(!has_database_privilege(&pool, &role, &db, "TEMPORARY").await);

        // Drift: one revoked out of band.
        exec(&pool, &format!("REVOKE CREATE ON DATABASE {} FROM {}", ident(&db), ident(&role))).await;
        let drifted = p.read(&cx(GRANT), &created.external_id, Some(&updated)).await.unwrap().unwrap();
        assert_eq!(drifted["privileges"], json!(["CONNECT"]));

        let schemas = p.schemas();
        let schema = schemas.iter().find(|s| s.name == GRANT).unwrap();
        for a in ["role", "database", "schema", "object_type", "objects"] {
            assert!(schema.attribute(a).unwrap().immutable, "{a}");
        }
        assert!(!schema.attribute("privileges").unwrap().immutable);

        // Lookup finds what is granted.
        assert!(matches!(p.lookup(&cx(GRANT), &desired).await.unwrap(), Lookup::Found(_)));

        p.delete(&cx(GRANT), &created.external_id, &drifted).await.unwrap();
        assert!(!has_database_privilege(&pool, &role, &db, "CONNECT").await);
        assert_eq!(p.read(&cx(GRANT), &created.external_id, Some(&drifted)).await.unwrap(), None);
        p.delete(&cx(GRANT), &created.external_id, &drifted).await.unwrap();
        assert!(matches!(p.lookup(&cx(GRANT), &desired).await.unwrap(), Lookup::Absent));

        // A privilege that is no keyword is refused before any statement is written.
        let bad = map(json!({"role": role, "database": db, "object_type": "database", "privileges": ["CONNECT ON DATABASE x TO y; --"]}));
        let err = p.create(&cx(GRANT), &bad).await.unwrap_err();
        assert!(matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "privileges"), "{err:?}");
        let bad = map(json!({"role": role, "database": db, "object_type": "table", "privileges": ["SELECT"]}));
        let err = p.create(&cx(GRANT), &bad).await.unwrap_err();
        assert!(matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "schema"), "{err:?}");
    }
    })
    .await;
    cleanup(&pool, &[&role], &[&db]).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

#[tokio::test]
async fn grant_on_tables_of_another_database_lifecycle() {
    let Some(pool) = server("grant_on_tables_of_another_database_lifecycle").await else {
        return;
    };
    let p = PostgresProvider::new();
    let role = unique("reader");
    let db = unique("tabledb");
    exec(&pool, &format!("CREATE ROLE {}", ident(&role))).await;
    exec(&pool, &format!("CREATE DATABASE {}", ident(&db))).await;
    let other_url = Server::from_config(&config_of(&test_url()))
        .unwrap()
        .for_database(&db)
        .unwrap()
        .url;
    let other = PgPool::connect(&other_url).await.unwrap();
    exec(
        &other,
        "CREATE SCHEMA app; CREATE TABLE app.a (id int); CREATE TABLE app.b (id int); CREATE SEQUENCE app.s",
    )
    .await;
    // On a task of its own, so the cleanup below runs even when it panics.
    let result = tokio::spawn({
        let (role, db, other) = (role.clone(), db.clone(), other.clone());
        async move {
            let has = |table: &'static str, privilege: &'static str| {
                let other = other.clone();
                let role = role.clone();
                async move {
                    sqlx::query_scalar::<_, bool>("SELECT has_table_privilege($1, $2, $3)")
                        .bind(&role)
                        .bind(table)
                        .bind(privilege)
                        .fetch_one(&other)
                        .await
                        .unwrap()
                }
            };
            let desired = map(json!({
                "role": role, "database": db, "schema": "app", "object_type": "table",
                "privileges": ["select", "INSERT"],
            }));
            let created = p.create(&cx(GRANT), &desired).await.unwrap();
            assert_eq!(created.external_id, format!("{role}/{db}/app/table"));
            assert_no_drift(&desired, &created.actual);
            assert!(has("app.a", "SELECT").await && has("app.b", "INSERT").await);
            assert!(!has("app.a", "DELETE").await);
            let read = p
                .read(&cx(GRANT), &created.external_id, Some(&created.actual))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(read, created.actual);

            // Drift: INSERT revoked on one of the tables: not held on all of them.
            exec(&other, &format!("REVOKE INSERT ON app.b FROM {}", ident(&role))).await;
            let drifted = p
                .read(&cx(GRANT), &created.external_id, Some(&created.actual))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(drifted["privileges"], json!(["SELECT"]));
            let updated = p
                .update(&cx(GRANT), &created.external_id, &desired, &drifted)
                .await
                .unwrap();
            assert_no_drift(&desired, &updated);
            assert!(has("app.b", "INSERT").await);

            // The schema itself.
            let usage = map(json!({
                "role": role, "database": db, "schema": "app", "object_type": "schema", "privileges": ["USAGE"],
            }));
            let usage_created = p.create(&cx(GRANT), &usage).await.unwrap();
            assert_eq!(usage_created.external_id, format!("{role}/{db}/app/schema"));
            assert_no_drift(&usage, &usage_created.actual);
            let has_usage = || async {
                sqlx::query_scalar::<_, bool>("SELECT has_schema_privilege($1, 'app', 'USAGE')")
                    .bind(&role)
                    .fetch_one(&other)
                    .await
                    .unwrap()
            };
            assert!(has_usage().await);
            // Revoked out of band: all of it, so the grant reads as gone.
            exec(&other, &format!("REVOKE USAGE ON SCHEMA app FROM {}", ident(&role))).await;
            assert_eq!(
                p.read(&cx(GRANT), &usage_created.external_id, Some(&usage_created.actual))
                    .await
                    .unwrap(),
                None
            );
            assert!(matches!(p.lookup(&cx(GRANT), &usage).await.unwrap(), Lookup::Absent));
            p.create(&cx(GRANT), &usage).await.unwrap();
            assert!(matches!(p.lookup(&cx(GRANT), &usage).await.unwrap(), Lookup::Found(_)));
            p.delete(&cx(GRANT), &usage_created.external_id, &usage_created.actual)
                .await
                .unwrap();
            assert!(!has_usage().await);

            // Sequences, listed by name, with ALL.
            let seq = map(json!({
                "role": role, "database": db, "schema": "app", "object_type": "sequence",
                "objects": ["s"], "privileges": ["ALL"],
            }));
            let seq_created = p.create(&cx(GRANT), &seq).await.unwrap();
            assert_no_drift(&seq, &seq_created.actual);
            p.delete(&cx(GRANT), &seq_created.external_id, &seq_created.actual)
                .await
                .unwrap();
            assert_eq!(
                p.read(&cx(GRANT), &seq_created.external_id, Some(&seq_created.actual))
                    .await
                    .unwrap(),
                None
            );

            p.delete(&cx(GRANT), &created.external_id, &updated).await.unwrap();
            assert!(!has("app.a", "SELECT").await && !has("app.b", "INSERT").await);
            assert_eq!(
                p.read(&cx(GRANT), &created.external_id, Some(&updated)).await.unwrap(),
                None
            );
            p.delete(&cx(GRANT), &created.external_id, &updated).await.unwrap();
        }
    })
    .await;
    other.close().await;
    cleanup(&pool, &[&role], &[&db]).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}
