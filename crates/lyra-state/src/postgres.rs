//! The Postgres state store: one database (optionally one schema of it) shared by every CLI
//! and controller that manages the same deployments.
//!
//! Every write is one autocommit statement (or one transaction where it needs several), so
//! it is committed when its call returns; with the server's default `synchronous_commit=on`
//! that means it is on the server's disk. Concurrent calls use separate pooled connections and
//! never wait on each other except for rows they both touch, and for the puts of one run,
//! which are written together ([`groups`]): runs on different deployments do not block each
//! other.
//!
//! **Connection faults.** The pool does not ping a connection before handing it out (that
//! would double the cost of every call); instead a call that fails because the connection or
//! the server went away is retried on a fresh connection, with a short backoff, for up to
//! [`RETRY_FOR`], when repeating it is harmless:
//!
//! - `put_resource` (an upsert), `remove_resource` (a delete), the lease operations (keyed by
//!   the holder's token) and every read are idempotent;
//! - `finish_run` is retried as "finish it, unless it was finished with exactly these
//!   values", so a retry after a commit whose answer was lost is not mistaken for a second
//!   finish;
//! - `drop_deployment` and `break_lease` are idempotent, but a retry after a lost answer
//!   reports what the retry saw (`false` / `None`), not what the first attempt did;
//! - `begin_run` and `import` append rows: repeating one whose commit succeeded but whose
//!   answer was lost would duplicate history. `begin_run` repeats its transaction up to,
//!   not including, the COMMIT (a transaction cut off before it is rolled back by the
//!   server) and sends the COMMIT once; `import` pings a connection first (retrying that
//!   part), then sends its statement once.
//!
//! When retrying does not help, the call fails with [`Error::PgUnavailable`] ("lost the
//! connection to the Postgres state at host:port/db"), which the engine sees as
//! `StoreErrorKind::Unavailable`. Nothing reported as written is ever lost: a write is only
//! reported once its commit is acknowledged.
//!
//! **Fencing.** A run's writes ([`FencedWrites`]) first take a share lock on the lease row
//! with the run's token (`FOR SHARE`): no token, no write ([`Error::LeaseLost`]); and a
//! takeover or break of the lease, which updates or deletes that row, waits for the write's
//! commit, so it never slips in between check and write. Each fenced write does both in one
//! statement: the lock is taken in a CTE, and the write is conditioned on it.
//!
//! **TLS.** A server on this machine is reached without TLS unless the URL or the environment
//! asks for it or the server insists ([`first_connection`]); elsewhere sqlx's default applies
//! (TLS when the server offers it).
//!
//! **Leases** use the server's clock (`clock_timestamp()`), so clients with skewed clocks
//! agree on expiry.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{Admin, Fence, Leases};
use crate::{DeploymentExport, DeploymentSummary, Lease, LeaseGrant, LeaseRequest, RecordStream, RunRecord};
use async_trait::async_trait;
use backon::{BackoffBuilder as _, ExponentialBuilder};
use lyra_core::state::{DeploymentState, ResourceRecord, RunEnd, RunId, RunStart, StoreError};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx::{Connection, PgConnection};

use crate::error::{Error, is_connection_fault};
use crate::rows::{
    APPLIED_MIGRATIONS, AppliedMigration, DeploymentSummaryRow, LeaseRow, ResourceRow, RunEndRow, RunRow,
    applied_as_embedded, lease_columns, now_ms, resource_columns, run_columns, summaries,
};
use crate::url::StoreUrl;

mod groups;
mod records;

/// A deployment joined to its resources in step order: one row per resource, or a row of
/// nulls for a deployment without any; no row for no deployment.
const LOAD: &str = "SELECT d.workflow AS deployment_workflow, \
                           r.deployment, r.step_id, r.type_name, r.external_id, r.desired, r.actual, \
                           r.depends_on, r.managed, r.pending, r.sensitive, r.updated_at, r.create_key \
                    FROM deployments d LEFT JOIN resources r ON r.deployment = d.name \
                    WHERE d.name = $1 ORDER BY r.step_id";

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// How long a call keeps retrying after connection faults before it reports the store
/// unavailable.
pub const RETRY_FOR: Duration = Duration::from_secs(10);

/// The prefix of the store's connections' `application_name` (`lyra-<pid>`) unless the URL
/// sets one: it shows in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "lyra";

/// Now on the server's clock, in Unix milliseconds. `clock_timestamp()`, not `now()`: the
/// latter is the start of the transaction.
macro_rules! server_now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}

/// How to open a [`PostgresStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// Size of the connection pool: how many calls run at once.
    pub max_connections: u32,
    /// How long a call retries after connection faults.
    pub retry_for: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            max_connections: 10,
            retry_for: RETRY_FOR,
        }
    }
}

