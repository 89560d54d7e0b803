//! The Helm chart (`charts/lyra`) and the controller image recipe (`Dockerfile`), checked
//! without a cluster: `helm lint --strict` and `helm template` with Helm 3 and 4 for the
//! default values and the value sets in `charts/lyra/ci/`, the rendered manifests against the
//! Kubernetes schemas (kubernetes-validate) and yamllint, the CRDs against `lyra crd`, the
//! Deployment's flags against the controller's, and the Dockerfile's paths and binaries
//! against the workspace. Installing the chart is `helm_install.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use integration_tests::manifests::{self, find, of_kind};
use integration_tests::tools::tools_or_skip;
use integration_tests::{Value, controller_bin, lyra_bin, workspace_dir};

fn chart_dir() -> PathBuf {
    workspace_dir().join("charts/lyra")
}

/// `None` for the default values, else a file of `charts/lyra/ci/`.
const VALUE_SETS: [Option<&str>; 3] = [None, Some("ci/namespaced-values.yaml"), Some("ci/minimal-values.yaml")];

fn helm(bin: &Path, args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().expect("a temporary directory");
    Command::new(bin)
        .args(args)
        .current_dir(chart_dir())
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("helm runs")
}

fn helm_ok(bin: &Path, args: &[&str]) -> String {
    let out = helm(bin, args);
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}{}",
        bin.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("helm prints UTF-8")
}

fn render(helm_bin: &Path, values: Option<&str>, extra: &[&str]) -> String {
    let mut args = vec!["template", "lyra", ".", "--namespace", "lyra-system"];
    if let Some(v) = values {
        args.extend(["-f", v]);
    }
    args.extend(extra);
    helm_ok(helm_bin, &args)
}

