//! The one place that makes state URLs safe to show: every message, log line and stored note
//! that names a state store goes through [`redact_url`] (or [`redact_text`] for free text).
//!
//! A URL keeps what makes a message useful (scheme, user, host, port, database, path and the
//! parameters known to be harmless, such as `schema` and `sslmode`) and loses everything that
//! can be a credential: the password, and the value of every other query parameter (an unknown
//! parameter is masked rather than guessed harmless).

use ::url::Url;
use ::url::form_urlencoded;

/// What replaces a secret.
pub const MASK: &str = "***";

/// Query parameters whose values are never secret, so they are shown. Everything else
/// (`password`, `sslpassword`, `sslkey`, which sqlx also accepts as inline PEM, typos...) is
/// masked.
const SHOWN_PARAMETERS: &[&str] = &[
    "schema",
    "synchronous",
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "application_name",
    "statement-cache-capacity",
];

/// `url` without credentials, for messages, logs and the history: the password becomes
/// `***`, and so does the value of every query parameter not known to be harmless. A file path
/// comes back as it is.
///
/// ```
/// assert_eq!(
///     lyra_state::redact_url("postgres://lyra:pw@db:5432/state?password=pw&schema=s"),
///     "postgres://lyra:***@db:5432/state?password=***&schema=s"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        if is_keyword_dsn(url) {
            return redact_keywords(url);
        }
        // `sqlite:PATH?…` or a plain path. Only a query can hold a secret here.
        return match url.split_once('?') {
            Some((base, query)) if is_scheme(base.split_once(':').map_or("", |(s, _)| s)) => {
                format!("{base}?{}", redact_query(query))
            }
            _ => url.to_owned(),
        };
    };
    match Url::parse(url) {
        // An `@` in the path means the authority ended early (an unencoded `/` in the
        // password, say), so part of the userinfo landed in the path: do not trust the parse.
        Ok(parsed) if is_scheme(scheme) && !parsed.path().contains('@') => redact_parsed(parsed),
        _ => redact_unparsed(scheme, rest),
    }
}

