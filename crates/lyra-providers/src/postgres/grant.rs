//! `Postgres::Grant`.
//!
//! Create and update revoke every privilege of the role on the objects and grant the desired
//! ones, in one transaction, as cyrilgdn/postgresql's `postgresql_grant` does. Read reports the
//! privileges granted to the role itself (ACL entries, not those it inherits through
//! membership); on tables and sequences, those it holds on every one of the objects. A grant
//! whose privileges were all revoked out of band reads as gone (so the next apply grants them
//! again); one with some revoked reads with the rest (an update).

use std::collections::{BTreeSet, HashMap};

use lyra_core::provider::{Created, Lookup, ProviderError};
use lyra_core::value::{Map, Value};
use sqlx::{AssertSqlSafe, Row as _};

use super::{PostgresProvider, Server, ident, invalid, opt_str, opt_strings, req_str};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Database,
    Schema,
    Table,
    Sequence,
}

impl Kind {
    fn parse(s: &str) -> Result<Kind, ProviderError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "database" => Kind::Database,
            "schema" => Kind::Schema,
            "table" => Kind::Table,
            "sequence" => Kind::Sequence,
            _ => {
                return Err(invalid(
                    "object_type",
                    format!("'{s}' is not one of database, schema, table, sequence"),
                ));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Database => "database",
            Kind::Schema => "schema",
            Kind::Table => "table",
            Kind::Sequence => "sequence",
        }
    }

    /// Every privilege there is on such an object (what ALL means), as aclexplode names them.
    fn all(self) -> &'static [&'static str] {
        match self {
            Kind::Database => &["CONNECT", "CREATE", "TEMPORARY"],
            Kind::Schema => &["CREATE", "USAGE"],
            Kind::Table => &[
                "DELETE",
                "INSERT",
                "REFERENCES",
                "SELECT",
                "TRIGGER",
                "TRUNCATE",
                "UPDATE",
            ],
            Kind::Sequence => &["SELECT", "UPDATE", "USAGE"],
        }
    }
}

/// A grant as the workflow describes it.
struct Spec {
    role: String,
    database: String,
    schema: Option<String>,
    kind: Kind,
    objects: Vec<String>,
    /// As listed (for the read to answer in the same spelling).
    listed: Vec<String>,
    /// Canonical and expanded (`ALL`, `TEMP`), sorted: what is granted.
    privileges: BTreeSet<String>,
}

/// The canonical name of a privilege: upper case, `TEMP` as `TEMPORARY`.
fn canonical(p: &str) -> String {
    let p = p.trim().to_ascii_uppercase();
    if p == "TEMP" { "TEMPORARY".to_owned() } else { p }
}

impl Spec {
    fn parse(m: &Map) -> Result<Spec, ProviderError> {
        let kind = Kind::parse(&req_str(m, "object_type")?)?;
        let schema = opt_str(m, "schema")?.filter(|s| !s.is_empty());
        let objects = opt_strings(m, "objects")?;
        match kind {
            Kind::Database if !objects.is_empty() => {
                return Err(invalid("objects", "must be empty for object_type database"));
            }
            Kind::Schema if !objects.is_empty() => {
                return Err(invalid("objects", "must be empty for object_type schema"));
            }
            Kind::Schema | Kind::Table | Kind::Sequence if schema.is_none() => {
                return Err(invalid(
                    "schema",
                    format!("is required for object_type {}", kind.name()),
                ));
            }
            _ => {}
        }
        let listed = opt_strings(m, "privileges")?;
        let mut privileges = BTreeSet::new();
        for p in &listed {
            let c = canonical(p);
            if c == "ALL" || c == "ALL PRIVILEGES" {
                privileges.extend(kind.all().iter().map(|s| (*s).to_owned()));
            } else if kind.all().contains(&c.as_str()) {
                privileges.insert(c);
            } else {
                // A whitelist: privileges are keywords, written into statements unquoted.
                return Err(invalid(
                    "privileges",
                    format!(
                        "'{p}' is not a privilege on a {} ({})",
                        kind.name(),
                        kind.all().join(", ")
                    ),
                ));
            }
        }
        Ok(Spec {
            role: req_str(m, "role")?,
            database: req_str(m, "database")?,
            schema,
            kind,
            objects,
            listed,
            privileges,
        })
    }

