//! HTTP: parses the Kubernetes REST paths, query parameters and content types, and answers
//! with discovery documents, objects, lists, Tables, watches or `Status` errors. Writes go to
//! `objects`; reads are in `read`.

mod admit;
mod read;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize as _;
use serde_json::{Value, json};

use crate::Shared;
use crate::errors::ApiError;
use crate::objects::{DeleteOptions, FieldManager, FieldValidation, PatchKind, Subresource, WriteOptions, Written};
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::watch::{self, WatchSpec};
use admit::Review;

/// The apiserver's `MaxRequestBodyBytes`: bodies over 3 MiB are refused before decoding.
pub const REQUEST_BODY_LIMIT: usize = 3 * 1024 * 1024;

/// How much of a body the server reads before it answers. A body over the limit is still
/// read to its end (up to this), then refused: answering first and closing the connection
/// on a client still sending makes it see a broken pipe instead of the 413 (kubectl on a
/// busy machine does), where Go's server, the apiserver's, lingers.
pub const REQUEST_BODY_READ_LIMIT: usize = 16 * REQUEST_BODY_LIMIT;

type Params = HashMap<String, String>;

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [("content-type", "application/json")], body.to_string()).into_response()
}

/// A group-version's OpenAPI document as the apiserver serves it: at the URL with its current
/// hash (the one the root lists), cacheable for good, which kubectl's HTTP cache honours; at a
/// stale hash, a redirect to the current one; without a hash, not cached.
fn openapi_response(path: &str, doc: &crate::openapi::Doc, asked: Option<&String>) -> Response {
    let hash = &doc.hash;
    let body = |code| (code, [("content-type", "application/json")], doc.body.clone()).into_response();
    match asked {
        Some(h) if h == hash => {
            let mut resp = body(StatusCode::OK);
            let headers = resp.headers_mut();
            headers.insert(
                "cache-control",
                HeaderValue::from_static("public, immutable, max-age=31536000"),
            );
            if let Ok(v) = HeaderValue::from_str(&format!("\"{hash}\"")) {
                headers.insert("etag", v);
            }
            resp
        }
        Some(_) => (
            StatusCode::MOVED_PERMANENTLY,
            [("location", format!("{path}?hash={hash}"))],
        )
            .into_response(),
        None => {
            let mut resp = body(StatusCode::OK);
            resp.headers_mut()
                .insert("cache-control", HeaderValue::from_static("no-cache, private"));
            resp
        }
    }
}

/// The single entry point: every request lands here.
pub async fn handle(
    AxumState(shared): AxumState<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(params): Query<Params>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) if body.len() > REQUEST_BODY_LIMIT => {
            return ApiError::request_too_large(REQUEST_BODY_LIMIT).into_response();
        }
        Ok(body) => body,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return ApiError::request_too_large(REQUEST_BODY_LIMIT).into_response();
        }
        Err(e) => return ApiError::bad_request(format!("reading the request body: {e}")).into_response(),
    };
    tracing::debug!(
        %method,
        path = uri.path(),
        content_type = ?headers.get("content-type"),
        "request"
    );
    let user = crate::audit::user(&headers);
    let resp = match route(&shared, &method, &uri, &params, &headers, &body, &user).await {
        Ok(Reply::Json(code, v)) => json_response(code, &v),
        Ok(Reply::Written(code, w, served)) => {
            let mut resp = json_response(code, &served);
            for warning in w.warnings {
                if let Ok(v) = HeaderValue::from_str(&format!("299 - {warning:?}")) {
                    resp.headers_mut().append("warning", v);
                }
            }
            resp
        }
        Ok(Reply::Watch(spec)) => watch::start(shared.clone(), spec),
        Ok(Reply::OpenApi(doc)) => openapi_response(uri.path(), &doc, params.get("hash")),
        Err(e) => e.into_response(),
    };
    let record = crate::audit::describe(&method, uri.path(), &params, user, resp.status().as_u16());
    // A server-side apply that creates its object is authorized as a create too, as the
    // apiserver does: RBAC needs both verbs for it.
    let created_by_apply = method == Method::PATCH
        && resp.status() == StatusCode::CREATED
        && headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/apply-patch"));
    if created_by_apply {
        shared.audit.push(crate::audit::AuditRecord {
            verb: "create".to_owned(),
            ..record.clone()
        });
    }
    shared.audit.push(record);
    resp
}

enum Reply {
    Json(StatusCode, Value),
    Written(StatusCode, Written, Value),
    Watch(WatchSpec),
    /// An OpenAPI v3 document, with the caching its URL allows.
    OpenApi(Arc<crate::openapi::Doc>),
}

/// A parsed object path: `<base>[/namespaces/<ns>]/<plural>[/<name>[/<subresource>]]`.
pub(crate) struct Target {
    rt: Arc<ResourceType>,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Subresource,
}