/// `text` with every `scheme://…` URL in it passed through [`redact_url`]: for notes and
/// errors that may quote a URL among other words.
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // Back over the scheme, forward to the end of the word.
        let start = rest[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(at, |(i, _)| i);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether `s` is a libpq keyword/value connection string (`host=db user=lyra password=…`):
/// every word is `key=value` and one key is a connection keyword.
pub(crate) fn is_keyword_dsn(s: &str) -> bool {
    let mut words = s.split_whitespace().peekable();
    words.peek().is_some()
        && s.split_whitespace()
            .all(|w| w.split_once('=').is_some_and(|(k, _)| !k.is_empty()))
        && words.any(|w| {
            let key = w.split_once('=').map_or("", |(k, _)| k);
            matches!(
                key,
                "host" | "hostaddr" | "port" | "dbname" | "user" | "password" | "sslmode"
            )
        })
}

fn redact_keywords(s: &str) -> String {
    s.split_whitespace()
        .map(|w| match w.split_once('=') {
            Some((k, _)) if !SHOWN_PARAMETERS.contains(&k) => format!("{k}={MASK}"),
            _ => w.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn redact_parsed(mut url: Url) -> String {
    if url.password().is_some() {
        // Cannot fail: the URL has a password, hence a host.
        let _ = url.set_password(Some(MASK));
    }
    if let Some(query) = url.query().map(redact_query) {
        url.set_query(Some(&query));
    }
    if url.fragment().is_some() {
        url.set_fragment(Some(MASK));
    }
    url.to_string()
}

/// A URL the `url` crate refuses (a bad port, an unencoded `/` in the password...): whatever
/// precedes the last `@` may be userinfo and is masked whole, and so is the whole query.
fn redact_unparsed(scheme: &str, rest: &str) -> String {
    let (rest, query) = match rest.split_once('?') {
        Some((r, _)) => (r, Some(MASK)),
        None => (rest, None),
    };
    let rest = match rest.rsplit_once('@') {
        Some((_, host)) => format!("{MASK}@{host}"),
        None => rest.to_owned(),
    };
    let rest = match rest.split_once('#') {
        Some((r, _)) => format!("{r}#{MASK}"),
        None => rest,
    };
    match query {
        Some(q) => format!("{scheme}://{rest}?{q}"),
        None => format!("{scheme}://{rest}"),
    }
}

/// The raw query with the value of every parameter not in [`SHOWN_PARAMETERS`] masked (a
/// bare word, which could be a token, is masked whole). Shown parts keep their spelling.
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|part| {
            let (raw_key, value) = match part.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (part, None),
            };
            let key: String = form_urlencoded::parse(raw_key.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            match value {
                _ if part.is_empty() => String::new(),
                Some(_) if SHOWN_PARAMETERS.contains(&key.as_str()) => part.to_owned(),
                Some(_) => format!("{raw_key}={MASK}"),
                None => MASK.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether `s` is a URL scheme of two characters or more (one letter is a Windows drive).
pub(crate) fn is_scheme(s: &str) -> bool {
    s.len() >= 2
        && s.starts_with(|c: char| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_the_userinfo_are_masked() {
        assert_eq!(redact_url("postgres://u:pw@h:5/db"), "postgres://u:***@h:5/db");
        assert_eq!(redact_url("postgresql://u:p@ss@h/db"), "postgresql://u:***@h/db");
        assert_eq!(redact_url("postgres://u:%40x%2F@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("postgres://:pw@h/db"), "postgres://:***@h/db");
        assert_eq!(
            redact_url("postgres://u:pw@[::1]:5432/db"),
            "postgres://u:***@[::1]:5432/db"
        );
        // No host (a Unix socket in the query): unparsable, so everything doubtful goes.
        assert_eq!(
            redact_url("postgres://u:pw@/db?host=/run/postgresql"),
            "postgres://***@/db?***"
        );
    }

    #[test]
    fn credential_parameters_and_unknown_ones_are_masked() {
        assert_eq!(
            redact_url("postgres://h/db?user=u&password=pw&schema=s&sslmode=require"),
            "postgres://h/db?user=u&password=***&schema=s&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://h/db?PASSWORD=pw&sslpassword=x&sslkey=-----BEGIN&pasword=typo"),
            "postgres://h/db?PASSWORD=***&sslpassword=***&sslkey=***&pasword=***"
        );
        // Percent-encoded keys are recognised; bare words are masked whole.
        assert_eq!(
            redact_url("postgres://h/db?pass%77ord=pw&tok"),
            "postgres://h/db?pass%77ord=***&***"
        );
        assert_eq!(redact_url("postgres://h/db?x=1#frag"), "postgres://h/db?x=***#***");
        assert_eq!(
            redact_url("sqlite:state.db?synchronous=full&key=k"),
            "sqlite:state.db?synchronous=full&key=***"
        );
    }

    #[test]
    fn unparsable_urls_lose_everything_that_could_be_userinfo() {
        for (url, expected) in [
            ("postgres://u:pw@h:notaport/db", "postgres://***@h:notaport/db"),
            ("postgres://u:pa/ss@h/db?password=x", "postgres://***@h/db?***"),
            ("postgres://u:1/w@h/db", "postgres://***@h/db"),
            ("mysql://u:pw@h:99999/db", "mysql://***@h:99999/db"),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }

    #[test]
    fn paths_are_left_alone() {
        for path in [
            ".lyra/state.db",
            "/var/lib/lyra/state.db",
            "C:\\lyra\\state.db",
            "./a:b.db",
            "a?b.db",
        ] {
            assert_eq!(redact_url(path), path);
        }
    }

    #[test]
    fn keyword_connection_strings_are_masked() {
        assert_eq!(
            redact_url("host=db user=lyra password=pw dbname=state"),
            "host=db user=lyra password=*** dbname=state"
        );
        assert!(!is_keyword_dsn("my dir/a=b.db"));
        assert!(!is_keyword_dsn("state.db"));
        assert!(is_keyword_dsn("password=x"));
    }

    #[test]
    fn urls_inside_text_are_redacted() {
        assert_eq!(
            redact_text("migrated from postgres://u:pw@h/db?password=pw&schema=s (store x)"),
            "migrated from postgres://u:***@h/db?password=***&schema=s (store x)"
        );
        assert_eq!(
            redact_text("a \"postgres://u:pw@h/db\" and mysql://x:y@z/w."),
            "a \"postgres://u:***@h/db\" and mysql://x:***@z/w."
        );
        assert_eq!(redact_text("no url here: a://"), "no url here: a://");
        assert_eq!(redact_text("x ://u:pw@h/db"), "x ://***@h/db");
        assert_eq!(redact_text("1pg://u:pw@h/db"), "1pg://***@h/db");
        assert_eq!(redact_text("plain"), "plain");
        assert_eq!(redact_text(""), "");
    }
}
