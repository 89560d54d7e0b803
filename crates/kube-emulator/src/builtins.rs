//! The kinds a fresh cluster serves, before any CRD: core `v1` Namespaces, ConfigMaps,
//! Secrets, ServiceAccounts and Events, `events.k8s.io/v1` Events (a view of the core ones),
//! `coordination.k8s.io/v1` Leases and `apiextensions.k8s.io/v1` CRDs.

use crate::registry::{ResourceType, Special, Storage, Version};
use crate::table::Column;

fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    columns: Vec<Column>,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        short_names: Vec::new(),
        categories: Vec::new(),
        namespaced,
        versions: vec![Version {
            name: version.into(),
            schema: None,
            openapi: None,
            rules: None,
            columns,
        }],
        status_subresource: false,
        has_generation: false,
        crd_uid: None,
        special: Special::None,
        storage: Storage::Own,
    }
}

pub fn builtin_types() -> Vec<ResourceType> {
    use crate::table::Column as C;
    let mut ns = builtin(
        "",
        "v1",
        "Namespace",
        "namespaces",
        false,
        vec![C::path("Status", "string", ".status.phase"), C::creation_age()],
    );
    ns.short_names = vec!["ns".into()];
    ns.status_subresource = true;
    ns.special = Special::Namespace;
    let mut cm = builtin(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        true,
        vec![C::count("Data", &["data", "binaryData"]), C::creation_age()],
    );
    cm.short_names = vec!["cm".into()];
    let mut secret = builtin(
        "",
        "v1",
        "Secret",
        "secrets",
        true,
        vec![
            C::path("Type", "string", ".type"),
            C::count("Data", &["data"]),
            C::creation_age(),
        ],
    );
    secret.special = Special::Secret;
    let mut sa = builtin(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        true,
        vec![C::count("Secrets", &["secrets"]), C::creation_age()],
    );
    sa.short_names = vec!["sa".into()];
    let mut ev = builtin(
        "",
        "v1",
        "Event",
        "events",
        true,
        vec![
            C::event_last_seen(),
            C::path("Type", "string", ".type"),
            C::path("Reason", "string", ".reason"),
            C::involved_object("Object", "involvedObject"),
            C::path("Message", "string", ".message"),
            C::wide_name(),
        ],
    );
    ev.short_names = vec!["ev".into()];
    let mut ev2 = builtin(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        true,
        vec![
            C::event_last_seen(),
            C::path("Type", "string", ".type"),
            C::path("Reason", "string", ".reason"),
            C::involved_object("Object", "regarding"),
            C::path("Message", "string", ".note"),
            C::wide_name(),
        ],
    );
    ev2.short_names = vec!["ev".into()];
    ev2.storage = Storage::CoreEvents;
    let lease = builtin(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        true,
        vec![C::path("Holder", "string", ".spec.holderIdentity"), C::creation_age()],
    );
    let mut crd = builtin(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        vec![C::path("Created At", "date", ".metadata.creationTimestamp")],
    );
    crd.short_names = vec!["crd".into(), "crds".into()];
    crd.status_subresource = true;
    crd.has_generation = true;
    crd.special = Special::Crd;
    vec![ns, cm, secret, sa, ev, ev2, lease, crd]
}
