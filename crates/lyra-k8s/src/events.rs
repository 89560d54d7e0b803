//! Kubernetes Events about Workflow objects (`events.k8s.io/v1`), for `kubectl describe`.
//!
//! Not kube's `Recorder`, for two reasons. It folds events into a series by reason and action
//! only, so a later `Applied` event kept the first run's note while the status said
//! otherwise; here only a repeat of the very same note joins a series. And it names events
//! `<object>.<time>`, which for long object names exceeds the 253 characters a name may have,
//! so such objects got no events at all; here names are valid for any valid object name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::mpsc;

use crate::reconcile::Note;
use crate::status::clip;

/// Background publishing: workers, and the events each may hold before senders wait.
const SHARDS: usize = 4;
const QUEUE_DEPTH: usize = 256;

type Queued = (Note, ObjectReference);

/// What the API accepts (`events.k8s.io/v1` validation): bytes, not characters.
pub const NOTE_LIMIT: usize = 1024;
pub const REASON_LIMIT: usize = 128;
pub const ACTION_LIMIT: usize = 128;
pub const INSTANCE_LIMIT: usize = 128;
/// A DNS subdomain, which every object name (an event's included) must be.
pub const NAME_LIMIT: usize = 253;

/// Repeats older than this start a new event rather than extending a series (as kube and
/// client-go do).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// What makes two events "the same" so that the second only counts in the first's series.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    namespace: String,
    regarding: (Option<String>, Option<String>, Option<String>),
    warning: bool,
    reason: String,
    action: String,
    note: String,
    related: Option<(String, String)>,
}

#[derive(Debug, Clone)]
struct Seen {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes events for one controller replica.
pub struct EventPublisher {
    inner: Arc<Inner>,
    queues: Mutex<Queues>,
}

/// The background workers of [`EventPublisher::send`]: started by the first event, so that
/// a publisher can be made outside a runtime; stopped by [`EventPublisher::flush`].
enum Queues {
    Idle,
    Running {
        senders: Vec<mpsc::Sender<Queued>>,
        workers: Vec<tokio::task::JoinHandle<()>>,
    },
    Flushed,
}

struct Inner {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<Series>,
}

/// The events published lately, to extend their series.
#[derive(Default)]
struct Series {
    map: HashMap<SeriesKey, Seen>,
    swept: Option<Timestamp>,
}

impl Series {
    /// The live series of `key`. Expired ones are dropped now and then, not on every call:
    /// a sweep per event made publishing quadratic in the events of the last minutes.
    fn current(&mut self, key: &SeriesKey, now: Timestamp) -> Option<Seen> {
        let ttl = k8s_openapi::jiff::SignedDuration::try_from(SERIES_TTL).unwrap_or_default();
        if self.swept.is_none_or(|at| at + ttl / 4 <= now) {
            self.map.retain(|_, s| s.last + ttl > now);
            self.swept = Some(now);
        }
        self.map.get(key).filter(|s| s.last + ttl > now).cloned()
    }
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("controller", &self.inner.controller)
            .field("instance", &self.inner.instance)
            .finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// `instance` names this replica (default: the controller's name).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> EventPublisher {
        let instance = instance.unwrap_or_else(|| controller.to_owned());
        EventPublisher {
            inner: Arc::new(Inner {
                client,
                controller: controller.to_owned(),
                instance: cut(&instance, INSTANCE_LIMIT),
                series: Mutex::new(Series::default()),
            }),
            queues: Mutex::new(Queues::Idle),
        }
    }

    /// Publishes `note` about `regarding` now (see [`EventPublisher::send`] for the usual way).
    pub async fn publish(&self, note: &Note, regarding: &ObjectReference) -> Result<(), kube::Error> {
        self.inner.publish(note, regarding).await
    }

    /// Queues `note` about `regarding` for a background worker, so that a reconcile does not
    /// wait on a round trip per event. The events of one object keep their order (they go
    /// through one worker), and a full queue makes the sender wait. A failure is logged: an
    /// event the API refused is a bug to see. After [`EventPublisher::flush`], publishes at once.
    pub async fn send(&self, note: Note, regarding: ObjectReference) {
        let sender = {
            let mut queues = self.queues.lock().expect("event queues lock");
            if matches!(*queues, Queues::Idle) {
                *queues = self.start();
            }
            match &*queues {
                Queues::Running { senders, .. } => Some(senders[shard(&regarding)].clone()),
                Queues::Idle | Queues::Flushed => None,
            }
        };
        let unsent = match sender {
            Some(sender) => sender.send((note, regarding)).await.err().map(|e| e.0),
            None => Some((note, regarding)),
        };
        if let Some((note, regarding)) = unsent {
            self.inner.publish_logged(&note, &regarding).await;
        }
    }

    fn start(&self) -> Queues {
        let (senders, workers) = (0..SHARDS)
            .map(|_| {
                let (tx, mut rx) = mpsc::channel::<Queued>(QUEUE_DEPTH);
                let inner = Arc::clone(&self.inner);
                let worker = tokio::spawn(async move {
                    while let Some((note, regarding)) = rx.recv().await {
                        inner.publish_logged(&note, &regarding).await;
                    }
                });
                (tx, worker)
            })
            .unzip();
        Queues::Running { senders, workers }
    }

