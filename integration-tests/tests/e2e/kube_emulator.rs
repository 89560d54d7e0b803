//! The Kubernetes API emulator driven by the real kubectl: every command the controller's
//! end-to-end tests and their authors rely on, asserting on what kubectl prints and on the
//! stored objects. Each test has its own emulator and its own `KUBECACHEDIR`.

use std::time::Duration;

use integration_tests::Value;
use integration_tests::kubectl::{Kubectl, kubectl_or_skip};
use kube_emulator::BlockingKubeEmulator;
use serde_json::json;

pub const WORKFLOW_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: workflows.lyra.example.com
spec:
  group: lyra.example.com
  scope: Namespaced
  names:
    plural: workflows
    singular: workflow
    kind: Workflow
    shortNames: [wf]
  versions:
  - name: v1alpha1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
    additionalPrinterColumns:
    - {name: Phase, type: string, jsonPath: .status.phase}
    - {name: Replicas, type: integer, jsonPath: .spec.replicas, priority: 1}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [image]
            properties:
              image: {type: string, pattern: '^[a-z][a-z0-9-]*$'}
              replicas: {type: integer, minimum: 1, maximum: 10, default: 1}
              mode: {type: string, enum: [fast, safe]}
              settings:
                type: object
                x-kubernetes-preserve-unknown-fields: true
          status:
            type: object
            properties:
              phase: {type: string}
              conditions:
                type: array
                items:
                  type: object
                  required: [type, status]
                  properties:
                    type: {type: string}
                    status: {type: string}
"#;

fn workflow(name: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: lyra.example.com/v1\nkind: Workflow\nmetadata:\n  name: {name}\n  labels: {{app: lyra}}\nspec:\n  image: nginx\n{extra_spec}"
    )
}

/// A started emulator with the Workflow CRD established, or `None` when kubectl is missing.
fn setup(test: &str) -> Option<(BlockingKubeEmulator, Kubectl)> {
    let bin = kubectl_or_skip(test)?;
    let emu = BlockingKubeEmulator::start().expect("the emulator starts");
    let k = Kubectl::new(bin, emu.kubeconfig_path());
    let out = k.ok_stdin(&["apply", "-f", "-"], WORKFLOW_CRD);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/workflows.lyra.example.com created"
    );
    let out = k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/workflows.lyra.example.com",
        "--timeout=10s",
    ]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/workflows.lyra.example.com condition met"
    );
    Some((emu, k))
}

/// Table rows as whitespace-split cells, header first.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn json_of(k: &Kubectl, args: &[&str]) -> Value {
    let mut full = args.to_vec();
    full.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&full)).expect("kubectl -o json prints JSON")
}

