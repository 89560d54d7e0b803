//! `Tls::PrivateKey`, `Tls::SelfSignedCert`, `Tls::CertRequest` and `Tls::LocallySignedCert`:
//! keys and X.509 certificates made in the engine and kept in its state, shaped after
//! Terraform's tls provider (`tls_private_key`, `tls_self_signed_cert`, `tls_cert_request`,
//! `tls_locally_signed_cert`).
//!
//! Keys and certificates are made by rcgen on ring. ring cannot generate RSA keys, so
//! `Tls::PrivateKey` makes ECDSA (P-256, P-384) and Ed25519 keys only and refuses RSA; RSA
//! keys made elsewhere (PKCS#8 PEM) can still sign certificates and requests.
//!
//! Everything lives only in the state: `read` returns what was recorded and `lookup` is
//! `Absent` (a create that was never recorded left nothing behind). Every setting is
//! immutable, so any change makes a new key or certificate, except `early_renewal_hours`,
//! which only moves the renewal time. A certificate is renewed by `read`: once the time is
//! within `early_renewal_hours` of its end (or past it), `read` says it is gone, and the
//! engine makes a new one.
//!
//! `subject` is a hash of `common_name`, `organization`, `organizational_unit`,
//! `street_address`, `locality`, `province`, `country`, `postal_code` and `serial_number`.
//! `allowed_uses` takes Terraform's names: `digital_signature`, `content_commitment`,
//! `key_encipherment`, `data_encipherment`, `key_agreement`, `cert_signing`, `crl_signing`,
//! `encipher_only`, `decipher_only` (key usages) and `any_extended`, `server_auth`,
//! `client_auth`, `code_signing`, `email_protection`, `timestamping`, `ocsp_signing`
//! (extended key usages). `public_key_fingerprint_sha256` is the SHA-256 digest, in hex, of
//! the DER SubjectPublicKeyInfo (what `openssl pkey -pubout -outform DER | sha256sum` prints).
//! Times are RFC 3339 in UTC.

use crate::{invalid, opt_str};
use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData as _, SerialNumber,
};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

/// The canonical type names.
pub const PRIVATE_KEY: &str = "Tls::PrivateKey";
pub const SELF_SIGNED_CERT: &str = "Tls::SelfSignedCert";
pub const CERT_REQUEST: &str = "Tls::CertRequest";
pub const LOCALLY_SIGNED_CERT: &str = "Tls::LocallySignedCert";

/// A hundred years: longer validity is a mistake.
const MAX_VALIDITY_HOURS: i64 = 876_600;

/// The subject's keys and the name types they stand for (custom ones by OID).
const SUBJECT_KEYS: [(&str, &[u64]); 9] = [
    ("common_name", &[2, 5, 4, 3]),
    ("organization", &[2, 5, 4, 10]),
    ("organizational_unit", &[2, 5, 4, 11]),
    ("street_address", &[2, 5, 4, 9]),
    ("locality", &[2, 5, 4, 7]),
    ("province", &[2, 5, 4, 8]),
    ("country", &[2, 5, 4, 6]),
    ("postal_code", &[2, 5, 4, 17]),
    ("serial_number", &[2, 5, 4, 5]),
];

/// The provider of the `Tls` types.
#[derive(Debug, Clone, Default)]
pub struct TlsProvider;

impl TlsProvider {
    pub fn new() -> Self {
        TlsProvider
    }
}

fn req_str<'a>(m: &'a Map, attribute: &str) -> Result<&'a str, ProviderError> {
    opt_str(m, attribute)?.ok_or_else(|| invalid(attribute, "is required"))
}

fn opt_int(m: &Map, attribute: &str, max: i64) -> Result<Option<i64>, ProviderError> {
    match m.get(attribute) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|i| (0..=max).contains(i))
            .map(Some)
            .ok_or_else(|| invalid(attribute, format!("expects an integer from 0 to {max}, got {n}"))),
        Some(other) => Err(invalid(
            attribute,
            format!("expects an integer, got {}", kind_of(other)),
        )),
    }
}

