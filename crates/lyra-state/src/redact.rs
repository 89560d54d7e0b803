//! The one place that makes state URLs safe to show: every message, log line and stored note
//! that names a state store goes through [`redact_url`] (or [`redact_text`] for free text).
//!
//! A URL keeps what makes a message useful (scheme, user, host, port, database, path and the
//! parameters known to be harmless, such as `schema` and `sslmode`) and loses everything that
//! can be a credential: the password, and the value of every other query parameter (an unknown
//! parameter is masked rather than guessed harmless). A password with an unencoded `?`, `&`,
//! `#` or `/` ends the authority early and spills into the query: so an `@` after the authority
//! masks everything before it, and a parameter name no driver knows (nor a misspelling of
//! one) is masked too, since it may be the rest of a password.

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

/// libpq's connection keywords: an unknown parameter with one of these names is named in the
/// message (it is not a piece of a password).
pub(crate) const LIBPQ_KEYWORDS: &[&str] = &[
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslnegotiation",
    "sslcompression",
    "sslpassword",
    "sslcertmode",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
];

/// The supported or libpq parameter `name` is a misspelling of: at most two edits from a
/// name of six letters or more, which no piece of a password plausibly is.
pub(crate) fn misspelt(name: &str) -> Option<&'static str> {
    crate::url::POSTGRES_PARAMETERS
        .iter()
        .chain(LIBPQ_KEYWORDS)
        .filter(|k| k.len() >= 6)
        .map(|k| (strsim::levenshtein(name, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Whether a query parameter's name may be shown: a name Lyra, sqlx or libpq knows, or a
/// misspelling of one. Any other "name" may be a piece of a password whose `&` was not
/// percent-encoded (`password=hun&ter2`).
pub(crate) fn nameable(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let lower = lower.as_str();
    SHOWN_PARAMETERS.contains(&lower)
        || crate::url::POSTGRES_PARAMETERS.contains(&lower)
        || LIBPQ_KEYWORDS.contains(&lower)
        // SQLCipher's passphrase: a name worth showing, masked value.
        || lower == "key"
        || lower.starts_with("options[")
        || misspelt(lower).is_some()
}

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
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        if is_scheme(scheme) && !scheme.eq_ignore_ascii_case("sqlite") && url.contains('@') {
            // A URL missing its slashes (`postgres:/u:pw@h/db`): what precedes the `@` may be
            // userinfo. (A SQLite path has none: `sqlite:/srv/a@b/state.db` is a path.)
            return redact_unparsed(scheme, &url[scheme.len() + 1..]).replacen("://", ":", 1);
        }
        // `sqlite:PATH?…` or a plain path. Only a query can hold a secret here.
        return match url.split_once('?') {
            Some((base, query)) if is_scheme(scheme) => format!("{base}?{}", redact_query(query)),
            _ => url.to_owned(),
        };
    };
    match Url::parse(url) {
        // An `@` after the authority means it ended early (an unencoded `/`, `?` or `#` in
        // the password, say), so part of the userinfo landed in the path, query or fragment:
        // do not trust the parse.
        Ok(parsed) if is_scheme(scheme) && !ends_early(&parsed) => redact_parsed(parsed),
        _ => redact_unparsed(scheme, rest),
    }
}

/// Whether an `@` follows the authority of `url`: then the authority ended inside the
/// userinfo, and the password (or part of it) is elsewhere in the URL.
fn ends_early(url: &Url) -> bool {
    [Some(url.path()), url.query(), url.fragment()]
        .into_iter()
        .flatten()
        .any(|part| part.contains('@') || part.contains("%40"))
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
/// a word is `key=value` with a connection keyword as its key. Not every word need be one: a
/// quoted value may hold spaces (`password='a b'`).
pub(crate) fn is_keyword_dsn(s: &str) -> bool {
    s.split_whitespace().any(|w| {
        let key = w.split_once('=').map_or("", |(k, _)| k);
        matches!(
            key,
            "host" | "hostaddr" | "port" | "dbname" | "user" | "password" | "sslmode"
        )
    })
}

/// A keyword connection string with every value not known to be harmless masked, and every
/// word that is not `key=value` (a piece of a quoted value) masked whole.
fn redact_keywords(s: &str) -> String {
    s.split_whitespace()
        .map(|w| match w.split_once('=') {
            Some((k, v)) if SHOWN_PARAMETERS.contains(&k) && !v.starts_with('\'') => w.to_owned(),
            Some((k, _)) if nameable(k) => format!("{k}={MASK}"),
            _ => MASK.to_owned(),
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

/// A URL the `url` crate refuses (a bad port, an unencoded `/` in the password...), or one
/// whose authority ended early: whatever precedes the last `@` (even past a `?` or `#`, which
/// may be in the password) may be userinfo and is masked whole, and so is the whole query.
fn redact_unparsed(scheme: &str, rest: &str) -> String {
    let rest = match rest.rsplit_once('@') {
        Some((_, host)) => format!("{MASK}@{host}"),
        None => rest.to_owned(),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, _)) => (r.to_owned(), Some(MASK)),
        None => (rest, None),
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

/// The raw query with the value of every parameter not in [`SHOWN_PARAMETERS`] masked, and
/// its name too unless it is [`nameable`] (a bare word, which could be a token, is masked
/// whole). Shown parts keep their spelling.
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
                Some(_) if nameable(&key) => format!("{raw_key}={MASK}"),
                Some(_) => format!("{MASK}={MASK}"),
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
        assert_eq!(redact_url("postgres://h/db?x=1#frag"), "postgres://h/db?***=***#***");
        // A name that is no parameter may be the rest of a password: `password=hun&ter2=x`.
        assert_eq!(
            redact_url("postgres://h/db?password=hun&ter2=x&connect_timeout=5"),
            "postgres://h/db?password=***&***=***&connect_timeout=***"
        );
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
            // `?`, `&` and `#` in the password: the authority ends early, at a bad port or a
            // good one; the rest of the password is in the query or the fragment.
            ("postgres://u:hun?ter2@h/db", "postgres://***@h/db"),
            ("postgres://u:12345?hunter2@h/db", "postgres://***@h/db"),
            ("postgres://u:12345#hunter2@h/db", "postgres://***@h/db"),
            ("postgres://u:hun#ter2@h/db", "postgres://***@h/db"),
            ("postgres://u:12345?hun%40ter2@h/db", "postgres://***@h/db"),
            ("postgres://u:pw@h/db?password=a@b", "postgres://***@b"),
            // A scheme without its `//`.
            ("postgres:/u:hunter2@h/db", "postgres:***@h/db"),
            ("postgres:u:hunter2@h/db?password=x", "postgres:***@h/db?***"),
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
            "/srv/u@h/state.db",
            "sqlite:/srv/u@h/state.db",
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
        // A quoted value with a space: its pieces are masked too.
        assert_eq!(
            redact_url("host=db password='hun ter2' user='a b'"),
            "host=db password=*** *** user=*** ***"
        );
        assert_eq!(redact_url("host=db password=hun ter2"), "host=db password=*** ***");
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
