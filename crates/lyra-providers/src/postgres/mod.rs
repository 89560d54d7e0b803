//! `Postgres::Role`, `Postgres::Database` and `Postgres::Grant`: roles, databases and
//! privileges of a PostgreSQL server, shaped after the `postgresql_role`,
//! `postgresql_database` and `postgresql_grant` resources of the cyrilgdn/postgresql Terraform
//! provider.
//!
//! The server is the workflow's `providers: {Postgres: {url: ...}}` (a `postgres://` URL; it
//! may hold a password, so it is sensitive), or `DATABASE_URL` when none is given. The provider
//! keeps one small, lazily connected pool per URL. Grants on objects of another database, and
//! the cleanup of a deleted role's objects in other databases, connect to that database through
//! the same URL with its path replaced.
//!
//! Reads ask the catalogs (`pg_roles`, `pg_auth_members`, `pg_database`, ACLs), so changes made
//! out of band show as drift. What the server cannot tell back (a role's password, a database's
//! template) is returned as last recorded.
//!
//! Limits: a role's name cannot change in place (a new name replaces the role). Deleting a role
//! reassigns what it owns to the provider's user and drops its privileges in the connected
//! database and in every other database where `pg_shdepend` records something of it, as long as
//! that database accepts connections; anything it still has in one that does not makes DROP
//! ROLE fail (retryably, with the server's reason). A role's memberships go with it. A
//! database's template is not recorded by the server, so it reads back as created.
//!
//! Identifiers are always double-quoted (inner quotes doubled) and literals are escape strings
//! (`E'...'`, quotes and backslashes doubled), so no value can end a statement early. Secrets
//! (the URL's password, a role's password) are never put in error messages.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

mod database;
mod grant;
mod role;
#[cfg(test)]
mod tests;

/// The canonical type names.
pub const ROLE: &str = "Postgres::Role";
pub const DATABASE: &str = "Postgres::Database";
pub const GRANT: &str = "Postgres::Grant";
/// The namespace, and the name of the configuration schema.
pub const NAMESPACE: &str = "Postgres";

/// How many connections a pool opens unless `max_connections` says otherwise: the provider's
/// statements are few and short.
const DEFAULT_MAX_CONNECTIONS: u32 = 2;
/// How long getting a connection may take before the operation fails (retryably).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The provider of the `Postgres::` types.
#[derive(Default)]
pub struct PostgresProvider {
    /// One pool per URL (the configured one, and those derived for other databases).
    pools: Mutex<HashMap<String, PgPool>>,
}

impl std::fmt::Debug for PostgresProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys are URLs, which may hold passwords.
        f.debug_struct("PostgresProvider").finish_non_exhaustive()
    }
}

/// The server an operation talks to: its URL and what must never be shown of it.
#[derive(Clone)]
pub(crate) struct Server {
    url: String,
    max_connections: u32,
}

