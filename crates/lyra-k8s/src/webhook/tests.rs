//! The HTTPS server end to end: a real TLS client verifying the server against the CA it
//! was given, POSTing AdmissionReviews; and a certificate swapped while serving.

use std::sync::Arc;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use lyra_providers::{ProvidersConfig, builtin};
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};

use super::*;
use crate::metrics::Metrics;
use crate::reconcile::{Runtime, Settings};

const HOST: &str = "lyra-webhook.lyra-system.svc";

/// POSTs `body` to `path` over HTTPS, trusting only `ca` (PEM): the status and the body.
async fn post(addr: SocketAddr, ca: &[u8], path: &str, body: String) -> Result<(u16, Value), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(HOST).unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = hyper::Request::post(path)
        .header("host", HOST)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

fn review(workflow_name: &str) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-7",
            "kind": {"group": "lyra.dev", "version": "v1alpha1", "kind": "Workflow"},
            "resource": {"group": "lyra.dev", "version": "v1alpha1", "resource": "workflows"},
            "name": "w",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {"metadata": {"name": "w", "namespace": "default"}, "spec": {"workflowName": workflow_name}},
        }
    })
    .to_string()
}

#[tokio::test]
async fn serves_reviews_over_verified_tls_and_swaps_its_certificate_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("workflows")).unwrap();
    std::fs::write(
        dir.path().join("workflows/hello.yaml"),
        "steps:\n  hello:\n    resource: Null::Resource\n    value: {input: hi}\n",
    )
    .unwrap();
    let store = lyra_state::open(&dir.path().join("state.db").display().to_string())
        .await
        .unwrap();
    let providers = Arc::new(builtin(&ProvidersConfig {
        foobernetes_file: dir.path().join("deployment.json"),
        ..ProvidersConfig::default()
    }));
    let runtime = Runtime::new(
        providers,
        store,
        Settings::new(dir.path().join("workflows")),
        Arc::new(Metrics::new()),
    );
    let admission = Arc::new(Admission::new(Arc::new(runtime)));

    let names = certs::dns_names("lyra-webhook", "lyra-system");
    let first = certs::generate(&names, None).unwrap();
    let tls = Tls::new(&first).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, shutdown) = watch::channel(false);
    let server = tokio::spawn(serve(listener, tls.clone(), router(admission), shutdown));

    let (status, answer) = post(addr, &first.ca, "/validate/workflows", review("no::such"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "req-7");
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("no::such"), "{message}");
    let (_, answer) = post(addr, &first.ca, "/validate/workflowdefinitions", review("hello"))
        .await
        .unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let (status, _) = post(addr, &first.ca, "/validate/workflows", "{}".to_owned())
        .await
        .unwrap();
    assert_eq!(status, 400);
    // A body past the limit is refused before it is read whole.
    let (status, _) = post(addr, &first.ca, "/validate/workflows", "x".repeat(MAX_BODY + 1))
        .await
        .unwrap();
    assert_eq!(status, 413);

    // A new certificate from another CA: new connections get it, without a restart.
    let second = certs::generate(&names, None).unwrap();
    assert!(tls.swap(&second).unwrap());
    assert!(!tls.swap(&second).unwrap(), "the same bundle is no change");
    let (_, answer) = post(addr, &second.ca, "/validate/workflows", review("hello"))
        .await
        .unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let refused = post(addr, &first.ca, "/validate/workflows", review("hello")).await;
    assert!(
        refused.is_err_and(|e| e.starts_with("handshake")),
        "the old CA no longer verifies it"
    );

    stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("a graceful shutdown")
        .unwrap()
        .unwrap();
}
