//! The emulator as an API server for charts and admission webhooks, driven by the real
//! kubectl and helm: the controller chart's objects accepted by helm 3 and 4 (install,
//! upgrade, uninstall with its protobuf deletes), validating webhooks reviewing kubectl's
//! writes (a TLS webhook server of the test's own, its CA made with rcgen), and the audit
//! of requests per user.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use integration_tests::kubectl::{Kubectl, kubectl_or_skip};
use integration_tests::tools::tool_or_skip;
use integration_tests::webhook::{Hook, response};
use integration_tests::{Value, workspace_dir};
use kube_emulator::BlockingKubeEmulator;
use serde_json::json;

/// A ValidatingWebhookConfiguration of one webhook on ConfigMaps, at `hook.webhooks.svc`.
fn configuration(hook: &Hook, operations: &str, extra: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: cms
webhooks:
- name: cms.example.com
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig:
    service: {{namespace: webhooks, name: hook, path: /validate}}
    caBundle: {}
  rules:
  - apiGroups: ['']
    apiVersions: [v1]
    operations: [{operations}]
    resources: [configmaps]
{extra}",
        hook.ca_bundle()
    )
}

/// The webhook's Service and the Endpoints routing it to the local server on `port`.
fn route(kubectl: &Kubectl, port: u16) {
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: webhooks\n---\n\
             apiVersion: v1\nkind: Service\nmetadata:\n  name: hook\n  namespace: webhooks\n\
             spec:\n  ports:\n  - name: https\n    port: 443\n    targetPort: https\n---\n\
             apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: hook\n  namespace: webhooks\n\
             subsets:\n- addresses:\n  - ip: 127.0.0.1\n  ports:\n  - name: https\n    port: {port}\n"
        ),
    );
}

fn cm(name: &str, data: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\ndata:\n  {data}\n")
}

#[test]
fn kubectl_writes_are_reviewed_by_a_validating_webhook() {
    let Some(bin) = kubectl_or_skip("kubectl_writes_are_reviewed_by_a_validating_webhook") else {
        return;
    };
    let emu = BlockingKubeEmulator::start().expect("start the emulator");
    let kubectl = Kubectl::new(bin, emu.kubeconfig_path());
    let hook = Hook::start("hook.webhooks.svc", |review| {
        if review["request"]["object"]["data"]["verdict"] == "deny" {
            response(
                review,
                false,
                json!({"status": {"code": 403, "message": "verdict is deny"}}),
            )
        } else {
            response(review, true, json!({"warnings": ["reviewed by cms"]}))
        }
    });
    route(&kubectl, hook.port);
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(&hook, "CREATE, UPDATE, DELETE", ""),
    );

    // A refused create prints the webhook's words and stores nothing.
    let refused = kubectl.fails_stdin(&["apply", "-f", "-"], &cm("refused", "verdict: deny"));
    assert!(
        refused.contains("admission webhook \"cms.example.com\" denied the request: verdict is deny"),
        "{refused}"
    );
    assert!(kubectl.run(&["get", "cm", "refused"]).stderr.contains("NotFound"));

    // An allowed one passes, with the webhook's warning.
    let out = kubectl.run_with_stdin(&["apply", "-f", "-"], Some(&cm("allowed", "verdict: ok")));
    assert!(out.success, "{}", out.stderr);
    assert!(out.stderr.contains("Warning: reviewed by cms"), "{}", out.stderr);
    assert_eq!(hook.last()["operation"], "CREATE");
    assert_eq!(hook.last()["object"]["data"]["verdict"], "ok");

    // An update to a refused state is refused, and the stored object is unchanged.
    let refused = kubectl.fails_stdin(&["apply", "-f", "-"], &cm("allowed", "verdict: deny"));
    assert!(refused.contains("verdict is deny"), "{refused}");
    assert_eq!(hook.last()["operation"], "UPDATE");
    assert_eq!(hook.last()["oldObject"]["data"]["verdict"], "ok");
    assert_eq!(
        kubectl.ok(&["get", "cm", "allowed", "-o", "jsonpath={.data.verdict}"]),
        "ok"
    );

    // A delete is reviewed with the object as oldObject.
    kubectl.ok(&["delete", "cm", "allowed"]);
    let review = hook.last();
    assert_eq!(review["operation"], "DELETE");
    assert!(review["object"].is_null());
    assert_eq!(review["oldObject"]["metadata"]["name"], "allowed");
    assert_eq!(review["userInfo"]["username"], kube_emulator::ANONYMOUS_ADMIN);
}

