//! Against a real local HTTP server: a small JSON CRUD API (axum) with an in-memory map, a
//! bearer token check, and a TLS variant whose certificate an rcgen CA signed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as AxumResponse};
use axum::routing::{any, get, post};
use lyra_core::provider::{Lookup, OpContext, Provider, ProviderError};
use lyra_core::value::{Map, Value};
use serde_json::json;

use super::*;
use crate::test_support::map;

const TOKEN: &str = "tok-s3cret-value";

#[derive(Clone, Default)]
struct Api {
    objects: Arc<Mutex<BTreeMap<String, Value>>>,
    next: Arc<AtomicU64>,
}

impl Api {
    fn get(&self, id: &str) -> Option<Value> {
        self.objects.lock().unwrap().get(id).cloned()
    }
    fn set(&self, id: &str, v: Value) {
        self.objects.lock().unwrap().insert(id.to_owned(), v);
    }
}

/// A 401 unless the request carries the token; the body echoes what it got, as careless servers
/// do, so the tests can see it is never repeated.
fn check(headers: &HeaderMap) -> Option<AxumResponse> {
    let got = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (got != format!("Bearer {TOKEN}"))
        .then(|| (StatusCode::UNAUTHORIZED, format!("bad credentials: {got}")).into_response())
}

fn with_id(mut body: Value, id: &str, created_at: Value) -> Value {
    if let Value::Object(m) = &mut body {
        m.insert("id".into(), json!(id));
        // A field the server adds: never drift.
        m.insert("created_at".into(), created_at);
    }
    body
}

async fn create(State(api): State<Api>, headers: HeaderMap, Json(body): Json<Value>) -> AxumResponse {
    if let Some(r) = check(&headers) {
        return r;
    }
    if body.get("name").is_none() {
        return (StatusCode::UNPROCESSABLE_ENTITY, r#"{"error":"name is required"}"#).into_response();
    }
    let id = format!("u{}", api.next.fetch_add(1, Ordering::SeqCst) + 1);
    let obj = with_id(body, &id, json!("2026-01-01T00:00:00Z"));
    api.set(&id, obj.clone());
    (StatusCode::CREATED, Json(obj)).into_response()
}

async fn read(State(api): State<Api>, headers: HeaderMap, Path(id): Path<String>) -> AxumResponse {
    if let Some(r) = check(&headers) {
        return r;
    }
    match api.get(&id) {
        Some(obj) => Json(obj).into_response(),
        None => (StatusCode::NOT_FOUND, "no such object").into_response(),
    }
}

/// Replaces the object, or creates it under the id given (PUT-creates).
async fn update(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> AxumResponse {
    if let Some(r) = check(&headers) {
        return r;
    }
    let created_at = api
        .get(&id)
        .and_then(|o| o.get("created_at").cloned())
        .unwrap_or(json!("2026-02-02T00:00:00Z"));
    let obj = with_id(body, &id, created_at);
    api.set(&id, obj.clone());
    Json(obj).into_response()
}

async fn delete(State(api): State<Api>, headers: HeaderMap, Path(id): Path<String>) -> AxumResponse {
    if let Some(r) = check(&headers) {
        return r;
    }
    match api.objects.lock().unwrap().remove(&id) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Always unavailable, echoing the request's authorization.
async fn down(headers: HeaderMap) -> AxumResponse {
    let got = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("overloaded, try later ({got})"),
    )
        .into_response()
}

/// Answers with what authenticated it, as an object with an id.
async fn echo(headers: HeaderMap) -> AxumResponse {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    Json(json!({"id": "e1", "auth": header("authorization"), "key": header("x-api-key"), "team": header("x-team")}))
        .into_response()
}

async fn slow() -> AxumResponse {
    tokio::time::sleep(Duration::from_secs(30)).await;
    StatusCode::NO_CONTENT.into_response()
}

fn router(api: Api) -> Router {
    Router::new()
        .route("/users", post(create))
        .route("/users/{id}", get(read).put(update).delete(delete))
        .route("/other/{id}", get(read).put(update).delete(delete))
        .route("/down", any(down))
        .route("/down/{id}", any(down))
        .route("/slow", any(slow))
        .route("/echo", any(echo))
        .route("/echo/{id}", any(echo))
        .with_state(api)
}

/// Serves the API on a free port: its base URL.
async fn serve(api: Api) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(api)).await });
    format!("http://{addr}")
}

/// The CA's PEM, and the API served over TLS with a certificate for 127.0.0.1 it signed.
async fn serve_tls(api: Api) -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config)),
    )
    .unwrap();
    tokio::spawn(async move { server.serve(router(api).into_make_service()).await });
    (format!("https://{addr}"), ca_cert.pem())
}

fn cx_with(config: Value) -> OpContext<'static> {
    let mut cx = crate::test_support::cx(RESOURCE);
    cx.config = Box::leak(Box::new(map(config)));
    cx
}

fn cx_for(base: &str) -> OpContext<'static> {
    cx_with(json!({"base_url": base, "bearer_token": TOKEN, "timeout": "5s"}))
}

