//! The admission webhook (issue 12): the controller's chart installed with real helm, one
//! replica started from the Deployment helm created, and real kubectl refused at `apply` for
//! every Workflow the engine's validator refuses, with the engine's own words. A valid one
//! passes and goes Ready; with the controller down, deletes still go through.

use std::time::Duration;

use integration_tests::controller_bin;
use integration_tests::helm::{CONTROLLER_USER, ChartCluster};
use integration_tests::kubectl::Kubectl;
use integration_tests::pod::PodProcess;
use integration_tests::wait_until;

/// A workflow with a typed parameter, on the controller's load path as `shop::web`.
const WEB: &str = "\
parameters:
  replicas: {type: 'Integer[1, 10]', lookup: replicas}
returns: [echo]
steps:
  web:
    returns:
      echo: output
    resource: Null::Resource
    value:
      input: $replicas
";

/// Valid YAML, but its two steps wait for each other: `bad::cycle`.
const CYCLE: &str = "\
steps:
  web:
    returns:
      webID: output
    resource: Null::Resource
    value:
      input: $lbID
  lb:
    returns:
      lbID: output
    resource: Null::Resource
    value:
      input: $webID
";

fn workflow(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{spec}"
    )
}

/// `kubectl apply` of `manifest` is refused by the webhook; what kubectl said.
#[track_caller]
fn refused(kubectl: &Kubectl, manifest: &str) -> String {
    let said = kubectl.fails_stdin(&["apply", "-f", "-"], manifest);
    assert!(
        said.contains("admission webhook \"workflows.validate.lyra.dev\" denied the request"),
        "not refused by the webhook:\n{said}"
    );
    said
}

#[test]
fn invalid_workflows_are_refused_at_apply_with_the_engines_words() {
    let Some(c) = ChartCluster::install(
        "invalid_workflows_are_refused_at_apply_with_the_engines_words",
        &[
            "--set",
            "workflows.configMap=lyra-workflows",
            "--set-json",
            r#"workflows.items=[{"key":"shop.web.yaml","path":"shop/web.yaml"},{"key":"bad.cycle.yaml","path":"bad/cycle.yaml"}]"#,
        ],
    ) else {
        return;
    };
    let kubectl = &c.kubectl;
    // The load path comes from a ConfigMap, as an operator would ship workflow files.
    let web = tempfile::NamedTempFile::new().expect("a file");
    std::fs::write(web.path(), WEB).expect("write");
    let cycle = tempfile::NamedTempFile::new().expect("a file");
    std::fs::write(cycle.path(), CYCLE).expect("write");
    kubectl.ok(&[
        "create",
        "configmap",
        "-n",
        "lyra-system",
        "lyra-workflows",
        &format!("--from-file=shop.web.yaml={}", web.path().display()),
        &format!("--from-file=bad.cycle.yaml={}", cycle.path().display()),
    ]);
    let pod = c.replica("lyra-0");

    // A workflow that is not on the load path.
    let said = refused(kubectl, &workflow("nosuch", "  workflowName: no::such\n"));
    assert!(said.contains("no::such"), "{said}");
    // One that does not validate: the cycle is named.
    let said = refused(kubectl, &workflow("loop", "  workflowName: bad::cycle\n"));
    assert!(said.contains("dependency cycle"), "{said}");
    assert!(
        said.contains("lb -> web -> lb") || said.contains("web -> lb -> web"),
        "{said}"
    );
    // Data that does not type-check: the parameter is named.
    let said = refused(
        kubectl,
        &workflow("typed", "  workflowName: shop::web\n  data:\n    replicas: three\n"),
    );
    assert!(said.contains("replicas"), "{said}");
    let said = refused(
        kubectl,
        &workflow("big", "  workflowName: shop::web\n  data:\n    replicas: 11\n"),
    );
    assert!(said.contains("replicas"), "{said}");
    // Both, or neither, of workflowName and workflow: the CRD's own rule refuses these
    // before any webhook is asked, as an apiserver runs CEL rules first.
    for (name, spec) in [
        (
            "both",
            "  workflowName: shop::web\n  workflow:\n    steps:\n      a:\n        resource: Null::Resource\n        value: {}\n",
        ),
        ("neither", "  data:\n    replicas: 1\n"),
    ] {
        let said = kubectl.fails_stdin(&["apply", "-f", "-"], &workflow(name, spec));
        assert!(said.contains("set exactly one of workflowName and workflow"), "{said}");
    }
    // An inline workflow's problem is named by its field path.
    let said = refused(
        kubectl,
        &workflow(
            "inline",
            "  workflow:\n    steps:\n      web:\n        resource: Null::Resource\n        value:\n          input: $nobody\n",
        ),
    );
    assert!(said.contains("nobody"), "{said}");
    assert!(said.contains("spec.workflow"), "{said}");
    // A server-side dry run is refused the same way, and nothing refused was stored.
    let said = kubectl.fails_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        &workflow("nosuch", "  workflowName: no::such\n"),
    );
    assert!(said.contains("denied the request"), "{said}");
    assert!(
        kubectl.ok(&["get", "workflows", "-o", "name"]).trim().is_empty(),
        "a refused Workflow was stored"
    );

    // A valid Workflow passes and goes Ready; an update that breaks it is refused and the
    // stored object keeps its valid spec.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &workflow("shop", "  workflowName: shop::web\n  data:\n    replicas: 3\n"),
    );
    kubectl.ok(&["wait", "--for=condition=Ready", "workflow/shop", "--timeout=60s"]);
    let said = refused(
        kubectl,
        &workflow("shop", "  workflowName: shop::web\n  data:\n    replicas: many\n"),
    );
    assert!(said.contains("replicas"), "{said}");
    let stored = kubectl.ok(&["get", "workflow", "shop", "-o", "jsonpath={.spec.data.replicas}"]);
    assert_eq!(stored.trim(), "3");
    // Metadata changes never need the engine's approval.
    kubectl.ok(&["label", "workflow", "shop", "team=shop"]);

    // With the controller down, a delete goes through (DELETE never reaches the webhook);
    // creating is refused, since nothing can vouch for the new object (failurePolicy: Fail).
    drop(pod);
    kubectl.ok(&["delete", "workflow", "shop", "--wait=false"]);
    let said = kubectl.fails_stdin(
        &["apply", "-f", "-"],
        &workflow("later", "  workflowName: shop::web\n  data:\n    replicas: 1\n"),
    );
    assert!(said.contains("failed calling webhook"), "{said}");
    // Back up, the controller finishes the deletion (its finalizer patch passes the webhook).
    let _pod = c.replica("lyra-1");
    let gone = wait_until(Duration::from_secs(60), || {
        kubectl.ok(&["get", "workflows", "-o", "name"]).trim().is_empty()
    });
    assert!(gone, "the deleted Workflow was not cleaned up");
}

