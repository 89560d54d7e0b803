//! Parsing of state store URLs (see [`crate::open`]).

use std::path::PathBuf;

use crate::error::Error;
use crate::redact::{LIBPQ_KEYWORDS, is_keyword_dsn, is_scheme, misspelt};
use crate::sqlite::{SqliteOptions, Synchronous};

/// The query parameters sqlx's Postgres driver understands (besides Lyra's `schema`). Others
/// are refused: sqlx would log and ignore them, value included (a misspelt `password=` would
/// land in the logs).
pub(crate) const POSTGRES_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

#[derive(Debug, PartialEq)]
pub(crate) enum StoreUrl {
    Sqlite {
        path: PathBuf,
        options: SqliteOptions,
    },
    Postgres {
        /// The URL without Lyra's own parameters, for sqlx.
        url: String,
        /// `schema=NAME`: the schema the store's tables live in.
        schema: Option<String>,
    },
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl, Error> {
        let invalid = |reason: &str| Error::invalid_url(url, reason);
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return parse_postgres(url);
        }
        if is_keyword_dsn(url) {
            return Err(invalid(
                "this is a libpq connection string; write postgres://USER@HOST:PORT/DB \
                 (and pass the password in PGPASSWORD or ~/.pgpass)",
            ));
        }
        let rest = if let Some(rest) = url.strip_prefix("sqlite://") {
            rest
        } else if let Some(rest) = url.strip_prefix("sqlite:") {
            rest
        } else if url.split_once(':').is_some_and(|(scheme, _)| is_scheme(scheme)) {
            return Err(invalid(
                "expected sqlite://PATH, sqlite:PATH, a file path or postgres://… \
                 (write ./NAME for a file whose name contains ':')",
            ));
        } else {
            url
        };

        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        if path.is_empty() {
            return Err(invalid("no database file given"));
        }
        if path == ":memory:" {
            return Err(invalid(
                "in-memory databases are not supported: the state must be a file",
            ));
        }

        let mut options = SqliteOptions::default();
        for param in query.into_iter().flat_map(|q| q.split('&')).filter(|p| !p.is_empty()) {
            match param.split_once('=') {
                Some(("synchronous", value)) => {
                    options.synchronous = match value.to_ascii_lowercase().as_str() {
                        "normal" => Synchronous::Normal,
                        "full" => Synchronous::Full,
                        "extra" => Synchronous::Extra,
                        _ => return Err(invalid("synchronous must be normal, full or extra")),
                    }
                }
                _ => {
                    // The name only: the value could be a secret.
                    let name = param.split_once('=').map_or(param, |(k, _)| k);
                    return Err(invalid(&format!(
                        "unknown parameter {name:?} (supported: synchronous=normal|full|extra)"
                    )));
                }
            }
        }
        Ok(StoreUrl::Sqlite {
            path: PathBuf::from(path),
            options,
        })
    }
}

/// Splits Lyra's `schema=` parameter off a Postgres URL; the rest is sqlx's business.
fn parse_postgres(url: &str) -> Result<StoreUrl, Error> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    if query.contains('@') || query.contains('#') {
        // The authority ended early: a `?` (or `&`, `#`) in the password. What follows it is
        // a piece of the password, not parameters to name in the message.
        return Err(Error::invalid_url(
            url,
            "'@' or '#' after the '?': a password containing '?', '&', '#' or '/' must be \
             percent-encoded (or given in PGPASSWORD or ~/.pgpass)",
        ));
    }
    let mut schema = None;
    let mut rest = Vec::new();
    for (n, param) in query.split('&').filter(|p| !p.is_empty()).enumerate() {
        match param.split_once('=') {
            Some(("schema", name)) => {
                if !is_schema_name(name) {
                    return Err(Error::invalid_url(
                        url,
                        &format!(
                            "schema {name:?} must be 1 to 63 lowercase letters, digits or '_', \
                             not starting with a digit"
                        ),
                    ));
                }
                schema = Some(name.to_owned());
            }
            Some((key, _)) if is_postgres_parameter(key) => rest.push(param),
            _ => {
                // Never the value, which could be a secret; and the name only when it is a
                // connection keyword: otherwise it may be the rest of a password whose `&`
                // was not percent-encoded (`password=hun&ter2`).
                let name = param.split_once('=').map_or(param, |(k, _)| k);
                let which = if LIBPQ_KEYWORDS.contains(&name) {
                    format!("unknown parameter {name:?}")
                } else if let Some(near) = misspelt(name) {
                    format!("unknown parameter {name:?} (did you mean {near:?}?)")
                } else {
                    format!(
                        "parameter {} of the query is unknown (its name is not shown: it may be \
                         part of a password, whose '&' must be percent-encoded)",
                        n + 1
                    )
                };
                return Err(Error::invalid_url(
                    url,
                    &format!(
                        "{which} (supported: schema, {}, options[NAME])",
                        POSTGRES_PARAMETERS.join(", ")
                    ),
                ));
            }
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok(StoreUrl::Postgres { url, schema })
}

/// A name that needs no quoting, so it means the same in `CREATE SCHEMA` and `search_path`
/// (Postgres folds unquoted names to lower case; we refuse upper case rather than guess).
pub(crate) fn is_schema_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_")
}

