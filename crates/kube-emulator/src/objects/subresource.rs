//! The status subresource: a kind that declares it takes `.status` only through `/status`,
//! and its main endpoint ignores `.status` (as a real apiserver does for custom resources).

use serde_json::Value;

use crate::registry::{ResourceType, Special};

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

/// Whether the main endpoint of `rt` leaves `.status` alone: kinds with the subresource,
/// but Namespaces and CRDs, whose status the server itself sets on every write.
pub(super) fn status_is_separate(rt: &ResourceType) -> bool {
    rt.status_subresource && !matches!(rt.special, Special::Namespace | Special::Crd)
}

/// `to` with the status of `from` (none, if `from` has none).
pub(super) fn copy_status(from: &Value, to: &mut Value) {
    match from.get("status") {
        Some(s) => to["status"] = s.clone(),
        None => {
            to.as_object_mut().map(|m| m.remove("status"));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::objects::{PatchKind, Subresource, WriteOptions, state_with_crd};

    #[test]
    fn generation_moves_only_with_the_spec_and_status_only_through_its_subresource() {
        let (mut s, wf) = state_with_crd();
        let o = WriteOptions::default();
        let created = s
            .create(
                &wf,
                "v1",
                "default",
                json!({"metadata": {"name": "a"}, "spec": {"replicas": 1}, "status": {"phase": "x"}}),
                o,
            )
            .unwrap();
        assert_eq!(created.object["metadata"]["generation"], 1);
        assert!(created.object.get("status").is_none());
        let labelled = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"metadata": {"labels": {"k": "v"}}}),
                Subresource::Main,
                o,
            )
            .unwrap();
        assert_eq!(labelled.object["metadata"]["generation"], 1);
        let status = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"status": {"phase": "Ready"}, "spec": {"replicas": 4}}),
                Subresource::Status,
                o,
            )
            .unwrap();
        assert_eq!(status.object["status"]["phase"], "Ready");
        assert_eq!(status.object["spec"]["replicas"], 1);
        let spec = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"spec": {"replicas": 2}, "status": null}),
                Subresource::Main,
                o,
            )
            .unwrap();
        assert_eq!(spec.object["metadata"]["generation"], 2);
        assert_eq!(spec.object["status"]["phase"], "Ready");
        let rv = spec.object["metadata"]["resourceVersion"].clone();
        let again = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"spec": {"replicas": 2}}),
                Subresource::Main,
                o,
            )
            .unwrap();
        assert_eq!(
            again.object["metadata"]["resourceVersion"], rv,
            "a no-op patch writes nothing"
        );
        let invalid = s
            .patch(
                &wf,
                "v1",
                "default",
                "a",
                PatchKind::Merge,
                &json!({"spec": {"replicas": 9}}),
                Subresource::Main,
                o,
            )
            .unwrap_err();
        assert_eq!(invalid.code, 422);
    }
}
