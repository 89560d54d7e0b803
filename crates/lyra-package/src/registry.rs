//! Registries: resolving, pulling (verified, cached by digest) and pushing packages.

use std::path::{Path, PathBuf};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};

use crate::layout::{Descriptor, Layout, parse_manifest, verify};
use crate::{Error, MANIFEST_MEDIA_TYPE, Package, Reference, RegistryRef};

/// How to reach registries and where to cache what is pulled.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Where pulled blobs are kept, by digest. `None`: no cache.
    pub cache_dir: Option<PathBuf>,
    /// Hosts (`HOST[:PORT]`) reached over plain HTTP besides loopback ones.
    pub insecure: Vec<String>,
    /// The Docker config file; `None`: none is read.
    pub docker_config: Option<PathBuf>,
    /// Credentials for every registry, before the Docker config's.
    pub username: Option<String>,
    pub password: Option<String>,
}

impl RegistryOptions {
    /// Options from the environment: the cache in `$XDG_CACHE_HOME/lyra` or `~/.cache/lyra`
    /// (`LYRA_CACHE_DIR` overrides), plain-HTTP hosts from `LYRA_INSECURE_REGISTRIES`
    /// (comma-separated), credentials from `LYRA_REGISTRY_USERNAME` and
    /// `LYRA_REGISTRY_PASSWORD`, and the Docker config from `$DOCKER_CONFIG/config.json` or
    /// `~/.docker/config.json`.
    pub fn from_env() -> RegistryOptions {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let home = var("HOME");
        let cache_dir = var("LYRA_CACHE_DIR")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("lyra")))
            .or_else(|| home.as_ref().map(|h| h.join(".cache/lyra")));
        let docker_config = var("DOCKER_CONFIG")
            .map(|d| d.join("config.json"))
            .or_else(|| home.map(|h| h.join(".docker/config.json")));
        let text = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        RegistryOptions {
            cache_dir,
            insecure: text("LYRA_INSECURE_REGISTRIES")
                .map(|s| {
                    s.split(',')
                        .map(|h| h.trim().to_owned())
                        .filter(|h| !h.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            docker_config,
            username: text("LYRA_REGISTRY_USERNAME"),
            password: text("LYRA_REGISTRY_PASSWORD"),
        }
    }

    fn client(&self, r: &RegistryRef) -> Client {
        let plain = r.is_loopback() || self.insecure.contains(&r.registry);
        Client::new(ClientConfig {
            protocol: if plain {
                ClientProtocol::HttpsExcept(vec![r.registry.clone()])
            } else {
                ClientProtocol::Https
            },
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            ..ClientConfig::default()
        })
    }

    /// The credentials for `r`: those in the reference, then the environment's, then the
    /// Docker config's `auths` entry for its host; else anonymous.
    fn auth(&self, r: &RegistryRef) -> RegistryAuth {
        if let Some((u, p)) = &r.userinfo {
            return RegistryAuth::Basic(u.clone(), p.clone());
        }
        if let (Some(u), Some(p)) = (&self.username, &self.password) {
            return RegistryAuth::Basic(u.clone(), p.clone());
        }
        self.docker_config
            .as_deref()
            .and_then(|path| docker_auth(path, &r.registry))
            .map_or(RegistryAuth::Anonymous, |(u, p)| RegistryAuth::Basic(u, p))
    }
}

/// The `auths` entry of a Docker config for `registry`: `auth` (base64 `user:password`) or
/// `username` and `password`. Credential helpers are not run.
fn docker_auth(path: &Path, registry: &str) -> Option<(String, String)> {
    use base64::Engine;
    let text = std::fs::read(path).ok()?;
    let config: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let auths = config.get("auths")?.as_object()?;
    let entry = auths.iter().find_map(|(k, v)| {
        let host = k.trim_start_matches("https://").trim_start_matches("http://");
        let host = host.split('/').next().unwrap_or(host);
        (host == registry).then_some(v)
    })?;
    let field = |k: &str| entry.get(k).and_then(|v| v.as_str()).filter(|s| !s.is_empty());
    if let Some(auth) = field("auth") {
        let decoded = base64::engine::general_purpose::STANDARD.decode(auth).ok()?;
        let (u, p) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
        return Some((u.to_owned(), p.to_owned()));
    }
    Some((field("username")?.to_owned(), field("password")?.to_owned()))
}

fn oci_ref(r: &RegistryRef) -> oci_client::Reference {
    match (&r.tag, &r.digest) {
        (_, Some(d)) => oci_client::Reference::with_digest(r.registry.clone(), r.repository.clone(), d.clone()),
        (Some(t), None) => oci_client::Reference::with_tag(r.registry.clone(), r.repository.clone(), t.clone()),
        (None, None) => oci_client::Reference::with_tag(r.registry.clone(), r.repository.clone(), "latest".into()),
    }
}

/// A registry error as ours: unreachable, not found, denied, or what the registry said.
fn registry_error(r: &RegistryRef, e: OciDistributionError) -> Error {
    let reference = r.to_string();
    match e {
        OciDistributionError::RequestError(e) if e.is_connect() || e.is_timeout() => Error::Unreachable {
            registry: r.registry.clone(),
            message: cause_chain(&e),
        },
        OciDistributionError::RequestError(e) if e.status().is_some_and(|s| s == 401 || s == 403) => {
            Error::Denied { reference }
        }
        OciDistributionError::RequestError(e) if e.status().is_some_and(|s| s == 404) => Error::NotFound { reference },
        OciDistributionError::ImageManifestNotFoundError(_) => Error::NotFound { reference },
        OciDistributionError::AuthenticationFailure(_) | OciDistributionError::UnauthorizedError { .. } => {
            Error::Denied { reference }
        }
        OciDistributionError::ServerError { code: 404, .. } => Error::NotFound { reference },
        OciDistributionError::ServerError { code: 401 | 403, .. } => Error::Denied { reference },
        OciDistributionError::RegistryError { envelope, .. }
            if envelope
                .errors
                .iter()
                .any(|e| format!("{:?}", e.code).contains("Unknown")) =>
        {
            Error::NotFound { reference }
        }
        OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError { expected, actual }) => {
            Error::DigestMismatch {
                digest: expected,
                actual,
                location: reference,
            }
        }
        other => Error::Registry {
            reference,
            message: cause_chain(&other),
        },
    }
}