#[test]
fn a_webhook_that_cannot_be_called_blocks_under_fail_and_not_under_ignore() {
    let Some(bin) = kubectl_or_skip("a_webhook_that_cannot_be_called_blocks_under_fail_and_not_under_ignore") else {
        return;
    };
    let emu = BlockingKubeEmulator::start().expect("start the emulator");
    let kubectl = Kubectl::new(bin, emu.kubeconfig_path());
    let hook = Hook::start("hook.webhooks.svc", |review| response(review, true, json!({})));
    // Nothing listens on the endpoint's port.
    let down = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    route(&kubectl, down);
    kubectl.ok_stdin(&["apply", "-f", "-"], &configuration(&hook, "CREATE", ""));
    let refused = kubectl.fails_stdin(&["apply", "-f", "-"], &cm("a", "k: v"));
    assert!(
        refused.contains(
            "Internal error occurred: failed calling webhook \"cms.example.com\": failed to call webhook: \
             Post \"https://hook.webhooks.svc:443/validate?timeout=10s\""
        ),
        "{refused}"
    );
    assert!(kubectl.run(&["get", "cm", "a"]).stderr.contains("NotFound"));

    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(&hook, "CREATE", "  failurePolicy: Ignore\n"),
    );
    kubectl.ok_stdin(&["apply", "-f", "-"], &cm("a", "k: v"));
    kubectl.ok(&["get", "cm", "a"]);
    assert!(hook.reviews().is_empty());

    // Up, but with a certificate another CA signed: TLS fails.
    let other = Hook::start("hook.webhooks.svc", |review| response(review, true, json!({})));
    route(&kubectl, other.port);
    kubectl.ok_stdin(&["apply", "-f", "-"], &configuration(&hook, "CREATE", ""));
    let refused = kubectl.fails_stdin(&["apply", "-f", "-"], &cm("b", "k: v"));
    assert!(refused.contains("failed calling webhook"), "{refused}");
    assert!(refused.contains("invalid peer certificate"), "{refused}");
    assert!(other.reviews().is_empty());

    // The right CA, but too slow for its timeout.
    let slow = Hook::start("hook.webhooks.svc", |review| {
        std::thread::sleep(Duration::from_secs(4));
        response(review, true, json!({}))
    });
    route(&kubectl, slow.port);
    let config = configuration(&slow, "CREATE", "  timeoutSeconds: 1\n");
    kubectl.ok_stdin(&["apply", "-f", "-"], &config);
    let started = Instant::now();
    let refused = kubectl.fails_stdin(&["apply", "-f", "-"], &cm("c", "k: v"));
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert!(
        refused.contains("?timeout=1s\": context deadline exceeded"),
        "{refused}"
    );
}

#[test]
fn a_namespace_selector_limits_the_reviews_to_its_namespaces() {
    let Some(bin) = kubectl_or_skip("a_namespace_selector_limits_the_reviews_to_its_namespaces") else {
        return;
    };
    let emu = BlockingKubeEmulator::start().expect("start the emulator");
    let kubectl = Kubectl::new(bin, emu.kubeconfig_path());
    let hook = Hook::start("hook.webhooks.svc", |review| {
        response(review, false, json!({"status": {"message": "watched"}}))
    });
    route(&kubectl, hook.port);
    kubectl.ok(&["create", "namespace", "team-a"]);
    kubectl.ok(&["create", "namespace", "team-b"]);
    let selector = "  namespaceSelector:\n    matchExpressions:\n    - key: kubernetes.io/metadata.name\n      \
                    operator: In\n      values: [team-a]\n";
    kubectl.ok_stdin(&["apply", "-f", "-"], &configuration(&hook, "CREATE", selector));
    let refused = kubectl.fails(&["create", "configmap", "x", "-n", "team-a"]);
    assert!(refused.contains("denied the request: watched"), "{refused}");
    kubectl.ok(&["create", "configmap", "x", "-n", "team-b"]);
    assert_eq!(hook.reviews().len(), 1);
    assert_eq!(hook.last()["namespace"], "team-a");
}

#[test]
fn kubectl_requests_are_recorded_for_the_user_they_act_as() {
    let Some(bin) = kubectl_or_skip("kubectl_requests_are_recorded_for_the_user_they_act_as") else {
        return;
    };
    let emu = BlockingKubeEmulator::start().expect("start the emulator");
    let kubectl = Kubectl::new(bin, emu.kubeconfig_path());
    let sa = "system:serviceaccount:team-a:reader";
    kubectl.ok(&["create", "configmap", "settings", "--from-literal=a=1"]);
    // client-go sends no bearer token over plain HTTP: kubectl names its user with --as.
    kubectl.ok(&["--as", sa, "get", "configmaps", "-n", "default"]);
    kubectl.ok(&["--as", sa, "get", "configmap", "settings", "-o", "name"]);
    let reads: Vec<(String, String, String, String, String)> = emu
        .requests_by(sa)
        .into_iter()
        .filter(|r| r.is_resource_request())
        .map(|r| (r.verb, r.api_group, r.resource, r.namespace, r.name))
        .collect();
    let t = |v: &str, n: &str| {
        (
            v.to_owned(),
            String::new(),
            "configmaps".to_owned(),
            "default".to_owned(),
            n.to_owned(),
        )
    };
    assert_eq!(reads, [t("list", ""), t("get", "settings")]);
    let admin = emu.requests_by(kube_emulator::ANONYMOUS_ADMIN);
    assert!(admin.iter().any(|r| r.verb == "create" && r.resource == "configmaps"));
    // Discovery is recorded too, as non-resource requests with their paths.
    assert!(
        emu.requests_by(sa)
            .iter()
            .any(|r| !r.is_resource_request() && r.path == "/api")
    );
}

