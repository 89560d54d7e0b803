//! Where a package is: a local OCI layout directory, a `.tar` of one, or a registry.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::Error;

/// A package reference as a user gives it.
#[derive(Clone, PartialEq, Eq)]
pub enum Reference {
    /// An OCI image layout directory.
    Layout(PathBuf),
    /// A `.tar` of an OCI image layout.
    Tar(PathBuf),
    /// `oci://HOST[:PORT]/REPO[:TAG][@sha256:…]`.
    Registry(RegistryRef),
}

/// A package in a registry.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryRef {
    /// `HOST[:PORT]`.
    pub registry: String,
    /// `team/web`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:…`.
    pub digest: Option<String>,
    /// `user:password` given in the reference itself (`oci://user:pw@host/…`); never shown.
    pub(crate) userinfo: Option<(String, String)>,
}

impl Reference {
    /// Parses a reference: `oci://…`, a path ending in `.tar`, or any other path (a layout
    /// directory).
    pub fn parse(text: &str) -> Result<Reference, Error> {
        if let Some(rest) = text.strip_prefix("oci://") {
            return RegistryRef::parse(rest)
                .map(Reference::Registry)
                .map_err(|why| Error::BadReference {
                    reference: redact(text),
                    why,
                });
        }
        if text.contains("://") {
            return Err(Error::BadReference {
                reference: redact(text),
                why: "only oci:// references, layout directories and .tar files are packages".into(),
            });
        }
        if text.is_empty() {
            return Err(Error::BadReference {
                reference: String::new(),
                why: "it is empty".into(),
            });
        }
        Ok(if text.ends_with(".tar") {
            Reference::Tar(PathBuf::from(text))
        } else {
            Reference::Layout(PathBuf::from(text))
        })
    }

    /// The reference `arg` makes if it names a package rather than a workflow: an `oci://`
    /// reference, a `.tar` file, or a directory holding an `oci-layout` file.
    pub fn detect(arg: &str) -> Option<Reference> {
        let path = Path::new(arg);
        if arg.starts_with("oci://") || (arg.ends_with(".tar") && path.is_file()) || path.join("oci-layout").is_file() {
            Reference::parse(arg).ok()
        } else {
            None
        }
    }

    /// The same reference pinned to `digest` (a registry reference keeps its tag for display).
    pub fn pinned(&self, digest: &str) -> Reference {
        match self {
            Reference::Registry(r) => Reference::Registry(RegistryRef {
                digest: Some(digest.to_owned()),
                ..r.clone()
            }),
            other => other.clone(),
        }
    }
}

impl RegistryRef {
    fn parse(rest: &str) -> Result<RegistryRef, String> {
        let (authority, path) = rest
            .split_once('/')
            .ok_or("expected oci://HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST]")?;
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((ui, host)) => {
                let (u, p) = ui
                    .split_once(':')
                    .ok_or("credentials in a reference must be USER:PASSWORD@")?;
                (Some((u.to_owned(), p.to_owned())), host)
            }
            None => (None, authority),
        };
        if host.is_empty() || !host.chars().all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c)) {
            return Err(format!("'{host}' is not a registry host"));
        }
        let (path, digest) = match path.split_once('@') {
            Some((p, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or("the digest must be sha256:<64 hex digits>")?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                    return Err("the digest must be sha256:<64 lowercase hex digits>".into());
                }
                (p, Some(d.to_owned()))
            }
            None => (path, None),
        };
        // A tag follows the last `:` of the last path segment.
        let last = path.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match path[last..].split_once(':') {
            Some((_, t)) => (&path[..last + path[last..].find(':').unwrap_or(0)], Some(t.to_owned())),
            None => (path, None),
        };
        if repository.is_empty()
            || !repository.split('/').all(|seg| {
                !seg.is_empty()
                    && seg
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
            })
        {
            return Err(format!(
                "'{repository}' is not a repository name (lowercase letters, digits, '.', '_', '-', separated by '/')"
            ));
        }
        if let Some(t) = &tag
            && (t.is_empty()
                || t.len() > 128
                || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                || t.starts_with(['.', '-']))
        {
            return Err(format!(
                "'{t}' is not a tag (letters, digits, '.', '_', '-', at most 128)"
            ));
        }
        Ok(RegistryRef {
            registry: host.to_owned(),
            repository: repository.to_owned(),
            tag,
            digest,
            userinfo,
        })
    }

    /// Whether the registry is on this machine (plain HTTP is allowed there).
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        lyra_core::net::is_loopback_host(host)
    }

    /// The same reference with `tag` (and no digest).
    pub fn with_tag(&self, tag: &str) -> RegistryRef {
        RegistryRef {
            tag: Some(tag.to_owned()),
            digest: None,
            ..self.clone()
        }
    }
}

/// `text` with any `user:password@` removed, for messages.
fn redact(text: &str) -> String {
    match text.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            if path.is_empty() && !rest.contains('/') {
                format!("{scheme}://{host}")
            } else {
                format!("{scheme}://{host}/{path}")
            }
        }
        None => text.to_owned(),
    }
}

impl fmt::Display for RegistryRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for RegistryRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Layout(p) | Reference::Tar(p) => write!(f, "{}", p.display()),
            Reference::Registry(r) => r.fmt(f),
        }
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_registry_references() {
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("oci://u:secret@127.0.0.1:5000/team/web:1.0.0@{d}")).unwrap();
        let Reference::Registry(rr) = &r else { panic!("{r}") };
        assert_eq!(rr.registry, "127.0.0.1:5000");
        assert_eq!(rr.repository, "team/web");
        assert_eq!(rr.tag.as_deref(), Some("1.0.0"));
        assert_eq!(rr.digest.as_deref(), Some(d.as_str()));
        assert!(rr.is_loopback());
        assert_eq!(r.to_string(), format!("oci://127.0.0.1:5000/team/web:1.0.0@{d}"));
        assert!(!format!("{r:?}").contains("secret"));
        let r = Reference::parse("oci://registry.example:443/web").unwrap();
        let Reference::Registry(rr) = &r else { panic!("{r}") };
        assert_eq!((rr.tag.as_deref(), rr.is_loopback()), (None, false));
    }

    #[test]
    fn refuses_bad_references_without_showing_credentials() {
        for bad in [
            "oci://host",
            "oci://u:pw@host/Web",
            "oci://host/web@sha256:12",
            "https://u:pw@h/x",
            "oci://host/web:-x",
        ] {
            let e = Reference::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("pw"), "{e}");
        }
        assert!(matches!(Reference::parse("out.tar").unwrap(), Reference::Tar(_)));
        assert!(matches!(Reference::parse("out").unwrap(), Reference::Layout(_)));
    }
}