/// A state store ([`crate::Store`]) in a Postgres database. See the module docs for durability and retries.
pub struct PostgresStore {
    pool: PgPool,
    /// See [`Recorder::store_id`].
    id: String,
    /// `host:port/database`, for messages (never the URL: it may hold a password).
    target: String,
    schema: Option<String>,
    retry_for: Duration,
    /// Puts waiting to be written together ([`groups`]).
    groups: groups::Groups,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.target)
            .field("schema", &self.schema)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to `postgres://…` / `postgresql://…` (sqlx's URL syntax, plus Lyra's
    /// `schema=NAME`) with default options, and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<PostgresStore, Error> {
        Self::connect_with(url, &PostgresOptions::default()).await
    }

    /// [`PostgresStore::connect`] with explicit options.
    pub async fn connect_with(url: &str, options: &PostgresOptions) -> Result<PostgresStore, Error> {
        Self::open(url, options, true).await
    }

    /// Connects only if the database (the URL's schema, if it names one) holds a Lyra state:
    /// creates no schema or table, otherwise [`Error::NoState`]. An existing state's schema is
    /// brought up to date.
    pub async fn connect_existing(url: &str, options: &PostgresOptions) -> Result<PostgresStore, Error> {
        Self::open(url, options, false).await
    }

    async fn open(url: &str, options: &PostgresOptions, create: bool) -> Result<PostgresStore, Error> {
        let StoreUrl::Postgres { url: rest, schema } = StoreUrl::parse(url)? else {
            return Err(Error::invalid_url(url, "expected postgres://… or postgresql://…"));
        };
        let mut connect = PgConnectOptions::from_str(&rest).map_err(|e| Error::invalid_url(url, &e.to_string()))?;
        if connect.get_application_name().is_none() {
            // The process id tells an operator (and the fault tests) whose connections they see.
            connect = connect.application_name(&format!("{APPLICATION_NAME}-{}", std::process::id()));
        }
        let target = format!(
            "{}:{}/{}",
            connect.get_host(),
            connect.get_port(),
            connect.get_database().unwrap_or(connect.get_username())
        );

        // The schema must exist before a connection whose search_path names it can create
        // tables; this first connection also runs the migrations, and settles whether the
        // pool's connections use TLS.
        let plain_first = tls_unspecified(&rest, |name| std::env::var_os(name).is_some()) && is_local(&connect);
        let mut conn = first_connection(&mut connect, plain_first)
            .await
            .map_err(|source| Error::PgConnect {
                target: target.clone(),
                source,
            })?;
        let connect_error = |source| Error::PgConnect {
            target: target.clone(),
            source,
        };
        let no_state = || Error::NoState {
            location: crate::redact_url(url),
        };
        if let Some(schema) = &schema {
            if create {
                create_schema(&mut conn, schema).await.map_err(connect_error)?;
            } else {
                let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                    .bind(schema)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(connect_error)?;
                if !exists {
                    return Err(no_state());
                }
            }
            // `schema` is a checked plain identifier (see `url::is_schema_name`).
            sqlx::query(sqlx::AssertSqlSafe(format!("SET search_path TO {schema}")))
                .execute(&mut conn)
                .await
                .map_err(|source| Error::PgConnect {
                    target: target.clone(),
                    source,
                })?;
            // Every pooled connection starts in the schema: a startup parameter, so no extra
            // round trip per connection.
            connect = connect.options([("search_path", schema.as_str())]);
        }
        if !create {
            // The migrations table marks a Lyra state; without it there is none to read.
            let migrated: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                .fetch_one(&mut conn)
                .await
                .map_err(connect_error)?;
            if !migrated {
                return Err(no_state());
            }
        }
        // sqlx holds an advisory lock while migrating, so concurrent openers take turns. A
        // state already up to date skips it: one query instead of the lock, four statements
        // and the unlock, on every command. Each migration commits whole, so one running in
        // another process is seen done or not at all.
        let applied: Result<Vec<AppliedMigration>, _> = sqlx::query_as(APPLIED_MIGRATIONS).fetch_all(&mut conn).await;
        if !applied.is_ok_and(|applied| applied_as_embedded(&MIGRATOR, &applied)) {
            MIGRATOR.run(&mut conn).await.map_err(|source| Error::PgMigrate {
                target: target.clone(),
                source,
            })?;
        }
        let id: String = sqlx::query_scalar("SELECT id FROM store_identity")
            .fetch_one(&mut conn)
            .await
            .map_err(|source| Error::PgConnect {
                target: target.clone(),
                source,
            })?;
        let _ = conn.close().await;

        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .min_connections(0)
            // A ping per acquire would double the cost of every call; faults are retried
            // instead (see the module docs).
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(connect);
        Ok(PostgresStore {
            pool,
            id,
            target,
            schema,
            retry_for: options.retry_for,
            groups: groups::Groups::default(),
        })
    }

    /// `host:port/database` of the server.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The schema the tables live in, if the URL named one.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Closes every connection (each call's write is already committed when it returns).
    pub async fn close(self) {
        self.pool.close().await;
    }

    fn unavailable(&self, source: sqlx::Error) -> Error {
        Error::PgUnavailable {
            target: self.target.clone(),
            source,
        }
    }

    /// Runs `attempt` until it succeeds, fails for a reason other than the connection, or
    /// [`PostgresOptions::retry_for`] has passed. `attempt` gets the attempt number (0 first)
    /// and must be safe to repeat.
    async fn retry<T, F, Fut>(&self, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let started = Instant::now();
        // The failed connection is not reused: the pool pings it on release and drops it. The
        // first retry is immediate (a stale pooled connection is the common case); later ones
        // back off, 25 ms doubling up to 1 s, while the server may be restarting.
        let mut delays = std::iter::once(Duration::ZERO).chain(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(25))
                .with_max_delay(Duration::from_secs(1))
                .without_max_times()
                .build(),
        );
        for n in 0.. {
            match attempt(n).await {
                Err(Error::Sqlx(e)) if is_connection_fault(&e) => {
                    let backoff = delays.next().unwrap_or(Duration::from_secs(1));
                    if started.elapsed() + backoff >= self.retry_for {
                        return Err(self.unavailable(e));
                    }
                    tracing::debug!(error = %e, attempt = n, "Postgres state: retrying after a connection fault");
                    tokio::time::sleep(backoff).await;
                }
                Err(Error::Sqlx(sqlx::Error::PoolClosed)) => return Err(Error::Closed),
                other => return other,
            }
        }
        unreachable!("the retry loop only ends by returning")
    }

    /// A pooled connection known to be alive (pinged), for writes that must not be repeated:
    /// if their statement then fails, it fails once.
    async fn live_connection(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, Error> {
        self.retry(|_| async {
            let mut conn = self.pool.acquire().await?;
            conn.ping().await?;
            Ok(conn)
        })
        .await
    }

    /// A failed non-repeatable write: connection faults are reported as such.
    fn once_error(&self, e: sqlx::Error) -> Error {
        if is_connection_fault(&e) {
            self.unavailable(e)
        } else {
            Error::Sqlx(e)
        }
    }

    /// One statement, so one snapshot in one round trip (a read-only transaction around two
    /// queries took four): the deployment joined to its resources, a row of nulls for a
    /// deployment without any ([`LOAD`]).
    async fn load_once(&self, deployment: &str) -> Result<Option<DeploymentState>, Error> {
        let rows = sqlx::query(LOAD).bind(deployment).fetch_all(&self.pool).await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let workflow: Option<String> = sqlx::Row::try_get(first, "deployment_workflow")?;
        let mut resources = Vec::with_capacity(rows.len());
        for row in &rows {
            if sqlx::Row::try_get::<Option<&str>, _>(row, "step_id")?.is_some() {
                resources.push(<ResourceRow as sqlx::FromRow<_>>::from_row(row)?);
            }
        }
        drop(rows);
        Ok(Some(crate::rows::deployment_state(deployment, workflow, resources)))
    }

    /// A read-only transaction that sees one snapshot for all its statements.
    async fn read_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, Error> {
        Ok(self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await?)
    }

    async fn list_once(&self) -> Result<Vec<DeploymentSummary>, Error> {
        let mut tx = self.read_tx().await?;
        let deployments: Vec<DeploymentSummaryRow> = sqlx::query_as(
            "SELECT d.name, d.workflow, \
                    (SELECT COUNT(*) FROM resources r WHERE r.deployment = d.name) AS resources \
             FROM deployments d ORDER BY d.name",
        )
        .fetch_all(&mut *tx)
        .await?;
        let last_runs: Vec<RunRow> = sqlx::query_as(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE id IN (SELECT MAX(id) FROM runs GROUP BY deployment)"
        ))
        .fetch_all(&mut *tx)
        .await?;
        let leases: Vec<LeaseRow> = sqlx::query_as(concat!(
            "SELECT ",
            lease_columns!(),
            " FROM leases WHERE expires > ",
            server_now_ms!()
        ))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        summaries(deployments, last_runs, leases)
    }

    async fn history_once(&self, deployment: &str, newest_first: bool) -> Result<Vec<RunRecord>, Error> {
        let query = if newest_first {
            concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE deployment = $1 ORDER BY id DESC"
            )
        } else {
            concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE deployment = $1 ORDER BY id"
            )
        };
        let rows: Vec<RunRow> = sqlx::query_as(query).bind(deployment).fetch_all(&self.pool).await?;
        rows.into_iter().map(RunRow::into_record).collect()
    }

    async fn export_once(&self, deployment: &str) -> Result<Option<DeploymentExport>, Error> {
        let mut tx = self.read_tx().await?;
        let Some(state) = load_in(&mut tx, deployment).await? else {
            return Ok(None);
        };
        let rows: Vec<RunRow> = sqlx::query_as(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE deployment = $1 ORDER BY id"
        ))
        .bind(deployment)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let history = rows.into_iter().map(RunRow::into_record).collect::<Result<_, _>>()?;
        Ok(Some(DeploymentExport { state, history }))
    }

    async fn acquire_once(&self, request: &LeaseRequest) -> Result<LeaseGrant, Error> {
        // The holder may release between the upsert and the read; then try again.
        for _ in 0..100 {
            let taken: Option<LeaseRow> = sqlx::query_as(concat!(
                "WITH now AS (SELECT ",
                server_now_ms!(),
                " AS ms) \
                 INSERT INTO leases (deployment, owner, operation, token, since, expires) \
                 SELECT $1, $2, $3, $4, ms, ms + $5 FROM now \
                 ON CONFLICT (deployment) DO UPDATE SET \
                     owner = excluded.owner, operation = excluded.operation, \
                     token = excluded.token, expires = excluded.expires, \
                     since = CASE WHEN leases.token = excluded.token \
                                  THEN leases.since ELSE excluded.since END \
                 WHERE leases.token = excluded.token OR leases.expires <= excluded.since \
                 RETURNING ",
                lease_columns!()
            ))
            .bind(&request.deployment)
            .bind(&request.owner)
            .bind(&request.operation)
            .bind(&request.token)
            .bind(request.ttl_ms)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(lease) = taken {
                return Ok(LeaseGrant::Acquired(lease.into()));
            }
            let holder: Option<LeaseRow> = sqlx::query_as(concat!(
                "SELECT ",
                lease_columns!(),
                " FROM leases WHERE deployment = $1"
            ))
            .bind(&request.deployment)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(holder) = holder {
                return Ok(LeaseGrant::Held(holder.public()));
            }
        }
        Err(Error::LeaseContended(request.deployment.clone()))
    }
}

