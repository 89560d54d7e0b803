use serde_json::json;
use x509_parser::prelude::*;

use super::*;
use crate::test_support::map;

fn cx(type_name: &'static str) -> OpContext<'static> {
    crate::test_support::cx(type_name)
}

fn s(m: &Map, k: &str) -> String {
    m[k].as_str().unwrap().to_owned()
}

async fn key(algorithm: &str) -> Map {
    TlsProvider::new()
        .create(&cx(PRIVATE_KEY), &map(json!({"algorithm": algorithm})))
        .await
        .unwrap()
        .actual
}

/// The DER of a PEM certificate.
fn der(pem: &str) -> Vec<u8> {
    parse_x509_pem(pem.as_bytes()).unwrap().1.contents
}

#[tokio::test]
async fn private_keys_of_each_supported_kind() {
    let p = TlsProvider::new();
    for (desired, alg) in [
        (json!({"algorithm": "ECDSA"}), &rcgen::PKCS_ECDSA_P256_SHA256),
        (
            json!({"algorithm": "ECDSA", "ecdsa_curve": "P384"}),
            &rcgen::PKCS_ECDSA_P384_SHA384,
        ),
        (json!({"algorithm": "ED25519"}), &rcgen::PKCS_ED25519),
    ] {
        let desired = map(desired);
        let created = p.create(&cx(PRIVATE_KEY), &desired).await.unwrap();
        let a = &created.actual;
        let pem = s(a, "private_key_pem");
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
        let parsed = KeyPair::from_pem(&pem).unwrap();
        assert_eq!(parsed.algorithm(), alg);
        assert_eq!(s(a, "public_key_pem"), parsed.public_key_pem());
        assert_eq!(
            s(a, "public_key_fingerprint_sha256"),
            sha256_hex(&parsed.subject_public_key_info())
        );
        assert_eq!(created.external_id, s(a, "public_key_fingerprint_sha256"));
        // Kept: read returns it, a second create makes another.
        let read = p
            .read(&cx(PRIVATE_KEY), &created.external_id, Some(a))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&read, a);
        let again = p.create(&cx(PRIVATE_KEY), &desired).await.unwrap();
        assert_ne!(again.actual["private_key_pem"], a["private_key_pem"]);
        p.delete(&cx(PRIVATE_KEY), &created.external_id, a).await.unwrap();
        p.delete(&cx(PRIVATE_KEY), &created.external_id, a).await.unwrap();
        assert_eq!(
            p.read(&cx(PRIVATE_KEY), &created.external_id, None).await.unwrap(),
            None
        );
        assert!(matches!(
            p.lookup(&cx(PRIVATE_KEY), &desired).await.unwrap(),
            Lookup::Absent
        ));
    }
}