/// An error and its causes on one line (reqwest's own message omits the cause).
fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

/// The digest `reference` names now: its own, the layout's, or what the registry says its
/// tag points at (one round trip).
pub async fn resolve_digest(reference: &Reference, opts: &RegistryOptions) -> Result<String, Error> {
    match reference {
        Reference::Registry(r) => {
            if let Some(d) = &r.digest {
                return Ok(d.clone());
            }
            let client = opts.client(r);
            client
                .fetch_manifest_digest(&oci_ref(r), &opts.auth(r))
                .await
                .map_err(|e| registry_error(r, e))
        }
        local => Ok(read_local(local)?.digest),
    }
}

/// The package `reference` names, read and verified, pinned by digest.
pub async fn resolve(reference: &Reference, opts: &RegistryOptions) -> Result<Package, Error> {
    fetch(reference, opts).await?.package()
}

/// Pulls the package `reference` names into a layout at `out` (a `.tar` if it ends so);
/// returns its digest.
pub async fn pull(reference: &Reference, opts: &RegistryOptions, out: &Path) -> Result<Package, Error> {
    let layout = fetch(reference, opts).await?;
    let package = layout.package()?;
    layout.write(out)?;
    Ok(package)
}

/// The verified blobs of the package `reference` names.
pub async fn fetch(reference: &Reference, opts: &RegistryOptions) -> Result<Layout, Error> {
    let r = match reference {
        Reference::Registry(r) => r,
        local => return read_local(local),
    };
    let cache = opts.cache_dir.as_deref().map(Cache);
    let client = opts.client(r);
    let auth = opts.auth(r);
    let image = oci_ref(r);
    // A pinned manifest may be in the cache; a tag is always asked for (it may have moved).
    let cached = match (&r.digest, &cache) {
        (Some(d), Some(c)) => c.get(d),
        _ => None,
    };
    let (manifest_bytes, digest) = match cached {
        Some(bytes) => (bytes, r.digest.clone().unwrap_or_default()),
        None => {
            client
                .auth(&image, &auth, RegistryOperation::Pull)
                .await
                .map_err(|e| registry_error(r, e))?;
            let (bytes, registry_digest) = client
                .pull_manifest_raw(&image, &auth, &[MANIFEST_MEDIA_TYPE])
                .await
                .map_err(|e| registry_error(r, e))?;
            let bytes = bytes.to_vec();
            // Pinned: the bytes must hash to the pin. By tag: to what the registry said.
            let expected = r.digest.clone().unwrap_or(registry_digest);
            verify(&expected, &bytes, &r.to_string())?;
            if let Some(c) = &cache {
                c.put(&expected, &bytes);
            }
            (bytes, expected)
        }
    };
    let location = r.pinned_display(&digest);
    let m = parse_manifest(&manifest_bytes, &location)?;
    let blob = async |d: &Descriptor| -> Result<Vec<u8>, Error> {
        if let Some(bytes) = cache.as_ref().and_then(|c| c.get(&d.digest)) {
            return Ok(bytes);
        }
        let mut bytes = Bounded::new(d.size);
        let desc = oci_client::manifest::OciDescriptor {
            media_type: d.media_type.clone(),
            digest: d.digest.clone(),
            size: d.size as i64,
            ..Default::default()
        };
        let pulled = client.pull_blob(&image, &desc, &mut bytes).await;
        if bytes.overflowed {
            return Err(Error::NotAPackage {
                location: location.clone(),
                why: format!("blob {} is larger than its manifest says ({} bytes)", d.digest, d.size),
            });
        }
        let bytes = bytes.buf;
        pulled.map_err(|e| match registry_error(r, e) {
            // Name the blob, not the manifest, as what failed.
            Error::DigestMismatch { digest, actual, .. } => Error::DigestMismatch {
                digest,
                actual,
                location: location.clone(),
            },
            other => other,
        })?;
        verify(&d.digest, &bytes, &location)?;
        if let Some(c) = &cache {
            c.put(&d.digest, &bytes);
        }
        Ok(bytes)
    };
    let config = blob(&m.config).await?;
    let layer = blob(&m.layers[0]).await?;
    let mut layout = Layout::new(manifest_bytes, config, layer, "");
    layout.ref_name = layout.package()?.manifest.version;
    Ok(layout)
}

