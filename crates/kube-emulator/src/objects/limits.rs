//! The apiserver's size limits on what it stores, with its errors.

use serde_json::Value;

use crate::errors::{ApiError, FieldError};

/// The most bytes all of an object's annotations may hold, keys included (the apiserver's
/// `TotalAnnotationSizeLimitB`). kubectl's client-side apply copies the whole object into its
/// `last-applied-configuration` annotation, so this is what limits a `kubectl apply`.
pub const ANNOTATIONS_LIMIT: usize = 256 * 1024;
/// etcd's default `--max-request-bytes` (1.5 MiB): the most a stored object may weigh. The
/// emulator counts the object's JSON; etcd counts its request, a few bytes more.
pub const OBJECT_LIMIT: usize = 1536 * 1024;

/// Annotations over [`ANNOTATIONS_LIMIT`] in all: a 422 on `metadata.annotations`.
pub(super) fn validate_annotations(obj: &Value) -> Option<FieldError> {
    let total: usize = obj["metadata"]["annotations"]
        .as_object()?
        .iter()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    (total > ANNOTATIONS_LIMIT).then(|| FieldError::too_long("metadata.annotations", ANNOTATIONS_LIMIT as u64))
}

/// What etcd refuses to store.
pub(super) fn check_stored_size(obj: &Value) -> Result<(), ApiError> {
    let size = serde_json::to_vec(obj).map_or(0, |v| v.len());
    if size > OBJECT_LIMIT {
        return Err(ApiError::etcd_request_too_large());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::{PatchKind, Subresource, WriteOptions, state_with_crd};

    #[test]
    fn size_limits_are_the_apiservers() {
        let (mut s, wf) = state_with_crd();
        let o = WriteOptions::default();
        let annotated = |bytes: usize| json!({"metadata": {"name": "a", "annotations": {"k": "x".repeat(bytes)}}});
        let e = s
            .create(&wf, "v1", "default", annotated(ANNOTATIONS_LIMIT), o)
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Workflow.lyra.example.com \"a\" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes"
        );
        s.create(&wf, "v1", "default", annotated(ANNOTATIONS_LIMIT - 1), o)
            .unwrap();

        // A big status on an object that fits: etcd refuses the write, the object stays.
        let status = json!({"status": {"phase": "x".repeat(OBJECT_LIMIT)}});
        let e = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &status,
                Subresource::Status,
                o,
            )
            .unwrap_err();
        assert_eq!((e.code, e.reason), (500, ""));
        assert_eq!(e.message, "etcdserver: request is too large");
        assert_eq!(e.to_status().get("reason"), None);
        assert!(s.get(&wf, "default", "a").unwrap().get("status").is_none());
        let cm = s.registry.find("", "v1", "configmaps").unwrap();
        let big = json!({"metadata": {"name": "b"}, "data": {"k": "x".repeat(OBJECT_LIMIT)}});
        assert_eq!(s.create(&cm, "v1", "default", big, o).unwrap_err().code, 500);
        let fits = json!({"metadata": {"name": "b"}, "data": {"k": "x".repeat(OBJECT_LIMIT - 1000)}});
        s.create(&cm, "v1", "default", fits, o).unwrap();
    }
}
