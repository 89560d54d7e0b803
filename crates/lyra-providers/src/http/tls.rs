//! The rustls configuration of `Http::Resource`'s client, on ring's provider (reqwest is built
//! without one of its own): the public roots plus `ca_certificate`, or no verification at all
//! with `insecure`.

use std::sync::Arc;

use lyra_core::provider::ProviderError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

type SharedProvider = Arc<rustls::crypto::CryptoProvider>;

pub(super) fn client_config(insecure: bool, ca_pem: &str) -> Result<rustls::ClientConfig, ProviderError> {
    let provider: SharedProvider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| ProviderError::Config(format!("Http TLS: {e}")))?;
    if insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth());
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if !ca_pem.trim().is_empty() {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| ProviderError::Config(format!("Http ca_certificate is not PEM: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| ProviderError::Config(format!("Http ca_certificate: {e}")))?;
            added += 1;
        }
        if added == 0 {
            return Err(ProviderError::Config(
                "Http ca_certificate holds no PEM certificate".to_owned(),
            ));
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `insecure: true`: any certificate is accepted (signatures are still checked, so the
/// handshake is well-formed), as `curl -k` would.
#[derive(Debug)]
struct NoVerification(SharedProvider);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