fn controller(objects: &[Value]) -> &Value {
    let deployment = of_kind(objects, "Deployment").next().expect("a Deployment");
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args_of(objects: &[Value]) -> Vec<String> {
    controller(objects)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string args").to_owned())
        .collect()
}

/// The long flags `bin --help` documents.
fn flags_of(bin: &Path) -> Vec<String> {
    let out = Command::new(bin).arg("--help").output().expect("the binary runs");
    assert!(out.status.success(), "{} --help failed", bin.display());
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    let re = regex::Regex::new(r"--[a-z][a-z0-9-]+").expect("valid regex");
    re.find_iter(&help).map(|m| m.as_str().to_owned()).collect()
}

#[test]
fn chart_lints_strictly_with_helm_3_and_4() {
    let Some(tools) = tools_or_skip("chart_lints_strictly_with_helm_3_and_4", ["helm3", "helm4"]) else {
        return;
    };
    for helm_bin in &tools {
        for values in VALUE_SETS {
            let mut args = vec!["lint", "--strict", "."];
            if let Some(v) = values {
                args.extend(["-f", v]);
            }
            let out = helm_ok(helm_bin, &args);
            assert!(out.contains("0 chart(s) failed"), "{out}");
        }
        // values.schema.json refuses what the chart cannot mean.
        for bad in [
            "webhook.failurePolicy=Sometimes",
            "replicaCount=-1",
            "controller.concurrency=0",
            "watchNamespaces[0]=Not_A_Namespace",
            "stateUrl=postgres://x",
            "state.url=mysql://x",
        ] {
            let out = helm(helm_bin, &["lint", "--strict", ".", "--set", bad]);
            assert!(!out.status.success(), "{bad} passed lint");
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            assert!(
                text.contains("values don't meet the specifications of the schema"),
                "{bad}: {text}"
            );
        }
    }
}

#[test]
fn rendered_manifests_validate_against_the_kubernetes_schemas_and_yamllint() {
    let Some([helm3, helm4, validate, yamllint]) = tools_or_skip(
        "rendered_manifests_validate_against_the_kubernetes_schemas_and_yamllint",
        ["helm3", "helm4", "kubernetes-validate", "yamllint"],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (i, values) in VALUE_SETS.iter().enumerate() {
        let rendered = render(&helm3, *values, &[]);
        // Helm 4 renders the same objects (it orders them differently).
        let sorted = |text: &str| {
            let mut objects = manifests::parse(text);
            objects.sort_by_key(|o| format!("{}/{}/{}", o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]));
            objects
        };
        let (three, four) = (sorted(&rendered), sorted(&render(&helm4, *values, &[])));
        assert_eq!(three.len(), four.len(), "{values:?}");
        for (a, b) in three.iter().zip(&four) {
            assert_eq!(
                a, b,
                "helm 3 and 4 render {} {} differently",
                a["kind"], a["metadata"]["name"]
            );
        }
        let file = dir.path().join(format!("rendered-{i}.yaml"));
        std::fs::write(&file, &rendered).expect("write the manifests");
        let out = Command::new(&validate)
            .args(["--strict", "-k", "1.32.0"])
            .arg(&file)
            .output()
            .expect("kubernetes-validate runs");
        let report = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !report.contains("ERROR"),
            "{values:?}:\n{report}"
        );
        // Every built-in kind was checked (only the CRD-defined ones have no schema there).
        for line in report.lines().filter(|l| l.contains("Couldn't find schema")) {
            assert!(
                ["Certificate", "Issuer", "ServiceMonitor"]
                    .iter()
                    .any(|k| line.contains(&format!("kind {k} "))),
                "{values:?}: {line}"
            );
        }
        let objects = manifests::parse(&rendered);
        assert!(
            report.matches("passed for resource").count() >= objects.len() - 3,
            "{report}"
        );
        let out = Command::new(&yamllint)
            .args(["--strict", "-c"])
            .arg(chart_dir().join(".yamllint"))
            .arg(&file)
            .output()
            .expect("yamllint runs");
        assert!(
            out.status.success(),
            "{values:?}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // The chart's own YAML sources (templates are not YAML until rendered).
    let out = Command::new(&yamllint)
        .args([
            "--strict",
            "-c",
            ".yamllint",
            "Chart.yaml",
            "values.yaml",
            "ci",
            ".yamllint",
        ])
        .current_dir(chart_dir())
        .output()
        .expect("yamllint runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn the_deployment_is_locked_down_and_passes_only_real_flags() {
    let Some([helm3]) = tools_or_skip("the_deployment_is_locked_down_and_passes_only_real_flags", ["helm3"]) else {
        return;
    };
    let flags = flags_of(&controller_bin());
    for values in VALUE_SETS {
        let objects = manifests::parse(&render(&helm3, values, &[]));
        let c = controller(&objects);
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{values:?}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{values:?}");
        assert_eq!(sc["runAsNonRoot"], true, "{values:?}");
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{values:?}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{values:?}");
        let pod = &of_kind(&objects, "Deployment").next().expect("a Deployment")["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert!(c["resources"]["requests"].is_object() && c["resources"]["limits"].is_object());
        for arg in args_of(&objects) {
            let flag = arg.split('=').next().expect("a flag");
            assert!(
                flags.iter().any(|f| f == flag),
                "{values:?}: the chart passes {arg}, which lyra-controller does not take"
            );
        }
        // The state URL only ever comes from a Secret.
        let env = c["env"].as_array().expect("env");
        let state = env.iter().find(|e| e["name"] == "LYRA_STATE").expect("LYRA_STATE");
        assert!(
            state["value"].is_null() && state["valueFrom"]["secretKeyRef"].is_object(),
            "{state}"
        );
        assert!(
            !serde_json::to_string(c).expect("JSON").contains("sqlite:"),
            "the URL is in the Deployment"
        );
    }
    // Leader election exactly when there is more than one replica.
    for (replicas, elect) in [("1", false), ("2", true), ("3", true)] {
        let objects = manifests::parse(&render(&helm3, None, &["--set", &format!("replicaCount={replicas}")]));
        assert_eq!(
            args_of(&objects).iter().any(|a| a == "--leader-elect"),
            elect,
            "{replicas} replicas"
        );
        let self_role = of_kind(&objects, "Role")
            .find(|r| r["metadata"]["name"] == "lyra-self")
            .expect("lyra-self");
        let has_leases = serde_json::to_string(&self_role["rules"])
            .expect("JSON")
            .contains("leases");
        assert_eq!(has_leases, elect, "{replicas} replicas: {self_role}");
    }
    // Namespaced: the watched kinds only in the watched namespaces.
    let objects = manifests::parse(&render(&helm3, Some("ci/namespaced-values.yaml"), &[]));
    let cluster_rules = serde_json::to_string(&find(&objects, "ClusterRole", "lyra")["rules"]).expect("JSON");
    assert!(
        !cluster_rules.contains("\"workflows\"") && !cluster_rules.contains("secrets"),
        "{cluster_rules}"
    );
    for ns in ["team-a", "team-b"] {
        let role = of_kind(&objects, "Role")
            .find(|r| r["metadata"]["namespace"] == ns)
            .unwrap_or_else(|| panic!("no Role in {ns}"));
        // providers.kubernetesRules: what workflows manage, where they are watched.
        assert!(
            serde_json::to_string(&role["rules"])
                .expect("JSON")
                .contains("configmaps"),
            "{role}"
        );
        assert!(
            serde_json::to_string(&role["rules"])
                .expect("JSON")
                .contains("\"workflows\"")
        );
        assert!(of_kind(&objects, "RoleBinding").any(|r| r["metadata"]["namespace"] == ns));
        assert!(args_of(&objects).contains(&format!("--namespace={ns}")));
    }
    let state = &controller(&objects)["env"][0]["valueFrom"]["secretKeyRef"];
    assert_eq!(state["name"], "lyra-postgres");
    assert!(
        of_kind(&objects, "Secret").next().is_none(),
        "an existing Secret needs none of ours"
    );
    // cert-manager mode mounts the certificate and asks cert-manager for the CA.
    assert!(args_of(&objects).contains(&"--webhook-cert-dir=/etc/lyra/webhook-tls".to_owned()));
    let webhook = find(&objects, "ValidatingWebhookConfiguration", "lyra");
    assert_eq!(
        webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "lyra-system/lyra-webhook"
    );
    assert_eq!(webhook["webhooks"][0]["failurePolicy"], "Ignore");
}

#[test]
fn the_webhook_never_sees_deletes() {
    let Some([helm3]) = tools_or_skip("the_webhook_never_sees_deletes", ["helm3"]) else {
        return;
    };
    let objects = manifests::parse(&render(&helm3, None, &[]));
    let webhook = find(&objects, "ValidatingWebhookConfiguration", "lyra");
    let hooks = webhook["webhooks"].as_array().expect("webhooks");
    assert_eq!(hooks.len(), 2);
    for hook in hooks {
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["clientConfig"]["service"]["name"], "lyra-webhook");
        for rule in hook["rules"].as_array().expect("rules") {
            assert_eq!(rule["operations"], serde_json::json!(["CREATE", "UPDATE"]), "{hook}");
        }
    }
}

#[test]
fn the_charts_crds_are_lyra_crd() {
    let out = Command::new(lyra_bin()).arg("crd").output().expect("lyra crd runs");
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).expect("UTF-8");
    let committed = std::fs::read_to_string(chart_dir().join("files/crds.yaml")).expect("files/crds.yaml");
    assert_eq!(
        committed, printed,
        "charts/lyra/files/crds.yaml is stale; regenerate it with\n  \
         cargo run -q -p lyra-cli -- crd > charts/lyra/files/crds.yaml"
    );
    let Some([helm3]) = tools_or_skip("the_charts_crds_are_lyra_crd", ["helm3"]) else {
        return;
    };
    let rendered = manifests::parse(&render(&helm3, None, &[]));
    let mut crds: Vec<Value> = of_kind(&rendered, "CustomResourceDefinition").cloned().collect();
    for crd in &mut crds {
        let meta = crd["metadata"].as_object_mut().expect("metadata");
        let annotations = meta.remove("annotations").expect("annotations");
        assert_eq!(
            annotations["helm.sh/resource-policy"], "keep",
            "Helm must keep the CRDs"
        );
        let labels = meta.remove("labels").expect("labels");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    }
    assert_eq!(
        crds,
        manifests::parse(&printed),
        "the rendered CRDs differ from lyra crd"
    );
    let none = manifests::parse(&render(&helm3, None, &["--set", "crds.install=false"]));
    assert_eq!(of_kind(&none, "CustomResourceDefinition").count(), 0);
}

/// The Dockerfile cannot be built here (no image builder, no registry): check what it names.
#[test]
fn the_dockerfile_copies_what_exists_and_runs_the_controller_with_real_flags() {
    let root = workspace_dir();
    let text = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    let stages: Vec<&str> = text.split("\nFROM ").collect();
    assert!(stages.len() >= 3, "a multi-stage build");
    let build = stages[1];
    assert!(build.contains(" AS build"), "{build}");
    let mut copied = 0;
    for line in build
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let parts: Vec<&str> = line.split_whitespace().skip(1).collect();
        for src in &parts[..parts.len() - 1] {
            assert!(
                root.join(src).exists(),
                "the Dockerfile copies {src}, which is not in the repository"
            );
            copied += 1;
        }
    }
    assert!(copied >= 4, "{build}");
    // Every workspace member the build needs is copied.
    let members = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    for member in members
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.strip_suffix("\","))
    {
        let top = member.split('/').next().expect("a path");
        assert!(
            build.contains(&format!("COPY {top} ")),
            "the build does not copy {member}"
        );
    }
    // The packages and binaries it builds are the workspace's, from a profile it defines.
    let profile = build
        .split_whitespace()
        .skip_while(|w| *w != "--profile")
        .nth(1)
        .expect("cargo build --profile");
    assert!(
        members.contains(&format!("\n[profile.{profile}]\n")),
        "the Dockerfile builds with profile {profile}, which Cargo.toml does not define"
    );
    for (package, binary) in [("lyra-controller", "lyra-controller"), ("lyra-cli", "lyra")] {
        assert!(build.contains(&format!("-p {package}")), "{package}");
        assert!(build.contains(&format!("target/{profile}/{binary} ")), "{binary}");
    }
    assert!(controller_bin().file_name().is_some_and(|n| n == "lyra-controller"));
    assert!(lyra_bin().file_name().is_some_and(|n| n == "lyra"));
    let runtime = stages.last().expect("a runtime stage");
    assert!(
        runtime.contains("nonroot") && runtime.contains("USER 65532"),
        "{runtime}"
    );
    let json_array = |prefix: &str| -> Vec<String> {
        let line = runtime
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix}"));
        serde_json::from_str(line.trim_start_matches(prefix).trim()).expect("exec form")
    };
    assert_eq!(json_array("ENTRYPOINT"), ["/usr/local/bin/lyra-controller"]);
    assert!(runtime.contains("COPY --from=build /out/lyra-controller /usr/local/bin/lyra-controller"));
    let flags = flags_of(&controller_bin());
    let cmd = json_array("CMD");
    assert!(!cmd.is_empty());
    for arg in cmd {
        let flag = arg.split('=').next().expect("a flag");
        assert!(
            flags.iter().any(|f| f == flag),
            "the image runs the controller with {arg}, which it does not take"
        );
    }
}

