//! `Postgres::Database`.

use std::time::Duration;

use lyra_core::provider::{Created, Lookup, ProviderError};
use lyra_core::value::{Map, Value};
use sqlx::{AssertSqlSafe, Row as _};

use super::{PostgresProvider, Server, ident, literal, opt_bool, opt_int, opt_str, req_str};

const DEFAULT_TEMPLATE: &str = "template0";
const DEFAULT_ENCODING: &str = "UTF8";

/// The settings ALTER DATABASE can change.
struct Settings {
    connection_limit: i32,
    allow_connections: bool,
    is_template: bool,
}

impl Settings {
    fn parse(m: &Map) -> Result<Settings, ProviderError> {
        Ok(Settings {
            connection_limit: opt_int(m, "connection_limit", -1)?,
            allow_connections: opt_bool(m, "allow_connections", true)?,
            is_template: opt_bool(m, "is_template", false)?,
        })
    }

    fn options(&self) -> String {
        format!(
            "CONNECTION LIMIT {} ALLOW_CONNECTIONS {} IS_TEMPLATE {}",
            self.connection_limit, self.allow_connections, self.is_template
        )
    }
}

pub(super) async fn create(p: &PostgresProvider, server: &Server, desired: &Map) -> Result<Created, ProviderError> {
    let name = req_str(desired, "name")?;
    let settings = Settings::parse(desired)?;
    let template = opt_str(desired, "template")?.unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
    let encoding = opt_str(desired, "encoding")?.unwrap_or_else(|| DEFAULT_ENCODING.to_owned());
    let mut sql = format!(
        "CREATE DATABASE {} WITH TEMPLATE {} ENCODING {}",
        ident(&name),
        ident(&template),
        literal(&encoding)
    );
    if let Some(owner) = opt_str(desired, "owner")? {
        sql.push_str(&format!(" OWNER {}", ident(&owner)));
    }
    if let Some(c) = opt_str(desired, "lc_collate")? {
        sql.push_str(&format!(" LC_COLLATE {}", literal(&c)));
    }
    if let Some(c) = opt_str(desired, "lc_ctype")? {
        sql.push_str(&format!(" LC_CTYPE {}", literal(&c)));
    }
    sql.push(' ');
    sql.push_str(&settings.options());
    let pool = p.pool(server)?;
    // One statement by the simple query protocol: CREATE DATABASE may not run in a
    // transaction block.
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .map_err(|e| server.error(&format!("create database {name}"), &e, &[]))?;
    let actual = read(p, server, &name, desired)
        .await?
        .ok_or_else(|| ProviderError::Other(format!("database {name} vanished right after its creation")))?;
    Ok(Created {
        external_id: name,
        actual,
    })
}

pub(super) async fn read(
    p: &PostgresProvider,
    server: &Server,
    name: &str,
    prior: &Map,
) -> Result<Option<Map>, ProviderError> {
    let pool = p.pool(server)?;
    let what = format!("read database {name}");
    let row = sqlx::query(
        "SELECT pg_get_userbyid(datdba)::text AS owner, pg_encoding_to_char(encoding)::text AS encoding, \
         datcollate::text AS lc_collate, datctype::text AS lc_ctype, datconnlimit, datallowconn, datistemplate \
         FROM pg_database WHERE datname = $1",
    )
    .bind(name)
    .fetch_optional(&pool)
    .await
    .map_err(|e| server.error(&what, &e, &[]))?;
    let Some(row) = row else { return Ok(None) };
    let get_err = |e: sqlx::Error| server.error(&what, &e, &[]);
    // Encodings and locales are named case-insensitively: the recorded spelling of the same
    // one is kept, so `utf8` does not read as a change (that would replace the database).
    let same_spelling = |key: &str, actual: String| -> Value {
        match opt_str(prior, key).ok().flatten() {
            Some(p) if p.eq_ignore_ascii_case(&actual) => Value::String(p),
            _ => Value::String(actual),
        }
    };
    let mut m = Map::new();
    m.insert("name".into(), Value::String(name.to_owned()));
    m.insert("owner".into(), Value::String(row.try_get("owner").map_err(get_err)?));
    // Not recorded by the server: as created.
    let template = opt_str(prior, "template").ok().flatten();
    m.insert(
        "template".into(),
        Value::String(template.unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned())),
    );
    m.insert(
        "encoding".into(),
        same_spelling("encoding", row.try_get("encoding").map_err(get_err)?),
    );
    m.insert(
        "lc_collate".into(),
        same_spelling("lc_collate", row.try_get("lc_collate").map_err(get_err)?),
    );
    m.insert(
        "lc_ctype".into(),
        same_spelling("lc_ctype", row.try_get("lc_ctype").map_err(get_err)?),
    );
    let limit: i32 = row.try_get("datconnlimit").map_err(get_err)?;
    m.insert("connection_limit".into(), Value::from(limit));
    m.insert(
        "allow_connections".into(),
        Value::Bool(row.try_get("datallowconn").map_err(get_err)?),
    );
    m.insert(
        "is_template".into(),
        Value::Bool(row.try_get("datistemplate").map_err(get_err)?),
    );
    Ok(Some(m))
}

pub(super) async fn update(
    p: &PostgresProvider,
    server: &Server,
    name: &str,
    desired: &Map,
    _prior: &Map,
) -> Result<Map, ProviderError> {
    let settings = Settings::parse(desired)?;
    let what = format!("update database {name}");
    let pool = p.pool(server)?;
    let mut sql = format!("ALTER DATABASE {} WITH {}", ident(name), settings.options());
    // An owner left unset is left as it is.
    if let Some(owner) = opt_str(desired, "owner")? {
        sql.push_str(&format!("; ALTER DATABASE {} OWNER TO {}", ident(name), ident(&owner)));
    }
    // Both in one implicit transaction (a simple query of two statements).
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .map_err(|e| server.error(&what, &e, &[]))?;
    read(p, server, name, desired)
        .await?
        .ok_or_else(|| ProviderError::Other(format!("database {name} vanished during its update")))
}

/// Stops new connections, ends the other sessions connected to it, then drops it.
pub(super) async fn delete(p: &PostgresProvider, server: &Server, name: &str) -> Result<(), ProviderError> {
    let what = format!("delete database {name}");
    let pool = p.pool(server)?;
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(&pool)
        .await
        .map_err(|e| server.error(&what, &e, &[]))?;
    if exists.is_none() {
        return Ok(());
    }
    // Our own pool to it (for grants, a role's cleanup) first.
    p.forget_pool(&server.for_database(name)?).await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false IS_TEMPLATE false",
        ident(name)
    )))
    .execute(&pool)
    .await
    .map_err(|e| server.error(&what, &e, &[]))?;
    let mut attempt = 0;
    loop {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(name)
        .execute(&pool)
        .await
        .map_err(|e| server.error(&what, &e, &[]))?;
        match sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {}", ident(name))))
            .execute(&pool)
            .await
        {
            Ok(_) => return Ok(()),
            // 55006 object_in_use: a terminated session had not yet gone.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55006") && attempt < 20 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(server.error(&what, &e, &[])),
        }
    }
}

/// Found when a database of the desired name exists.
pub(super) async fn lookup(p: &PostgresProvider, server: &Server, desired: &Map) -> Result<Lookup, ProviderError> {
    let name = req_str(desired, "name")?;
    Ok(match read(p, server, &name, desired).await? {
        Some(actual) => Lookup::Found(Created {
            external_id: name,
            actual,
        }),
        None => Lookup::Absent,
    })
}