fn strings<'a>(m: &'a Map, attribute: &str) -> Result<Vec<&'a str>, ProviderError> {
    match m.get(attribute) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(invalid(attribute, format!("expects strings, got {}", kind_of(other)))),
            })
            .collect(),
        Some(other) => Err(invalid(
            attribute,
            format!("expects an array of strings, got {}", kind_of(other)),
        )),
    }
}

/// The key in PEM attribute `attribute`. The message says nothing of the value: it is secret.
fn key_from_pem(attribute: &str, m: &Map) -> Result<KeyPair, ProviderError> {
    let pem = match m.get(attribute) {
        Some(Value::String(s)) => s,
        None | Some(Value::Null) => return Err(invalid(attribute, "is required")),
        Some(other) => {
            return Err(invalid(
                attribute,
                format!("expects a PEM string, got {}", kind_of(other)),
            ));
        }
    };
    KeyPair::from_pem(pem).map_err(|_| {
        invalid(
            attribute,
            "is not a PKCS#8 PEM private key (-----BEGIN PRIVATE KEY-----) of a supported algorithm",
        )
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn rfc3339(t: OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn distinguished_name(m: &Map) -> Result<DistinguishedName, ProviderError> {
    let mut dn = DistinguishedName::new();
    match m.get("subject") {
        None | Some(Value::Null) => {}
        Some(Value::Object(subject)) => {
            for (k, v) in subject {
                let Some((_, oid)) = SUBJECT_KEYS.iter().find(|(name, _)| name == k) else {
                    let known: Vec<&str> = SUBJECT_KEYS.iter().map(|(n, _)| *n).collect();
                    return Err(invalid(
                        "subject",
                        format!("unknown key {k}: expected one of {}", known.join(", ")),
                    ));
                };
                let Value::String(s) = v else {
                    return Err(invalid("subject", format!("{k} expects a string, got {}", kind_of(v))));
                };
                let ty = match *oid {
                    [2, 5, 4, 3] => DnType::CommonName,
                    [2, 5, 4, 10] => DnType::OrganizationName,
                    [2, 5, 4, 11] => DnType::OrganizationalUnitName,
                    [2, 5, 4, 7] => DnType::LocalityName,
                    [2, 5, 4, 8] => DnType::StateOrProvinceName,
                    [2, 5, 4, 6] => DnType::CountryName,
                    other => DnType::CustomDnType(other.to_vec()),
                };
                dn.push(ty, s.as_str());
            }
        }
        Some(other) => return Err(invalid("subject", format!("expects a hash, got {}", kind_of(other)))),
    }
    Ok(dn)
}

/// The subject alternative names of `dns_names` and `ip_addresses`.
fn alt_names(m: &Map) -> Result<Vec<rcgen::SanType>, ProviderError> {
    let mut sans = Vec::new();
    for name in strings(m, "dns_names")? {
        let ia5 = name
            .to_owned()
            .try_into()
            .map_err(|_| invalid("dns_names", format!("'{name}' is not an ASCII DNS name")))?;
        sans.push(rcgen::SanType::DnsName(ia5));
    }
    for ip in strings(m, "ip_addresses")? {
        let addr = ip
            .parse()
            .map_err(|_| invalid("ip_addresses", format!("'{ip}' is not an IP address")))?;
        sans.push(rcgen::SanType::IpAddress(addr));
    }
    Ok(sans)
}

/// Sets validity, CA-ness, uses and a random serial on `params` from `m`.
fn certificate_settings(params: &mut CertificateParams, m: &Map) -> Result<(), ProviderError> {
    let hours = opt_int(m, "validity_period_hours", MAX_VALIDITY_HOURS)?
        .ok_or_else(|| invalid("validity_period_hours", "is required"))?;
    opt_int(m, "early_renewal_hours", MAX_VALIDITY_HOURS)?;
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| OffsetDateTime::now_utc());
    params.not_before = now;
    params.not_after = now + time::Duration::hours(hours);
    params.is_ca = match m.get("is_ca_certificate") {
        None | Some(Value::Null | Value::Bool(false)) => IsCa::ExplicitNoCa,
        Some(Value::Bool(true)) => IsCa::Ca(BasicConstraints::Unconstrained),
        Some(other) => {
            return Err(invalid(
                "is_ca_certificate",
                format!("expects a boolean, got {}", kind_of(other)),
            ));
        }
    };
    params.key_usages.clear();
    params.extended_key_usages.clear();
    for u in strings(m, "allowed_uses")? {
        match u {
            "digital_signature" => params.key_usages.push(KeyUsagePurpose::DigitalSignature),
            "content_commitment" => params.key_usages.push(KeyUsagePurpose::ContentCommitment),
            "key_encipherment" => params.key_usages.push(KeyUsagePurpose::KeyEncipherment),
            "data_encipherment" => params.key_usages.push(KeyUsagePurpose::DataEncipherment),
            "key_agreement" => params.key_usages.push(KeyUsagePurpose::KeyAgreement),
            "cert_signing" => params.key_usages.push(KeyUsagePurpose::KeyCertSign),
            "crl_signing" => params.key_usages.push(KeyUsagePurpose::CrlSign),
            "encipher_only" => params.key_usages.push(KeyUsagePurpose::EncipherOnly),
            "decipher_only" => params.key_usages.push(KeyUsagePurpose::DecipherOnly),
            "any_extended" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::Any),
            "server_auth" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth),
            "client_auth" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth),
            "code_signing" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::CodeSigning),
            "email_protection" => params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::EmailProtection),
            "timestamping" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::TimeStamping),
            "ocsp_signing" => params.extended_key_usages.push(ExtendedKeyUsagePurpose::OcspSigning),
            other => {
                return Err(invalid(
                    "allowed_uses",
                    format!("unknown use '{other}' (see the Tls provider's documentation for the names)"),
                ));
            }
        }
    }
    // Positive and 16 bytes, as RFC 5280 asks (at most 20, not negative).
    let mut serial = [0u8; 16];
    rand::fill(&mut serial);
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    params.serial_number = Some(SerialNumber::from(serial.to_vec()));
    Ok(())
}

