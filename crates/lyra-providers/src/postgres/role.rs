//! `Postgres::Role`.

use lyra_core::provider::{Created, Lookup, ProviderError};
use lyra_core::value::{Map, Value};
use sqlx::{AssertSqlSafe, Row as _};

use super::{PostgresProvider, Server, ident, literal, opt_bool, opt_int, opt_str, opt_strings, ordered_like, req_str};

/// A role as the workflow describes it, defaults applied.
struct Spec {
    name: String,
    login: bool,
    password: Option<String>,
    superuser: bool,
    create_database: bool,
    create_role: bool,
    inherit: bool,
    connection_limit: i32,
    valid_until: Option<String>,
    roles: Vec<String>,
}

impl Spec {
    fn parse(m: &Map) -> Result<Spec, ProviderError> {
        Ok(Spec {
            name: req_str(m, "name")?,
            login: opt_bool(m, "login", false)?,
            password: opt_str(m, "password").map_err(|_| {
                // Not the parser's message: nothing about the value, which is secret.
                super::invalid("password", "expects a string without NUL characters")
            })?,
            superuser: opt_bool(m, "superuser", false)?,
            create_database: opt_bool(m, "create_database", false)?,
            create_role: opt_bool(m, "create_role", false)?,
            inherit: opt_bool(m, "inherit", true)?,
            connection_limit: opt_int(m, "connection_limit", -1)?,
            valid_until: opt_str(m, "valid_until")?,
            roles: opt_strings(m, "roles")?,
        })
    }

    /// The options of CREATE ROLE / ALTER ROLE, without the password.
    fn options(&self) -> String {
        let flag = |on: bool, yes: &str, no: &str| if on { yes.to_owned() } else { no.to_owned() };
        let mut out = [
            flag(self.login, "LOGIN", "NOLOGIN"),
            flag(self.superuser, "SUPERUSER", "NOSUPERUSER"),
            flag(self.create_database, "CREATEDB", "NOCREATEDB"),
            flag(self.create_role, "CREATEROLE", "NOCREATEROLE"),
            flag(self.inherit, "INHERIT", "NOINHERIT"),
            format!("CONNECTION LIMIT {}", self.connection_limit),
        ]
        .join(" ");
        // No expiry is `infinity`: how an update takes one away.
        out.push_str(&format!(
            " VALID UNTIL {}",
            literal(self.valid_until.as_deref().unwrap_or("infinity"))
        ));
        out
    }

    fn secrets(&self) -> Vec<&str> {
        self.password.as_deref().into_iter().collect()
    }
}

/// The password clause: the password as a literal, or NULL to take it away.
fn password_clause(password: Option<&str>) -> String {
    match password {
        Some(p) => format!(" PASSWORD {}", literal(p)),
        None => " PASSWORD NULL".to_owned(),
    }
}

pub(super) async fn create(p: &PostgresProvider, server: &Server, desired: &Map) -> Result<Created, ProviderError> {
    let spec = Spec::parse(desired)?;
    let secrets = spec.secrets();
    let pool = p.pool(server)?;
    let mut tx = pool.begin().await.map_err(|e| server.error("connect", &e, &secrets))?;
    let mut sql = format!("CREATE ROLE {} WITH {}", ident(&spec.name), spec.options());
    if let Some(pw) = &spec.password {
        sql.push_str(&password_clause(Some(pw)));
    }
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await
        .map_err(|e| server.error(&format!("create role {}", spec.name), &e, &secrets))?;
    for r in &spec.roles {
        grant_membership(&mut tx, server, r, &spec.name, &secrets).await?;
    }
    tx.commit()
        .await
        .map_err(|e| server.error(&format!("create role {}", spec.name), &e, &secrets))?;
    let actual = read(p, server, &spec.name, desired)
        .await?
        .ok_or_else(|| ProviderError::Other(format!("role {} vanished right after its creation", spec.name)))?;
    Ok(Created {
        external_id: spec.name,
        actual,
    })
}