async fn route(
    shared: &Shared,
    method: &Method,
    uri: &Uri,
    params: &Params,
    headers: &HeaderMap,
    body: &Bytes,
    user: &str,
) -> Result<Reply, ApiError> {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    if *method == Method::GET
        && let ["openapi", "v3", gv @ ..] = segments.as_slice()
        && !gv.is_empty()
    {
        let reg = &shared.lock().registry;
        let doc = match gv {
            ["api", "v1"] => crate::openapi::cached_document(reg, "", "v1"),
            ["apis", g, v] => crate::openapi::cached_document(reg, g, v),
            _ => None,
        };
        return doc.map(Reply::OpenApi).ok_or_else(ApiError::no_such_path);
    }
    if *method == Method::GET
        && let Some(reply) = crate::discovery::document(&shared.lock().registry, &segments)
    {
        return reply.map(|v| Reply::Json(StatusCode::OK, v));
    }
    let (group, version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", "v1", rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return Err(ApiError::no_such_path()),
    };
    let target = parse_target(shared, group, version, rest)?;
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let parse_body = || {
        if content_type.contains("protobuf") {
            crate::protobuf::decode(body).map_err(|e| ApiError::new(415, "UnsupportedMediaType", e))
        } else {
            parse_json(body)
        }
    };
    let opts = write_options(params, headers)?;
    match (method.as_str(), target.name.is_some()) {
        ("GET", false) if is_true(params.get("watch")) => read::watch_request(shared, target, params, headers),
        ("GET", false) => read::list(shared, &target, params, headers),
        ("GET", true) => read::get(shared, &target, headers),
        ("POST", false) => {
            let ns = target.namespace.clone().unwrap_or_default();
            if target.rt.namespaced && target.namespace.is_none() {
                return Err(ApiError::method_not_allowed());
            }
            let obj = parse_body()?;
            let review = Review::new(&target, user, options("CreateOptions", params));
            let w = admit::write(shared, &target, review, opts, |s, opts, pinned| {
                s.create(&target.rt, &target.version, &ns, pinned_name(&obj, pinned), opts)
            })
            .await?;
            written(&target, StatusCode::CREATED, w)
        }
        ("PUT", true) => {
            let obj = parse_body()?;
            let (ns, name) = named(&target);
            let review = Review::new(&target, user, options("UpdateOptions", params));
            let w = admit::write(shared, &target, review, opts, |s, opts, _| {
                s.update(&target.rt, &target.version, &ns, &name, obj.clone(), target.sub, opts)
            })
            .await?;
            written(&target, StatusCode::OK, w)
        }
        ("PATCH", true) => {
            let kind = PatchKind::from_content_type(content_type).ok_or_else(ApiError::unsupported_media_type)?;
            if kind == PatchKind::Apply && params.get("fieldManager").is_none_or(String::is_empty) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let patch = parse_json(body)?;
            let (ns, name) = named(&target);
            let review = Review::new(&target, user, options("PatchOptions", params));
            let w = admit::write(shared, &target, review, opts, |s, opts, _| {
                s.patch(&target.rt, &target.version, &ns, &name, kind, &patch, target.sub, opts)
            })
            .await?;
            let code = if w.created { StatusCode::CREATED } else { StatusCode::OK };
            written(&target, code, w)
        }
        ("DELETE", true) => {
            let (del, del_json) = delete_options(body, params, content_type)?;
            let (ns, name) = named(&target);
            let review = Review::new(&target, user, del_json);
            let gone = admit::delete(shared, &target, review, &ns, &name, &del, opts.dry_run).await?;
            Ok(Reply::Json(StatusCode::OK, serve(&target, &gone)))
        }
        ("DELETE", false) => delete_collection(shared, &target, params, body, content_type, opts.dry_run, user).await,
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn parse_target(shared: &Shared, group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    // `/api/v1/namespaces/<ns>/status` is the namespace's own status; any other
    // `namespaces/<ns>/<plural>...` is a namespaced path.
    let is_ns_subresource = group.is_empty() && rest.len() == 3 && matches!(rest[2], "status" | "finalize");
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() && !is_ns_subresource => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(*sub)),
        _ => return Err(ApiError::no_such_path()),
    };
    let rt = shared
        .lock()
        .registry
        .find(group, version, plural)
        .ok_or_else(ApiError::no_such_path)?;
    if namespace.is_some() && !rt.namespaced {
        return Err(ApiError::no_such_path());
    }
    if name.is_some() && rt.namespaced && namespace.is_none() {
        return Err(ApiError::no_such_path());
    }
    let sub = match sub {
        None => Subresource::Main,
        Some("status") if rt.status_subresource => Subresource::Status,
        Some("finalize") if rt.special == crate::registry::Special::Namespace => Subresource::Main,
        Some(_) => return Err(ApiError::no_such_path()),
    };
    Ok(Target {
        rt,
        version: version.to_string(),
        namespace,
        name,
        sub,
    })
}