/// The libpq environment variables that say something about TLS. Of the URL's parameters,
/// those are the ones whose names start with `ssl` (see `url::POSTGRES_PARAMETERS`).
const TLS_VARIABLES: &[&str] = &["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"];

/// Whether neither the URL (`url`, sqlx's part of it) nor the environment (`is_set`) says
/// anything about TLS, leaving it to the default, `sslmode=prefer`.
fn tls_unspecified(url: &str, is_set: impl Fn(&str) -> bool) -> bool {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    let in_url = query
        .split('&')
        .any(|param| param.split_once('=').map_or(param, |(key, _)| key).starts_with("ssl"));
    !in_url && !TLS_VARIABLES.iter().any(|name| is_set(name))
}

/// Whether the server is on this machine: a Unix socket, `localhost` or a loopback address.
fn is_local(connect: &PgConnectOptions) -> bool {
    let host = connect.get_host();
    connect.get_socket().is_some()
        || host.starts_with('/')
        || lyra_core::net::is_loopback_host(&host.to_ascii_lowercase())
}

/// Opens the store's first connection. With `plain_first` (TLS left to the default and the
/// server on this machine) it tries without TLS first and, if the server refuses that (a
/// `hostssl` rule), with it: libpq's `sslmode=allow`, which sqlx treats as `disable`. Over
/// loopback TLS protects nothing, as the traffic never leaves the machine, yet its handshake
/// and encryption cost every connection the pool opens (the controller's first object Ready
/// about 180 ms later, see ARCHITECTURE.md). The mode that worked is kept in `connect` for
/// the pool.
async fn first_connection(connect: &mut PgConnectOptions, plain_first: bool) -> Result<PgConnection, sqlx::Error> {
    if plain_first {
        let plain = connect.clone().ssl_mode(PgSslMode::Disable);
        match PgConnection::connect_with(&plain).await {
            Ok(conn) => {
                *connect = plain;
                return Ok(conn);
            }
            // The server answered and refused; with TLS it may accept, and if not, its answer
            // to that attempt is the one to report.
            Err(sqlx::Error::Database(e)) => {
                tracing::debug!(error = %e, "Postgres state: refused without TLS, trying with it");
            }
            Err(e) => return Err(e),
        }
    }
    PgConnection::connect_with(connect).await
}