#[tokio::test]
async fn rsa_is_refused_naming_what_is_supported() {
    let err = TlsProvider::new()
        .create(&cx(PRIVATE_KEY), &map(json!({"algorithm": "RSA", "rsa_bits": 4096})))
        .await
        .unwrap_err();
    match err {
        ProviderError::InvalidValue { attribute, message } => {
            assert_eq!(attribute, "algorithm");
            assert!(message.contains("ECDSA") && message.contains("ED25519"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_self_signed_certificate_holds_what_was_asked() {
    let p = TlsProvider::new();
    let key = key("ECDSA").await;
    let desired = map(json!({
        "private_key_pem": s(&key, "private_key_pem"),
        "subject": {"common_name": "example.test", "organization": "Lyra", "country": "NL", "postal_code": "1234"},
        "dns_names": ["example.test", "www.example.test"],
        "ip_addresses": ["127.0.0.1", "::1"],
        "validity_period_hours": 48,
        "is_ca_certificate": true,
        "allowed_uses": ["cert_signing", "digital_signature", "server_auth"],
    }));
    let created = p.create(&cx(SELF_SIGNED_CERT), &desired).await.unwrap();
    let a = &created.actual;
    let bytes = der(&s(a, "cert_pem"));
    let (_, cert) = parse_x509_certificate(&bytes).unwrap();
    assert_eq!(cert.subject(), cert.issuer());
    assert_eq!(
        cert.subject().to_string(),
        "CN=example.test, O=Lyra, C=NL, postalCode=1234"
    );
    cert.verify_signature(None).expect("signed by its own key");
    assert_eq!(
        cert.public_key().raw,
        KeyPair::from_pem(&s(&key, "private_key_pem"))
            .unwrap()
            .subject_public_key_info()
    );
    assert!(cert.is_ca());
    let sans = cert.subject_alternative_name().unwrap().unwrap();
    let sans: Vec<String> = sans.value.general_names.iter().map(ToString::to_string).collect();
    assert_eq!(
        sans,
        [
            "DNSName(example.test)",
            "DNSName(www.example.test)",
            "IPAddress(7f:00:00:01)",
            "IPAddress(00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:01)"
        ]
    );
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.digital_signature() && !ku.key_encipherment());
    assert!(cert.extended_key_usage().unwrap().unwrap().value.server_auth);
    let validity = cert.validity();
    assert_eq!(
        validity.not_after.timestamp() - validity.not_before.timestamp(),
        48 * 3600
    );
    let start = s(a, "validity_start_time");
    assert_eq!(start.len(), "2026-01-01T00:00:00Z".len());
    assert!(start.ends_with('Z') && start.contains('T'), "{start}");
    let iso = validity.not_after.to_datetime();
    assert_eq!(s(a, "validity_end_time"), rfc3339(iso));
    assert_eq!(created.external_id, hex::encode(cert.raw_serial()));

    // Kept on read; early_renewal_hours changes in place.
    let read = p
        .read(&cx(SELF_SIGNED_CERT), &created.external_id, Some(a))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&read, a);
    let mut renew = desired.clone();
    renew.insert("early_renewal_hours".to_owned(), json!(47));
    let updated = p
        .update(&cx(SELF_SIGNED_CERT), &created.external_id, &renew, a)
        .await
        .unwrap();
    assert_eq!(updated["cert_pem"], a["cert_pem"]);
    assert_eq!(updated["early_renewal_hours"], json!(47));
    assert!(
        p.read(&cx(SELF_SIGNED_CERT), &created.external_id, Some(&updated))
            .await
            .unwrap()
            .is_some()
    );
    // Within the renewal window: read says it is gone, so it is made again.
    renew.insert("early_renewal_hours".to_owned(), json!(48));
    let updated = p
        .update(&cx(SELF_SIGNED_CERT), &created.external_id, &renew, &updated)
        .await
        .unwrap();
    assert_eq!(
        p.read(&cx(SELF_SIGNED_CERT), &created.external_id, Some(&updated))
            .await
            .unwrap(),
        None
    );
    assert!(matches!(
        p.lookup(&cx(SELF_SIGNED_CERT), &desired).await.unwrap(),
        Lookup::Absent
    ));
}

#[tokio::test]
async fn a_locally_signed_certificate_verifies_against_its_ca() {
    let p = TlsProvider::new();
    let ca_key = key("ECDSA").await;
    let ca = p
        .create(
            &cx(SELF_SIGNED_CERT),
            &map(json!({
                "private_key_pem": s(&ca_key, "private_key_pem"),
                "subject": {"common_name": "Lyra Test CA"},
                "validity_period_hours": 24,
                "is_ca_certificate": true,
                "allowed_uses": ["cert_signing", "crl_signing"],
            })),
        )
        .await
        .unwrap()
        .actual;
    let leaf_key = key("ED25519").await;
    let csr = p
        .create(
            &cx(CERT_REQUEST),
            &map(json!({
                "private_key_pem": s(&leaf_key, "private_key_pem"),
                "subject": {"common_name": "svc.test"},
                "dns_names": ["svc.test"],
            })),
        )
        .await
        .unwrap()
        .actual;
    assert!(s(&csr, "cert_request_pem").starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
    let desired = map(json!({
        "cert_request_pem": s(&csr, "cert_request_pem"),
        "ca_private_key_pem": s(&ca_key, "private_key_pem"),
        "ca_cert_pem": s(&ca, "cert_pem"),
        "validity_period_hours": 12,
        "allowed_uses": ["digital_signature", "server_auth", "client_auth"],
    }));
    let created = p.create(&cx(LOCALLY_SIGNED_CERT), &desired).await.unwrap();
    let leaf_der = der(&s(&created.actual, "cert_pem"));
    let (_, leaf) = parse_x509_certificate(&leaf_der).unwrap();
    let ca_der = der(&s(&ca, "cert_pem"));
    let (_, ca_cert) = parse_x509_certificate(&ca_der).unwrap();
    assert_eq!(leaf.issuer(), ca_cert.subject());
    assert_eq!(leaf.subject().to_string(), "CN=svc.test");
    leaf.verify_signature(Some(ca_cert.public_key()))
        .expect("signed by the CA");
    assert!(leaf.verify_signature(None).is_err(), "not self-signed");
    assert!(!leaf.is_ca());
    assert_eq!(
        leaf.public_key().raw,
        KeyPair::from_pem(&s(&leaf_key, "private_key_pem"))
            .unwrap()
            .subject_public_key_info()
    );
    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    // The authority key id is the CA's subject key id.
    let aki = leaf
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(a) => a.key_identifier.clone(),
            _ => None,
        })
        .expect("an authority key identifier");
    let ski = ca_cert
        .extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.clone()),
            _ => None,
        })
        .expect("a subject key identifier");
    assert_eq!(aki.0, ski.0);
    let v = leaf.validity();
    assert_eq!(v.not_after.timestamp() - v.not_before.timestamp(), 12 * 3600);
    let read = p
        .read(&cx(LOCALLY_SIGNED_CERT), &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, created.actual);

    // Another key than the CA's is refused, naming the attribute and nothing of the key.
    let other = key("ECDSA").await;
    let mut wrong = desired.clone();
    wrong.insert("ca_private_key_pem".to_owned(), other["private_key_pem"].clone());
    let err = p.create(&cx(LOCALLY_SIGNED_CERT), &wrong).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "ca_private_key_pem"),
        "{err:?}"
    );
    let mut bad_csr = desired.clone();
    bad_csr.insert(
        "cert_request_pem".to_owned(),
        json!("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"),
    );
    let err = p.create(&cx(LOCALLY_SIGNED_CERT), &bad_csr).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "cert_request_pem"),
        "{err:?}"
    );
}