/// `desired` plus the certificate's PEM and validity times; the external id is its serial.
fn certificate_state(desired: &Map, params: &CertificateParams, pem: String) -> Created {
    let mut actual = desired.clone();
    actual.insert("cert_pem".to_owned(), Value::String(pem));
    actual.insert(
        "validity_start_time".to_owned(),
        Value::String(rfc3339(params.not_before)),
    );
    actual.insert("validity_end_time".to_owned(), Value::String(rfc3339(params.not_after)));
    let serial = params
        .serial_number
        .as_ref()
        .map(|s| hex::encode(s.to_bytes()))
        .unwrap_or_default();
    Created {
        external_id: serial,
        actual,
    }
}

fn private_key(desired: &Map) -> Result<Created, ProviderError> {
    let algorithm = req_str(desired, "algorithm")?;
    let alg = match algorithm {
        "ECDSA" => match opt_str(desired, "ecdsa_curve")?.unwrap_or("P256") {
            "P256" => &rcgen::PKCS_ECDSA_P256_SHA256,
            "P384" => &rcgen::PKCS_ECDSA_P384_SHA384,
            other => return Err(invalid("ecdsa_curve", format!("'{other}' is not P256 or P384"))),
        },
        "ED25519" => &rcgen::PKCS_ED25519,
        "RSA" => {
            return Err(invalid(
                "algorithm",
                "RSA keys cannot be generated here (ring, Lyra's cryptography, has no RSA key generation): use ECDSA (ecdsa_curve P256 or P384) or ED25519",
            ));
        }
        other => return Err(invalid("algorithm", format!("'{other}' is not ECDSA, ED25519 or RSA"))),
    };
    opt_int(desired, "rsa_bits", 16_384)?;
    let key = KeyPair::generate_for(alg).map_err(ProviderError::other)?;
    let fingerprint = sha256_hex(&key.subject_public_key_info());
    let mut actual = desired.clone();
    actual.insert("private_key_pem".to_owned(), Value::String(key.serialize_pem()));
    actual.insert("public_key_pem".to_owned(), Value::String(key.public_key_pem()));
    actual.insert(
        "public_key_fingerprint_sha256".to_owned(),
        Value::String(fingerprint.clone()),
    );
    Ok(Created {
        external_id: fingerprint,
        actual,
    })
}

