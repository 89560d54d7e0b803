//! Parsing of state store URLs (see [`crate::open`]).

use std::path::PathBuf;

use crate::error::Error;
use crate::sqlite::{SqliteOptions, Synchronous};

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
        let invalid = |reason: &str| Error::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return parse_postgres(url);
        }
        let rest = if let Some(rest) = url.strip_prefix("sqlite://") {
            rest
        } else if let Some(rest) = url.strip_prefix("sqlite:") {
            rest
        } else if has_scheme(url) {
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
                    return Err(invalid(&format!(
                        "unknown parameter {param:?} (supported: synchronous=normal|full|extra)"
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
    let mut schema = None;
    let mut rest = Vec::new();
    for param in query.split('&').filter(|p| !p.is_empty()) {
        match param.split_once('=') {
            Some(("schema", name)) => {
                if !is_schema_name(name) {
                    return Err(Error::InvalidUrl {
                        url: redact(url),
                        reason: format!(
                            "schema {name:?} must be 1 to 63 lowercase letters, digits or '_', \
                             not starting with a digit"
                        ),
                    });
                }
                schema = Some(name.to_owned());
            }
            _ => rest.push(param),
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

/// `url` with any password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let mut out = url.to_owned();
    // `scheme://user:password@host/...`
    if let Some(start) = url.find("://").map(|i| i + 3) {
        let authority_end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
        let authority = &url[start..authority_end];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
        {
            out = format!("{}***{}", &url[..start + colon + 1], &url[start + at..]);
        }
    }
    // `?password=...`
    if let Some((base, query)) = out.split_once('?') {
        let query: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => p.to_owned(),
            })
            .collect();
        out = format!("{base}?{}", query.join("&"));
    }
    out
}

/// Whether `s` starts with a URL scheme (`name:`, two characters or more so that a Windows
/// drive letter still reads as a path).
fn has_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once(':') else {
        return false;
    };
    scheme.len() >= 2
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
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
    fn redaction() {
        assert_eq!(redact("postgres://u:pw@h:5/db?x=1"), "postgres://u:***@h:5/db?x=1");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact("postgres://h/db?user=u&password=pw&schema=s"),
            "postgres://h/db?user=u&password=***&schema=s"
        );
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