fn named(t: &Target) -> (String, String) {
    (
        t.namespace.clone().unwrap_or_default(),
        t.name.clone().unwrap_or_default(),
    )
}

fn is_true(v: Option<&String>) -> bool {
    v.is_some_and(|v| v == "true" || v == "1")
}

fn write_options(params: &Params, headers: &HeaderMap) -> Result<WriteOptions, ApiError> {
    let manager = match params.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => FieldManager::new(m).ok_or_else(|| {
            ApiError::new(
                422,
                "Invalid",
                format!(
                    "fieldManager: Too long: may not be more than {} bytes",
                    FieldManager::MAX
                ),
            )
        })?,
        None => FieldManager::from_user_agent(
            headers
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        ),
    };
    Ok(WriteOptions {
        dry_run: params.get("dryRun").is_some_and(|v| v == "All"),
        field_validation: match params.get("fieldValidation").map(String::as_str) {
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            _ => FieldValidation::Warn,
        },
        manager,
        force: is_true(params.get("force")),
    })
}

/// How deeply a request body may nest: the apiserver's JSON decoder stops at 10,000 levels.
pub const MAX_JSON_DEPTH: usize = 10_000;

/// A request body as JSON. Nesting is what a real API server accepts (up to
/// [`MAX_JSON_DEPTH`]), not `serde_json`'s default of 128: a client may store a deep object,
/// and its controllers must cope. Measured first, iteratively, so parsing without the limit
/// cannot be led arbitrarily deep (the server's threads have stack for this depth).
fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    let not_json = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!(
            "the request body is not JSON (YAML bodies are not supported): {e}"
        ))
    };
    if let Some(offset) = nesting_exceeds(body, MAX_JSON_DEPTH) {
        return Err(not_json(&format_args!(
            "exceeded max depth of {MAX_JSON_DEPTH} at byte {offset}"
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    de.disable_recursion_limit();
    let value = Value::deserialize(&mut de).map_err(|e| not_json(&e))?;
    de.end().map_err(|e| not_json(&e))?;
    Ok(value)
}

/// The offset of the first `[` or `{` nested deeper than `limit`, outside strings.
fn nesting_exceeds(body: &[u8], limit: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, &b) in body.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// A DELETE's options, and their JSON form (what webhooks are sent as `options`).
fn delete_options(body: &Bytes, params: &Params, content_type: &str) -> Result<(DeleteOptions, Value), ApiError> {
    let mut v = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else if content_type.contains("protobuf") {
        // Helm's typed client deletes its release Secrets with a protobuf `DeleteOptions`.
        crate::protobuf::decode(body).map_err(|e| ApiError::new(415, "UnsupportedMediaType", e))?
    } else {
        parse_json(body)?
    };
    let mut opts = DeleteOptions::from_body(&v);
    if let Some(p) = params.get("propagationPolicy") {
        opts.orphan |= p == "Orphan";
        v["propagationPolicy"] = json!(p);
    }
    if v.is_object() {
        v["kind"] = json!("DeleteOptions");
        v["apiVersion"] = json!("meta.k8s.io/v1");
    }
    Ok((opts, v))
}

/// A write's options as webhooks are sent them.
fn options(kind: &str, params: &Params) -> Value {
    let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if let Some(m) = params.get("fieldManager") {
        o["fieldManager"] = json!(m);
    }
    if params.get("dryRun").is_some_and(|v| v == "All") {
        o["dryRun"] = json!(["All"]);
    }
    if kind == "PatchOptions" && is_true(params.get("force")) {
        o["force"] = json!(true);
    }
    o
}

/// A create's body with the name its dry run generated, so the webhooks review the object
/// stored (`generateName` would draw another).
fn pinned_name(obj: &Value, pinned: Option<&str>) -> Value {
    let mut obj = obj.clone();
    if let Some(name) = pinned
        && obj.is_object()
    {
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        obj["metadata"]["name"] = json!(name);
    }
    obj
}

/// The object at the requested version (objects are stored once, whatever version wrote them).
fn serve(t: &Target, obj: &Value) -> Value {
    let mut o = obj.clone();
    o["apiVersion"] = json!(t.rt.api_version(&t.version));
    o
}

fn written(t: &Target, code: StatusCode, w: Written) -> Result<Reply, ApiError> {
    let served = serve(t, &w.object);
    Ok(Reply::Written(code, w, served))
}

fn selectors(params: &Params) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))?;
    let fields = FieldSelector::parse(params.get("fieldSelector").map_or("", String::as_str))?;
    Ok((labels, fields))
}