fn is_postgres_parameter(key: &str) -> bool {
    POSTGRES_PARAMETERS.contains(&key) || key.starts_with("options[") && key.ends_with(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite_path(url: &str) -> PathBuf {
        match StoreUrl::parse(url) {
            Ok(StoreUrl::Sqlite { path, .. }) => path,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn sqlite_forms() {
        assert_eq!(
            sqlite_path("sqlite:///var/lib/lyra/state.db"),
            PathBuf::from("/var/lib/lyra/state.db")
        );
        assert_eq!(sqlite_path("sqlite://state.db"), PathBuf::from("state.db"));
        assert_eq!(sqlite_path("sqlite:dir/state.db"), PathBuf::from("dir/state.db"));
        assert_eq!(sqlite_path("/tmp/x.db"), PathBuf::from("/tmp/x.db"));
        assert_eq!(sqlite_path("state.db"), PathBuf::from("state.db"));
        assert_eq!(sqlite_path("./a:b.db"), PathBuf::from("./a:b.db"));
        assert_eq!(sqlite_path("C:\\lyra\\state.db"), PathBuf::from("C:\\lyra\\state.db"));
    }

    #[test]
    fn synchronous_parameter() {
        let Ok(StoreUrl::Sqlite { options, .. }) = StoreUrl::parse("sqlite:s.db?synchronous=FULL") else {
            panic!("not parsed");
        };
        assert_eq!(options.synchronous, Synchronous::Full);
        assert!(matches!(
            StoreUrl::parse("sqlite:s.db?synchronous=off"),
            Err(Error::InvalidUrl { .. })
        ));
        assert!(matches!(
            StoreUrl::parse("sqlite:s.db?mode=ro"),
            Err(Error::InvalidUrl { .. })
        ));
    }

    fn postgres(url: &str) -> (String, Option<String>) {
        match StoreUrl::parse(url) {
            Ok(StoreUrl::Postgres { url, schema }) => (url, schema),
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn postgres_forms() {
        assert_eq!(postgres("postgres://u@h/db"), ("postgres://u@h/db".to_owned(), None));
        assert_eq!(postgres("postgresql://h/db"), ("postgresql://h/db".to_owned(), None));
        assert_eq!(
            postgres("postgres://h/db?schema=lyra_1"),
            ("postgres://h/db".to_owned(), Some("lyra_1".to_owned()))
        );
        assert_eq!(
            postgres("postgres://h/db?sslmode=disable&schema=s&application_name=x"),
            (
                "postgres://h/db?sslmode=disable&application_name=x".to_owned(),
                Some("s".to_owned())
            )
        );
        for bad in ["Upper", "1abc", "a-b", "a;drop", "", "pg_catalog", "a b"] {
            let url = format!("postgres://u:hunter2@h/db?schema={bad}");
            let err = StoreUrl::parse(&url).expect_err(bad);
            let message = err.to_string();
            assert!(!message.contains("hunter2"), "{message}");
            assert!(message.contains("schema"), "{message}");
        }
    }

    #[test]
    fn messages_never_show_credentials() {
        for url in [
            "postgres://u:hunter2@h/db?schema=Bad",
            "postgres://h/db?password=hunter2&schema=Bad",
            "postgres://h/db?sslpassword=hunter2",
            "postgres://h/db?pasword=hunter2",
            "postgres://u:hun?ter2@h/db",
            "postgres://u:hunter2?x@h/db",
            "postgres://u@h/db?password=hun&hunter2",
            "postgres://u@h/db?password=hun&hunter2=x",
            "postgres://u@h/db?password=hun#hunter2",
            "postgres:/u:hunter2@h/db",
            "postgress://u:hunter2@h/db",
            "mysql://u:hunter2@h/db",
            "sqlite:s.db?password=hunter2",
            "host=h user=u password=hunter2",
        ] {
            let err = StoreUrl::parse(url).expect_err(url);
            let message = err.to_string();
            assert!(!message.contains("hunter2"), "{message}");
            assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
            assert!(message.starts_with("invalid state store URL"), "{message}");
        }
        // Parameters sqlx knows pass through, unknown ones are named.
        assert_eq!(
            postgres("postgres://h/db?password=pw&options[statement_timeout]=5s").0,
            "postgres://h/db?password=pw&options[statement_timeout]=5s"
        );
        let message = StoreUrl::parse("postgres://h/db?sslpasword=x").unwrap_err().to_string();
        assert!(message.contains("unknown parameter \"sslpasword\""), "{message}");
        let message = StoreUrl::parse("postgres://h/db?connect_timeout=5")
            .unwrap_err()
            .to_string();
        assert!(message.contains("unknown parameter \"connect_timeout\""), "{message}");
        // Not a keyword, nor a misspelt one: maybe the rest of a password (`password=a&b`).
        let message = StoreUrl::parse("postgres://h/db?password=a&ter2")
            .unwrap_err()
            .to_string();
        assert!(message.contains("parameter 2 of the query is unknown"), "{message}");
        assert!(!message.contains("ter2"), "{message}");
    }

    #[test]
    fn other_schemes() {
        for url in [
            "mysql://h/db",
            "http://x",
            "",
            "sqlite:",
            "sqlite://",
            "sqlite::memory:",
        ] {
            assert!(matches!(StoreUrl::parse(url), Err(Error::InvalidUrl { .. })), "{url}");
        }
    }
}