fn assert_no_token(err: &ProviderError) {
    let text = format!("{err} {err:?}");
    assert!(!text.contains(TOKEN) && !text.contains("s3cret"), "{text}");
}

#[tokio::test]
async fn lifecycle() {
    let api = Api::default();
    let base = serve(api.clone()).await;
    let p = HttpProvider::new();
    let cx = cx_for(&base);
    let desired = map(json!({
        "path": "/users",
        "data": {"name": "ada", "roles": ["admin"], "profile": {"city": "London"}},
    }));

    let created = p.create(&cx, &desired).await.unwrap();
    assert_eq!(created.external_id, "u1");
    assert_eq!(created.actual["id"], json!("u1"));
    assert_eq!(created.actual["data"], desired["data"]);
    assert_eq!(created.actual["status_code"], json!(200));
    assert_eq!(created.actual["response"]["created_at"], json!("2026-01-01T00:00:00Z"));
    assert_eq!(api.get("u1").unwrap()["name"], json!("ada"));

    // No drift: the server's own field is not in data.
    let read = p.read(&cx, "u1", Some(&created.actual)).await.unwrap().unwrap();
    assert_eq!(read, created.actual);

    // Update in place.
    let desired = map(json!({
        "path": "/users",
        "data": {"name": "ada", "roles": ["admin", "ops"], "profile": {"city": "Paris"}},
    }));
    let updated = p.update(&cx, "u1", &desired, &created.actual).await.unwrap();
    assert_eq!(updated["data"], desired["data"]);
    assert_eq!(api.get("u1").unwrap()["profile"]["city"], json!("Paris"));

    // Drift: a managed key changed out of band shows, nested ones too; a new server field and
    // a new nested field do not.
    let mut obj = api.get("u1").unwrap();
    obj["name"] = json!("grace");
    obj["profile"]["city"] = json!("Rome");
    obj["profile"]["zip"] = json!("00100");
    obj["extra"] = json!(true);
    api.set("u1", obj);
    let drifted = p.read(&cx, "u1", Some(&updated)).await.unwrap().unwrap();
    assert_eq!(
        drifted["data"],
        json!({"name": "grace", "roles": ["admin", "ops"], "profile": {"city": "Rome"}})
    );
    assert_eq!(drifted["response"]["extra"], json!(true));

    // A new path replaces: the schema says so.
    let schemas = p.schemas();
    assert!(schemas[0].attribute("path").unwrap().immutable);
    assert!(schemas[0].attribute("object_id").unwrap().immutable);
    assert!(schemas[0].attribute("id").unwrap().computed);

    // Delete, then it is gone, and deleting again is fine.
    p.delete(&cx, "u1", &drifted).await.unwrap();
    assert!(api.get("u1").is_none());
    assert_eq!(p.read(&cx, "u1", Some(&drifted)).await.unwrap(), None);
    p.delete(&cx, "u1", &drifted).await.unwrap();

    // Without object_id there is no natural key.
    assert!(matches!(p.lookup(&cx, &desired).await.unwrap(), Lookup::Unsupported));
}

