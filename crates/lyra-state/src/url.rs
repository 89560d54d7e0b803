//! Parsing of state store URLs (see [`crate::open`]).

use std::path::PathBuf;

use crate::error::Error;
use crate::sqlite::{SqliteOptions, Synchronous};

#[derive(Debug, PartialEq)]
pub(crate) enum StoreUrl {
    Sqlite { path: PathBuf, options: SqliteOptions },
    Postgres,
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl, Error> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres);
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

    #[test]
    fn other_schemes() {
        assert_eq!(StoreUrl::parse("postgres://u@h/db").unwrap(), StoreUrl::Postgres);
        assert_eq!(StoreUrl::parse("postgresql://h/db").unwrap(), StoreUrl::Postgres);
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
