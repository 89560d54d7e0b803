//! Helm as a client of a cluster running Lyra, with real Helm 3 and Helm 4 against the
//! emulator: the controller's own chart (`charts/lyra`) installed, upgraded and uninstalled,
//! the controller started from the Deployment helm created (`integration_tests::pod`), its
//! admission webhook rejecting invalid Workflows at `kubectl apply`; and a consumer's chart of
//! Workflows (`examples/charts/shop`) installed, upgraded, rolled back and uninstalled.

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::helm::{Helm, chart, start_replica};
use integration_tests::kubectl::{Kubectl, kubectl_or_skip};
use integration_tests::tools::tool_or_skip;
use integration_tests::{Value, cluster_or_skip, wait_until};
use kube_emulator::BlockingKubeEmulator;

fn json(kubectl: &Kubectl, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl.ok(&all)).expect("kubectl prints JSON")
}

const VALID: &str = "\
apiVersion: lyra.dev/v1alpha1
kind: Workflow
metadata:
  name: hello
  namespace: default
spec:
  workflow:
    steps:
      hello:
        resource: Null::Resource
        value:
          input: hello
";

fn controller_chart_lifecycle(helm_name: &str) {
    let test = format!("controller_chart_lifecycle_{helm_name}");
    let (Some(helm_bin), Some(kubectl_bin)) = (tool_or_skip(&test, helm_name), kubectl_or_skip(&test)) else {
        return;
    };
    let emu = BlockingKubeEmulator::start().expect("start the emulator");
    let kubectl = Kubectl::new(kubectl_bin, emu.kubeconfig_path());
    let helm = Helm::new(helm_bin, emu.kubeconfig_path());
    let chart = chart("charts/lyra");
    let said = helm.ok(&["install", "lyra", &chart, "-n", "lyra-system", "--create-namespace"]);
    assert!(
        said.contains("kubectl -n lyra-system rollout status deployment/lyra"),
        "NOTES:\n{said}"
    );
    assert_eq!(helm.releases("lyra-system")[0]["status"], "deployed");
    kubectl.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/workflows.lyra.dev",
        "--timeout=30s",
    ]);

    let pod = start_replica(&kubectl, emu.kubeconfig_path(), "lyra-0");
    let config = json(&kubectl, &["get", "validatingwebhookconfiguration", "lyra"]);
    for hook in config["webhooks"].as_array().expect("webhooks") {
        assert!(
            hook["clientConfig"]["caBundle"].as_str().is_some_and(|b| !b.is_empty()),
            "the controller did not inject its CA: {hook}"
        );
    }

    // A valid Workflow goes Ready; invalid ones are refused at apply with the engine's words.
    kubectl.ok_stdin(&["apply", "-f", "-"], VALID);
    kubectl.ok(&["wait", "--for=condition=Ready", "workflow/hello", "--timeout=60s"]);
    let refused = kubectl.fails_stdin(
        &["apply", "-f", "-"],
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: nosuch\n  namespace: default\n\
         spec:\n  workflowName: no::such\n",
    );
    assert!(refused.contains("denied the request"), "{refused}");
    assert!(refused.contains("no::such"), "{refused}");
    assert!(
        kubectl.run(&["get", "workflow", "nosuch"]).stderr.contains("NotFound"),
        "a refused Workflow was stored"
    );

    // helm upgrade changes a value; the Deployment follows, and a controller started from
    // the new Deployment carries on.
    let before = json(&kubectl, &["get", "deployment", "-n", "lyra-system", "lyra"]);
    helm.ok(&[
        "upgrade",
        "lyra",
        &chart,
        "-n",
        "lyra-system",
        "--reuse-values",
        "--set",
        "controller.concurrency=3",
    ]);
    let after = json(&kubectl, &["get", "deployment", "-n", "lyra-system", "lyra"]);
    let args = after["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--concurrency=3"), "{args}");
    assert!(after["metadata"]["generation"].as_i64() > before["metadata"]["generation"].as_i64());
    assert_eq!(helm.releases("lyra-system")[0]["revision"], "2");
    drop(pod);

    // With the controller down, deletes go through (DELETE never reaches the webhook) while
    // creates are refused (failurePolicy: Fail).
    kubectl.ok(&["delete", "workflow", "hello", "--wait=false"]);
    let refused = kubectl.fails_stdin(&["apply", "-f", "-"], &VALID.replace("name: hello", "name: later"));
    assert!(refused.contains("failed calling webhook"), "{refused}");

    let pod = start_replica(&kubectl, emu.kubeconfig_path(), "lyra-1");
    assert!(pod.args.contains(&"--concurrency=3".to_owned()));
    kubectl.ok(&["wait", "--for=delete", "workflow/hello", "--timeout=60s"]);

    let said = helm.ok(&["uninstall", "lyra", "-n", "lyra-system"]);
    assert!(said.contains("uninstalled"), "{said}");
    assert!(helm.releases("lyra-system").is_empty());
    assert!(
        kubectl
            .run(&["get", "deployment", "-n", "lyra-system", "lyra"])
            .stderr
            .contains("NotFound")
    );
    let left = kubectl.ok(&["get", "secrets", "-n", "lyra-system", "-l", "owner=helm", "-o", "name"]);
    assert!(left.trim().is_empty(), "release Secrets left: {left}");
    // The CRDs stay (helm.sh/resource-policy: keep): deleting them would delete every Workflow.
    kubectl.ok(&["get", "crd", "workflows.lyra.dev"]);
}