    /// From an external id (`role/database/schema/object_type`), when there is no record.
    fn from_id(id: &str) -> Result<Spec, ProviderError> {
        let parts: Vec<&str> = id.split('/').collect();
        let [role, database, schema, kind] = parts.as_slice() else {
            return Err(ProviderError::Other(format!(
                "'{id}' is not a Postgres::Grant id (role/database/schema/object_type)"
            )));
        };
        let mut m = Map::new();
        m.insert("role".into(), Value::String((*role).to_owned()));
        m.insert("database".into(), Value::String((*database).to_owned()));
        m.insert("schema".into(), Value::String((*schema).to_owned()));
        m.insert("object_type".into(), Value::String((*kind).to_owned()));
        Spec::parse(&m)
    }

    fn id(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.role,
            self.database,
            self.schema.as_deref().unwrap_or(""),
            self.kind.name()
        )
    }

    fn public(&self) -> bool {
        self.role.eq_ignore_ascii_case("public")
    }

    /// The grantee as SQL: PUBLIC, or the quoted role.
    fn grantee(&self) -> String {
        if self.public() {
            "PUBLIC".to_owned()
        } else {
            ident(&self.role)
        }
    }

    /// What the privileges are on, as SQL (`DATABASE "d"`, `ALL TABLES IN SCHEMA "s"`...).
    fn target(&self) -> String {
        let schema = self.schema.as_deref().unwrap_or("");
        let list = |word: &str| {
            let names: Vec<String> = self
                .objects
                .iter()
                .map(|o| format!("{}.{}", ident(schema), ident(o)))
                .collect();
            format!("{word} {}", names.join(", "))
        };
        match self.kind {
            Kind::Database => format!("DATABASE {}", ident(&self.database)),
            Kind::Schema => format!("SCHEMA {}", ident(schema)),
            Kind::Table if self.objects.is_empty() => format!("ALL TABLES IN SCHEMA {}", ident(schema)),
            Kind::Sequence if self.objects.is_empty() => format!("ALL SEQUENCES IN SCHEMA {}", ident(schema)),
            Kind::Table => list("TABLE"),
            Kind::Sequence => list("SEQUENCE"),
        }
    }

    /// The server to run the statements on: the grant's database (a database's own
    /// privileges can be granted from any).
    fn server(&self, server: &Server) -> Result<Server, ProviderError> {
        if self.kind == Kind::Database || server.database().as_deref() == Some(self.database.as_str()) {
            Ok(server.clone())
        } else {
            server.for_database(&self.database)
        }
    }

    /// `privileges` as the workflow spells them when they are what it listed, else canonical.
    fn spelled(&self, held: &BTreeSet<String>) -> Value {
        if *held == self.privileges {
            return Value::Array(self.listed.iter().cloned().map(Value::String).collect());
        }
        Value::Array(held.iter().cloned().map(Value::String).collect())
    }
}

/// Revokes everything, then grants `spec.privileges`, in one transaction.
async fn apply(p: &PostgresProvider, server: &Server, spec: &Spec) -> Result<(), ProviderError> {
    let target_server = spec.server(server)?;
    let pool = p.pool(&target_server)?;
    let what = format!("grant on {} {}", spec.kind.name(), spec.id());
    let mut sql = format!("REVOKE ALL PRIVILEGES ON {} FROM {}", spec.target(), spec.grantee());
    if !spec.privileges.is_empty() {
        let privileges: Vec<&str> = spec.privileges.iter().map(String::as_str).collect();
        sql.push_str(&format!(
            "; GRANT {} ON {} TO {}",
            privileges.join(", "),
            spec.target(),
            spec.grantee()
        ));
    }
    let mut tx = pool.begin().await.map_err(|e| target_server.error(&what, &e, &[]))?;
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await
        .map_err(|e| target_server.error(&what, &e, &[]))?;
    tx.commit().await.map_err(|e| target_server.error(&what, &e, &[]))?;
    Ok(())
}