impl Server {
    /// The configured server: `url` of the provider's configuration, or `DATABASE_URL`.
    fn from_config(config: &Map) -> Result<Server, ProviderError> {
        let url = match config.get("url") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_owned(),
            None | Some(Value::Null) => match std::env::var("DATABASE_URL") {
                Ok(s) if !s.trim().is_empty() => s.trim().to_owned(),
                _ => {
                    return Err(ProviderError::Config(
                        "Postgres needs a url (providers: {Postgres: {url: postgres://...}}) or DATABASE_URL"
                            .to_owned(),
                    ));
                }
            },
            Some(Value::String(_)) => return Err(ProviderError::Config("Postgres url is empty".to_owned())),
            Some(other) => {
                return Err(ProviderError::Config(format!(
                    "Postgres url must be a string, got {}",
                    kind_of(other)
                )));
            }
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ProviderError::Config(format!(
                "Postgres url {} is not a postgres:// URL",
                redact_url(&url)
            )));
        }
        let max_connections = match config.get("max_connections") {
            None | Some(Value::Null) => DEFAULT_MAX_CONNECTIONS,
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| ProviderError::Config("Postgres max_connections must be 1 to 100".to_owned()))?,
        };
        Ok(Server { url, max_connections })
    }

    /// The same server and credentials, connected to database `name` instead.
    pub(crate) fn for_database(&self, name: &str) -> Result<Server, ProviderError> {
        let mut url = url::Url::parse(&self.url)
            .map_err(|_| ProviderError::Config(format!("Postgres url {} is not a valid URL", redact_url(&self.url))))?;
        // The path segment is percent-encoded by `url`, so any database name fits.
        url.path_segments_mut()
            .map_err(|()| ProviderError::Config(format!("Postgres url {} has no path", redact_url(&self.url))))?
            .clear()
            .push(name);
        Ok(Server {
            url: url.to_string(),
            max_connections: self.max_connections,
        })
    }

    /// The database the URL names (`postgres` by default, as libpq would pick the user's name
    /// otherwise; only used to tell whether a derived URL is needed).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn database(&self) -> Option<String> {
        let url = url::Url::parse(&self.url).ok()?;
        let path = url.path().trim_start_matches('/');
        if path.is_empty() {
            return None;
        }
        percent_encoding::percent_decode_str(path)
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    }

    /// The URL as it may be shown.
    pub(crate) fn shown(&self) -> String {
        redact_url(&self.url)
    }

    /// The secrets an error message must not hold: the URL's password, raw and decoded.
    fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(url) = url::Url::parse(&self.url)
            && let Some(p) = url.password()
            && !p.is_empty()
        {
            out.push(p.to_owned());
            if let Ok(d) = percent_encoding::percent_decode_str(p).decode_utf8() {
                out.push(d.into_owned());
            }
        }
        out.push(self.url.clone());
        out
    }

    /// A failed statement or connection, as a retryable error that names the server (redacted)
    /// and holds none of `more_secrets` nor the URL's password.
    pub(crate) fn error(&self, what: &str, e: &sqlx::Error, more_secrets: &[&str]) -> ProviderError {
        let mut message = match e {
            // The server's own words, without sqlx's prefix.
            sqlx::Error::Database(db) => db.message().to_owned(),
            sqlx::Error::PoolTimedOut => format!("no connection within {}s", CONNECT_TIMEOUT.as_secs()),
            other => other.to_string(),
        };
        for s in self
            .secrets()
            .iter()
            .map(String::as_str)
            .chain(more_secrets.iter().copied())
        {
            if !s.is_empty() {
                message = message.replace(s, "***");
            }
        }
        let message = format!("Postgres at {}: {what}: {message}", self.shown());
        match e {
            sqlx::Error::Configuration(_) => ProviderError::Config(message),
            _ => ProviderError::Other(message),
        }
    }
}

impl PostgresProvider {
    pub fn new() -> Self {
        Self::default()
    }

    /// The pool of `server`, made (unconnected) on first use.
    pub(crate) fn pool(&self, server: &Server) -> Result<PgPool, ProviderError> {
        let mut pools = self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(pool) = pools.get(&server.url) {
            return Ok(pool.clone());
        }
        let pool = PgPoolOptions::new()
            .max_connections(server.max_connections)
            .min_connections(0)
            .acquire_timeout(CONNECT_TIMEOUT)
            // Connections are not kept long: a database the workflow deletes must not stay
            // busy with ours.
            .idle_timeout(Some(Duration::from_secs(60)))
            .connect_lazy(&server.url)
            .map_err(|e| server.error("invalid url", &e, &[]))?;
        pools.insert(server.url.clone(), pool.clone());
        Ok(pool)
    }

    /// Forgets (and closes) the pool of `server`, if any: before its database is dropped.
    pub(crate) async fn forget_pool(&self, server: &Server) {
        let pool = {
            let mut pools = self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            pools.remove(&server.url)
        };
        if let Some(pool) = pool {
            pool.close().await;
        }
    }
}