/// helm bound to one kubeconfig, with homes of its own.
fn helm(bin: &Path, kubeconfig: &Path, home: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("helm runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "helm {args:?} failed:\n{text}");
    text
}

/// Every object of the controller chart, default and with every option the emulator serves
/// (two replicas, namespaced RBAC, a PVC, a NetworkPolicy), installed, upgraded and
/// uninstalled (helm deletes its release Secrets with protobuf bodies).
fn chart_objects_are_accepted(helm_name: &str) {
    let test = format!("chart_objects_are_accepted_by_{helm_name}");
    let (Some(helm_bin), Some(kubectl_bin)) = (tool_or_skip(&test, helm_name), kubectl_or_skip(&test)) else {
        return;
    };
    let emu = BlockingKubeEmulator::start().expect("start the emulator");
    let kubectl = Kubectl::new(kubectl_bin, emu.kubeconfig_path());
    let home = tempfile::tempdir().expect("a helm home");
    let h = |args: &[&str]| helm(&helm_bin, emu.kubeconfig_path(), home.path(), args);
    let chart = workspace_dir().join("charts/lyra");
    let chart = chart.to_str().expect("UTF-8 path");
    let namespaced = workspace_dir().join("charts/lyra/ci/namespaced-values.yaml");
    let namespaced = namespaced.to_str().expect("UTF-8 path");
    kubectl.ok(&["create", "namespace", "team-a"]);
    kubectl.ok(&["create", "namespace", "team-b"]);
    let variants: [&[&str]; 2] = [
        &["--set", "replicaCount=2"],
        // cert-manager's kinds and the ServiceMonitor are not the emulator's.
        &[
            "-f",
            namespaced,
            "--set",
            "webhook.certManager.enabled=false",
            "--set",
            "metrics.serviceMonitor.enabled=false",
        ],
    ];
    for values in variants {
        let mut install = vec!["install", "lyra", chart, "-n", "lyra-system", "--create-namespace"];
        install.extend(values);
        h(&install);
        let listed = kubectl.ok(&[
            "get",
            "deploy,svc,sa,secret,clusterrole,clusterrolebinding,role,rolebinding,validatingwebhookconfiguration",
            "-A",
            "-l",
            "app.kubernetes.io/instance=lyra",
            "-o",
            "name",
        ]);
        for kind in [
            "deployment.apps/lyra",
            "service/lyra-webhook",
            "clusterrole.rbac.authorization.k8s.io/lyra",
            "validatingwebhookconfiguration.admissionregistration.k8s.io/lyra",
        ] {
            assert!(listed.contains(kind), "{kind} missing:\n{listed}");
        }
        let deploy: Value =
            serde_json::from_str(&kubectl.ok(&["get", "deploy", "-n", "lyra-system", "lyra", "-o", "json"]))
                .expect("JSON");
        let replicas = deploy["spec"]["replicas"].as_i64();
        assert_eq!(replicas, Some(2));
        let wide = kubectl.ok(&["get", "deploy", "-n", "lyra-system"]);
        assert!(wide.contains("0/2"), "{wide}");
        h(&[
            "upgrade",
            "lyra",
            chart,
            "-n",
            "lyra-system",
            "--reuse-values",
            "--set",
            "replicaCount=3",
            "--set",
            "controller.concurrency=3",
        ]);
        let after: Value =
            serde_json::from_str(&kubectl.ok(&["get", "deploy", "-n", "lyra-system", "lyra", "-o", "json"]))
                .expect("JSON");
        assert_eq!(after["spec"]["replicas"], 3);
        // Helm 3 patches strategically: the container, merged by name, has its new args and
        // keeps what the patch left out.
        let container = |d: &Value| d["spec"]["template"]["spec"]["containers"][0].clone();
        assert!(container(&after)["args"].to_string().contains("--concurrency=3"));
        for kept in ["image", "env", "volumeMounts", "ports"] {
            assert_eq!(container(&after)[kept], container(&deploy)[kept], "{kept}");
        }
        assert_eq!(
            after["metadata"]["generation"].as_i64(),
            deploy["metadata"]["generation"].as_i64().map(|g| g + 1)
        );
        let said = h(&["uninstall", "lyra", "-n", "lyra-system"]);
        assert!(said.contains("uninstalled"), "{said}");
        let left = kubectl.ok(&["get", "secrets", "-n", "lyra-system", "-l", "owner=helm", "-o", "name"]);
        assert!(left.trim().is_empty(), "release Secrets left: {left}");
        assert!(
            kubectl
                .run(&["get", "deploy", "-n", "lyra-system", "lyra"])
                .stderr
                .contains("NotFound")
        );
    }
    let ns = kubectl.ok(&["get", "ns", "team-a", "--show-labels"]);
    assert!(ns.contains("kubernetes.io/metadata.name=team-a"), "{ns}");
}

#[test]
fn chart_objects_are_accepted_by_helm_3() {
    chart_objects_are_accepted("helm3");
}

#[test]
fn chart_objects_are_accepted_by_helm_4() {
    chart_objects_are_accepted("helm4");
}