    /// Publishes everything queued, and stops the workers: later events are published at once.
    pub async fn flush(&self) {
        let queues = std::mem::replace(&mut *self.queues.lock().expect("event queues lock"), Queues::Flushed);
        if let Queues::Running { senders, workers } = queues {
            drop(senders);
            for w in workers {
                let _ = w.await;
            }
        }
    }
}

/// The worker of the object an event is about: the same one for every event of an object,
/// so they are published in order and a series is extended by one worker only.
fn shard(regarding: &ObjectReference) -> usize {
    let key = regarding
        .uid
        .as_deref()
        .or(regarding.name.as_deref())
        .unwrap_or_default();
    (fnv1a(key) % SHARDS as u64) as usize
}

impl Inner {
    async fn publish_logged(&self, note: &Note, regarding: &ObjectReference) {
        if let Err(e) = self.publish(note, regarding).await {
            let name = regarding.name.as_deref().unwrap_or_default();
            tracing::warn!(object = %name, reason = %note.reason, error = %e, "could not publish an event");
        }
    }

    /// Publishes `note` about `regarding`: a new event, or, for a repeat of the same note
    /// within a few minutes, one more in that event's series.
    async fn publish(&self, note: &Note, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let key = SeriesKey {
            namespace: namespace.clone(),
            regarding: (regarding.kind.clone(), regarding.name.clone(), regarding.uid.clone()),
            warning: note.warning,
            reason: cut(note.reason.as_str(), REASON_LIMIT),
            action: cut(&note.action, ACTION_LIMIT),
            note: clip(&note.message, NOTE_LIMIT),
            related: note.resource.clone(),
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let seen = self.series.lock().expect("series lock").current(&key, now);
        if let Some(seen) = seen {
            let count = seen.count + 1;
            let patch = serde_json::json!({
                "series": EventSeries { count, last_observed_time: MicroTime(now) }
            });
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.series.lock().expect("series lock").map.insert(
                        key,
                        Seen {
                            count,
                            last: now,
                            ..seen
                        },
                    );
                    return Ok(());
                }
                // Events expire on the server (an hour by default): start a new one.
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let name = event_name(regarding.name.as_deref().unwrap_or(&self.controller), now);
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if note.warning { "Warning" } else { "Normal" }.to_owned()),
            reason: Some(key.reason.clone()),
            action: Some(key.action.clone()),
            note: Some(key.note.clone()),
            regarding: Some(regarding.clone()),
            related: note.resource.as_ref().map(|(kind, name)| ObjectReference {
                kind: Some(kind.clone()),
                name: Some(name.clone()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.series.lock().expect("series lock").map.insert(
            key,
            Seen {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }
}

/// `<object>.<time in hex>`, as kubectl and kube name events, except that an object name too
/// long to leave room for the suffix is shortened and made unique again with a hash of the
/// whole name. Valid (a DNS subdomain of at most 253 characters) for any valid object name.
pub fn event_name(object: &str, now: Timestamp) -> String {
    let suffix = format!("{:x}", now.as_nanosecond().unsigned_abs());
    let room = NAME_LIMIT - 1 - suffix.len();
    if object.len() <= room {
        return format!("{object}.{suffix}");
    }
    let hash = format!("{:08x}", fnv1a(object) as u32);
    // Object names are ASCII; the cut leaves room for `-<hash>`, and trimming keeps the
    // shortened label ending in a letter or digit.
    let mut cut = room - 1 - hash.len();
    while !object.is_char_boundary(cut) {
        cut -= 1;
    }
    let base = object[..cut].trim_end_matches(['-', '.']);
    format!("{base}-{hash}.{suffix}")
}

/// An identifier shortened to `max` bytes (no ellipsis: it is a name, not prose).
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// FNV-1a, 64 bits: a stable hash (std's is randomly seeded per process).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_subdomain(s: &str) -> bool {
        s.len() <= NAME_LIMIT
            && s.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn event_names_are_valid_for_every_valid_object_name() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        assert_eq!(event_name("shop", now), format!("shop.{:x}", now.as_nanosecond()));
        let long_label = "a".repeat(63);
        let names = [
            "x".to_owned(),
            "b".repeat(NAME_LIMIT),
            format!("{long_label}.{long_label}.{long_label}.{}", "d".repeat(61)),
            // Cut right after a dot or a dash.
            format!("{}.{}", "e".repeat(230), "f".repeat(22)),
            format!("{}-{}", "g".repeat(226), "h".repeat(26)),
            format!("{}.{}", "e".repeat(225), "f".repeat(27)),
        ];
        for name in &names {
            assert!(is_dns_subdomain(name), "test input {name}");
            let event = event_name(name, now);
            assert!(is_dns_subdomain(&event), "{event} ({} chars)", event.len());
        }
        // Long names that differ only at the end still get different events.
        let a = event_name(&format!("{}a", "z".repeat(252)), now);
        let b = event_name(&format!("{}b", "z".repeat(252)), now);
        assert_ne!(a, b);
    }
}