/// The documented path: the chart is pushed to the same OCI registry as packages, and
/// installed (here: rendered) from there.
#[test]
fn the_chart_is_published_to_an_oci_registry_and_used_from_there() {
    let Some([helm3, helm4]) = tools_or_skip(
        "the_chart_is_published_to_an_oci_registry_and_used_from_there",
        ["helm3", "helm4"],
    ) else {
        return;
    };
    let Some(registry) = integration_tests::registry::Registry::start() else {
        return;
    };
    let out = tempfile::tempdir().expect("a temporary directory");
    let dest = out.path().to_str().expect("UTF-8 path");
    let packaged = helm_ok(&helm3, &["package", ".", "--destination", dest]);
    let tgz = out.path().join("lyra-0.1.0.tgz");
    assert!(tgz.is_file(), "{packaged}");
    let repo = registry.url("charts");
    let pushed = helm(&helm3, &["push", tgz.to_str().expect("UTF-8"), &repo, "--plain-http"]);
    let said = String::from_utf8_lossy(&pushed.stdout).into_owned() + &String::from_utf8_lossy(&pushed.stderr);
    assert!(pushed.status.success(), "{said}");
    assert!(said.contains("Digest: sha256:"), "{said}");
    assert!(
        registry.manifest_digest("charts/lyra", "0.1.0").is_some(),
        "the registry has no charts/lyra:0.1.0"
    );
    // Both helm versions install from it (`helm template` is install's rendering).
    let chart = registry.url("charts/lyra");
    for helm_bin in [&helm3, &helm4] {
        let rendered = helm_ok(
            helm_bin,
            &[
                "template",
                "lyra",
                &chart,
                "--version",
                "0.1.0",
                "--plain-http",
                "--namespace",
                "lyra-system",
            ],
        );
        let objects = manifests::parse(&rendered);
        find(&objects, "Deployment", "lyra");
        assert_eq!(of_kind(&objects, "CustomResourceDefinition").count(), 2);
        // What is packaged leaves out the CI value sets.
        assert!(!rendered.contains("namespaced-values"));
    }
}