/// The `caBundle` of the chart's webhook configuration (the first webhook's).
fn ca_bundle(kubectl: &Kubectl) -> String {
    kubectl
        .ok(&[
            "get",
            "validatingwebhookconfiguration",
            "lyra",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ])
        .trim()
        .to_owned()
}

#[test]
fn replicas_share_one_certificate_and_a_new_one_is_served_without_a_restart() {
    let Some(c) = ChartCluster::install(
        "replicas_share_one_certificate_and_a_new_one_is_served_without_a_restart",
        &["--set", "replicaCount=2"],
    ) else {
        return;
    };
    let (kubectl, emu) = (&c.kubectl, &c.emulator);
    // Two replicas starting together race to create the certificate: one Secret, one CA, and
    // both serve a certificate the API server trusts (each is routed to in turn).
    let start = |name: &str| {
        PodProcess::start(
            kubectl,
            emu.kubeconfig_path(),
            CONTROLLER_USER,
            "lyra-system",
            "lyra",
            name,
            &controller_bin(),
        )
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| start("lyra-0"));
        let b = s.spawn(|| start("lyra-1"));
        (a.join().expect("lyra-0"), b.join().expect("lyra-1"))
    });
    a.wait_ready(Duration::from_secs(60));
    b.wait_ready(Duration::from_secs(60));
    let ca = ca_bundle(kubectl);
    assert!(!ca.is_empty(), "no CA injected");
    let secret_ca = kubectl.ok(&[
        "get",
        "secret",
        "-n",
        "lyra-system",
        "lyra-webhook-tls",
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]);
    assert_eq!(secret_ca.trim(), ca, "the injected CA is not the Secret's");
    for (i, pod) in [&a, &b].into_iter().enumerate() {
        integration_tests::helm::route_webhook(kubectl, "lyra-system", "lyra-webhook", pod);
        let said = refused(kubectl, &workflow("nosuch", "  workflowName: no::such\n"));
        assert!(said.contains("no::such"), "replica {i}: {said}");
        kubectl.ok_stdin(
            &["apply", "-f", "-"],
            &workflow(
                &format!("ok-{i}"),
                "  workflow:\n    steps:\n      a:\n        resource: Null::Resource\n        value:\n          input: x\n",
            ),
        );
    }

    // The certificate is replaced (here: its Secret deleted, as an operator rotating it by
    // hand would): a new CA is made and injected, and the running replica serves the new
    // certificate without a restart.
    drop(b);
    integration_tests::helm::route_webhook(kubectl, "lyra-system", "lyra-webhook", &a);
    kubectl.ok(&["delete", "secret", "-n", "lyra-system", "lyra-webhook-tls"]);
    let rotated = wait_until(Duration::from_secs(60), || {
        let now = ca_bundle(kubectl);
        !now.is_empty() && now != ca
    });
    assert!(rotated, "no new CA was injected:\n{}", a.log());
    let served = wait_until(Duration::from_secs(30), || {
        kubectl
            .run_with_stdin(
                &["apply", "-f", "-"],
                Some(&workflow(
                    "after",
                    "  workflow:\n    steps:\n      a:\n        resource: Null::Resource\n        value:\n          input: y\n",
                )),
            )
            .success
    });
    assert!(
        served,
        "the replica does not serve a certificate of the new CA:\n{}",
        a.log()
    );
}

