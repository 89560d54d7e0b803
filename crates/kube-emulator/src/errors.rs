//! `metav1.Status` error bodies, worded as a real apiserver words them: kubectl prints the
//! `message` (and, for `Invalid`, rebuilds its lines from `details.causes`), so the wording is
//! part of the contract.

use std::fmt;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A failed request, rendered as a `Status` body with its HTTP code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// What a resource is called in messages: `workflows.lyra.example.com`, or `configmaps` for the
/// core group.
pub fn qualified_resource(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, kind: &str, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": kind });
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// `workflows.lyra.example.com "demo" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} {name:?} not found", qualified_resource(group, plural)),
            )
        }
    }

    /// A path that names no resource the server knows.
    pub fn no_such_path() -> Self {
        ApiError {
            details: Some(json!({})),
            ..Self::new(404, "NotFound", "the server could not find the requested resource")
        }
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", qualified_resource(group, plural)),
            )
        }
    }

    /// A server-side apply changing fields other managers own, worded as the apiserver's.
    pub fn apply_conflicts(group: &str, plural: &str, name: &str, conflicts: &[crate::objects::Conflict]) -> Self {
        let n = conflicts.len();
        let mut by_manager: Vec<(String, Vec<&str>)> = Vec::new();
        for c in conflicts {
            let who = format!("{:?} using {}", c.manager, c.api_version);
            match by_manager.iter_mut().find(|(m, _)| *m == who) {
                Some((_, paths)) => paths.push(&c.path),
                None => by_manager.push((who, vec![&c.path])),
            }
        }
        let parts: Vec<String> = by_manager
            .iter()
            .map(|(who, paths)| match paths.as_slice() {
                [one] => format!("conflict with {who}: {one}"),
                many => format!("conflicts with {who}:\n- {}", many.join("\n- ")),
            })
            .collect();
        let mut d = details(group, plural, name);
        d["causes"] = conflicts
            .iter()
            .map(|c| {
                json!({"reason": "FieldManagerConflict", "field": c.path,
                    "message": format!("conflict with {:?} using {}", c.manager, c.api_version)})
            })
            .collect();
        ApiError {
            details: Some(d),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Apply failed with {n} conflict{}: {}",
                    if n == 1 { "" } else { "s" },
                    parts.join("\n")
                ),
            )
        }
    }

    /// The optimistic-concurrency failure (stale `resourceVersion` or failed precondition).
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: {why}",
                    qualified_resource(group, plural)
                ),
            )
        }
    }

    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per field error; `kind` is the object's Kind (`Workflow`).
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let aggregate = match errors {
            [] => String::new(),
            [one] => format!(": {one}"),
            many => format!(
                ": [{}]",
                many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.kind.cause_type(), "message": e.body(), "field": e.field }))
            .collect();
        let mut d = details(group, kind, name);
        d["causes"] = Value::Array(causes);
        ApiError {
            details: Some(d),
            ..Self::new(
                422,
                "Invalid",
                format!("{qualified_kind} {name:?} is invalid{aggregate}"),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// The wording kubectl shows for a strategic merge patch of a custom resource.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }

    /// A request body over the apiserver's limit (`MaxRequestBodyBytes`, 3 MiB).
    pub fn request_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// An object over etcd's request limit: the storage error passes through as an
    /// unclassified 500 (no reason), so kubectl prints `Error from server: <message>`.
    pub fn etcd_request_too_large() -> Self {
        Self::new(500, "", "etcdserver: request is too large")
    }

    /// A watch from a `resourceVersion` the event log no longer holds.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // `reason` is omitted when unknown (Go's `omitempty`).
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            code,
            [("content-type", "application/json")],
            self.to_status().to_string(),
        )
            .into_response()
    }
}

/// The kinds of `field.Error` the apiserver reports for schema violations.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    /// The allowed values, for an `enum` violation.
    NotSupported(Vec<Value>),
    TooLong(u64),
    TooMany(u64),
    /// A CEL rule with `reason: FieldValueForbidden`.
    Forbidden,
}

impl FieldErrorKind {
    fn cause_type(&self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported(_) => "FieldValueNotSupported",
            FieldErrorKind::TooLong(_) => "FieldValueTooLong",
            FieldErrorKind::TooMany(_) => "FieldValueTooMany",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
        }
    }
}

/// One violation at one field path (`spec.replicas`, `spec.items[0].name`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    /// The offending value as the apiserver shows it (already formatted).
    pub value: String,
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Required,
            field: field.into(),
            value: String::new(),
            detail: detail.into(),
        }
    }

    /// `Too long: may not be more than <max> bytes` (the value is not shown).
    pub fn too_long(field: impl Into<String>, max: u64) -> Self {
        FieldError {
            kind: FieldErrorKind::TooLong(max),
            field: field.into(),
            value: String::new(),
            detail: String::new(),
        }
    }

    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Invalid,
            field: field.into(),
            value: show_value(value),
            detail: detail.into(),
        }
    }

    /// The text after `field: ` (what a `Status` cause carries as `message`).
    pub fn body(&self) -> String {
        let mut s = match &self.kind {
            FieldErrorKind::Required => "Required value".to_string(),
            FieldErrorKind::Invalid => format!("Invalid value: {}", self.value),
            FieldErrorKind::NotSupported(allowed) => {
                let allowed: Vec<String> = allowed.iter().map(show_value).collect();
                format!(
                    "Unsupported value: {}: supported values: {}",
                    self.value,
                    allowed.join(", ")
                )
            }
            FieldErrorKind::TooLong(max) => format!("Too long: may not be more than {max} bytes"),
            FieldErrorKind::TooMany(max) => format!("Too many: {}: must have at most {max} items", self.value),
            FieldErrorKind::Forbidden => "Forbidden".to_string(),
        };
        if !self.detail.is_empty() && !matches!(self.kind, FieldErrorKind::NotSupported(_)) {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Values in messages: strings quoted, scalars bare, containers by type name (as Go prints them
/// after the apiserver's truncation).
pub fn show_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_message_has_field_paths_like_the_apiserver() {
        let e = ApiError::invalid(
            "lyra.example.com",
            "Workflow",
            "demo",
            &[FieldError::invalid(
                "spec.replicas",
                &json!(20),
                "spec.replicas in body should be less than or equal to 10",
            )],
        );
        assert_eq!(
            e.message,
            "Workflow.lyra.example.com \"demo\" is invalid: spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10"
        );
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][0]["field"], "spec.replicas");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueInvalid");
    }

    #[test]
    fn not_found_names_the_qualified_resource() {
        assert_eq!(
            ApiError::not_found("lyra.example.com", "workflows", "demo").message,
            "workflows.lyra.example.com \"demo\" not found"
        );
        assert_eq!(
            ApiError::not_found("", "configmaps", "x").message,
            "configmaps \"x\" not found"
        );
    }
}
