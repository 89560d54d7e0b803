//! Watches: a chunked `application/json` stream of `{"type":..,"object":..}` lines, one task
//! per watch. A watch replays the event log from its `resourceVersion` and then follows it;
//! without one (or with `0`) it first sends the current objects as `ADDED`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::Shared;
use crate::errors::ApiError;
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Event, EventType};
use crate::table::{self, IncludeObject};

/// How the client wants each event's object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    Object,
    /// A one-row `Table` (what `kubectl get -w` asks for).
    Table(IncludeObject),
    PartialMetadata,
}

/// One watch request.
#[derive(Debug)]
pub struct WatchSpec {
    pub rt: Arc<ResourceType>,
    pub version: String,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// `None`: start with the current objects as ADDED events.
    pub from: Option<u64>,
    /// `sendInitialEvents=true`: the initial ADDED events end with a BOOKMARK.
    pub initial_events_bookmark: bool,
    pub timeout: Duration,
    pub rendering: Rendering,
}

impl WatchSpec {
    fn selects(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj["metadata"]["namespace"].as_str() != Some(ns)
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// What this watch sees of a logged event, and the object in the watched kind's view:
    /// objects moving into or out of the selection arrive as ADDED or DELETED, as from a real
    /// apiserver.
    fn classify(&self, ev: &Event, store_id: &str) -> Option<(EventType, Arc<Value>)> {
        if ev.resource != store_id {
            return None;
        }
        let object = self.rt.view(&ev.object);
        let now = self.selects(&object);
        let before = ev.previous.as_ref().is_some_and(|p| self.selects(&self.rt.view(p)));
        let type_ = match (ev.type_, before, now) {
            (EventType::Added, _, true) => EventType::Added,
            (EventType::Modified, true, true) => EventType::Modified,
            (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, false) => EventType::Deleted,
            (EventType::Deleted, b, n) if b || n => EventType::Deleted,
            _ => return None,
        };
        Some((type_, object))
    }

    fn line(&self, type_: &str, obj: &Value) -> Bytes {
        let api_version = self.rt.api_version(&self.version);
        let rendered = match self.rendering {
            Rendering::Object if obj["apiVersion"] == api_version.as_str() => None,
            Rendering::Object => {
                let mut o = obj.clone();
                o["apiVersion"] = json!(api_version);
                Some(o)
            }
            Rendering::PartialMetadata => Some(table::partial_metadata(obj)),
            Rendering::Table(include) => {
                let columns = self
                    .rt
                    .version(&self.version)
                    .map(|v| v.columns.as_slice())
                    .unwrap_or_default();
                let rv = obj["metadata"]["resourceVersion"].clone();
                Some(table::table(columns, &[obj], json!({ "resourceVersion": rv }), include))
            }
        };
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(type_.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        serde_json::to_writer(&mut out, rendered.as_ref().unwrap_or(obj)).expect("JSON values serialize");
        out.extend_from_slice(b"}\n");
        Bytes::from(out)
    }
}

/// Starts a watch task and returns the streaming response it feeds.
pub fn start(shared: Arc<Shared>, spec: WatchSpec) -> Response {
    let (tx, mut rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run(shared, spec, tx));
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(Ok::<_, Infallible>)));
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Counts a watch as active for as long as it runs.
struct ActiveWatch(Arc<Shared>);

impl Drop for ActiveWatch {
    fn drop(&mut self) {
        self.0.active_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn run(shared: Arc<Shared>, spec: WatchSpec, tx: mpsc::Sender<Bytes>) {
    shared.active_watches.fetch_add(1, Ordering::SeqCst);
    let _active = ActiveWatch(shared.clone());
    let deadline = Instant::now() + spec.timeout;
    let mut notified = shared.notify.subscribe();
    let mut shutdown = shared.shutdown.subscribe();
    let id = spec.rt.id();
    let store_id = spec.rt.store_id();
    let (initial, mut last) = {
        let state = shared.lock();
        match spec.from {
            Some(rv) => (Vec::new(), rv),
            None => {
                let ns = spec.namespace.as_deref();
                let objs: Vec<_> = state
                    .store
                    .list(&store_id, ns)
                    .map(|o| spec.rt.view(o))
                    .filter(|o| spec.selects(o))
                    .collect();
                (objs, state.store.current_rv())
            }
        }
    };
    for obj in initial {
        if tx.send(spec.line("ADDED", &obj)).await.is_err() {
            return;
        }
    }
    if spec.initial_events_bookmark {
        let bookmark = json!({
            "kind": spec.rt.kind,
            "apiVersion": spec.rt.api_version(&spec.version),
            "metadata": {
                "resourceVersion": last.to_string(),
                "annotations": { "k8s.io/initial-events-end": "true" },
            },
        });
        let line = format!("{}\n", json!({ "type": "BOOKMARK", "object": bookmark }));
        if tx.send(Bytes::from(line)).await.is_err() {
            return;
        }
    }
    loop {
        notified.borrow_and_update();
        let (events, kind_gone) = {
            let state = shared.lock();
            let alive = state.registry.by_id(&id).is_some_and(|t| t.crd_uid == spec.rt.crd_uid);
            (state.store.events_after(last), !alive)
        };
        match events {
            Err(oldest) => {
                let status = ApiError::expired(last, oldest).to_status();
                let _ = tx
                    .send(Bytes::from(format!(
                        "{}\n",
                        json!({ "type": "ERROR", "object": status })
                    )))
                    .await;
                return;
            }
            Ok(events) => {
                for ev in events {
                    last = ev.rv;
                    if let Some((t, object)) = spec.classify(&ev, &store_id)
                        && tx.send(spec.line(t.as_str(), &object)).await.is_err()
                    {
                        return;
                    }
                }
            }
        }
        if kind_gone {
            return;
        }
        tokio::select! {
            changed = notified.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(deadline) => return,
            _ = shutdown.changed() => return,
            () = tx.closed() => return,
        }
    }
}
