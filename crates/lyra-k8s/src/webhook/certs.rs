//! The webhook's certificate: from files (cert-manager mounts them), or made and kept by the
//! controller itself (self-managed: a CA and a serving certificate in a Secret, the CA put
//! into the webhook configuration's `caBundle`).
//!
//! Self-managed, every replica runs the same idempotent loop, so two replicas agree without
//! electing anyone: read the Secret; absent, create it (a 409 means another replica made
//! one first: read that); expiring within [`RENEW_BEFORE`] or made for other names, replace
//! it with an update carrying the resourceVersion read (a 409: someone renewed it first, read
//! again). Each renewal makes a new CA too (the CA key is never stored) and keeps the previous
//! CA in `ca.crt` beside the new one, so replicas still serving the old certificate stay
//! trusted while they pick up the new one. Then every webhook's `caBundle` is patched to
//! `ca.crt` if it differs (helm, on upgrade, resets it to absent).
//!
//! API calls, exactly (the chart's RBAC): Secrets `get`, `create`, `update`, and `list`/`watch`
//! with `metadata.name=<secret>`, in the controller's namespace; the
//! ValidatingWebhookConfiguration `get` and `patch` (a JSON patch per webhook that differs).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Renew a serving certificate that expires within this long.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a made serving certificate is valid.
const SERVING_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long a made CA is valid: longer than any serving certificate it signs.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Clocks of the API server and of other replicas may be behind ours.
const BACKDATE: Duration = Duration::from_secs(3600);

pub const CA_KEY: &str = "ca.crt";
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";
/// On the Secret: the names its certificate was made for, so a renamed Service gets a new one.
pub const NAMES_ANNOTATION: &str = "lyra.dev/webhook-dns-names";

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("making a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// A serving certificate (chain) and key, in PEM, and the CA bundle that verifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl Bundle {
    /// The rustls configuration serving it, on ring (the process's only provider).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, CertError> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| CertError::Invalid {
            what: what.to_owned(),
            message: e.to_string(),
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(CERT_KEY, &e))?;
        if chain.is_empty() {
            return Err(invalid(CERT_KEY, &"no certificate in it"));
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| invalid(KEY_KEY, &e))?;
        let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("TLS", &e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| invalid("the serving certificate and key", &e))?;
        // The API server speaks HTTP/2 or HTTP/1.1; both are served.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// When the serving certificate (the first of `tls.crt`) expires.
    pub fn not_after(&self) -> Option<SystemTime> {
        let der = CertificateDer::pem_slice_iter(&self.cert).next()?.ok()?;
        not_after(&der)
    }

    /// Reads `ca.crt`, `tls.crt` and `tls.key` from a Secret's data; `None` if one is missing.
    fn from_secret(secret: &Secret) -> Option<Bundle> {
        let data = secret.data.as_ref()?;
        let get = |k: &str| data.get(k).map(|v| v.0.clone()).filter(|v| !v.is_empty());
        Some(Bundle {
            ca: get(CA_KEY)?,
            cert: get(CERT_KEY)?,
            key: get(KEY_KEY)?,
        })
    }

    fn data(&self) -> BTreeMap<String, ByteString> {
        BTreeMap::from([
            (CA_KEY.to_owned(), ByteString(self.ca.clone())),
            (CERT_KEY.to_owned(), ByteString(self.cert.clone())),
            (KEY_KEY.to_owned(), ByteString(self.key.clone())),
        ])
    }
}

/// The names a webhook Service is reached by: `<service>`, `<service>.<namespace>`, and the
/// `.svc` and `.svc.cluster.local` names the API server uses.
pub fn dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// A new CA and a serving certificate it signed for `names`. `previous_ca` (PEM) is kept in
/// the bundle after the new CA, so what it signed stays trusted during a rotation.
pub fn generate(names: &[String], previous_ca: Option<&[u8]>) -> Result<Bundle, CertError> {
    generate_valid_for(names, previous_ca, SERVING_VALIDITY)
}