#[test]
fn crd_registers_kind_in_discovery_and_deleting_it_drops_everything() {
    let Some((_emu, k)) = setup("crd_registers_kind_in_discovery_and_deleting_it_drops_everything") else {
        return;
    };
    let resources = k.ok(&["api-resources"]);
    let wf = rows(&resources)
        .into_iter()
        .find(|r| r[0] == "workflows")
        .expect("workflows in api-resources");
    assert_eq!(wf, vec!["workflows", "wf", "lyra.example.com/v1", "true", "Workflow"]);
    assert!(resources.contains("customresourcedefinitions"), "{resources}");
    assert!(resources.contains("leases"), "{resources}");

    let crd = json_of(&k, &["get", "crd", "workflows.lyra.example.com"]);
    let conditions: Vec<(&str, &str)> = crd["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    assert_eq!(conditions, vec![("NamesAccepted", "True"), ("Established", "True")]);
    assert_eq!(crd["status"]["storedVersions"], serde_json::json!(["v1"]));

    let group: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/apis/lyra.example.com"])).unwrap();
    assert_eq!(group["preferredVersion"]["version"], "v1", "GA is preferred over alpha");
    let version = k.ok(&["version", "-o", "json"]);
    assert!(version.contains("\"minor\": \"32\""), "{version}");

    k.ok_stdin(&["apply", "-f", "-"], &workflow("demo", ""));
    // The same object through the other served version: only apiVersion differs.
    let alpha = json_of(&k, &["get", "workflows.v1alpha1.lyra.example.com", "demo"]);
    assert_eq!(alpha["apiVersion"], "lyra.example.com/v1alpha1");
    assert_eq!(alpha["spec"]["image"], "nginx");

    let out = k.ok(&["delete", "crd", "workflows.lyra.example.com"]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io \"workflows.lyra.example.com\" deleted"
    );
    let err = k.fails(&["get", "workflows.lyra.example.com"]);
    assert!(
        err.contains("the server could not find the requested resource")
            || err.contains("doesn't have a resource type"),
        "{err}"
    );
    let fresh = Kubectl::new(kubectl_or_skip("crd").unwrap(), _emu.kubeconfig_path());
    let err = fresh.fails(&["get", "wf"]);
    assert!(err.contains("the server doesn't have a resource type \"wf\""), "{err}");
    assert!(!fresh.ok(&["api-resources"]).contains("workflows"));
}

#[test]
fn custom_objects_apply_create_replace_patch_label_and_get() {
    let Some((_emu, k)) = setup("custom_objects_apply_create_replace_patch_label_and_get") else {
        return;
    };
    assert_eq!(
        k.ok_stdin(&["apply", "-f", "-"], &workflow("demo", "")).trim(),
        "workflow.lyra.example.com/demo created"
    );
    assert_eq!(
        k.ok_stdin(&["apply", "-f", "-"], &workflow("demo", "")).trim(),
        "workflow.lyra.example.com/demo unchanged"
    );
    let changed = workflow("demo", "  replicas: 2\n");
    assert_eq!(
        k.ok_stdin(&["apply", "-f", "-"], &changed).trim(),
        "workflow.lyra.example.com/demo configured"
    );
    assert_eq!(
        k.ok_stdin(&["create", "-f", "-"], &workflow("other", "")).trim(),
        "workflow.lyra.example.com/other created"
    );
    let err = k.fails_stdin(&["create", "-f", "-"], &workflow("other", ""));
    assert!(
        err.contains("workflows.lyra.example.com \"other\" already exists"),
        "{err}"
    );

    let obj = json_of(&k, &["get", "wf", "demo"]);
    assert_eq!(obj["metadata"]["generation"], 2, "the spec changed once");
    assert_eq!(obj["spec"]["replicas"], 2);
    assert!(obj["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert!(
        obj["metadata"]["creationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let rv: u64 = obj["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();

    // Labels and status do not bump the generation; the status goes through its subresource.
    assert_eq!(
        k.ok(&["label", "wf", "demo", "tier=web"]).trim(),
        "workflow.lyra.example.com/demo labeled"
    );
    k.ok(&[
        "patch",
        "wf",
        "demo",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Ignored"}}"#,
    ]);
    k.ok(&[
        "patch",
        "wf",
        "demo",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ]);
    let obj = json_of(&k, &["get", "wf", "demo"]);
    assert_eq!(obj["metadata"]["generation"], 2);
    assert_eq!(obj["status"]["phase"], "Running");
    assert_eq!(obj["metadata"]["labels"]["tier"], "web");
    assert!(
        obj["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv
    );

    // JSON patch with a test op, then a failing test op.
    k.ok(&[
        "patch",
        "wf",
        "demo",
        "--type=json",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":2},{"op":"replace","path":"/spec/replicas","value":3}]"#,
    ]);
    let err = k.fails(&[
        "patch",
        "wf",
        "demo",
        "--type=json",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":99},{"op":"replace","path":"/spec/replicas","value":4}]"#,
    ]);
    assert!(err.contains("Invalid") || err.contains("rejected"), "{err}");
    let obj = json_of(&k, &["get", "wf", "demo"]);
    assert_eq!(obj["spec"]["replicas"], 3);
    assert_eq!(obj["metadata"]["generation"], 3);
    // kubectl's default patch type is strategic merge, which custom resources refuse.
    let err = k.fails(&["patch", "wf", "demo", "-p", r#"{"spec":{"replicas":4}}"#]);
    assert!(
        err.contains("application/strategic-merge-patch+json is not supported"),
        "{err}"
    );

    // Printer columns, wide columns, all namespaces, label selection, names.
    let table = rows(&k.ok(&["get", "wf"]));
    assert_eq!(table[0], vec!["NAME", "PHASE", "AGE"]);
    assert_eq!(table[1][..2], ["demo".to_string(), "Running".to_string()]);
    assert!(table[1][2].ends_with('s'), "age cell: {:?}", table[1]);
    assert_eq!(table[2][0], "other");
    let wide = rows(&k.ok(&["get", "wf", "-o", "wide"]));
    assert_eq!(wide[0], vec!["NAME", "PHASE", "REPLICAS", "AGE"]);
    assert_eq!(
        wide[1][..3],
        ["demo".to_string(), "Running".to_string(), "3".to_string()]
    );
    let all = rows(&k.ok(&["get", "wf", "-A"]));
    assert_eq!(all[0], vec!["NAMESPACE", "NAME", "PHASE", "AGE"]);
    assert_eq!(all[1][..2], ["default".to_string(), "demo".to_string()]);
    let labelled = rows(&k.ok(&["get", "wf", "-l", "tier=web"]));
    assert_eq!(labelled.len(), 2, "{labelled:?}");
    assert_eq!(labelled[1][0], "demo");
    assert_eq!(rows(&k.ok(&["get", "wf", "-l", "tier in (web,db),app=lyra"])).len(), 2);
    assert!(
        k.run(&["get", "wf", "-l", "tier=db"])
            .stderr
            .contains("No resources found in default namespace.")
    );
    assert_eq!(
        k.ok(&["get", "wf", "-o", "name"]),
        "workflow.lyra.example.com/demo\nworkflow.lyra.example.com/other\n"
    );
    let yaml = k.ok(&["get", "wf", "demo", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: Workflow") && yaml.contains("  image: nginx") && yaml.contains("phase: Running"),
        "{yaml}"
    );
    let list = json_of(&k, &["get", "wf"]);
    assert_eq!(list["items"].as_array().unwrap().len(), 2);

    // Replace: a fresh copy succeeds, a stale one conflicts.
    let current = k.ok(&["get", "wf", "demo", "-o", "json"]);
    let stale = current.replace("\"image\": \"nginx\"", "\"image\": \"redis\"");
    assert_eq!(
        k.ok_stdin(&["replace", "-f", "-"], &stale).trim(),
        "workflow.lyra.example.com/demo replaced"
    );
    let err = k.fails_stdin(&["replace", "-f", "-"], &stale.replace("redis", "httpd"));
    assert!(
        err.contains(
            "Operation cannot be fulfilled on workflows.lyra.example.com \"demo\": the object has been modified"
        ),
        "{err}"
    );
    assert_eq!(json_of(&k, &["get", "wf", "demo"])["spec"]["image"], "redis");

    // describe shows the object (and asks for its events).
    let described = k.ok(&["describe", "wf", "demo"]);
    for want in [
        "Name:         demo",
        "Namespace:    default",
        "tier=web",
        "Image:     redis",
        "Phase:  Running",
        "Events:",
    ] {
        assert!(described.contains(want), "describe lacks {want:?}:\n{described}");
    }
}

#[test]
fn kubectl_edit_goes_through_the_editor() {
    let Some((_emu, k)) = setup("kubectl_edit_goes_through_the_editor") else {
        return;
    };
    let mut k = k;
    k.ok_stdin(&["apply", "-f", "-"], &workflow("demo", ""));
    let dir = tempfile::tempdir().unwrap();
    let editor = dir.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/image: nginx/image: busybox/' \"$1\"\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    k.env("KUBE_EDITOR", editor.to_str().unwrap());
    assert_eq!(
        k.ok(&["edit", "wf", "demo"]).trim(),
        "workflow.lyra.example.com/demo edited"
    );
    let obj = json_of(&k, &["get", "wf", "demo"]);
    assert_eq!(obj["spec"]["image"], "busybox");
    assert_eq!(obj["metadata"]["generation"], 2);
}

#[test]
fn server_side_apply_and_server_dry_run() {
    let Some((_emu, k)) = setup("server_side_apply_and_server_dry_run") else {
        return;
    };
    let out = k.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        &workflow("ssa", "  replicas: 4\n"),
    );
    assert_eq!(out.trim(), "workflow.lyra.example.com/ssa serverside-applied");
    let out = k.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        &workflow("ssa", "  replicas: 5\n"),
    );
    assert_eq!(out.trim(), "workflow.lyra.example.com/ssa serverside-applied");
    let obj = json_of(&k, &["get", "wf", "ssa"]);
    assert_eq!(obj["spec"]["replicas"], 5);
    assert_eq!(obj["metadata"]["generation"], 2);

    let out = k.ok_stdin(&["create", "--dry-run=server", "-f", "-"], &workflow("dry", ""));
    assert_eq!(out.trim(), "workflow.lyra.example.com/dry created (server dry run)");
    let dry = k.ok_stdin(
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        &workflow("dry", ""),
    );
    let dry: Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(dry["spec"]["replicas"], 1, "defaults are applied in a dry run too");
    let err = k.fails(&["get", "wf", "dry"]);
    assert!(err.contains("workflows.lyra.example.com \"dry\" not found"), "{err}");
    // A dry-run of an invalid object fails like the real thing.
    let err = k.fails_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        &workflow("dry", "  replicas: 0\n"),
    );
    assert!(err.contains("spec.replicas: Invalid value: 0"), "{err}");
}

/// Server-side apply owns fields: what kubectl applied and now omits is removed, what another
/// manager owns stays, and changing another applier's field is a conflict until forced.
#[test]
fn server_side_apply_removes_what_it_no_longer_applies() {
    let Some((_emu, k)) = setup("server_side_apply_removes_what_it_no_longer_applies") else {
        return;
    };
    let apply = &["apply", "--server-side", "-f", "-"];
    k.ok_stdin(
        apply,
        &workflow(
            "owned",
            "  mode: fast\n  replicas: 4\n  settings: {retries: 3, timeout: 5s}\n",
        ),
    );
    k.ok(&["label", "wf", "owned", "team=core"]);
    let out = k.ok_stdin(apply, &workflow("owned", "  settings: {retries: 3}\n"));
    assert_eq!(out.trim(), "workflow.lyra.example.com/owned serverside-applied");
    let obj = json_of(&k, &["get", "wf", "owned", "--show-managed-fields"]);
    assert!(obj["spec"].get("mode").is_none(), "{obj:#}");
    assert_eq!(obj["spec"]["replicas"], 1, "removed, then defaulted again");
    assert_eq!(obj["spec"]["settings"], json!({"retries": 3}));
    assert_eq!(obj["metadata"]["labels"], json!({"app": "lyra", "team": "core"}));
    let fields = obj["metadata"]["managedFields"].as_array().expect("managedFields");
    let kubectl = fields
        .iter()
        .find(|e| e["manager"] == "kubectl" && e["operation"] == "Apply")
        .expect("kubectl's apply");
    assert_eq!(
        kubectl["fieldsV1"],
        json!({"f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {"f:image": {}, "f:settings": {"f:retries": {}}}})
    );
    assert!(
        fields
            .iter()
            .any(|e| e["manager"] == "kubectl-label" && e["operation"] == "Update"),
        "{fields:#?}"
    );
    // Without --show-managed-fields kubectl hides them, as from a real apiserver.
    assert!(
        json_of(&k, &["get", "wf", "owned"])["metadata"]
            .get("managedFields")
            .is_none()
    );

    let other = &["apply", "--server-side", "--field-manager=ops", "-f", "-"];
    let err = k.fails_stdin(other, &workflow("owned", "").replace("nginx", "busybox"));
    assert!(
        err.contains("conflict with \"kubectl\"") && err.contains(".spec.image"),
        "{err}"
    );
    let forced = &[
        "apply",
        "--server-side",
        "--field-manager=ops",
        "--force-conflicts",
        "-f",
        "-",
    ];
    k.ok_stdin(forced, &workflow("owned", "").replace("nginx", "busybox"));
    assert_eq!(json_of(&k, &["get", "wf", "owned"])["spec"]["image"], "busybox");
}

#[test]
fn schema_violations_are_rejected_with_field_paths() {
    let Some((_emu, k)) = setup("schema_violations_are_rejected_with_field_paths") else {
        return;
    };
    let bad = "apiVersion: lyra.example.com/v1\nkind: Workflow\nmetadata:\n  name: bad\nspec:\n  image: Not_Valid\n  replicas: 20\n  mode: slow\n";
    let err = k.fails_stdin(&["apply", "-f", "-"], bad);
    for want in [
        "The Workflow \"bad\" is invalid",
        "spec.image: Invalid value: \"Not_Valid\": spec.image in body should match '^[a-z][a-z0-9-]*$'",
        "spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10",
        "spec.mode: Unsupported value: \"slow\": supported values: \"fast\", \"safe\"",
    ] {
        assert!(err.contains(want), "stderr lacks {want:?}:\n{err}");
    }
    let missing = "apiVersion: lyra.example.com/v1\nkind: Workflow\nmetadata:\n  name: bad\nspec:\n  replicas: 2\n";
    let err = k.fails_stdin(&["create", "-f", "-"], missing);
    assert!(err.contains("spec.image: Required value"), "{err}");
    let wrong_type = "apiVersion: lyra.example.com/v1\nkind: Workflow\nmetadata:\n  name: bad\nspec:\n  image: x\n  replicas: many\n";
    let err = k.fails_stdin(&["create", "-f", "-"], wrong_type);
    assert!(
        err.contains(
            "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\""
        ),
        "{err}"
    );
    // kubectl asks for strict field validation: an unknown field is an error...
    let typo = workflow("typo", "  imagee: x\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &typo);
    assert!(
        err.contains("strict decoding error: unknown field \"spec.imagee\""),
        "{err}"
    );
    // ...unless asked otherwise, when it is pruned; preserved fields survive.
    let pruned = workflow("pruned", "  imagee: x\n  settings: {anything: [1, 2]}\n");
    let out = k.ok_stdin(&["create", "--validate=false", "-f", "-"], &pruned);
    assert_eq!(out.trim(), "workflow.lyra.example.com/pruned created");
    let obj = json_of(&k, &["get", "wf", "pruned"]);
    assert_eq!(
        obj["spec"],
        serde_json::json!({"image": "nginx", "settings": {"anything": [1, 2]}, "replicas": 1})
    );
    assert!(k.fails(&["get", "wf", "bad"]).contains("not found"));
}

#[test]
fn get_watch_streams_changes_until_the_timeout() {
    let Some((emu, k)) = setup("get_watch_streams_changes_until_the_timeout") else {
        return;
    };
    k.ok_stdin(&["apply", "-f", "-"], &workflow("demo", ""));
    let kubeconfig = emu.kubeconfig_path().to_path_buf();
    let bin = kubectl_or_skip("watch").unwrap();
    let watcher = std::thread::spawn(move || {
        let k = Kubectl::new(bin, &kubeconfig);
        k.run(&["get", "wf", "-w", "--request-timeout=3s"])
    });
    emu.wait_for_watches(1, Duration::from_secs(30));
    k.ok(&[
        "patch",
        "wf",
        "demo",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ]);
    k.ok_stdin(&["apply", "-f", "-"], &workflow("second", ""));
    k.ok(&["delete", "wf", "second"]);
    let out = watcher.join().unwrap();
    let lines = rows(&out.stdout);
    assert_eq!(lines[0], vec!["NAME", "PHASE", "AGE"], "{}", out.stdout);
    assert_eq!(lines[1][0], "demo");
    assert!(
        lines.iter().any(|r| r[0] == "demo" && r[1] == "Running"),
        "the status change is streamed:\n{}",
        out.stdout
    );
    assert!(
        lines.iter().filter(|r| r[0] == "second").count() >= 2,
        "added and deleted:\n{}",
        out.stdout
    );

    let names = k.ok(&["get", "wf", "-w", "--request-timeout=1s", "-o", "name"]);
    assert_eq!(names.trim(), "workflow.lyra.example.com/demo");
}

#[test]
fn wait_for_conditions_jsonpath_and_deletion_with_finalizers() {
    let Some((emu, k)) = setup("wait_for_conditions_jsonpath_and_deletion_with_finalizers") else {
        return;
    };
    k.ok_stdin(&["apply", "-f", "-"], &workflow("demo", ""));
    let kubeconfig = emu.kubeconfig_path().to_path_buf();
    let bin = kubectl_or_skip("wait").unwrap();
    let waiter = {
        let (bin, kubeconfig) = (bin.clone(), kubeconfig.clone());
        std::thread::spawn(move || {
            Kubectl::new(bin, &kubeconfig).run(&["wait", "--for=condition=Ready", "wf/demo", "--timeout=20s"])
        })
    };
    let jsonpath_waiter = {
        let (bin, kubeconfig) = (bin.clone(), kubeconfig.clone());
        std::thread::spawn(move || {
            Kubectl::new(bin, &kubeconfig).run(&[
                "wait",
                "--for=jsonpath={.status.phase}=Ready",
                "wf/demo",
                "--timeout=20s",
            ])
        })
    };
    emu.wait_for_watches(2, Duration::from_secs(30));
    k.ok(&[
        "patch",
        "wf",
        "demo",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Ready","conditions":[{"type":"Ready","status":"True"}]}}"#,
    ]);
    let out = waiter.join().unwrap();
    assert!(out.success, "{out:?}");
    assert_eq!(out.stdout.trim(), "workflow.lyra.example.com/demo condition met");
    let out = jsonpath_waiter.join().unwrap();
    assert!(out.success, "{out:?}");
    assert_eq!(out.stdout.trim(), "workflow.lyra.example.com/demo condition met");

    // With a finalizer, delete only marks the object; it goes when the finalizer does.
    k.ok(&[
        "patch",
        "wf",
        "demo",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["lyra.example.com/cleanup"]}}"#,
    ]);
    assert_eq!(
        k.ok(&["delete", "wf", "demo", "--wait=false"]).trim(),
        "workflow.lyra.example.com \"demo\" deleted"
    );
    let marked = json_of(&k, &["get", "wf", "demo"]);
    assert!(marked["metadata"]["deletionTimestamp"].is_string(), "{marked}");
    assert_eq!(
        marked["metadata"]["finalizers"],
        serde_json::json!(["lyra.example.com/cleanup"])
    );
    let delete_waiter = std::thread::spawn(move || {
        Kubectl::new(bin, &kubeconfig).run(&["wait", "--for=delete", "wf/demo", "--timeout=20s"])
    });
    emu.wait_for_watches(1, Duration::from_secs(30));
    k.ok(&[
        "patch",
        "wf",
        "demo",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    let out = delete_waiter.join().unwrap();
    assert!(out.success, "{out:?}");
    assert_eq!(out.stdout.trim(), "workflow.lyra.example.com/demo condition met");
    assert!(
        k.fails(&["get", "wf", "demo"])
            .contains("workflows.lyra.example.com \"demo\" not found")
    );

    // Without finalizers, delete removes at once.
    k.ok_stdin(&["apply", "-f", "-"], &workflow("plain", ""));
    assert_eq!(
        k.ok(&["delete", "wf", "plain"]).trim(),
        "workflow.lyra.example.com \"plain\" deleted"
    );
    assert!(
        k.run(&["get", "wf"])
            .stderr
            .contains("No resources found in default namespace.")
    );
}

#[test]
fn built_in_kinds_from_manifests() {
    let Some((_emu, k)) = setup("built_in_kinds_from_manifests") else {
        return;
    };
    // Separate documents: a `kind: List` would make kubectl validate against /openapi/v2.
    let manifest = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team}
data: {a: "1", b: "2"}
---
apiVersion: v1
kind: Secret
metadata: {name: token, namespace: team}
stringData: {t: hunter2}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: leader, namespace: team}
spec: {holderIdentity: pod-a, leaseDurationSeconds: 15}
"#;
    let out = k.ok_stdin(&["apply", "-f", "-"], manifest);
    assert!(
        out.contains("namespace/team created") && out.contains("lease.coordination.k8s.io/leader created"),
        "{out}"
    );
    let cms = rows(&k.ok(&["get", "configmaps", "-n", "team"]));
    assert_eq!(cms[0], vec!["NAME", "DATA", "AGE"]);
    assert_eq!(cms[1][..2], ["settings".to_string(), "2".to_string()]);
    let secret = json_of(&k, &["get", "secret", "token", "-n", "team"]);
    assert_eq!(
        secret["data"]["t"], "aHVudGVyMg==",
        "stringData is stored base64-encoded"
    );
    assert_eq!(secret["type"], "Opaque");
    let leases = rows(&k.ok(&["get", "leases", "-n", "team"]));
    assert_eq!(leases[1][..2], ["leader".to_string(), "pod-a".to_string()]);
    let sa = rows(&k.ok(&["get", "sa", "-n", "team", "-o", "name"]));
    assert_eq!(sa, vec![vec!["serviceaccount/default"]]);
    let err = k.fails_stdin(
        &["apply", "-f", "-"],
        &workflow("x", "").replace("name: x", "name: x\n  namespace: nowhere"),
    );
    assert!(err.contains("namespaces \"nowhere\" not found"), "{err}");

    assert_eq!(
        k.ok(&["delete", "namespace", "team"]).trim(),
        "namespace \"team\" deleted"
    );
    assert!(
        k.fails(&["get", "namespace", "team"])
            .contains("namespaces \"team\" not found")
    );
    assert!(
        k.run(&["get", "configmaps", "-n", "team"])
            .stderr
            .contains("No resources found")
    );
}

#[test]
fn kubectl_create_generators_for_built_in_kinds() {
    // These commands send protobuf, unlike `apply -f`.
    let Some((_emu, k)) = setup("kubectl_create_generators_for_built_in_kinds") else {
        return;
    };
    assert_eq!(k.ok(&["create", "namespace", "team"]).trim(), "namespace/team created");
    k.ok(&[
        "-n",
        "team",
        "create",
        "configmap",
        "settings",
        "--from-literal=a=1",
        "--from-literal=b=2",
    ]);
    k.ok(&[
        "-n",
        "team",
        "create",
        "secret",
        "generic",
        "token",
        "--from-literal=t=hunter2",
    ]);
    k.ok(&["-n", "team", "create", "serviceaccount", "robot"]);
    let cm = json_of(&k, &["-n", "team", "get", "configmap", "settings"]);
    assert_eq!(cm["data"], serde_json::json!({"a": "1", "b": "2"}));
    let secret = json_of(&k, &["-n", "team", "get", "secret", "token"]);
    assert_eq!(secret["data"]["t"], "aHVudGVyMg==");
    let sas = k.ok(&["-n", "team", "get", "serviceaccounts", "-o", "name"]);
    assert_eq!(sas, "serviceaccount/default\nserviceaccount/robot\n");
    let ns = json_of(&k, &["get", "namespace", "team"]);
    assert_eq!(ns["status"]["phase"], "Active");
    k.ok(&["-n", "team", "label", "configmap", "settings", "tier=web"]);
    let labelled = rows(&k.ok(&["-n", "team", "get", "configmap", "-l", "tier=web", "--show-labels"]));
    assert_eq!(labelled[1], vec!["settings", "2", &labelled[1][2], "tier=web"]);
}