fn self_signed(desired: &Map) -> Result<Created, ProviderError> {
    let key = key_from_pem("private_key_pem", desired)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(desired)?;
    params.subject_alt_names = alt_names(desired)?;
    certificate_settings(&mut params, desired)?;
    let cert = params.self_signed(&key).map_err(ProviderError::other)?;
    Ok(certificate_state(desired, &params, cert.pem()))
}

fn cert_request(desired: &Map) -> Result<Created, ProviderError> {
    let key = key_from_pem("private_key_pem", desired)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(desired)?;
    params.subject_alt_names = alt_names(desired)?;
    let csr = params.serialize_request(&key).map_err(ProviderError::other)?;
    let pem = csr.pem().map_err(ProviderError::other)?;
    let mut actual = desired.clone();
    actual.insert("cert_request_pem".to_owned(), Value::String(pem));
    Ok(Created {
        external_id: crate::random_hex_id("csr"),
        actual,
    })
}

fn locally_signed(desired: &Map) -> Result<Created, ProviderError> {
    let csr_pem = req_str(desired, "cert_request_pem")?;
    let mut csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| {
        invalid(
            "cert_request_pem",
            format!("is not a PEM certificate request with a valid signature and supported extensions: {e}"),
        )
    })?;
    let ca_key = key_from_pem("ca_private_key_pem", desired)?;
    let ca_pem = req_str(desired, "ca_cert_pem")?;
    let ca_der = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())
        .map_err(|_| invalid("ca_cert_pem", "is not a PEM certificate"))?
        .1
        .contents;
    let (_, ca) =
        x509_parser::parse_x509_certificate(&ca_der).map_err(|_| invalid("ca_cert_pem", "is not a PEM certificate"))?;
    // Signing with some other key would make a certificate nobody can verify against the CA.
    if ca.public_key().raw != ca_key.subject_public_key_info().as_slice() {
        return Err(invalid("ca_private_key_pem", "is not the key of ca_cert_pem"));
    }
    let issuer = Issuer::from_ca_cert_pem(ca_pem, &ca_key)
        .map_err(|e| invalid("ca_cert_pem", format!("cannot be used as an issuer: {e}")))?;
    certificate_settings(&mut csr.params, desired)?;
    csr.params.use_authority_key_identifier_extension = true;
    let cert = csr.signed_by(&issuer).map_err(ProviderError::other)?;
    Ok(certificate_state(desired, &csr.params, cert.pem()))
}