/// Creates `schema` unless it exists. Two processes creating it at once can both pass the
/// `IF NOT EXISTS` check; the loser's duplicate error is fine.
async fn create_schema(conn: &mut PgConnection, schema: &str) -> Result<(), sqlx::Error> {
    // `schema` is a checked plain identifier (see `url::is_schema_name`).
    let created = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS {schema}")))
        .execute(&mut *conn)
        .await;
    match created {
        Err(sqlx::Error::Database(db)) if matches!(db.code().as_deref(), Some("23505" | "42P06")) => Ok(()),
        other => other.map(drop),
    }
}

/// A deployment and its resources, read in the caller's transaction.
async fn load_in(conn: &mut PgConnection, deployment: &str) -> Result<Option<DeploymentState>, Error> {
    let workflow: Option<Option<String>> = sqlx::query_scalar("SELECT workflow FROM deployments WHERE name = $1")
        .bind(deployment)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(workflow) = workflow else {
        return Ok(None);
    };
    let rows: Vec<ResourceRow> = sqlx::query_as(concat!(
        "SELECT ",
        resource_columns!(),
        " FROM resources WHERE deployment = $1 ORDER BY step_id"
    ))
    .bind(deployment)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Some(crate::rows::deployment_state(deployment, workflow, rows)))
}

/// The start of an insert of a resource row, and the upsert that ends it. The values are `$1`
/// to `$12` (see [`bind_resource`]).
macro_rules! resource_insert {
    () => {
        concat!("INSERT INTO resources (", resource_columns!(), ") ")
    };
}
macro_rules! resource_upsert {
    () => {
        " ON CONFLICT (deployment, step_id) DO UPDATE SET \
             type_name = excluded.type_name, external_id = excluded.external_id, \
             desired = excluded.desired, actual = excluded.actual, depends_on = excluded.depends_on, \
             managed = excluded.managed, pending = excluded.pending, sensitive = excluded.sensitive, \
             updated_at = excluded.updated_at, create_key = excluded.create_key"
    };
}

const PUT_RESOURCE: &str = concat!(
    resource_insert!(),
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $11, $10, $12)",
    resource_upsert!()
);

/// [`PUT_RESOURCE`], creating the deployment first if needed, in one statement (so one round
/// trip and one commit). The foreign key is checked at the end of the statement, so it sees
/// the deployment the CTE inserted.
const PUT_RESOURCE_ENSURING_DEPLOYMENT: &str = concat!(
    "WITH d AS (\
         INSERT INTO deployments (name, workflow, created_at, updated_at) VALUES ($1, NULL, $10, $10) \
         ON CONFLICT (name) DO NOTHING) ",
    resource_insert!(),
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $11, $10, $12)",
    resource_upsert!()
);

/// The `fence` CTE a fenced statement starts with: given the parameters of the fence's
/// deployment and token, it takes the share lock on the lease row (held until the statement
/// commits, as it would be in a transaction) and holds a row only if the lease is the run's;
/// without them it always holds one, for the same statement run unfenced.
macro_rules! with_fence {
    ($deployment:literal, $token:literal) => {
        concat!(
            "WITH fence AS (SELECT 1 FROM leases WHERE deployment = ",
            $deployment,
            " AND token = ",
            $token,
            " FOR SHARE), "
        )
    };
    () => {
        "WITH fence AS (SELECT 1), "
    };
}