/// `url` with the password of its user info (and any `password=` query parameter) replaced by
/// `***`: the form of a URL errors may show.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = (&authority[..at], &authority[at + 1..]);
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => authority.to_owned(),
            }
        }
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// An SQL identifier: double-quoted, inner double quotes doubled.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An SQL string literal that means `s` whatever `standard_conforming_strings` says: an escape
/// string with quotes and backslashes doubled.
pub(crate) fn literal(s: &str) -> String {
    format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

pub(crate) use crate::invalid;

/// A string attribute; absent or null is `None`. Names may not hold NUL (the server refuses
/// them, and would quote them back in its error).
pub(crate) fn opt_str(m: &Map, key: &str) -> Result<Option<String>, ProviderError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.contains('\0') => Err(invalid(key, "must not contain NUL characters")),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(key, format!("expects a string, got {}", kind_of(other)))),
    }
}

/// A required, non-empty string attribute.
pub(crate) fn req_str(m: &Map, key: &str) -> Result<String, ProviderError> {
    match opt_str(m, key)? {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(invalid(key, "is required")),
    }
}

pub(crate) fn opt_bool(m: &Map, key: &str, default: bool) -> Result<bool, ProviderError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(invalid(key, format!("expects a boolean, got {}", kind_of(other)))),
    }
}

pub(crate) fn opt_int(m: &Map, key: &str, default: i32) -> Result<i32, ProviderError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| *n >= -1)
            .ok_or_else(|| invalid(key, "expects an integer of -1 or more")),
    }
}

/// A list of strings; absent or null is empty.
pub(crate) fn opt_strings(m: &Map, key: &str) -> Result<Vec<String>, ProviderError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) if !s.is_empty() && !s.contains('\0') => Ok(s.clone()),
                Value::String(_) => Err(invalid(key, "holds an empty string or one with NUL")),
                other => Err(invalid(key, format!("expects strings, got {}", kind_of(other)))),
            })
            .collect(),
        Some(other) => Err(invalid(
            key,
            format!("expects an array of strings, got {}", kind_of(other)),
        )),
    }
}

/// `actual` ordered like `prior` (what the workflow listed, in its order), the rest after it
/// sorted: a set the server reports in its own order diffs equal to the same set listed
/// otherwise.
pub(crate) fn ordered_like(mut actual: Vec<String>, prior: &[String]) -> Value {
    actual.sort();
    actual.dedup();
    let mut out: Vec<Value> = Vec::with_capacity(actual.len());
    for p in prior {
        if let Some(i) = actual.iter().position(|a| a == p) {
            out.push(Value::String(actual.remove(i)));
        }
    }
    out.extend(actual.into_iter().map(Value::String));
    Value::Array(out)
}

/// A string list attribute.
fn strings() -> Type {
    Type::array(Type::String)
}

fn opt(t: Type) -> Type {
    Type::optional(t)
}