#[test]
fn definitions_that_cannot_be_kinds_or_would_break_theirs_are_refused_at_apply() {
    use super::registration::{WEBAPP_V1, WEBAPP_V2};
    let registry = integration_tests::registry_or_skip!();
    let Some(c) = ChartCluster::install(
        "definitions_that_cannot_be_kinds_or_would_break_theirs_are_refused_at_apply",
        &[],
    ) else {
        return;
    };
    let kubectl = &c.kubectl;
    let _pod = c.replica("lyra-0");
    let lyra = integration_tests::Lyra::new();
    let push = |name: &str, workflow: &str, version: &str| registry.publish(&lyra, name, workflow, version);
    let definition = |name: &str, kind: &str, package: &str, annotations: &str| {
        format!(
            "apiVersion: lyra.dev/v1alpha1\nkind: WorkflowDefinition\nmetadata:\n  name: {name}\n{annotations}\
             spec:\n  package: {package}\n  kind: {kind}\n  plural: {}s\n",
            kind.to_lowercase()
        )
    };
    let denied = |manifest: &str| {
        let said = kubectl.fails_stdin(&["apply", "-f", "-"], manifest);
        assert!(
            said.contains("admission webhook \"workflowdefinitions.validate.lyra.dev\" denied the request"),
            "not refused by the webhook:\n{said}"
        );
        said
    };

    // A package whose parameter cannot be a field of a kind: refused, nothing registered.
    let reserved = push("reserved", "parameters:\n  lyra: {type: String}\nsteps: {}\n", "1.0.0");
    let said = denied(&definition("reserved", "Reserved", &reserved, ""));
    assert!(said.contains("lyra"), "{said}");
    assert!(
        !kubectl.run(&["get", "wfd", "reserved"]).success,
        "a refused definition was stored"
    );

    // v1 registers; v2 (compatible) passes; v3 (a parameter removed, one narrowed) is refused
    // naming what it breaks, until the definition allows breaking changes.
    let v1 = push("webapp", WEBAPP_V1, "1.0.0");
    kubectl.ok_stdin(&["apply", "-f", "-"], &definition("webapp", "WebApp", &v1, ""));
    kubectl.ok(&["wait", "--for=condition=Ready", "wfd/webapp", "--timeout=60s"]);
    let v2 = push("webapp", WEBAPP_V2, "2.0.0");
    kubectl.ok_stdin(&["apply", "-f", "-"], &definition("webapp", "WebApp", &v2, ""));
    let v3 = push(
        "webapp",
        "parameters:\n  replicas: {type: 'Integer[1, 2]', default: 1}\n  password: {type: Sensitive}\nsteps: {}\n",
        "3.0.0",
    );
    let said = denied(&definition("webapp", "WebApp", &v3, ""));
    assert!(said.contains("breaks the schema of kind WebApp"), "{said}");
    assert!(said.contains("region"), "{said}");
    assert!(said.contains("lyra.dev/allow-breaking"), "{said}");
    let stored = kubectl.ok(&["get", "wfd", "webapp", "-o", "jsonpath={.spec.package}"]);
    assert!(stored.contains("webapp:2.0.0"), "{stored}");
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &definition(
            "webapp",
            "WebApp",
            &v3,
            "  annotations:\n    lyra.dev/allow-breaking: \"true\"\n",
        ),
    );
}