/// A write under a fence in one statement, answering whether the fence held: each write of
/// the statement is conditioned on the `fence` CTE ([`with_fence!`]) having found the row.
/// One round trip instead of four (BEGIN, check, write, COMMIT).
macro_rules! fenced {
    ($deployment:literal, $token:literal; $($write:expr),+ $(,)?) => {
        concat!(
            with_fence!($deployment, $token),
            $($write,)+
            " SELECT EXISTS (SELECT 1 FROM fence)"
        )
    };
}

const FENCED_PUT_RESOURCE: &str = fenced!("$13", "$14";
    "d AS (\
         INSERT INTO deployments (name, workflow, created_at, updated_at) \
         SELECT $1, NULL, $10, $10 WHERE EXISTS (SELECT 1 FROM fence) \
         ON CONFLICT (name) DO NOTHING), \
     w AS (",
    resource_insert!(),
    "SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $11, $10, $12 WHERE EXISTS (SELECT 1 FROM fence)",
    resource_upsert!(),
    ")"
);

/// Puts of one deployment in one statement ([`groups`]): `$1` the deployment, `$2` to `$12`
/// the other columns as arrays, in [`resource_columns!`]'s order, `$13` the time a new
/// deployment row is created at; `$14` and `$15` the fence's.
macro_rules! group_put {
    ($($fence:literal),*) => {
        concat!(
            with_fence!($($fence),*),
            "d AS (\
                 INSERT INTO deployments (name, workflow, created_at, updated_at) \
                 SELECT $1, NULL, $13, $13 WHERE EXISTS (SELECT 1 FROM fence) \
                 ON CONFLICT (name) DO NOTHING), \
             w AS (",
            resource_insert!(),
            "SELECT $1, g.* FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
                 $7::text[], $8::bool[], $9::bool[], $10::text[], $11::int8[], $12::text[]) AS g \
             WHERE EXISTS (SELECT 1 FROM fence)",
            resource_upsert!(),
            ") SELECT EXISTS (SELECT 1 FROM fence)"
        )
    };
}
const GROUP_PUT: &str = group_put!();
const GROUP_PUT_FENCED: &str = group_put!("$14", "$15");

/// `$1` and `$2` are the deployment and step.
const FENCED_REMOVE_RESOURCE: &str = fenced!("$3", "$4";
    "w AS (DELETE FROM resources WHERE deployment = $1 AND step_id = $2 AND EXISTS (SELECT 1 FROM fence))"
);

fn bind_resource<'q>(
    query: &'static str,
    row: &'q ResourceRow,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(query)
        .bind(&row.deployment)
        .bind(&row.step_id)
        .bind(&row.type_name)
        .bind(&row.external_id)
        .bind(&row.desired)
        .bind(&row.actual)
        .bind(&row.depends_on)
        .bind(row.managed)
        .bind(row.pending)
        .bind(row.updated_at)
        .bind(&row.sensitive)
        .bind(&row.create_key)
}

/// Binds the fence's parameters of a [`fenced!`] statement, the last two.
fn bind_fence<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    fence: Option<&'q Fence>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let (deployment, token) = fence.map(|f| (f.deployment.as_str(), f.token.as_str())).unzip();
    query.bind(deployment).bind(token)
}

crate::store::recorder_and_fenced_writes!(PostgresStore);

/// What the `Recorder` and `FencedWrites` impls delegate to: the load, and the writes of a run
/// (under `fence` when given), each in one transaction.
impl PostgresStore {
    async fn load_state(&self, deployment: &str) -> Result<Option<DeploymentState>, StoreError> {
        Ok(self.retry(|_| self.load_once(deployment)).await?)
    }