/// Each selected object deleted as by its own DELETE (webhooks see one review each).
async fn delete_collection(
    shared: &Shared,
    t: &Target,
    params: &Params,
    body: &Bytes,
    content_type: &str,
    dry_run: bool,
    user: &str,
) -> Result<Reply, ApiError> {
    let (labels, fields) = selectors(params)?;
    let (del, del_json) = delete_options(body, params, content_type)?;
    let id = t.rt.store_id();
    let keys: Vec<(String, String)> = shared
        .lock()
        .store
        .list(&id, t.namespace.as_deref())
        .map(|o| t.rt.view(o))
        .filter(|o| labels.matches(o) && fields.matches(o))
        .map(|o| crate::store::key_of(&o))
        .collect();
    let mut deleted = Vec::new();
    for (ns, name) in keys {
        let review = Review::new(t, user, del_json.clone());
        match admit::delete(shared, t, review, &ns, &name, &del, dry_run).await {
            Ok(obj) => deleted.push(serve(t, &obj)),
            // Gone meanwhile: nothing to delete.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = shared.lock().store.current_rv();
    Ok(Reply::Json(
        StatusCode::OK,
        json!({
            "kind": t.rt.list_kind,
            "apiVersion": t.rt.api_version(&t.version),
            "metadata": { "resourceVersion": rv.to_string() },
            "items": deleted,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    use super::{MAX_JSON_DEPTH, REQUEST_BODY_LIMIT, nesting_exceeds};
    use crate::BlockingKubeEmulator;

    /// One HTTP/1.1 exchange on a connection of its own: the status line and the body.
    fn exchange(host: &str, method: &str, path: &str, body: &str) -> (String, String) {
        let mut stream = TcpStream::connect(host).expect("connect");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read the answer");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
    }

    fn nested(levels: usize) -> String {
        format!("{}{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn nesting_is_measured_outside_strings() {
        assert_eq!(nesting_exceeds(b"[[1]]", 2), None);
        assert_eq!(nesting_exceeds(b"[[[1]]]", 2), Some(2));
        assert_eq!(nesting_exceeds(br#"{"a":"[[[\"[[[","b":{}}"#, 2), None);
        assert_eq!(nesting_exceeds(br#"{"a":"\\","b":[[]]}"#, 2), Some(15));
    }

    /// As deep as a real API server takes (10,000 levels), and not a level more; what is
    /// stored is served back whole (chunked answers are only read to their end here).
    #[test]
    fn deep_objects_are_stored_and_served_like_the_apiservers() {
        let emu = BlockingKubeEmulator::start().expect("start the emulator");
        let host = emu.url().strip_prefix("http://").expect("plain HTTP").to_owned();
        let object = |name: &str, levels: usize| {
            // The object and its `deep` field are two of the levels.
            format!(
                "{{\"metadata\":{{\"name\":\"{name}\"}},\"deep\":{}}}",
                nested(levels - 1)
            )
        };
        let path = "/api/v1/namespaces/default/configmaps";
        let (status, body) = exchange(&host, "POST", path, &object("deep", MAX_JSON_DEPTH));
        assert!(status.contains(" 201 "), "{status}: {}", &body[..body.len().min(300)]);
        let (status, body) = exchange(&host, "GET", &format!("{path}/deep"), "");
        assert!(status.contains(" 200 "), "{status}");
        assert!(
            body.contains(&nested(MAX_JSON_DEPTH - 1)),
            "{}",
            &body[..body.len().min(300)]
        );
        let (status, body) = exchange(&host, "POST", path, &object("deeper", MAX_JSON_DEPTH + 1));
        assert!(status.contains(" 400 "), "{status}");
        assert!(body.contains("exceeded max depth of 10000"), "{body}");
    }

    /// A client still sending a body over the limit when the answer is ready (a loaded
    /// kubectl) must get the 413, not a broken pipe.
    #[test]
    fn a_body_over_the_limit_is_read_to_its_end_and_refused() {
        let emu = BlockingKubeEmulator::start().expect("start the emulator");
        let host = emu.url().strip_prefix("http://").expect("plain HTTP").to_owned();
        let body = format!(
            "{{\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"k\":\"{}\"}}}}",
            "x".repeat(REQUEST_BODY_LIMIT + 1024 * 1024)
        );
        let mut stream = TcpStream::connect(&host).expect("connect");
        write!(
            stream,
            "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: {host}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .expect("send the head");
        for chunk in body.as_bytes().chunks(64 * 1024) {
            stream.write_all(chunk).expect("the server reads the whole body");
            // Slower than the server, as a client on a busy machine is.
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut head = [0u8; 512];
        let n = stream.read(&mut head).expect("read the answer");
        let answer = String::from_utf8_lossy(&head[..n]);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }
}
