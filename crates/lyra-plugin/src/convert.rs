//! Conversions between `lyra_core` values and the protocol's messages.

use lyra_core::provider::{OpContext, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::Type;
use lyra_core::value::Map;

use crate::proto;

pub(crate) fn schema_to_proto(s: &ResourceSchema) -> proto::ResourceSchema {
    proto::ResourceSchema {
        name: s.name.clone(),
        doc: s.doc.clone(),
        attributes: s
            .attributes
            .iter()
            .map(|a| proto::AttributeSchema {
                name: a.name.clone(),
                r#type: a.ty.to_string(),
                doc: a.doc.clone(),
                required: a.required,
                provided: a.provided,
                computed: a.computed,
                immutable: a.immutable,
                sensitive: a.sensitive,
            })
            .collect(),
    }
}

pub(crate) fn schema_from_proto(s: proto::ResourceSchema) -> Result<ResourceSchema, String> {
    let mut attributes = Vec::with_capacity(s.attributes.len());
    for a in s.attributes {
        let ty = Type::parse(&a.r#type).map_err(|e| format!("{}.{}: bad type {:?}: {e}", s.name, a.name, a.r#type))?;
        let mut attr = AttributeSchema::new(&a.name, ty).doc(&a.doc);
        attr.required = a.required;
        attr.provided = a.provided || a.computed;
        attr.computed = a.computed;
        attr.immutable = a.immutable;
        attr.sensitive = a.sensitive;
        attributes.push(attr);
    }
    Ok(ResourceSchema::new(&s.name, attributes).doc(&s.doc))
}

pub(crate) fn to_json(m: &Map) -> Vec<u8> {
    // A map of JSON values always serialises.
    serde_json::to_vec(m).unwrap_or_else(|_| b"{}".to_vec())
}

/// A JSON object; empty bytes are the empty object.
pub(crate) fn from_json(bytes: &[u8]) -> Result<Map, serde_json::Error> {
    if bytes.is_empty() {
        return Ok(Map::new());
    }
    serde_json::from_slice(bytes)
}

pub(crate) fn context_to_proto(cx: &OpContext<'_>) -> proto::Context {
    proto::Context {
        deployment: cx.deployment.to_owned(),
        step_id: cx.step_id.to_owned(),
        type_name: cx.type_name.to_owned(),
        idempotency_key: cx.idempotency_key.map(str::to_owned),
        config: to_json(cx.config),
    }
}

pub(crate) fn error_to_proto(e: ProviderError) -> proto::Error {
    use proto::error::Kind;
    let message = e.to_string();
    let (kind, attribute, external_id, message) = match e {
        ProviderError::NotFound { external_id, .. } => (Kind::NotFound, String::new(), external_id, message),
        ProviderError::InvalidValue { attribute, message } => (Kind::Invalid, attribute, String::new(), message),
        ProviderError::Config(m) => (Kind::Config, String::new(), String::new(), m),
        ProviderError::Cancelled => (Kind::Cancelled, String::new(), String::new(), message),
        ProviderError::TimedOut(_) => (Kind::Retryable, String::new(), String::new(), message),
        ProviderError::Other(m) => (Kind::Other, String::new(), String::new(), m),
    };
    proto::Error {
        kind: kind as i32,
        attribute,
        message,
        external_id,
    }
}

pub(crate) fn error_from_proto(e: proto::Error, type_name: &str) -> ProviderError {
    use proto::error::Kind;
    match e.kind() {
        Kind::NotFound => ProviderError::NotFound {
            type_name: type_name.to_owned(),
            external_id: e.external_id,
        },
        Kind::Invalid => ProviderError::InvalidValue {
            attribute: e.attribute,
            message: e.message,
        },
        Kind::Config => ProviderError::Config(e.message),
        Kind::Cancelled => ProviderError::Cancelled,
        Kind::Other | Kind::Retryable => ProviderError::Other(e.message),
    }
}