    async fn begin_run_in(&self, fence: Option<&Fence>, run: &RunStart) -> Result<RunId, StoreError> {
        let row = RunRow::started(run, now_ms())?;
        // Only an apply changes which workflow the deployment runs.
        let applied_workflow = (row.operation == "apply").then_some(row.workflow.as_deref()).flatten();
        // One statement, the fence included. It appends a run row, so it is sent once (a
        // repeat after a commit whose answer was lost would record the run twice), on a
        // connection pinged first: the common fault, a pooled connection the server closed,
        // is found and retried before anything is sent.
        macro_rules! begin_run {
            ($($fence:literal),*) => {
                concat!(
                    with_fence!($($fence),*),
                    "d AS (\
                         INSERT INTO deployments (name, workflow, created_at, updated_at) \
                         SELECT $1, $2, $5, $5 WHERE EXISTS (SELECT 1 FROM fence) \
                         ON CONFLICT (name) DO UPDATE \
                         SET workflow = COALESCE($6, deployments.workflow), updated_at = excluded.updated_at \
                         RETURNING name), \
                     r AS (\
                         INSERT INTO runs (deployment, workflow, operation, actor, started_at, counts, changes) \
                         SELECT name, $2, $3, $4, $5, $7, $8 FROM d RETURNING id) \
                     SELECT EXISTS (SELECT 1 FROM fence), (SELECT id FROM r)"
                )
            };
        }
        let query = if fence.is_some() {
            begin_run!("$9", "$10")
        } else {
            begin_run!()
        };
        let mut conn = self.live_connection().await?;
        let (held, id): (bool, Option<i64>) = sqlx::query_as(query)
            .bind(&row.deployment)
            .bind(&row.workflow)
            .bind(&row.operation)
            .bind(&row.actor)
            .bind(row.started_at)
            .bind(applied_workflow)
            .bind(&row.counts)
            .bind(&row.changes)
            .bind(fence.map(|f| f.deployment.as_str()))
            .bind(fence.map(|f| f.token.as_str()))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.once_error(e))?;
        match (held, id, fence) {
            (true, Some(id), _) => Ok(id),
            (false, _, Some(fence)) => Err(Error::LeaseLost(fence.deployment.clone()).into()),
            // The deployment upsert always returns its row, so the run is always inserted.
            _ => Err(Error::Sqlx(sqlx::Error::RowNotFound).into()),
        }
    }

    /// Runs one write: `plain` alone without a fence, `fenced` (see [`fenced!`]) with one;
    /// either way one autocommit round trip. Fewer round trips also mean fewer chances for a
    /// dropped connection to fail a write until its retries run out.
    async fn write<'q>(
        &self,
        fence: Option<&'q Fence>,
        plain: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        fenced: impl FnOnce() -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<(), Error> {
        let Some(fence) = fence else {
            plain.execute(&self.pool).await?;
            return Ok(());
        };
        let held: bool = sqlx::Row::try_get(&fenced().fetch_one(&self.pool).await?, 0)?;
        if held {
            Ok(())
        } else {
            Err(Error::LeaseLost(fence.deployment.clone()))
        }
    }

    async fn put_resource_in(
        &self,
        fence: Option<&Fence>,
        deployment: &str,
        record: &ResourceRecord,
    ) -> Result<(), StoreError> {
        let row = Arc::new(ResourceRow::new(deployment, record, now_ms())?);
        let key = (deployment.to_owned(), fence.map(|f| f.token.clone()));
        let mut leading = match self.groups.join(&key, &row) {
            groups::Joined::Lead => {
                let mut leading = groups::Leading::new(&self.groups, key, Vec::new());
                // The steps made ready with this one record theirs as soon as it lets them
                // run: one turn of the executor, and they are written with it rather than
                // in a second statement after it.
                tokio::task::yield_now().await;
                leading.gather();
                leading
            }
            groups::Joined::Wait(waiting) => match waiting.turn().await {
                Some(groups::Turn::Written) => return Ok(()),
                Some(groups::Turn::Lead(others)) => groups::Leading::new(&self.groups, key, others),
                // The group failed, or its leader was cancelled.
                Some(groups::Turn::Alone) | None => return Ok(self.put_alone(fence, &row).await?),
            },
        };
        if leading.others.is_empty() {
            return Ok(self.put_alone(fence, &row).await?);
        }
        let rows = groups::distinct(std::iter::once(&*row).chain(leading.others.iter().map(|q| &*q.row)));
        self.retry(|_| self.put_group(fence, &rows)).await?;
        leading.written();
        Ok(())
    }

    async fn put_alone(&self, fence: Option<&Fence>, row: &ResourceRow) -> Result<(), Error> {
        self.retry(|_| async {
            self.write(fence, bind_resource(PUT_RESOURCE_ENSURING_DEPLOYMENT, row), || {
                bind_fence(bind_resource(FENCED_PUT_RESOURCE, row), fence)
            })
            .await
        })
        .await
    }

    /// The rows (of one deployment, each of another step) in one statement.
    async fn put_group(&self, fence: Option<&Fence>, rows: &[&ResourceRow]) -> Result<(), Error> {
        macro_rules! column {
            ($field:ident) => {
                rows.iter().map(|r| r.$field.clone()).collect::<Vec<_>>()
            };
        }
        let columns = (
            column!(step_id),
            column!(type_name),
            column!(external_id),
            column!(desired),
            column!(actual),
            column!(depends_on),
            column!(managed),
            column!(pending),
            column!(sensitive),
            column!(updated_at),
            column!(create_key),
        );
        let c = &columns;
        let bound = |query: &'static str| {
            sqlx::query(query)
                .bind(&rows[0].deployment)
                .bind(&c.0)
                .bind(&c.1)
                .bind(&c.2)
                .bind(&c.3)
                .bind(&c.4)
                .bind(&c.5)
                .bind(&c.6)
                .bind(&c.7)
                .bind(&c.8)
                .bind(&c.9)
                .bind(&c.10)
                .bind(rows[0].updated_at)
        };
        self.write(fence, bound(GROUP_PUT), || bind_fence(bound(GROUP_PUT_FENCED), fence))
            .await
    }

    async fn remove_resource_in(
        &self,
        fence: Option<&Fence>,
        deployment: &str,
        step_id: &str,
    ) -> Result<(), StoreError> {
        self.retry(|_| async {
            let remove = sqlx::query("DELETE FROM resources WHERE deployment = $1 AND step_id = $2")
                .bind(deployment)
                .bind(step_id);
            self.write(fence, remove, || {
                bind_fence(
                    sqlx::query(FENCED_REMOVE_RESOURCE).bind(deployment).bind(step_id),
                    fence,
                )
            })
            .await
        })
        .await?;
        Ok(())
    }

    async fn finish_run_in(&self, fence: Option<&Fence>, run: RunId, end: &RunEnd) -> Result<(), StoreError> {
        let end = RunEndRow::new(run, end, now_ms())?;
        let end = &end;
        // One statement, the fence included: whether the fence held, whether the run was
        // finished by it, and whether the run exists (to say why not).
        macro_rules! finish_run {
            ($condition:expr $(, $fence:literal)*) => {
                concat!(
                    with_fence!($($fence),*),
                    finish_update!($condition),
                    " SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM u), \
                            EXISTS (SELECT 1 FROM runs WHERE id = $1)"
                )
            };
        }
        self.retry(|attempt| async move {
            let query = match (attempt == 0, fence.is_some()) {
                (true, true) => finish_run!("finished_at IS NULL", "$9", "$10"),
                (true, false) => finish_run!("finished_at IS NULL"),
                (false, true) => finish_run!(retried_end!(), "$9", "$10"),
                (false, false) => finish_run!(retried_end!()),
            };
            let (held, finished, exists): (bool, bool, bool) = bind_end(sqlx::query_as(query), end)
                .bind(fence.map(|f| f.deployment.as_str()))
                .bind(fence.map(|f| f.token.as_str()))
                .fetch_one(&self.pool)
                .await?;
            match (held, finished, exists, fence) {
                (false, _, _, Some(fence)) => Err(Error::LeaseLost(fence.deployment.clone())),
                (_, true, _, _) => Ok(()),
                (_, false, true, _) => Err(Error::RunAlreadyFinished(end.id)),
                (_, false, false, _) => Err(Error::UnknownRun(end.id)),
            }
        })
        .await?;
        Ok(())
    }

    /// The finish of a run and the release of its lease, one statement: the lease row the
    /// fence locks is deleted only if the run was finished by it.
    async fn finish_run_and_release_in(&self, fence: &Fence, run: RunId, end: &RunEnd) -> Result<bool, StoreError> {
        let end = RunEndRow::new(run, end, now_ms())?;
        let end = &end;
        macro_rules! finish_and_release {
            ($condition:expr) => {
                concat!(
                    with_fence!("$9", "$10"),
                    finish_update!($condition),
                    ", r AS (DELETE FROM leases WHERE deployment = $9 AND token = $10 \
                             AND EXISTS (SELECT 1 FROM u) RETURNING 1) \
                     SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM u), \
                            EXISTS (SELECT 1 FROM runs WHERE id = $1), EXISTS (SELECT 1 FROM r), \
                            EXISTS (SELECT 1 FROM runs WHERE id = $1 AND ",
                    same_end!(),
                    ")"
                )
            };
        }
        let released = self
            .retry(|attempt| async move {
                let query = if attempt == 0 {
                    finish_and_release!("finished_at IS NULL")
                } else {
                    finish_and_release!(retried_end!())
                };
                let (held, finished, exists, released, same): (bool, bool, bool, bool, bool) =
                    bind_end(sqlx::query_as(query), end)
                        .bind(fence.deployment.as_str())
                        .bind(fence.token.as_str())
                        .fetch_one(&self.pool)
                        .await?;
                match (held, finished, exists) {
                    (true, true, _) => Ok(released),
                    // A retry whose first attempt committed, its answer lost: that attempt
                    // finished the run with exactly this end, and released the lease with it.
                    (false, _, _) if attempt > 0 && same => Ok(true),
                    (false, _, _) => Err(Error::LeaseLost(fence.deployment.clone())),
                    (true, false, true) => Err(Error::RunAlreadyFinished(end.id)),
                    (true, false, false) => Err(Error::UnknownRun(end.id)),
                }
            })
            .await?;
        Ok(released)
    }
}

