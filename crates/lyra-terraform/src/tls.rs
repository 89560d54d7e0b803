//! go-plugin's automatic mutual TLS, client side.
//!
//! The client makes a throwaway certificate and hands it to the provider in
//! `PLUGIN_CLIENT_CERT`; the provider answers with its own (DER, base64) in the handshake
//! line. Each side trusts exactly the other's certificate: there is no CA, no name check and
//! no expiry that matters, so verification is pinning. go-plugin's server key is ECDSA P-521,
//! which ring (rustls' provider here) does not verify; that scheme is checked with RustCrypto's
//! `p521`, every other one by ring.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::SignatureScheme;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// The client's certificate (PEM, for `PLUGIN_CLIENT_CERT`) and the key material to use it.
pub(crate) struct ClientCert {
    pub pem: String,
    der: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

/// Makes a fresh self-signed certificate for one provider process, as go-plugin's own client
/// does: a CA for `localhost` good for client and server auth (the provider puts it in its
/// client CA pool, so it must verify as its own root).
pub(crate) fn client_cert() -> Result<ClientCert, rcgen::Error> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "Lyra");
    params.distinguished_name.push(rcgen::DnType::CommonName, "localhost");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
        rcgen::KeyUsagePurpose::KeyCertSign,
    ];
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    ];
    let cert = params.self_signed(&key)?;
    Ok(ClientCert {
        pem: cert.pem(),
        der: cert.der().clone(),
        key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    })
}

/// A rustls client configuration that presents `cert` and accepts only `server_der`.
pub(crate) fn client_config(cert: &ClientCert, server_der: Vec<u8>) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(Pinned {
        cert: server_der,
        provider: Arc::clone(&provider),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(vec![cert.der.clone()], cert.key.clone_key())?;
    // gRPC over TLS is HTTP/2, negotiated by ALPN.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Trusts exactly one certificate.
#[derive(Debug)]
struct Pinned {
    cert: Vec<u8>,
    provider: Arc<CryptoProvider>,
}

impl Pinned {
    fn verify(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
        tls13: bool,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if dss.scheme == SignatureScheme::ECDSA_NISTP521_SHA512 {
            return verify_p521(message, cert, dss.signature());
        }
        let algs = &self.provider.signature_verification_algorithms;
        if tls13 {
            rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
        } else {
            rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
        }
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify(message, cert, dss, false)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify(message, cert, dss, true)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        // First: a TLS 1.2 server picks the first scheme of ours its key can make.
        let mut schemes = vec![SignatureScheme::ECDSA_NISTP521_SHA512];
        schemes.extend(self.provider.signature_verification_algorithms.supported_schemes());
        schemes
    }
}

fn verify_p521(
    message: &[u8],
    cert: &CertificateDer<'_>,
    signature: &[u8],
) -> Result<HandshakeSignatureValid, rustls::Error> {
    use p521::ecdsa::signature::Verifier as _;
    let bad = || rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature);
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|_| bad())?;
    let point = parsed.public_key().subject_public_key.data.as_ref();
    let key = p521::ecdsa::VerifyingKey::from_sec1_bytes(point).map_err(|_| bad())?;
    let sig = p521::ecdsa::Signature::from_der(signature).map_err(|_| bad())?;
    key.verify(message, &sig).map_err(|_| bad())?;
    Ok(HandshakeSignatureValid::assertion())
}