/// A blob being pulled, refused past the size its descriptor gives: a registry that streams
/// more (by mistake or malice) cannot make us hold more than the manifest allowed, which
/// `parse_manifest` bounds.
struct Bounded {
    buf: Vec<u8>,
    limit: u64,
    overflowed: bool,
}

impl Bounded {
    fn new(limit: u64) -> Bounded {
        Bounded {
            buf: Vec::with_capacity(limit as usize),
            limit,
            overflowed: false,
        }
    }
}

impl tokio::io::AsyncWrite for Bounded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if (self.buf.len() + data.len()) as u64 > self.limit {
            self.overflowed = true;
            return std::task::Poll::Ready(Err(std::io::Error::other(
                "the blob is larger than its descriptor says",
            )));
        }
        self.buf.extend_from_slice(data);
        std::task::Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

fn read_local(reference: &Reference) -> Result<Layout, Error> {
    match reference {
        Reference::Layout(dir) => Layout::read_dir(dir),
        Reference::Tar(path) => Layout::read_tar(path),
        Reference::Registry(_) => unreachable!("a registry reference is not local"),
    }
}

/// Pushes `layout` to `target`, tagged with its tag or else the package version (`+` becomes
/// `_`, which tags cannot hold); returns the reference pinned by digest.
pub async fn push(layout: &Layout, target: &RegistryRef, opts: &RegistryOptions) -> Result<RegistryRef, Error> {
    let tag = target.tag.clone().unwrap_or_else(|| layout.ref_name.replace('+', "_"));
    let tagged = target.with_tag(&tag);
    let client = opts.client(target);
    let auth = opts.auth(target);
    let image = oci_ref(&tagged);
    client
        .auth(&image, &auth, RegistryOperation::Push)
        .await
        .map_err(|e| registry_error(&tagged, e))?;
    for (digest, bytes) in &layout.blobs {
        let present = client
            .blob_exists(&image, digest)
            .await
            .map_err(|e| registry_error(&tagged, e))?;
        if !present {
            client
                .push_blob(&image, bytes.clone(), digest)
                .await
                .map_err(|e| registry_error(&tagged, e))?;
        }
    }
    client
        .push_manifest_raw(
            &image,
            layout.manifest_bytes.clone(),
            http::HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
        )
        .await
        .map_err(|e| registry_error(&tagged, e))?;
    Ok(RegistryRef {
        digest: Some(layout.digest.clone()),
        ..tagged
    })
}

