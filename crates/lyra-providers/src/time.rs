//! `Time::Sleep`: waits `create_duration` when created and `destroy_duration` when deleted, like
//! Terraform's `time_sleep`. Useful to give something outside the engine time to settle, and to
//! test the engine's parallelism and cancellation.
//!
//! Durations are humane strings (`100ms`, `2s`, `1m30s`). Like `Null::Resource`, nothing is
//! stored outside the engine's state.

use std::time::Duration;

use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};

/// The canonical type name.
pub const SLEEP: &str = "Time::Sleep";

const CREATE_DURATION: &str = "create_duration";
const DESTROY_DURATION: &str = "destroy_duration";

/// The provider of `Time::Sleep`.
#[derive(Debug, Clone, Default)]
pub struct TimeProvider;

impl TimeProvider {
    pub fn new() -> Self {
        TimeProvider
    }
}

/// The duration in `attribute` of `state`; absent or null means no wait.
fn duration(state: &Map, attribute: &str) -> Result<Duration, ProviderError> {
    let invalid = |message: String| ProviderError::InvalidValue {
        attribute: attribute.to_owned(),
        message,
    };
    match state.get(attribute) {
        None | Some(Value::Null) => Ok(Duration::ZERO),
        // The message quotes the value whole and nothing of the parser's detail, which quotes
        // pieces of it: the engine can mask a value it knows is secret, not a piece of one.
        Some(Value::String(s)) => humantime::parse_duration(s.trim())
            .map_err(|_| invalid(format!("'{s}' is not a duration such as 100ms, 2s or 1m30s"))),
        Some(other) => Err(invalid(format!(
            "expects a duration string such as 2s, got {}",
            kind_of(other)
        ))),
    }
}

/// Checks both durations, so that a bad `destroy_duration` fails the create or update that
/// records it rather than the delete, much later.
fn check_durations(desired: &Map) -> Result<Duration, ProviderError> {
    let create = duration(desired, CREATE_DURATION)?;
    duration(desired, DESTROY_DURATION)?;
    Ok(create)
}

#[async_trait]
impl Provider for TimeProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![ResourceSchema::new(
            SLEEP,
            vec![
                AttributeSchema::new(CREATE_DURATION, Type::optional(Type::String)),
                AttributeSchema::new(DESTROY_DURATION, Type::optional(Type::String)),
                AttributeSchema::new("triggers", Type::Any).immutable(),
            ],
        )]
    }

    async fn create(&self, _cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let wait = check_durations(desired)?;
        tokio::time::sleep(wait).await;
        Ok(Created {
            external_id: crate::random_hex_id("sleep"),
            actual: desired.clone(),
        })
    }

    async fn read(
        &self,
        _cx: &OpContext<'_>,
        _external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        Ok(prior.cloned())
    }

    async fn update(
        &self,
        _cx: &OpContext<'_>,
        _external_id: &str,
        desired: &Map,
        _prior: &Map,
    ) -> Result<Map, ProviderError> {
        // Only the durations can change in place, and they matter at create and delete only.
        check_durations(desired)?;
        Ok(desired.clone())
    }

    async fn delete(&self, _cx: &OpContext<'_>, _external_id: &str, prior: &Map) -> Result<(), ProviderError> {
        tokio::time::sleep(duration(prior, DESTROY_DURATION)?).await;
        Ok(())
    }

    /// Always `Absent`, and truthfully so: a Time::Sleep is nothing but its record in the engine's
    /// state, so a create whose result was never recorded left nothing behind to find, and
    /// creating again makes no duplicate.
    async fn lookup(&self, _cx: &OpContext<'_>, _desired: &Map) -> Result<Lookup, ProviderError> {
        Ok(Lookup::Absent)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use serde_json::json;

    fn cx() -> OpContext<'static> {
        crate::test_support::cx(SLEEP)
    }

    use crate::test_support::map;

    #[test]
    fn parses_humane_durations() {
        let d = |s: &str| duration(&map(json!({ "create_duration": s })), CREATE_DURATION);
        assert_eq!(d("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(d("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(d("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(duration(&Map::new(), CREATE_DURATION).unwrap(), Duration::ZERO);
        assert!(d("soon").is_err());
        assert!(d("5").is_err(), "a bare number has no unit");
    }

    #[tokio::test]
    async fn create_and_delete_sleep_for_their_durations() {
        let p = TimeProvider::new();
        let desired = map(json!({"create_duration": "150ms", "destroy_duration": "100ms", "triggers": {"v": 1}}));

        let start = Instant::now();
        let created = p.create(&cx(), &desired).await.unwrap();
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(150), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
        assert!(created.external_id.starts_with("sleep-"), "{}", created.external_id);
        assert_eq!(created.actual, desired);

        let start = Instant::now();
        p.delete(&cx(), &created.external_id, &created.actual).await.unwrap();
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }

    #[tokio::test]
    async fn update_does_not_sleep_and_read_returns_prior() {
        let p = TimeProvider::new();
        let desired = map(json!({"create_duration": "1h"}));
        let start = Instant::now();
        assert_eq!(
            p.update(&cx(), "sleep-1", &desired, &Map::new()).await.unwrap(),
            desired
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(
            p.read(&cx(), "sleep-1", Some(&desired)).await.unwrap(),
            Some(desired.clone())
        );
        assert_eq!(p.read(&cx(), "sleep-1", None).await.unwrap(), None);
    }

    #[tokio::test]
    async fn bad_durations_are_invalid_values() {
        let p = TimeProvider::new();
        let err = p
            .create(&cx(), &map(json!({"create_duration": "3forever"})))
            .await
            .unwrap_err();
        match err {
            ProviderError::InvalidValue { attribute, message } => {
                assert_eq!(attribute, "create_duration");
                assert!(message.starts_with("'3forever' is not a duration"), "{message}");
                assert_eq!(message.matches("forever").count(), 1, "no piece of it again: {message}");
            }
            other => panic!("unexpected error {other:?}"),
        }
        let err = p.create(&cx(), &map(json!({"destroy_duration": 3}))).await.unwrap_err();
        assert!(
            matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == DESTROY_DURATION),
            "{err:?}"
        );
        let err = p
            .delete(&cx(), "sleep-1", &map(json!({"destroy_duration": "x"})))
            .await
            .unwrap_err();
        assert!(matches!(err, ProviderError::InvalidValue { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn lookup_finds_nothing_outside_the_state() {
        let p = TimeProvider::new();
        let cx = cx();
        assert!(matches!(p.lookup(&cx, &Map::new()).await.unwrap(), Lookup::Absent));
        // Even right after a create for the same key: there is nowhere it could be found.
        p.create(&cx, &Map::new()).await.unwrap();
        assert!(matches!(p.lookup(&cx, &Map::new()).await.unwrap(), Lookup::Absent));
    }
}