async fn grant_membership(
    tx: &mut sqlx::PgConnection,
    server: &Server,
    role: &str,
    member: &str,
    secrets: &[&str],
) -> Result<(), ProviderError> {
    sqlx::raw_sql(AssertSqlSafe(format!("GRANT {} TO {}", ident(role), ident(member))))
        .execute(&mut *tx)
        .await
        .map_err(|e| server.error(&format!("grant role {role} to {member}"), &e, secrets))?;
    Ok(())
}

/// The role `name` as it is, with what cannot be read (its password, `skip_reassign_owned`)
/// from `prior`.
pub(super) async fn read(
    p: &PostgresProvider,
    server: &Server,
    name: &str,
    prior: &Map,
) -> Result<Option<Map>, ProviderError> {
    let prior_valid_until = opt_str(prior, "valid_until").ok().flatten();
    let pool = p.pool(server)?;
    let row = sqlx::query(
        "SELECT r.rolcanlogin, r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolinherit, r.rolconnlimit, \
         r.rolvaliduntil::text AS valid_until, \
         (r.rolvaliduntil IS NOT DISTINCT FROM $2::timestamptz) AS same_valid_until, \
         ARRAY(SELECT b.rolname::text FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid \
               WHERE m.member = r.oid ORDER BY 1) AS roles \
         FROM pg_roles r WHERE r.rolname = $1",
    )
    .bind(name)
    .bind(prior_valid_until.as_deref())
    .fetch_optional(&pool)
    .await
    .map_err(|e| server.error(&format!("read role {name}"), &e, &[]))?;
    let Some(row) = row else { return Ok(None) };
    let get_err = |e: sqlx::Error| server.error(&format!("read role {name}"), &e, &[]);
    let valid_until: Option<String> = row.try_get("valid_until").map_err(get_err)?;
    let same: Option<bool> = row.try_get("same_valid_until").map_err(get_err)?;
    // The server writes timestamps its own way: the recorded spelling of the same instant is
    // kept, and no expiry reads as none whether it is NULL or infinity.
    let valid_until = if same == Some(true) {
        prior_valid_until.map_or(Value::Null, Value::String)
    } else {
        match valid_until {
            None => Value::Null,
            Some(v) if v == "infinity" && prior_valid_until.is_none() => Value::Null,
            Some(v) => Value::String(v),
        }
    };
    let roles: Vec<String> = row.try_get("roles").map_err(get_err)?;
    let prior_roles = opt_strings(prior, "roles").unwrap_or_default();
    let mut m = Map::new();
    m.insert("name".into(), Value::String(name.to_owned()));
    m.insert(
        "login".into(),
        Value::Bool(row.try_get("rolcanlogin").map_err(get_err)?),
    );
    // Never readable: what was last set.
    m.insert("password".into(), prior.get("password").cloned().unwrap_or(Value::Null));
    m.insert(
        "superuser".into(),
        Value::Bool(row.try_get("rolsuper").map_err(get_err)?),
    );
    m.insert(
        "create_database".into(),
        Value::Bool(row.try_get("rolcreatedb").map_err(get_err)?),
    );
    m.insert(
        "create_role".into(),
        Value::Bool(row.try_get("rolcreaterole").map_err(get_err)?),
    );
    m.insert(
        "inherit".into(),
        Value::Bool(row.try_get("rolinherit").map_err(get_err)?),
    );
    let limit: i32 = row.try_get("rolconnlimit").map_err(get_err)?;
    m.insert("connection_limit".into(), Value::from(limit));
    m.insert("valid_until".into(), valid_until);
    m.insert("roles".into(), ordered_like(roles, &prior_roles));
    m.insert(
        "skip_reassign_owned".into(),
        Value::Bool(opt_bool(prior, "skip_reassign_owned", false).unwrap_or(false)),
    );
    Ok(Some(m))
}