fn generate_valid_for(names: &[String], previous_ca: Option<&[u8]>, validity: Duration) -> Result<Bundle, CertError> {
    let now = SystemTime::now();
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "lyra-controller webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    ca.not_before = (now - BACKDATE).into();
    ca.not_after = (now + CA_VALIDITY).into();
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(names.to_vec())?;
    serving.distinguished_name.push(
        DnType::CommonName,
        names.get(2).or(names.first()).cloned().unwrap_or_default(),
    );
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.use_authority_key_identifier_extension = true;
    serving.not_before = (now - BACKDATE).into();
    serving.not_after = (now + validity).into();
    let cert = serving.signed_by(&key, &issuer)?;

    let mut ca_pem = ca_cert.pem().into_bytes();
    if let Some(old) = previous_ca.and_then(|p| CertificateDer::pem_slice_iter(p).next()?.ok()) {
        ca_pem.extend_from_slice(pem_of(&old).as_bytes());
    }
    Ok(Bundle {
        ca: ca_pem,
        cert: cert.pem().into_bytes(),
        key: key.serialize_pem().into_bytes(),
    })
}

fn pem_of(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Reads a bundle mounted from a Secret (cert-manager's `tls.crt`, `tls.key`, `ca.crt`; the
/// last is optional here, since only the API server needs it).
pub fn read_dir(dir: &std::path::Path) -> Result<Bundle, CertError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| CertError::Read { path, source })
    };
    Ok(Bundle {
        cert: read(CERT_KEY)?,
        key: read(KEY_KEY)?,
        ca: read(CA_KEY).unwrap_or_default(),
    })
}

/// The self-managed certificate's place: its Secret, the Service it is for, and the webhook
/// configuration that trusts its CA.
#[derive(Clone)]
pub struct SelfManaged {
    pub client: Client,
    pub namespace: String,
    pub secret: String,
    pub service: String,
    pub configuration: String,
}

impl std::fmt::Debug for SelfManaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfManaged")
            .field("namespace", &self.namespace)
            .field("secret", &self.secret)
            .field("service", &self.service)
            .field("configuration", &self.configuration)
            .finish_non_exhaustive()
    }
}

impl SelfManaged {
    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn api_error(&self, what: &str, source: kube::Error) -> CertError {
        CertError::Api {
            what: format!("{what} Secret {}/{}", self.namespace, self.secret),
            source,
        }
    }