pub(super) async fn create(p: &PostgresProvider, server: &Server, desired: &Map) -> Result<Created, ProviderError> {
    let spec = Spec::parse(desired)?;
    apply(p, server, &spec).await?;
    let actual = read_spec(p, server, &spec, desired).await?;
    Ok(Created {
        external_id: spec.id(),
        actual: actual.unwrap_or_else(|| with_privileges(desired, Value::Array(Vec::new()))),
    })
}

fn with_privileges(m: &Map, privileges: Value) -> Map {
    let mut out = m.clone();
    out.insert("privileges".into(), privileges);
    out
}

pub(super) async fn read(
    p: &PostgresProvider,
    server: &Server,
    id: &str,
    prior: &Map,
) -> Result<Option<Map>, ProviderError> {
    let spec = if prior.contains_key("role") {
        Spec::parse(prior)?
    } else {
        Spec::from_id(id)?
    };
    read_spec(p, server, &spec, prior).await
}

/// The grant's privileges as they are, with its other attributes as `spec` has them (and any
/// other of `base`'s); `None` when there are none (or its role, database or schema is gone).
async fn read_spec(
    p: &PostgresProvider,
    server: &Server,
    spec: &Spec,
    base: &Map,
) -> Result<Option<Map>, ProviderError> {
    let mut base = base.clone();
    for (k, v) in [
        ("role", Value::String(spec.role.clone())),
        ("database", Value::String(spec.database.clone())),
        ("schema", spec.schema.clone().map_or(Value::Null, Value::String)),
        ("object_type", Value::String(spec.kind.name().to_owned())),
        (
            "objects",
            Value::Array(spec.objects.iter().cloned().map(Value::String).collect()),
        ),
    ] {
        base.insert(k.to_owned(), v);
    }
    let base = &base;
    let what = format!("read grant {}", spec.id());
    let main = p.pool(server)?;
    // The database and role first: a connection to a database that is gone would fail.
    let present: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) \
         AND ($3 OR EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2))",
    )
    .bind(&spec.database)
    .bind(&spec.role)
    .bind(spec.public())
    .fetch_one(&main)
    .await
    .map_err(|e| server.error(&what, &e, &[]))?;
    if !present {
        return Ok(None);
    }
    let target_server = spec.server(server)?;
    let pool = p.pool(&target_server)?;
    let grantee = "CASE WHEN $1 THEN 0::oid ELSE (SELECT oid FROM pg_roles WHERE rolname = $2) END";
    let held: BTreeSet<String> = match spec.kind {
        Kind::Database | Kind::Schema => {
            let sql = if spec.kind == Kind::Database {
                format!(
                    "SELECT a.privilege_type::text FROM pg_database d, \
                     aclexplode(COALESCE(d.datacl, acldefault('d', d.datdba))) a \
                     WHERE d.datname = $3 AND a.grantee = {grantee}"
                )
            } else {
                format!(
                    "SELECT a.privilege_type::text FROM pg_namespace n, \
                     aclexplode(COALESCE(n.nspacl, acldefault('n', n.nspowner))) a \
                     WHERE n.nspname = $3 AND a.grantee = {grantee}"
                )
            };
            let subject = if spec.kind == Kind::Database {
                spec.database.clone()
            } else {
                spec.schema.clone().unwrap_or_default()
            };
            if spec.kind == Kind::Schema && !schema_exists(&pool, &target_server, &what, &subject).await? {
                return Ok(None);
            }
            let rows: Vec<String> = sqlx::query_scalar(AssertSqlSafe(sql))
                .bind(spec.public())
                .bind(&spec.role)
                .bind(&subject)
                .fetch_all(&pool)
                .await
                .map_err(|e| target_server.error(&what, &e, &[]))?;
            rows.into_iter().collect()
        }
        Kind::Table | Kind::Sequence => {
            let schema = spec.schema.clone().unwrap_or_default();
            if !schema_exists(&pool, &target_server, &what, &schema).await? {
                return Ok(None);
            }
            let (kinds, default): (Vec<String>, &str) = if spec.kind == Kind::Table {
                (["r", "v", "m", "f", "p"].map(str::to_owned).to_vec(), "r")
            } else {
                (vec!["S".to_owned()], "s")
            };
            let sql = format!(
                "SELECT c.relname::text AS object, a.privilege_type::text AS privilege \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 LEFT JOIN LATERAL aclexplode(COALESCE(c.relacl, acldefault('{default}', c.relowner))) a \
                   ON a.grantee = {grantee} \
                 WHERE n.nspname = $3 AND c.relkind::text = ANY($4) \
                 AND (cardinality($5::text[]) = 0 OR c.relname::text = ANY($5))"
            );
            let rows = sqlx::query(AssertSqlSafe(sql))
                .bind(spec.public())
                .bind(&spec.role)
                .bind(&schema)
                .bind(&kinds)
                .bind(&spec.objects)
                .fetch_all(&pool)
                .await
                .map_err(|e| target_server.error(&what, &e, &[]))?;
            let mut per_object: HashMap<String, BTreeSet<String>> = HashMap::new();
            for row in rows {
                let object: String = row.try_get("object").map_err(|e| target_server.error(&what, &e, &[]))?;
                let privilege: Option<String> = row
                    .try_get("privilege")
                    .map_err(|e| target_server.error(&what, &e, &[]))?;
                let set = per_object.entry(object).or_default();
                set.extend(privilege);
            }
            // A listed object that does not exist holds nothing.
            for o in &spec.objects {
                per_object.entry(o.clone()).or_default();
            }
            let mut sets = per_object.into_values();
            match sets.next() {
                // No object at all: every one of them (none) has the privileges.
                None => spec.privileges.clone(),
                Some(first) => sets.fold(first, |acc, s| acc.intersection(&s).cloned().collect()),
            }
        }
    };
    // Only what this kind of object can have (MAINTAIN, in newer servers, aside).
    let held: BTreeSet<String> = held
        .into_iter()
        .filter(|p| spec.kind.all().contains(&p.as_str()))
        .collect();
    if held.is_empty() {
        return Ok(None);
    }
    Ok(Some(with_privileges(base, spec.spelled(&held))))
}

