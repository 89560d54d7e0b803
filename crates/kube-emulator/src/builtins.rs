//! The kinds a fresh cluster serves, before any CRD: core `v1` Namespaces, ConfigMaps,
//! Secrets, ServiceAccounts, Events, Services, Endpoints and PersistentVolumeClaims,
//! `events.k8s.io/v1` Events (a view of the core ones), `apps/v1` Deployments, the RBAC kinds,
//! the admission webhook configurations, `networking.k8s.io/v1` NetworkPolicies,
//! `coordination.k8s.io/v1` Leases and `apiextensions.k8s.io/v1` CRDs: what a controller's
//! chart installs. They are stored as given (no schema), with the few defaults clients read.

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
    let mut types = vec![ns, cm, secret, sa, ev, ev2, lease, crd];
    types.extend(workload_types());
    types
}

/// What a controller's chart installs besides CRDs: workloads, networking, RBAC, webhooks.
fn workload_types() -> Vec<ResourceType> {
    use crate::table::Column as C;
    let mut deploy = builtin(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        true,
        vec![
            C::ratio("Ready", ".status.readyReplicas", ".spec.replicas"),
            C::path("Up-to-date", "integer", ".status.updatedReplicas"),
            C::path("Available", "integer", ".status.availableReplicas"),
            C::creation_age(),
        ],
    );
    deploy.short_names = vec!["deploy".into()];
    deploy.categories = vec!["all".into()];
    deploy.status_subresource = true;
    deploy.has_generation = true;
    deploy.special = Special::Deployment;
    let mut svc = builtin(
        "",
        "v1",
        "Service",
        "services",
        true,
        vec![
            C::path("Type", "string", ".spec.type"),
            C::path("Cluster-IP", "string", ".spec.clusterIP"),
            C::path("External-IP", "string", ".spec.externalName"),
            C::service_ports(),
            C::creation_age(),
        ],
    );
    svc.short_names = vec!["svc".into()];
    svc.categories = vec!["all".into()];
    svc.status_subresource = true;
    svc.special = Special::Service;
    let mut ep = builtin(
        "",
        "v1",
        "Endpoints",
        "endpoints",
        true,
        vec![C::endpoints(), C::creation_age()],
    );
    ep.short_names = vec!["ep".into()];
    // `Endpoints` is its own list's singular, as on a real apiserver.
    ep.list_kind = "EndpointsList".into();
    let mut pvc = builtin(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
        vec![
            C::path("Status", "string", ".status.phase"),
            C::path("Volume", "string", ".spec.volumeName"),
            C::path("StorageClass", "string", ".spec.storageClassName"),
            C::creation_age(),
        ],
    );
    pvc.short_names = vec!["pvc".into()];
    pvc.status_subresource = true;
    let rbac = "rbac.authorization.k8s.io";
    let created_at = || vec![C::path("Created At", "date", ".metadata.creationTimestamp")];
    let cluster_role = builtin(rbac, "v1", "ClusterRole", "clusterroles", false, created_at());
    let role = builtin(rbac, "v1", "Role", "roles", true, created_at());
    let binding_columns = || vec![C::role_ref(), C::creation_age()];
    let cluster_binding = builtin(
        rbac,
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
        binding_columns(),
    );
    let binding = builtin(rbac, "v1", "RoleBinding", "rolebindings", true, binding_columns());
    let admission = "admissionregistration.k8s.io";
    let hooks = || vec![C::count("Webhooks", &["webhooks"]), C::creation_age()];
    let mut validating = builtin(
        admission,
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        false,
        hooks(),
    );
    validating.has_generation = true;
    let mut mutating = builtin(
        admission,
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
        hooks(),
    );
    mutating.has_generation = true;
    let mut netpol = builtin(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
        vec![
            C::path("Pod-Selector", "string", ".spec.podSelector"),
            C::creation_age(),
        ],
    );
    netpol.short_names = vec!["netpol".into()];
    netpol.has_generation = true;
    vec![
        deploy,
        svc,
        ep,
        pvc,
        cluster_role,
        cluster_binding,
        role,
        binding,
        validating,
        mutating,
        netpol,
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::objects::{PatchKind, State, Subresource, WriteOptions};

    #[test]
    fn a_charts_kinds_are_served_with_their_scopes_and_short_names() {
        let s = State::new(100);
        for (group, plural, namespaced, short) in [
            ("apps", "deployments", true, Some("deploy")),
            ("", "services", true, Some("svc")),
            ("", "endpoints", true, Some("ep")),
            ("", "persistentvolumeclaims", true, Some("pvc")),
            ("rbac.authorization.k8s.io", "clusterroles", false, None),
            ("rbac.authorization.k8s.io", "clusterrolebindings", false, None),
            ("rbac.authorization.k8s.io", "roles", true, None),
            ("rbac.authorization.k8s.io", "rolebindings", true, None),
            (
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                false,
                None,
            ),
            (
                "admissionregistration.k8s.io",
                "mutatingwebhookconfigurations",
                false,
                None,
            ),
            ("networking.k8s.io", "networkpolicies", true, Some("netpol")),
        ] {
            let t = s
                .registry
                .find(group, "v1", plural)
                .unwrap_or_else(|| panic!("{plural}"));
            assert_eq!(t.namespaced, namespaced, "{plural}");
            assert_eq!(t.short_names.first().map(String::as_str), short, "{plural}");
            let gv = if group.is_empty() {
                vec!["api", "v1"]
            } else {
                vec!["apis", group, "v1"]
            };
            let doc = crate::discovery::document(&s.registry, &gv).unwrap().unwrap();
            assert!(doc["resources"].as_array().unwrap().iter().any(|r| r["name"] == plural));
            assert!(crate::openapi::document(&s.registry, group, "v1").is_some(), "{plural}");
        }
    }

    #[test]
    fn deployments_bump_generation_on_spec_changes_and_keep_status_apart() {
        let mut s = State::new(100);
        let deploy = s.registry.find("apps", "v1", "deployments").unwrap();
        let o = WriteOptions::default();
        let body = json!({"metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}},
            "status": {"readyReplicas": 1}});
        let created = s.create(&deploy, "v1", "default", body, o).unwrap().object;
        assert_eq!(created["metadata"]["generation"], 1);
        assert_eq!(created["spec"]["replicas"], 1);
        assert!(created.get("status").is_none());
        let patch = |s: &mut State, p, sub| {
            s.patch(&deploy, "v1", "default", "d", PatchKind::Merge, &p, sub, o)
                .unwrap()
                .object
        };
        let labelled = patch(&mut s, json!({"metadata": {"labels": {"a": "b"}}}), Subresource::Main);
        assert_eq!(labelled["metadata"]["generation"], 1);
        let scaled = patch(&mut s, json!({"spec": {"replicas": 2}}), Subresource::Main);
        assert_eq!(scaled["metadata"]["generation"], 2);
        let status = patch(&mut s, json!({"status": {"readyReplicas": 2}}), Subresource::Status);
        assert_eq!(status["status"]["readyReplicas"], 2);
        assert_eq!(status["metadata"]["generation"], 2);
        let table_cols = &s.registry.find("apps", "v1", "deployments").unwrap().versions[0].columns;
        let t = crate::table::table(table_cols, &[&status], json!({}), crate::table::IncludeObject::None);
        assert_eq!(t["rows"][0]["cells"][1], "2/2");
    }

    #[test]
    fn namespaces_carry_their_name_label_and_services_their_defaults() {
        let mut s = State::new(100);
        let ns = s.registry.find("", "v1", "namespaces").unwrap();
        let o = WriteOptions::default();
        let created = s
            .create(
                &ns,
                "v1",
                "",
                json!({"metadata": {"name": "team-a", "labels": {"x": "y"}}}),
                o,
            )
            .unwrap()
            .object;
        assert_eq!(created["metadata"]["labels"]["kubernetes.io/metadata.name"], "team-a");
        assert_eq!(created["metadata"]["labels"]["x"], "y");
        let default = s.get(&ns, "", "default").unwrap();
        assert_eq!(default["metadata"]["labels"]["kubernetes.io/metadata.name"], "default");

        let svc = s.registry.find("", "v1", "services").unwrap();
        let body = json!({"metadata": {"name": "hook"}, "spec": {"ports": [{"name": "https", "port": 443}]}});
        let created = s.create(&svc, "v1", "default", body, o).unwrap().object;
        assert_eq!(created["spec"]["type"], "ClusterIP");
        assert_eq!(created["spec"]["ports"][0]["targetPort"], 443);
        assert_eq!(created["spec"]["ports"][0]["protocol"], "TCP");
        let ip = created["spec"]["clusterIP"].clone();
        assert!(ip.as_str().is_some_and(|ip| ip.starts_with("10.96.")), "{ip}");
        let put = json!({"metadata": {"name": "hook"}, "spec": {"ports": [{"port": 8443}]}});
        let updated = s
            .update(&svc, "v1", "default", "hook", put, Subresource::Main, o)
            .unwrap()
            .object;
        assert_eq!(updated["spec"]["clusterIP"], ip, "the cluster IP is kept");
    }
}