    /// The bundle in the Secret, made or renewed first if needed. Safe to run on every
    /// replica at once.
    pub async fn ensure(&self) -> Result<Bundle, CertError> {
        let names = dns_names(&self.service, &self.namespace);
        let api = self.secrets();
        // Each round either returns or lost a race it will see the result of on the next.
        for _ in 0..5 {
            let current = api
                .get_opt(&self.secret)
                .await
                .map_err(|e| self.api_error("reading", e))?;
            let Some(current) = current else {
                let made = generate(&names, None)?;
                match api.create(&PostParams::default(), &self.secret_of(&made, None)).await {
                    Ok(_) => {
                        tracing::info!(secret = %self.secret, "made the webhook's certificate");
                        return Ok(made);
                    }
                    // Another replica made it first: use theirs.
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(self.api_error("creating", e)),
                }
            };
            let bundle = Bundle::from_secret(&current);
            let fresh = bundle.as_ref().is_some_and(|b| {
                b.server_config().is_ok()
                    && b.not_after().is_some_and(|t| t > SystemTime::now() + RENEW_BEFORE)
                    && made_for(&current).as_deref() == Some(names.join(",").as_str())
            });
            if let (true, Some(bundle)) = (fresh, bundle.clone()) {
                return Ok(bundle);
            }
            let made = generate(&names, bundle.as_ref().map(|b| b.ca.as_slice()))?;
            let version = current.metadata.resource_version.clone();
            match api
                .replace(&self.secret, &PostParams::default(), &self.secret_of(&made, version))
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %self.secret, "renewed the webhook's certificate");
                    return Ok(made);
                }
                // Someone renewed it since it was read: read theirs.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(self.api_error("updating", e)),
            }
        }
        Err(CertError::Invalid {
            what: format!("Secret {}/{}", self.namespace, self.secret),
            message: "it kept changing while it was being read".to_owned(),
        })
    }

    fn secret_of(&self, bundle: &Bundle, resource_version: Option<String>) -> Secret {
        let names = dns_names(&self.service, &self.namespace).join(",");
        Secret {
            metadata: ObjectMeta {
                name: Some(self.secret.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version,
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "lyra-controller".to_owned(),
                )])),
                annotations: Some(BTreeMap::from([(NAMES_ANNOTATION.to_owned(), names)])),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(bundle.data()),
            ..Secret::default()
        }
    }

    /// Puts `ca` into every webhook's `caBundle` that holds something else. Returns how many
    /// it changed (0: all were right; nothing is written then).
    pub async fn inject_ca(&self, ca: &[u8]) -> Result<usize, CertError> {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let err = |what: &str, source| CertError::Api {
            what: format!("{what} ValidatingWebhookConfiguration {}", self.configuration),
            source,
        };
        let config = api.get(&self.configuration).await.map_err(|e| err("reading", e))?;
        let ops = ca_patch(&config, ca);
        if ops.is_empty() {
            return Ok(0);
        }
        let n = ops.len() / 2;
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::Value::Array(ops)).map_err(|e| CertError::Invalid {
                what: "the caBundle patch".to_owned(),
                message: e.to_string(),
            })?;
        api.patch(&self.configuration, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(|e| err("patching", e))?;
        tracing::info!(configuration = %self.configuration, webhooks = n, "injected the webhook CA");
        Ok(n)
    }
}

/// The JSON patch operations setting `caBundle` to `ca` on each webhook of `config` that
/// differs: a `test` of the webhook's name at its index (so a concurrent reordering fails
/// the patch rather than patching the wrong webhook), then an `add` (which also replaces).
pub fn ca_patch(config: &ValidatingWebhookConfiguration, ca: &[u8]) -> Vec<serde_json::Value> {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(ca);
    let mut ops = Vec::new();
    for (i, hook) in config.webhooks.iter().flatten().enumerate() {
        if hook.client_config.ca_bundle.as_ref().is_some_and(|b| b.0 == ca) {
            continue;
        }
        ops.push(serde_json::json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": hook.name}));
        ops.push(
            serde_json::json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}),
        );
    }
    ops
}

/// The DNS names the Secret's certificate was made for, as recorded on it.
fn made_for(secret: &Secret) -> Option<String> {
    secret.metadata.annotations.as_ref()?.get(NAMES_ANNOTATION).cloned()
}