async fn schema_exists(pool: &sqlx::PgPool, server: &Server, what: &str, schema: &str) -> Result<bool, ProviderError> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(pool)
        .await
        .map_err(|e| server.error(what, &e, &[]))
}

pub(super) async fn update(
    p: &PostgresProvider,
    server: &Server,
    _id: &str,
    desired: &Map,
    _prior: &Map,
) -> Result<Map, ProviderError> {
    let spec = Spec::parse(desired)?;
    apply(p, server, &spec).await?;
    Ok(read_spec(p, server, &spec, desired)
        .await?
        .unwrap_or_else(|| with_privileges(desired, Value::Array(Vec::new()))))
}

/// Revokes every privilege of the role on the objects; nothing to do when the role, the
/// database or the schema is gone.
pub(super) async fn delete(p: &PostgresProvider, server: &Server, id: &str, prior: &Map) -> Result<(), ProviderError> {
    let spec = if prior.contains_key("role") {
        Spec::parse(prior)?
    } else {
        Spec::from_id(id)?
    };
    if read_spec(p, server, &spec, prior).await?.is_none() {
        return Ok(());
    }
    let none = Spec {
        privileges: BTreeSet::new(),
        ..spec
    };
    apply(p, server, &none).await
}

/// Found when the role holds any of the privileges.
pub(super) async fn lookup(p: &PostgresProvider, server: &Server, desired: &Map) -> Result<Lookup, ProviderError> {
    let spec = Spec::parse(desired)?;
    Ok(match read_spec(p, server, &spec, desired).await? {
        Some(actual) => Lookup::Found(Created {
            external_id: spec.id(),
            actual,
        }),
        None => Lookup::Absent,
    })
}
