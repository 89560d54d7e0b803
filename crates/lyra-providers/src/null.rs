//! `Null::Resource`: a resource that exists only in the engine's state, like Terraform's
//! `terraform_data`.
//!
//! `output` echoes `input`, so a workflow can pass values through a resource step, and a change
//! of `triggers_replace` replaces the resource. Nothing is stored anywhere else, which makes it
//! cheap enough for the engine's large benchmarks: every operation is a map clone at most.

use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::Type;
use lyra_core::value::{Map, Value};

/// The canonical type name.
pub const RESOURCE: &str = "Null::Resource";

/// The provider of `Null::Resource`.
#[derive(Debug, Clone, Default)]
pub struct NullProvider;

impl NullProvider {
    pub fn new() -> Self {
        NullProvider
    }
}

/// `desired` plus `output`, the echo of `input`.
fn echo(desired: &Map) -> Map {
    let mut actual = desired.clone();
    let output = desired.get("input").cloned().unwrap_or(Value::Null);
    actual.insert("output".to_owned(), output);
    actual
}

#[async_trait]
impl Provider for NullProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![
            ResourceSchema::new(
                RESOURCE,
                vec![
                    AttributeSchema::new("input", Type::Any),
                    AttributeSchema::new("output", Type::Any).computed(),
                    AttributeSchema::new("triggers_replace", Type::Any).immutable(),
                ],
            )
            .local()
            .read_is_record(),
        ]
    }

    async fn create(&self, _cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        Ok(Created {
            external_id: crate::random_hex_id("null"),
            actual: echo(desired),
        })
    }

    async fn read(
        &self,
        _cx: &OpContext<'_>,
        _external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        // The engine's state is the only record, so what it last saw is what exists.
        Ok(prior.cloned())
    }

    async fn update(
        &self,
        _cx: &OpContext<'_>,
        _external_id: &str,
        desired: &Map,
        _prior: &Map,
    ) -> Result<Map, ProviderError> {
        Ok(echo(desired))
    }

    async fn delete(&self, _cx: &OpContext<'_>, _external_id: &str, _prior: &Map) -> Result<(), ProviderError> {
        Ok(())
    }

    /// Always `Absent`, and truthfully so: a Null::Resource is nothing but its record in the engine's
    /// state, so a create whose result was never recorded left nothing behind to find, and
    /// creating again makes no duplicate.
    async fn lookup(&self, _cx: &OpContext<'_>, _desired: &Map) -> Result<Lookup, ProviderError> {
        Ok(Lookup::Absent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cx() -> OpContext<'static> {
        crate::test_support::cx(RESOURCE)
    }

    use crate::test_support::map;

    #[tokio::test]
    async fn create_and_update_echo_input() {
        let p = NullProvider::new();
        let desired = map(json!({"input": {"a": [1, 2]}, "triggers_replace": "x"}));
        let created = p.create(&cx(), &desired).await.unwrap();
        assert!(created.external_id.starts_with("null-"), "{}", created.external_id);
        assert_eq!(
            Value::Object(created.actual.clone()),
            json!({"input": {"a": [1, 2]}, "triggers_replace": "x", "output": {"a": [1, 2]}})
        );

        let desired = map(json!({"input": "new"}));
        let updated = p
            .update(&cx(), &created.external_id, &desired, &created.actual)
            .await
            .unwrap();
        assert_eq!(Value::Object(updated), json!({"input": "new", "output": "new"}));

        // No input: the output is null rather than missing, so it can still be referenced.
        let created = p.create(&cx(), &Map::new()).await.unwrap();
        assert_eq!(Value::Object(created.actual), json!({"output": null}));
    }

    #[tokio::test]
    async fn read_returns_prior_and_delete_always_succeeds() {
        let p = NullProvider::new();
        let prior = map(json!({"input": 1, "output": 1}));
        assert_eq!(
            p.read(&cx(), "null-1", Some(&prior)).await.unwrap(),
            Some(prior.clone())
        );
        assert_eq!(p.read(&cx(), "null-1", None).await.unwrap(), None);
        p.delete(&cx(), "null-1", &prior).await.unwrap();
    }

    #[test]
    fn schema_marks_output_provided_and_triggers_immutable() {
        let schema = &NullProvider::new().schemas()[0];
        assert!(schema.attribute("output").unwrap().provided);
        assert!(schema.attribute("triggers_replace").unwrap().immutable);
        assert!(schema.read_is_record, "its read is `prior.cloned()`");
        assert!(!schema.attribute("input").unwrap().immutable);
    }

    #[tokio::test]
    async fn lookup_finds_nothing_outside_the_state() {
        let p = NullProvider::new();
        let cx = cx();
        assert!(matches!(p.lookup(&cx, &Map::new()).await.unwrap(), Lookup::Absent));
        // Even right after a create for the same key: there is nowhere it could be found.
        p.create(&cx, &Map::new()).await.unwrap();
        assert!(matches!(p.lookup(&cx, &Map::new()).await.unwrap(), Lookup::Absent));
    }
}