/// The `notAfter` of an X.509 certificate (DER); `None` when it is not one.
pub fn not_after(der: &[u8]) -> Option<SystemTime> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let seconds = cert.validity().not_after.timestamp();
    let since_epoch = Duration::from_secs(u64::try_from(seconds).ok()?);
    SystemTime::UNIX_EPOCH.checked_add(since_epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_bundle_serves_and_says_when_it_expires() {
        let names = dns_names("lyra-webhook", "lyra-system");
        assert_eq!(names[2], "lyra-webhook.lyra-system.svc");
        assert_eq!(names[3], "lyra-webhook.lyra-system.svc.cluster.local");
        let b = generate(&names, None).unwrap();
        b.server_config().expect("rustls takes it");
        let expires = b.not_after().unwrap();
        let in_a_year = SystemTime::now() + SERVING_VALIDITY;
        let off = in_a_year.duration_since(expires).unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_secs(5), "{off:?}");
        assert_eq!(CertificateDer::pem_slice_iter(&b.ca).count(), 1);

        // A renewal keeps the previous CA after the new one.
        let renewed = generate(&names, Some(&b.ca)).unwrap();
        let cas: Vec<_> = CertificateDer::pem_slice_iter(&renewed.ca)
            .map(Result::unwrap)
            .collect();
        assert_eq!(cas.len(), 2);
        assert_eq!(cas[1], CertificateDer::pem_slice_iter(&b.ca).next().unwrap().unwrap());
        // And only that one: bundles do not grow with each renewal.
        let again = generate(&names, Some(&renewed.ca)).unwrap();
        assert_eq!(CertificateDer::pem_slice_iter(&again.ca).count(), 2);
    }

    /// Two replicas at once against an API server: one Secret, the same bundle for both;
    /// one expiring soon is renewed, keeping its CA in the bundle.
    #[tokio::test]
    async fn replicas_agree_on_one_secret_and_renew_it_before_expiry() {
        use k8s_openapi::api::core::v1::Namespace;
        let emu = kube_emulator::KubeEmulator::start().await.unwrap();
        let client = Client::try_from(kube::Config::new(emu.url().parse().unwrap())).unwrap();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("lyra-system".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let managed = SelfManaged {
            client: client.clone(),
            namespace: "lyra-system".into(),
            secret: "lyra-webhook-tls".into(),
            service: "lyra-webhook".into(),
            configuration: "lyra".into(),
        };
        let (a, b) = tokio::join!(managed.ensure(), managed.ensure());
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b, "both replicas serve the one certificate");
        let secrets = managed.secrets();
        let stored = secrets.get("lyra-webhook-tls").await.unwrap();
        assert_eq!(stored.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(Bundle::from_secret(&stored).unwrap(), a);
        assert_eq!(managed.ensure().await.unwrap(), a, "a fresh one is kept");

        // Expiring in a day: renewed, with a new CA, the old one still in the bundle.
        let names = dns_names("lyra-webhook", "lyra-system");
        let short = generate_valid_for(&names, None, Duration::from_secs(24 * 3600)).unwrap();
        let mut expiring = stored.clone();
        expiring.data = Some(short.data());
        secrets
            .replace("lyra-webhook-tls", &PostParams::default(), &expiring)
            .await
            .unwrap();
        let renewed = managed.ensure().await.unwrap();
        assert_ne!(renewed.cert, short.cert);
        assert!(renewed.not_after().unwrap() > SystemTime::now() + RENEW_BEFORE);
        assert!(renewed.ca.ends_with(&short.ca), "the previous CA stays trusted");

        // Another Service name: a certificate for the new names.
        let renamed = SelfManaged {
            service: "other".into(),
            ..managed.clone()
        };
        let other = renamed.ensure().await.unwrap();
        assert_ne!(other.cert, renewed.cert);
    }

    #[test]
    fn what_is_no_certificate_has_no_expiry() {
        assert_eq!(not_after(&[]), None);
        assert_eq!(not_after(&[0x30, 0x05, 1]), None);
        assert_eq!(not_after(b"-----BEGIN CERTIFICATE-----"), None);
    }

    #[test]
    fn the_ca_patch_touches_only_webhooks_that_differ() {
        let config: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lyra"},
            "webhooks": [
                {"name": "workflows.validate.lyra.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {"caBundle": "Q0E="}},
                {"name": "workflowdefinitions.validate.lyra.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {}},
            ]
        }))
        .unwrap();
        assert_eq!(ca_patch(&config, b"CA").len(), 2, "the first holds it already");
        let ops = ca_patch(&config, b"NEW");
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[1]["path"], "/webhooks/0/clientConfig/caBundle");
        assert_eq!(ops[2]["value"], "workflowdefinitions.validate.lyra.dev");
        assert_eq!(ops[3]["value"], "TkVX");
    }
}
