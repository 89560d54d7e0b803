//! Reads: one object, a list (selectors, pages, Tables or metadata only) or the start of a
//! watch, rendered as the `Accept` header asks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use serde_json::{Value, json};

use super::{Params, Reply, Target, is_true, named, selectors, serve};
use crate::Shared;
use crate::errors::ApiError;
use crate::table::{self, IncludeObject};
use crate::watch::{Rendering, WatchSpec};

/// A watch without `timeoutSeconds` ends after this long (a real apiserver picks 30-60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What the Accept header asks for.
fn rendering(headers: &HeaderMap, params: &Params) -> Rendering {
    let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or_default();
    // The first alternative the server can produce wins; JSON objects are always possible.
    for alt in accept.split(',') {
        if alt.contains("as=Table") {
            return Rendering::Table(IncludeObject::from_query(
                params.get("includeObject").map(String::as_str),
            ));
        }
        if alt.contains("as=PartialObjectMetadata") {
            return Rendering::PartialMetadata;
        }
        if alt.contains("json") || alt.trim().starts_with("*/*") {
            return Rendering::Object;
        }
    }
    Rendering::Object
}

pub(super) fn get(shared: &Shared, t: &Target, headers: &HeaderMap) -> Result<Reply, ApiError> {
    let (ns, name) = named(t);
    let obj = shared.lock().get(&t.rt, &ns, &name)?;
    let served = serve(t, &obj);
    let body = match rendering(headers, &HashMap::new()) {
        Rendering::Object => served,
        Rendering::PartialMetadata => table::partial_metadata(&served),
        Rendering::Table(include) => {
            let columns =
                t.rt.version(&t.version)
                    .map(|v| v.columns.as_slice())
                    .unwrap_or_default();
            let rv = served["metadata"]["resourceVersion"].clone();
            table::table(columns, &[&served], json!({ "resourceVersion": rv }), include)
        }
    };
    Ok(Reply::Json(StatusCode::OK, body))
}

pub(super) fn list(shared: &Shared, t: &Target, params: &Params, headers: &HeaderMap) -> Result<Reply, ApiError> {
    let (labels, fields) = selectors(params)?;
    let limit = params
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let after = match params.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => Some(decode_continue(token)?),
        None => None,
    };
    let id = t.rt.store_id();
    let (mut items, rv) = {
        let state = shared.lock();
        let ns = t.namespace.as_deref();
        // Selectors see the requested view (`regarding.name` of an events.k8s.io Event).
        let selected = |o: &Arc<Value>| labels.matches(o) && fields.matches(o);
        let items: Vec<Arc<Value>> = match (fields.pinned_name(), ns) {
            (Some(name), Some(ns)) => state
                .store
                .get(&id, ns, name)
                .map(|o| t.rt.view(o))
                .into_iter()
                .filter(selected)
                .collect(),
            _ => state
                .store
                .list(&id, ns)
                .filter(|o| after.as_ref().is_none_or(|a| crate::store::key_of(o) > *a))
                .map(|o| t.rt.view(o))
                .filter(selected)
                .collect(),
        };
        (items, state.store.current_rv())
    };
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if let Some(limit) = limit
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        let (ns, name) = crate::store::key_of(items.last().expect("limit > 0"));
        meta["continue"] = json!(encode_continue(&ns, &name));
        meta["remainingItemCount"] = json!(remaining);
    }
    let served: Vec<Value> = items.iter().map(|o| serve(t, o)).collect();
    let body = match rendering(headers, params) {
        Rendering::Table(include) => {
            let columns =
                t.rt.version(&t.version)
                    .map(|v| v.columns.as_slice())
                    .unwrap_or_default();
            let refs: Vec<&Value> = served.iter().collect();
            table::table(columns, &refs, meta, include)
        }
        Rendering::PartialMetadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
            "items": served.iter().map(table::partial_metadata).collect::<Vec<_>>(),
        }),
        Rendering::Object => {
            let mut list = json!({
                "kind": t.rt.list_kind,
                "apiVersion": t.rt.api_version(&t.version),
                "metadata": meta,
            });
            // Moved in: `json!` would copy every object once more.
            list["items"] = Value::Array(served);
            list
        }
    };
    Ok(Reply::Json(StatusCode::OK, body))
}

fn encode_continue(ns: &str, name: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json!([ns, name]).to_string())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let bad = || ApiError::bad_request(format!("invalid continue token {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let (ns, name): (String, String) = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((ns, name))
}

pub(super) fn watch_request(
    shared: &Shared,
    t: Target,
    params: &Params,
    headers: &HeaderMap,
) -> Result<Reply, ApiError> {
    let (labels, fields) = selectors(params)?;
    let send_initial = is_true(params.get("sendInitialEvents"));
    let from = match params.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(_) if send_initial => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?,
        ),
    };
    if let Some(rv) = from
        && let Err(oldest) = shared.lock().store.events_after(rv).map(|_| ())
    {
        return Err(ApiError::expired(rv, oldest));
    }
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    Ok(Reply::Watch(WatchSpec {
        rendering: rendering(headers, params),
        rt: t.rt,
        version: t.version,
        namespace: t.namespace,
        labels,
        fields,
        from,
        initial_events_bookmark: send_initial,
        timeout,
    }))
}