/// The `u` CTE of a statement that finishes a run under the `fence` CTE: `$1` the run,
/// `$2` to `$8` its end ([`bind_end`]), written where `condition` holds.
macro_rules! finish_update {
    ($condition:expr) => {
        concat!(
            "u AS (\
                 UPDATE runs SET finished_at = $2, outcome = $3, counts = $4, changes = $5, error = $6, \
                                 note = $7, returns = $8 \
                 WHERE id = $1 AND ",
            $condition,
            " AND EXISTS (SELECT 1 FROM fence) RETURNING 1)"
        )
    };
}
use finish_update;

/// A run already finished with exactly the end `$2` to `$8`.
macro_rules! same_end {
    () => {
        "(finished_at = $2 AND outcome = $3 AND counts = $4 AND changes = $5 \
          AND error IS NOT DISTINCT FROM $6 AND note IS NOT DISTINCT FROM $7 \
          AND returns IS NOT DISTINCT FROM $8)"
    };
}
use same_end;

/// What a retried finish accepts: an unfinished run, or one already finished with exactly
/// this end (the previous attempt's commit may have succeeded with its answer lost).
macro_rules! retried_end {
    () => {
        concat!("(finished_at IS NULL OR ", same_end!(), ")")
    };
}
use retried_end;

/// Binds a run's end, `$1` to `$8` of a statement built on [`finish_update!`].
fn bind_end<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    end: &'q RunEndRow,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    query
        .bind(end.id)
        .bind(end.finished_at)
        .bind(end.outcome)
        .bind(&end.counts)
        .bind(&end.changes)
        .bind(&end.error)
        .bind(&end.note)
        .bind(&end.returns)
}

#[async_trait]
impl Admin for PostgresStore {
    async fn list(&self) -> Result<Vec<DeploymentSummary>, StoreError> {
        Ok(self.retry(|_| self.list_once()).await?)
    }

    async fn records(&self, deployment: &str) -> Result<Option<RecordStream>, StoreError> {
        Ok(self.retry(|_| self.records_once(deployment)).await?)
    }

    async fn history(&self, deployment: &str) -> Result<Vec<RunRecord>, StoreError> {
        Ok(self.retry(|_| self.history_once(deployment, true)).await?)
    }

    async fn export(&self, deployment: &str) -> Result<Option<DeploymentExport>, StoreError> {
        Ok(self.retry(|_| self.export_once(deployment)).await?)
    }