#[test]
fn controller_chart_installs_upgrades_and_uninstalls_with_helm_3() {
    controller_chart_lifecycle("helm3");
}

#[test]
fn controller_chart_installs_upgrades_and_uninstalls_with_helm_4() {
    controller_chart_lifecycle("helm4");
}

/// The images of the Foobernetes instances (one per Workflow of the shop chart), sorted.
fn images(cluster: &Cluster) -> Vec<String> {
    let cloud = cluster.cloud();
    let mut images: Vec<String> = cloud["Instances"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(|i| i["Image"].as_str().map(str::to_owned))
        .collect();
    images.sort();
    images
}

fn consumer_chart_lifecycle(cluster: &Cluster, helm: &Helm, helm4: bool) {
    let chart = chart("examples/charts/shop");
    let _controller = cluster.controller("c", &[]);
    let mut install = vec![
        "install",
        "shop",
        &chart,
        "-n",
        "default",
        "--set",
        "refreshInterval=5m",
    ];
    if helm4 {
        // Helm 4 waits on the kstatus conditions the controller writes.
        install.extend(["--wait", "--timeout", "120s"]);
    }
    helm.ok(&install);
    if helm4 {
        for name in ["shop-web", "shop-db"] {
            let ready = cluster.workflow(name)["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            assert!(ready, "helm --wait returned before {name} was Ready");
        }
    } else {
        cluster.wait_for("shop-web", "condition=Ready", "60s");
        cluster.wait_for("shop-db", "condition=Ready", "60s");
    }
    assert_eq!(images(cluster), ["postgres:17", "webapp:1.4"]);
    assert_eq!(cluster.workflow("shop-web")["spec"]["refreshInterval"], "5m");

    // An upgrade that changes one service changes one resource, and a field the chart no
    // longer sets is removed (Helm 3: a three-way merge patch; Helm 4: server-side apply).
    let web_generation = cluster.workflow("shop-web")["metadata"]["generation"].clone();
    let db_generation = cluster.workflow("shop-db")["metadata"]["generation"].clone();
    let mut upgrade = vec![
        "upgrade",
        "shop",
        &chart,
        "-n",
        "default",
        "--set",
        "services.web.image=webapp:1.5",
    ];
    if helm4 {
        upgrade.extend(["--wait", "--timeout", "120s"]);
    }
    helm.ok(&upgrade);
    let web = cluster.wait_until_status("shop-web", Duration::from_secs(60), |wf| {
        wf["metadata"]["generation"] != web_generation
            && wf["status"]["conditions"].as_array().into_iter().flatten().any(|c| {
                c["type"] == "Ready" && c["status"] == "True" && c["observedGeneration"] == wf["metadata"]["generation"]
            })
    });
    assert!(
        web["spec"].get("refreshInterval").is_none(),
        "the removed field survived: {}",
        web["spec"]
    );
    assert!(cluster.workflow("shop-db")["spec"].get("refreshInterval").is_none());
    // The db Workflow lost the field too (one spec change), but its instance is unchanged.
    assert_eq!(
        cluster.workflow("shop-db")["metadata"]["generation"].as_i64(),
        db_generation.as_i64().map(|g| g + 1)
    );
    assert_eq!(images(cluster), ["postgres:17", "webapp:1.5"]);

    // Rollback to the first revision: the image and the field come back.
    helm.ok(&["rollback", "shop", "1", "-n", "default"]);
    let ok = wait_until(Duration::from_secs(60), || {
        images(cluster) == ["postgres:17", "webapp:1.4"]
    });
    assert!(ok, "the rollback was not applied: {:?}", images(cluster));
    assert_eq!(cluster.workflow("shop-web")["spec"]["refreshInterval"], "5m");

    // Uninstall: the Workflows are deleted, the controller tears their resources down, and
    // the release is gone.
    let said = helm.ok(&["uninstall", "shop", "-n", "default", "--wait", "--timeout", "120s"]);
    assert!(said.contains("uninstalled"), "{said}");
    let gone = wait_until(Duration::from_secs(60), || {
        cluster
            .kubectl
            .ok(&["get", "workflows", "-o", "name"])
            .trim()
            .is_empty()
    });
    assert!(gone, "the Workflows were not deleted");
    assert!(images(cluster).is_empty(), "resources left: {:?}", images(cluster));
    assert!(helm.releases("default").is_empty());
    let left = cluster
        .kubectl
        .ok(&["get", "secrets", "-l", "owner=helm", "-o", "name"]);
    assert!(left.trim().is_empty(), "release Secrets left: {left}");
}

#[test]
fn consumer_chart_of_workflows_with_helm_3() {
    let cluster = cluster_or_skip!();
    let Some(bin) = tool_or_skip("consumer_chart_of_workflows_with_helm_3", "helm3") else {
        return;
    };
    let helm = Helm::new(bin, cluster.emulator.kubeconfig_path());
    consumer_chart_lifecycle(&cluster, &helm, false);
}

#[test]
fn consumer_chart_of_workflows_with_helm_4() {
    let cluster = cluster_or_skip!();
    let Some(bin) = tool_or_skip("consumer_chart_of_workflows_with_helm_4", "helm4") else {
        return;
    };
    let helm = Helm::new(bin, cluster.emulator.kubeconfig_path());
    consumer_chart_lifecycle(&cluster, &helm, true);
}