impl RegistryRef {
    fn pinned_display(&self, digest: &str) -> String {
        RegistryRef {
            digest: Some(digest.to_owned()),
            ..self.clone()
        }
        .to_string()
    }
}

/// Blobs by digest in `DIR/blobs/sha256/<hex>`. Read blobs are verified like pulled ones;
/// a damaged entry is dropped and pulled again.
struct Cache<'a>(&'a Path);

impl Cache<'_> {
    fn path(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| self.0.join("blobs/sha256").join(hex))
    }

    fn get(&self, digest: &str) -> Option<Vec<u8>> {
        let path = self.path(digest)?;
        let bytes = std::fs::read(&path).ok()?;
        if crate::digest_of(&bytes) == digest {
            Some(bytes)
        } else {
            let _ = std::fs::remove_file(&path);
            None
        }
    }

    /// Best effort: a cache that cannot be written costs a pull next time, nothing more.
    fn put(&self, digest: &str, bytes: &[u8]) {
        let Some(path) = self.path(digest) else { return };
        let Some(dir) = path.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        // Written beside and renamed, so a reader never sees half a blob.
        if let Ok(mut tmp) = tempfile::NamedTempFile::new_in(dir) {
            use std::io::Write;
            if tmp.write_all(bytes).is_ok() {
                let _ = tmp.persist(&path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_auths_give_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        // "alice:s3cret" in base64.
        std::fs::write(
            &path,
            r#"{"auths": {"https://reg.example:5000": {"auth": "YWxpY2U6czNjcmV0"}, "other.example": {"username": "bob", "password": "pw"}}}"#,
        )
        .unwrap();
        assert_eq!(
            docker_auth(&path, "reg.example:5000"),
            Some(("alice".into(), "s3cret".into()))
        );
        assert_eq!(docker_auth(&path, "other.example"), Some(("bob".into(), "pw".into())));
        assert_eq!(docker_auth(&path, "nowhere.example"), None);
        let opts = RegistryOptions {
            docker_config: Some(path),
            username: Some("env".into()),
            password: Some("envpw".into()),
            ..RegistryOptions::default()
        };
        let Reference::Registry(r) = Reference::parse("oci://reg.example:5000/x").unwrap() else {
            unreachable!()
        };
        // The environment's credentials come before the Docker config's.
        assert!(matches!(opts.auth(&r), RegistryAuth::Basic(u, _) if u == "env"));
    }
}