#[tokio::test]
async fn bad_keys_and_settings_are_invalid_values_without_the_secret() {
    let p = TlsProvider::new();
    let secret = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----\n";
    let err = p
        .create(
            &cx(SELF_SIGNED_CERT),
            &map(json!({"private_key_pem": secret, "validity_period_hours": 1})),
        )
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("private_key_pem") && !msg.contains("c2VjcmV0"), "{msg}");
    let key = key("ECDSA").await;
    let pem = s(&key, "private_key_pem");
    for (extra, attribute) in [
        (json!({"allowed_uses": ["world_domination"]}), "allowed_uses"),
        (json!({"subject": {"nickname": "x"}}), "subject"),
        (json!({"ip_addresses": ["300.1.1.1"]}), "ip_addresses"),
        (json!({"validity_period_hours": null}), "validity_period_hours"),
        (json!({"is_ca_certificate": "maybe"}), "is_ca_certificate"),
    ] {
        let mut desired = map(json!({"private_key_pem": pem, "validity_period_hours": 1}));
        desired.extend(map(extra.clone()));
        let err = p.create(&cx(SELF_SIGNED_CERT), &desired).await.unwrap_err();
        assert!(
            matches!(&err, ProviderError::InvalidValue { attribute: a, .. } if a == attribute),
            "{extra}: {err:?}"
        );
        assert!(!err.to_string().contains(&pem[30..60]), "{err}");
    }
}

#[test]
fn schemas_mark_secrets_and_immutables() {
    let schemas = TlsProvider::new().schemas();
    assert_eq!(schemas.len(), 4);
    for schema in &schemas {
        for a in &schema.attributes {
            assert!(!a.doc.is_empty(), "{}.{}", schema.name, a.name);
            assert!(
                a.computed || a.immutable || a.name == "early_renewal_hours",
                "{}.{}",
                schema.name,
                a.name
            );
        }
    }
    let key = &schemas[0];
    assert!(key.is_secret("private_key_pem") && !key.is_secret("public_key_pem"));
    assert!(schemas[1].is_secret("private_key_pem"));
    assert!(schemas[3].is_secret("ca_private_key_pem"));
    assert!(!schemas[3].is_secret("cert_pem"));
}
