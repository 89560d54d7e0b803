//! Kubernetes Events about Workflow objects (`events.k8s.io/v1`), for `kubectl describe`.
//!
//! Not kube's `Recorder`, for two reasons. It folds events into a series by reason and action
//! only, so a later `Applied` event kept the first run's note while the status said
//! otherwise; here only a repeat of the very same note joins a series. And it names events
//! `<object>.<time>`, which for long object names exceeds the 253 characters a name may have,
//! so such objects got no events at all; here names are valid for any valid object name.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::reconcile::Note;
use crate::status::clip;

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
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<HashMap<SeriesKey, Seen>>,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// `instance` names this replica (default: the controller's name).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> EventPublisher {
        let instance = instance.unwrap_or_else(|| controller.to_owned());
        EventPublisher {
            client,
            controller: controller.to_owned(),
            instance: cut(&instance, INSTANCE_LIMIT),
            series: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes `note` about `regarding`: a new event, or, for a repeat of the same note
    /// within a few minutes, one more in that event's series.
    pub async fn publish(&self, note: &Note, regarding: &ObjectReference) -> Result<(), kube::Error> {
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
        let seen = {
            let mut series = self.series.lock().expect("series lock");
            let ttl = k8s_openapi::jiff::SignedDuration::try_from(SERIES_TTL).unwrap_or_default();
            series.retain(|_, s| s.last + ttl > now);
            series.get(&key).cloned()
        };
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
                    let mut series = self.series.lock().expect("series lock");
                    series.insert(
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
        self.series.lock().expect("series lock").insert(
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