    async fn import(&self, export: &DeploymentExport) -> Result<(), StoreError> {
        let deployment = &export.state.name;
        let now = now_ms();
        let resources: Vec<ResourceRow> = export
            .state
            .resources
            .iter()
            .map(|r| ResourceRow::new(deployment, r, now))
            .collect::<Result<_, _>>()?;
        let runs: Vec<RunRow> = export
            .history
            .iter()
            .map(|r| RunRow::imported(r, deployment))
            .collect::<Result<_, _>>()?;

        // Appends history, so not repeated (see the module docs).
        let mut conn = self.live_connection().await?;
        let written: Result<(), sqlx::Error> = async {
            let mut tx = conn.begin().await?;
            sqlx::query(
                "INSERT INTO deployments (name, workflow, created_at, updated_at) VALUES ($1, $2, $3, $3) \
                 ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, \
                                                  updated_at = excluded.updated_at",
            )
            .bind(deployment)
            .bind(&export.state.workflow)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM resources WHERE deployment = $1")
                .bind(deployment)
                .execute(&mut *tx)
                .await?;
            for row in &resources {
                bind_resource(PUT_RESOURCE, row).execute(&mut *tx).await?;
            }
            for run in &runs {
                sqlx::query(
                    "INSERT INTO runs (deployment, workflow, operation, actor, started_at, finished_at, \
                                       outcome, counts, changes, error, note, returns) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                )
                .bind(&run.deployment)
                .bind(&run.workflow)
                .bind(&run.operation)
                .bind(&run.actor)
                .bind(run.started_at)
                .bind(run.finished_at)
                .bind(&run.outcome)
                .bind(&run.counts)
                .bind(&run.changes)
                .bind(&run.error)
                .bind(&run.note)
                .bind(&run.returns)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await
        }
        .await;
        written.map_err(|e| self.once_error(e))?;
        Ok(())
    }

    async fn drop_deployment(&self, deployment: &str) -> Result<bool, StoreError> {
        let existed = self
            .retry(|_| async {
                let mut tx = self.pool.begin().await?;
                sqlx::query("DELETE FROM leases WHERE deployment = $1")
                    .bind(deployment)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("DELETE FROM runs WHERE deployment = $1")
                    .bind(deployment)
                    .execute(&mut *tx)
                    .await?;
                // Resources go with it (ON DELETE CASCADE).
                let dropped = sqlx::query("DELETE FROM deployments WHERE name = $1")
                    .bind(deployment)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(dropped.rows_affected() > 0)
            })
            .await?;
        Ok(existed)
    }
}

#[async_trait]
impl Leases for PostgresStore {
    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        // Repeating is safe: a retry after a lost answer finds the lease under our token and
        // renews it, keeping `since`.
        Ok(self.retry(|_| self.acquire_once(request)).await?)
    }

    async fn renew_lease(&self, lease: &Lease, ttl_ms: i64) -> Result<Option<Lease>, StoreError> {
        let renewed = self
            .retry(|_| async {
                let row: Option<LeaseRow> = sqlx::query_as(concat!(
                    "UPDATE leases SET expires = ",
                    server_now_ms!(),
                    " + $3 WHERE deployment = $1 AND token = $2 RETURNING ",
                    lease_columns!()
                ))
                .bind(&lease.deployment)
                .bind(&lease.token)
                .bind(ttl_ms)
                .fetch_optional(&self.pool)
                .await?;
                Ok(row)
            })
            .await?;
        Ok(renewed.map(Lease::from))
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        // A retry after a lost answer finds nothing and says "not ours": the caller then
        // reports a lost lease it may in fact have kept, which errs on the side of caution.
        let released = self
            .retry(|_| async {
                let done = sqlx::query("DELETE FROM leases WHERE deployment = $1 AND token = $2")
                    .bind(&lease.deployment)
                    .bind(&lease.token)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            })
            .await?;
        Ok(released)
    }

    async fn lease(&self, deployment: &str) -> Result<Option<Lease>, StoreError> {
        let row = self
            .retry(|_| async {
                let row: Option<LeaseRow> = sqlx::query_as(concat!(
                    "SELECT ",
                    lease_columns!(),
                    " FROM leases WHERE deployment = $1 AND expires > ",
                    server_now_ms!()
                ))
                .bind(deployment)
                .fetch_optional(&self.pool)
                .await?;
                Ok(row)
            })
            .await?;
        Ok(row.map(LeaseRow::public))
    }

    async fn break_lease(&self, deployment: &str) -> Result<Option<Lease>, StoreError> {
        self.delete_lease(deployment, None).await
    }

    async fn break_lease_held_by(&self, deployment: &str, holder: &str) -> Result<Option<Lease>, StoreError> {
        if !crate::lease::holder::is_public_part(holder) {
            return Ok(None);
        }
        self.delete_lease(deployment, Some(holder)).await
    }
}

impl PostgresStore {
    /// Deletes the deployment's lease, if `held_by` is given only while its token ends so.
    async fn delete_lease(&self, deployment: &str, held_by: Option<&str>) -> Result<Option<Lease>, StoreError> {
        let row = self
            .retry(|_| async {
                let row: Option<LeaseRow> = sqlx::query_as(concat!(
                    "DELETE FROM leases WHERE deployment = $1 \
                     AND ($2::text IS NULL OR right(token, length($2)) = $2) RETURNING ",
                    lease_columns!()
                ))
                .bind(deployment)
                .bind(held_by)
                .fetch_optional(&self.pool)
                .await?;
                Ok(row)
            })
            .await?;
        Ok(row.map(Lease::from))
    }
}

#[cfg(test)]
mod tests;