/// Whether the certificate in `state` is due for renewal: within `early_renewal_hours` of its
/// end, past it, or unreadable.
fn due_for_renewal(state: &Map) -> bool {
    let Some(Value::String(pem)) = state.get("cert_pem") else {
        return true;
    };
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(pem.as_bytes()) else {
        return true;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(&pem.contents) else {
        return true;
    };
    let early = opt_int(state, "early_renewal_hours", MAX_VALIDITY_HOURS)
        .ok()
        .flatten()
        .unwrap_or(0);
    let renew_at = cert.validity().not_after.timestamp() - early * 3600;
    OffsetDateTime::now_utc().unix_timestamp() >= renew_at
}

fn is(cx: &OpContext<'_>, name: &str) -> bool {
    cx.type_name.eq_ignore_ascii_case(name)
}

fn schemas() -> Vec<ResourceSchema> {
    let secret_pem = || Type::Sensitive(Box::new(Type::String));
    let strings = || Type::optional(Type::array(Type::String));
    let subject = || {
        AttributeSchema::new("subject", Type::optional(Type::hash(Type::String, Type::String)))
            .immutable()
            .doc("The subject's names: common_name, organization, organizational_unit, street_address, locality, province, country, postal_code, serial_number.")
    };
    let dns_names = || {
        AttributeSchema::new("dns_names", strings())
            .immutable()
            .doc("DNS names the certificate is for (subject alternative names).")
    };
    let ip_addresses = || {
        AttributeSchema::new("ip_addresses", strings())
            .immutable()
            .doc("IP addresses the certificate is for (subject alternative names).")
    };
    let hours = || Type::Integer {
        min: Some(0),
        max: Some(MAX_VALIDITY_HOURS),
    };
    let cert_settings = || {
        vec![
            AttributeSchema::new("validity_period_hours", hours())
                .required()
                .immutable()
                .doc("How long the certificate is valid, from its creation."),
            AttributeSchema::new("is_ca_certificate", Type::optional(Type::Boolean))
                .immutable()
                .doc("Whether the certificate may sign certificates (basic constraints CA:TRUE)."),
            AttributeSchema::new("allowed_uses", strings())
                .immutable()
                .doc("Key usages and extended key usages, by Terraform's names (digital_signature, key_encipherment, cert_signing, server_auth, client_auth...)."),
            AttributeSchema::new("early_renewal_hours", Type::optional(hours()))
                .doc("How long before its end the certificate is renewed (read reports it gone, so it is made again)."),
        ]
    };
    let cert_outputs = || {
        vec![
            AttributeSchema::new("cert_pem", Type::String)
                .computed()
                .doc("The certificate, PEM."),
            AttributeSchema::new("validity_start_time", Type::String)
                .computed()
                .doc("When the certificate becomes valid (RFC 3339, UTC)."),
            AttributeSchema::new("validity_end_time", Type::String)
                .computed()
                .doc("When the certificate stops being valid (RFC 3339, UTC)."),
        ]
    };
    let key_input = |name: &str, doc: &str| {
        AttributeSchema::new(name, secret_pem())
            .sensitive()
            .required()
            .immutable()
            .doc(doc)
    };
    let mut self_signed = vec![
        key_input(
            "private_key_pem",
            "The key that signs the certificate and whose public key it holds (PKCS#8 PEM).",
        ),
        subject(),
        dns_names(),
        ip_addresses(),
    ];
    self_signed.extend(cert_settings());
    self_signed.extend(cert_outputs());
    let mut locally_signed = vec![
        AttributeSchema::new("cert_request_pem", Type::String)
            .required()
            .immutable()
            .doc("The certificate request (PEM, e.g. a Tls::CertRequest's cert_request_pem): its subject, names and public key."),
        key_input("ca_private_key_pem", "The CA's key, which signs the certificate (PKCS#8 PEM)."),
        AttributeSchema::new("ca_cert_pem", Type::String)
            .required()
            .immutable()
            .doc("The CA's certificate (PEM): the issuer."),
    ];
    locally_signed.extend(cert_settings());
    locally_signed.extend(cert_outputs());
    vec![
        ResourceSchema::new(
            PRIVATE_KEY,
            vec![
                AttributeSchema::new("algorithm", Type::Enum(vec!["RSA".into(), "ECDSA".into(), "ED25519".into()]))
                    .required()
                    .immutable()
                    .doc("ECDSA or ED25519 (RSA is refused: ring cannot generate RSA keys)."),
                AttributeSchema::new("rsa_bits", Type::optional(Type::INTEGER))
                    .immutable()
                    .doc("For RSA, which is not supported: accepted for Terraform's shape only."),
                AttributeSchema::new("ecdsa_curve", Type::optional(Type::Enum(vec!["P256".into(), "P384".into()])))
                    .immutable()
                    .doc("The ECDSA curve: P256 (default) or P384."),
                AttributeSchema::new("private_key_pem", secret_pem())
                    .computed()
                    .sensitive()
                    .doc("The private key, PKCS#8 PEM."),
                AttributeSchema::new("public_key_pem", Type::String)
                    .computed()
                    .doc("The public key, PEM (SubjectPublicKeyInfo)."),
                AttributeSchema::new("public_key_fingerprint_sha256", Type::String)
                    .computed()
                    .doc("The SHA-256 digest of the DER public key, in hex; the external id."),
            ],
        )
        .local()
        .doc("A private key made once and kept in the state (like Terraform's tls_private_key)."),
        ResourceSchema::new(SELF_SIGNED_CERT, self_signed)
            .local()
            .doc("A self-signed certificate, renewed within early_renewal_hours of its end (like Terraform's tls_self_signed_cert)."),
        ResourceSchema::new(
            CERT_REQUEST,
            vec![
                key_input("private_key_pem", "The key whose public key the request holds and which signs it (PKCS#8 PEM)."),
                subject(),
                dns_names(),
                ip_addresses(),
                AttributeSchema::new("cert_request_pem", Type::String)
                    .computed()
                    .doc("The certificate request (CSR), PEM."),
            ],
        )
        .local()
        .doc("A certificate signing request (like Terraform's tls_cert_request)."),
        ResourceSchema::new(LOCALLY_SIGNED_CERT, locally_signed)
            .local()
            .doc("A certificate signed by a CA key and certificate given to it (like Terraform's tls_locally_signed_cert)."),
    ]
}

#[async_trait]
impl Provider for TlsProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        schemas()
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        if is(cx, PRIVATE_KEY) {
            private_key(desired)
        } else if is(cx, SELF_SIGNED_CERT) {
            self_signed(desired)
        } else if is(cx, CERT_REQUEST) {
            cert_request(desired)
        } else if is(cx, LOCALLY_SIGNED_CERT) {
            locally_signed(desired)
        } else {
            Err(ProviderError::Other(format!(
                "the Tls provider has no type {}",
                cx.type_name
            )))
        }
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        _external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        let Some(prior) = prior else {
            return Ok(None);
        };
        if (is(cx, SELF_SIGNED_CERT) || is(cx, LOCALLY_SIGNED_CERT)) && due_for_renewal(prior) {
            return Ok(None);
        }
        Ok(Some(prior.clone()))
    }

    /// Only `early_renewal_hours` can change in place (everything else is immutable): the
    /// key or certificate made is kept.
    async fn update(
        &self,
        _cx: &OpContext<'_>,
        _external_id: &str,
        desired: &Map,
        prior: &Map,
    ) -> Result<Map, ProviderError> {
        opt_int(desired, "early_renewal_hours", MAX_VALIDITY_HOURS)?;
        let mut actual = prior.clone();
        for (k, v) in desired {
            actual.insert(k.clone(), v.clone());
        }
        if !desired.contains_key("early_renewal_hours") {
            actual.remove("early_renewal_hours");
        }
        Ok(actual)
    }

    async fn delete(&self, _cx: &OpContext<'_>, _external_id: &str, _prior: &Map) -> Result<(), ProviderError> {
        Ok(())
    }

    /// Always `Absent`: keys and certificates live only in the state.
    async fn lookup(&self, _cx: &OpContext<'_>, _desired: &Map) -> Result<Lookup, ProviderError> {
        Ok(Lookup::Absent)
    }
}

#[cfg(test)]
mod tests;