#[tokio::test]
async fn put_creates_with_a_known_id_and_lookup_finds_them() {
    let api = Api::default();
    let base = serve(api.clone()).await;
    let p = HttpProvider::new();
    let cx = cx_for(&base);
    let desired = map(json!({
        "path": "/other",
        "object_id": "a b/c",
        "create_method": "put",
        "create_path": "{path}/{id}",
        "data": {"name": "x"},
    }));
    assert!(matches!(p.lookup(&cx, &desired).await.unwrap(), Lookup::Absent));
    // The create whose result is "lost".
    p.create(&cx, &desired).await.unwrap();
    // The id was percent-encoded into one path segment.
    assert!(
        api.get("a b/c").is_some(),
        "{:?}",
        api.objects.lock().unwrap().keys().collect::<Vec<_>>()
    );
    match p.lookup(&cx, &desired).await.unwrap() {
        Lookup::Found(c) => {
            assert_eq!(c.external_id, "a b/c");
            assert_eq!(c.actual["data"], json!({"name": "x"}));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn failures_are_classified_and_never_show_the_token() {
    let api = Api::default();
    let base = serve(api.clone()).await;
    let p = HttpProvider::new();
    let cx = cx_for(&base);

    // 503: retryable; the echoed token is masked.
    let err = p
        .create(&cx, &map(json!({"path": "/down", "data": {"name": "x"}})))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("503"), "{err}");
    assert!(err.to_string().contains("overloaded"), "{err}");
    assert_no_token(&err);
    let err = p
        .read(&cx, "1", Some(&map(json!({"path": "/down", "data": {}}))))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");

    // 422: the value is refused, with the server's reason.
    let err = p
        .create(&cx, &map(json!({"path": "/users", "data": {"nom": "x"}})))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, message } if attribute == "data" && message.contains("name is required")),
        "{err:?}"
    );

    // 401 with a wrong token: configuration, and neither token shows.
    let wrong = cx_with(json!({"base_url": base, "bearer_token": "tok-wrong-s3cret"}));
    let err = p
        .create(&wrong, &map(json!({"path": "/users", "data": {"name": "x"}})))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err:?}");
    assert!(!err.to_string().contains("tok-wrong-s3cret"), "{err}");

    // Nothing listening: retryable.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err = p
        .create(
            &cx_for(&format!("http://user:pw-s3cret@{closed}?key=s3cret")),
            &map(json!({"path": "/users", "data": {"name": "x"}})),
        )
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_no_token(&err);

    // The id is not where id_attribute says.
    let err = p
        .create(
            &cx,
            &map(json!({"path": "/users", "id_attribute": "data.uid", "data": {"name": "x"}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "id_attribute"),
        "{err:?}"
    );
}

#[tokio::test]
async fn bad_configuration_is_a_config_error() {
    let p = HttpProvider::new();
    let desired = map(json!({"path": "/users", "data": {}}));
    for config in [
        json!({"base_url": "ftp://x"}),
        json!({"base_url": "http://x", "timeout": "soon"}),
        json!({"base_url": "http://x", "insecure": "yes"}),
        json!({"base_url": "http://x", "ca_certificate": "not a certificate"}),
        json!({}),
    ] {
        let err = p.create(&cx_with(config.clone()), &desired).await.unwrap_err();
        assert!(matches!(err, ProviderError::Config(_)), "{config}: {err:?}");
    }
}

#[tokio::test]
async fn slow_requests_stop_when_cancelled_or_timed_out() {
    let base = serve(Api::default()).await;
    let p = HttpProvider::new();
    let desired = map(json!({"path": "/slow", "data": {}}));

    let cx = cx_for(&base);
    let cancel = cx.cancel;
    let started = std::time::Instant::now();
    let (r, ()) = tokio::join!(p.create(&cx, &desired), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.store(true, Ordering::SeqCst);
    });
    assert!(matches!(r, Err(ProviderError::Cancelled)), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let cx = cx_with(json!({"base_url": base, "bearer_token": TOKEN, "timeout": "300ms"}));
    let err = p.create(&cx, &desired).await.unwrap_err();
    assert!(err.is_retryable() && err.to_string().contains("timed out"), "{err:?}");
}

#[tokio::test]
async fn tls_trusts_ca_certificate_or_nothing_when_insecure() {
    let api = Api::default();
    let (base, ca) = serve_tls(api.clone()).await;
    let p = HttpProvider::new();
    let desired = map(json!({"path": "/users", "data": {"name": "tls"}}));

    // Not trusted by the public roots.
    let err = p.create(&cx_for(&base), &desired).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(api.objects.lock().unwrap().is_empty());

    let trusting = cx_with(json!({"base_url": base, "bearer_token": TOKEN, "ca_certificate": ca}));
    let created = p.create(&trusting, &desired).await.unwrap();
    assert_eq!(created.actual["data"], json!({"name": "tls"}));

    let insecure = cx_with(json!({"base_url": base, "bearer_token": TOKEN, "insecure": true}));
    let read = p
        .read(&insecure, &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, created.actual);
}

#[test]
fn projection_keeps_exactly_the_managed_keys() {
    let server = map(json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1], "f": "new"}));
    let managed = map(json!({"a": 0, "b": {"c": 0}, "e": [], "g": 1}));
    assert_eq!(
        Value::Object(project(&server, &managed)),
        json!({"a": 1, "b": {"c": 2}, "e": [1], "g": null})
    );
    assert_eq!(shown_url("https://u:p@h:1/x/y?k=v#f"), "https://h:1/x/y");
    assert_eq!(at_path(&json!({"data": {"id": 7}}), "data.id"), Some(&json!(7)));
    assert_eq!(
        at_path(&json!({"items": [{"id": "a"}]}), "items.0.id"),
        Some(&json!("a"))
    );
    let _ = Map::new();
}

#[tokio::test]
async fn basic_auth_and_headers_are_sent() {
    let base = serve(Api::default()).await;
    let p = HttpProvider::new();
    let cx = cx_with(json!({
        "base_url": format!("{base}/"),
        "username": "user",
        "password": "pw",
        "headers": {"X-Api-Key": "key-s3cret"},
    }));
    let desired = map(json!({"path": "echo", "headers": {"X-Team": "blue"}, "data": {}}));
    let created = p.create(&cx, &desired).await.unwrap();
    assert_eq!(created.external_id, "e1");
    // base64("user:pw")
    assert_eq!(created.actual["response"]["auth"], json!("Basic dXNlcjpwdw=="));
    assert_eq!(created.actual["response"]["key"], json!("key-s3cret"));
    assert_eq!(created.actual["response"]["team"], json!("blue"));

    // A header value a server echoes in an error is masked.
    let err = p
        .create(
            &cx,
            &map(json!({"path": "/down", "headers": {"X-Team": "blue"}, "data": {}})),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("overloaded, try later (Basic ***)"), "{err}");
    assert!(!err.to_string().contains("dXNlcjpwdw"), "{err}");
}