#[async_trait]
impl Provider for PostgresProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        let int = || {
            opt(Type::Integer {
                min: Some(-1),
                max: None,
            })
        };
        vec![
            ResourceSchema::new(
                ROLE,
                vec![
                    AttributeSchema::new("name", Type::String)
                        .required()
                        .immutable()
                        .doc("The role's name; a new name replaces the role (there is no rename)."),
                    AttributeSchema::new("login", opt(Type::Boolean)).doc("Whether it may log in (false)."),
                    AttributeSchema::new("password", opt(Type::Sensitive(Box::new(Type::String))))
                        .sensitive()
                        .doc("Its password; never read back, so a change made out of band is not seen."),
                    AttributeSchema::new("superuser", opt(Type::Boolean)).doc("SUPERUSER (false)."),
                    AttributeSchema::new("create_database", opt(Type::Boolean)).doc("CREATEDB (false)."),
                    AttributeSchema::new("create_role", opt(Type::Boolean)).doc("CREATEROLE (false)."),
                    AttributeSchema::new("inherit", opt(Type::Boolean))
                        .doc("INHERIT: whether it has the privileges of the roles it is a member of (true)."),
                    AttributeSchema::new("connection_limit", int()).doc("Its connection limit; -1 for none (-1)."),
                    AttributeSchema::new("valid_until", opt(Type::String))
                        .doc("When its password stops being valid, a timestamp such as 2030-01-01 or infinity."),
                    AttributeSchema::new("roles", opt(strings()))
                        .doc("The roles it is a member of: granted and revoked to match."),
                    AttributeSchema::new("skip_reassign_owned", opt(Type::Boolean)).doc(
                        "On delete, skip REASSIGN OWNED (to the provider's user) and DROP OWNED in the \
                         databases where it owns objects (false).",
                    ),
                ],
            )
            .doc(
                "A PostgreSQL role (like cyrilgdn/postgresql's postgresql_role). External id: its name. \
                 Delete reassigns what it owns to the provider's user, drops its privileges, then drops it.",
            ),
            ResourceSchema::new(
                DATABASE,
                vec![
                    AttributeSchema::new("name", Type::String)
                        .required()
                        .immutable()
                        .doc("The database's name; a new name replaces it."),
                    AttributeSchema::new("owner", opt(Type::String))
                        .provided()
                        .doc("The role that owns it (the provider's user unless set); changed in place."),
                    AttributeSchema::new("template", opt(Type::String))
                        .immutable()
                        .doc("The template it is copied from (template0); not read back."),
                    AttributeSchema::new("encoding", opt(Type::String))
                        .immutable()
                        .provided()
                        .doc("Its character encoding (UTF8)."),
                    AttributeSchema::new("lc_collate", opt(Type::String))
                        .immutable()
                        .provided()
                        .doc("Its collation locale (the template's unless set)."),
                    AttributeSchema::new("lc_ctype", opt(Type::String))
                        .immutable()
                        .provided()
                        .doc("Its character classification locale (the template's unless set)."),
                    AttributeSchema::new("connection_limit", int())
                        .doc("How many connections it takes; -1 for no limit (-1)."),
                    AttributeSchema::new("allow_connections", opt(Type::Boolean))
                        .doc("Whether it accepts connections (true)."),
                    AttributeSchema::new("is_template", opt(Type::Boolean))
                        .doc("Whether it is a template others may be copied from (false)."),
                ],
            )
            .doc(
                "A PostgreSQL database (like cyrilgdn/postgresql's postgresql_database). External id: its \
                 name. Delete ends the other sessions connected to it, then drops it.",
            ),
            ResourceSchema::new(
                GRANT,
                vec![
                    AttributeSchema::new("role", Type::String)
                        .required()
                        .immutable()
                        .doc("The role granted the privileges (PUBLIC for everyone)."),
                    AttributeSchema::new("database", Type::String)
                        .required()
                        .immutable()
                        .doc("The database of the objects (or the database itself)."),
                    AttributeSchema::new("schema", opt(Type::String))
                        .immutable()
                        .doc("The schema: required for object_type schema, table and sequence."),
                    AttributeSchema::new(
                        "object_type",
                        Type::Enum(vec![
                            "database".into(),
                            "schema".into(),
                            "table".into(),
                            "sequence".into(),
                        ]),
                    )
                    .required()
                    .immutable()
                    .doc("What the privileges are on: database, schema, table or sequence."),
                    AttributeSchema::new("objects", opt(strings()))
                        .immutable()
                        .doc("The tables or sequences (of `schema`); empty for all of them as they are now."),
                    AttributeSchema::new("privileges", strings()).required().doc(
                        "The privileges (SELECT, INSERT, USAGE, CONNECT...); changed in place: all \
                         revoked and these granted, in one transaction.",
                    ),
                ],
            )
            .doc(
                "Privileges of a role on a database, a schema, or tables or sequences of a schema (like \
                 cyrilgdn/postgresql's postgresql_grant). External id: role/database/schema/object_type. \
                 Read reports the privileges the role really holds (on every object, for tables and \
                 sequences), so one revoked out of band shows as drift.",
            ),
        ]
    }

    fn config_schemas(&self) -> Vec<ResourceSchema> {
        vec![
            ResourceSchema::new(
                NAMESPACE,
                vec![
                    AttributeSchema::new("url", opt(Type::String))
                        .sensitive()
                        .doc("The server, postgres://user:password@host:5432/database; DATABASE_URL when unset."),
                    AttributeSchema::new(
                        "max_connections",
                        opt(Type::Integer {
                            min: Some(1),
                            max: Some(100),
                        }),
                    )
                    .doc("How many connections to the server (and to each other database) at most (2)."),
                ],
            )
            .doc("The PostgreSQL server the Postgres:: types manage."),
        ]
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let server = Server::from_config(cx.config)?;
        crate::cancellable(cx, async {
            match cx.type_name {
                t if t.eq_ignore_ascii_case(ROLE) => role::create(self, &server, desired).await,
                t if t.eq_ignore_ascii_case(DATABASE) => database::create(self, &server, desired).await,
                t if t.eq_ignore_ascii_case(GRANT) => grant::create(self, &server, desired).await,
                other => Err(unknown(other)),
            }
        })
        .await
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        let server = Server::from_config(cx.config)?;
        let empty = Map::new();
        let prior = prior.unwrap_or(&empty);
        crate::cancellable(cx, async {
            match cx.type_name {
                t if t.eq_ignore_ascii_case(ROLE) => role::read(self, &server, external_id, prior).await,
                t if t.eq_ignore_ascii_case(DATABASE) => database::read(self, &server, external_id, prior).await,
                t if t.eq_ignore_ascii_case(GRANT) => grant::read(self, &server, external_id, prior).await,
                other => Err(unknown(other)),
            }
        })
        .await
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        prior: &Map,
    ) -> Result<Map, ProviderError> {
        let server = Server::from_config(cx.config)?;
        crate::cancellable(cx, async {
            match cx.type_name {
                t if t.eq_ignore_ascii_case(ROLE) => role::update(self, &server, external_id, desired, prior).await,
                t if t.eq_ignore_ascii_case(DATABASE) => {
                    database::update(self, &server, external_id, desired, prior).await
                }
                t if t.eq_ignore_ascii_case(GRANT) => grant::update(self, &server, external_id, desired, prior).await,
                other => Err(unknown(other)),
            }
        })
        .await
    }

    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, prior: &Map) -> Result<(), ProviderError> {
        let server = Server::from_config(cx.config)?;
        crate::cancellable(cx, async {
            match cx.type_name {
                t if t.eq_ignore_ascii_case(ROLE) => role::delete(self, &server, external_id, prior).await,
                t if t.eq_ignore_ascii_case(DATABASE) => database::delete(self, &server, external_id).await,
                t if t.eq_ignore_ascii_case(GRANT) => grant::delete(self, &server, external_id, prior).await,
                other => Err(unknown(other)),
            }
        })
        .await
    }

    /// By natural key: the role's or database's name, the grant's role, database, schema and
    /// object type (found when any of its privileges are held).
    async fn lookup(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Lookup, ProviderError> {
        let server = Server::from_config(cx.config)?;
        crate::cancellable(cx, async {
            match cx.type_name {
                t if t.eq_ignore_ascii_case(ROLE) => role::lookup(self, &server, desired).await,
                t if t.eq_ignore_ascii_case(DATABASE) => database::lookup(self, &server, desired).await,
                t if t.eq_ignore_ascii_case(GRANT) => grant::lookup(self, &server, desired).await,
                other => Err(unknown(other)),
            }
        })
        .await
    }
}

fn unknown(type_name: &str) -> ProviderError {
    ProviderError::Other(format!("the Postgres provider has no type {type_name}"))
}