pub(super) async fn update(
    p: &PostgresProvider,
    server: &Server,
    name: &str,
    desired: &Map,
    prior: &Map,
) -> Result<Map, ProviderError> {
    let spec = Spec::parse(desired)?;
    let prior_password = opt_str(prior, "password").ok().flatten();
    let mut secrets = spec.secrets();
    secrets.extend(prior_password.as_deref());
    let what = format!("update role {name}");
    let current = read(p, server, name, prior)
        .await?
        .ok_or_else(|| ProviderError::Other(format!("role {name} does not exist")))?;
    let current_roles = opt_strings(&current, "roles").unwrap_or_default();
    let pool = p.pool(server)?;
    let mut tx = pool.begin().await.map_err(|e| server.error("connect", &e, &secrets))?;
    let mut sql = format!("ALTER ROLE {} WITH {}", ident(name), spec.options());
    if spec.password != prior_password {
        sql.push_str(&password_clause(spec.password.as_deref()));
    }
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await
        .map_err(|e| server.error(&what, &e, &secrets))?;
    for r in spec.roles.iter().filter(|r| !current_roles.contains(r)) {
        grant_membership(&mut tx, server, r, name, &secrets).await?;
    }
    for r in current_roles.iter().filter(|r| !spec.roles.contains(r)) {
        sqlx::raw_sql(AssertSqlSafe(format!("REVOKE {} FROM {}", ident(r), ident(name))))
            .execute(&mut *tx)
            .await
            .map_err(|e| server.error(&format!("revoke role {r} from {name}"), &e, &secrets))?;
    }
    tx.commit().await.map_err(|e| server.error(&what, &e, &secrets))?;
    read(p, server, name, desired)
        .await?
        .ok_or_else(|| ProviderError::Other(format!("role {name} vanished during its update")))
}

/// Reassigns what the role owns to the provider's user and drops its privileges, in every
/// database where it has any (that accepts connections), then drops it.
pub(super) async fn delete(
    p: &PostgresProvider,
    server: &Server,
    name: &str,
    prior: &Map,
) -> Result<(), ProviderError> {
    let pool = p.pool(server)?;
    let what = format!("delete role {name}");
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_roles WHERE rolname = $1")
        .bind(name)
        .fetch_optional(&pool)
        .await
        .map_err(|e| server.error(&what, &e, &[]))?;
    if exists.is_none() {
        return Ok(());
    }
    if !opt_bool(prior, "skip_reassign_owned", false).unwrap_or(false) {
        // pg_shdepend records, per database, what a role owns and where it holds privileges.
        let mut databases: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT d.datname::text FROM pg_shdepend s JOIN pg_database d ON d.oid = s.dbid \
             WHERE s.refclassid = 'pg_authid'::regclass \
             AND s.refobjid = (SELECT oid FROM pg_roles WHERE rolname = $1) AND d.datallowconn",
        )
        .bind(name)
        .fetch_all(&pool)
        .await
        .map_err(|e| server.error(&what, &e, &[]))?;
        let here: String = sqlx::query_scalar("SELECT current_database()::text")
            .fetch_one(&pool)
            .await
            .map_err(|e| server.error(&what, &e, &[]))?;
        // The connected database always: objects it owns there may be unrecorded (shared
        // catalogs aside), and its REASSIGN also takes over the databases the role owns.
        databases.retain(|d| *d != here);
        databases.insert(0, here.clone());
        for db in &databases {
            let target = if *db == here {
                server.clone()
            } else {
                server.for_database(db)?
            };
            let pool = p.pool(&target)?;
            let sql = format!("REASSIGN OWNED BY {0} TO CURRENT_USER; DROP OWNED BY {0}", ident(name));
            // Both in one implicit transaction (a simple query of two statements).
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .map_err(|e| target.error(&format!("{what}: reassign and drop what it owns in {db}"), &e, &[]))?;
        }
    }
    // Memberships (its own and others' in it) go with the role.
    sqlx::raw_sql(AssertSqlSafe(format!("DROP ROLE IF EXISTS {}", ident(name))))
        .execute(&pool)
        .await
        .map_err(|e| server.error(&what, &e, &[]))?;
    Ok(())
}

/// Found when a role of the desired name exists. Its password cannot be read, so it is
/// reported unset (when one is desired): the engine's update then sets it.
pub(super) async fn lookup(p: &PostgresProvider, server: &Server, desired: &Map) -> Result<Lookup, ProviderError> {
    let name = req_str(desired, "name")?;
    let mut prior = desired.clone();
    prior.remove("password");
    Ok(match read(p, server, &name, &prior).await? {
        Some(actual) => Lookup::Found(Created {
            external_id: name,
            actual,
        }),
        None => Lookup::Absent,
    })
}
