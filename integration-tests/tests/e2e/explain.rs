//! The emulator's OpenAPI v3 schemas and admission, through the real kubectl: `kubectl explain`
//! of the Workflow CRD and of a typed CRD created at run time (and updated: the published
//! document changes under the same discovery cache), and wrongly typed objects or broken CEL
//! rules (`x-kubernetes-validations`) refused with their field paths and messages.

use integration_tests::Lyra;
use integration_tests::kubectl::{Kubectl, kubectl_or_skip};
use kube_emulator::BlockingKubeEmulator;

fn start(test: &str) -> Option<(BlockingKubeEmulator, Kubectl)> {
    let bin = kubectl_or_skip(test)?;
    let emu = BlockingKubeEmulator::start().expect("the emulator starts");
    let k = Kubectl::new(bin, emu.kubeconfig_path());
    Some((emu, k))
}

fn apply_crd(k: &Kubectl, crd: &str, name: &str) {
    k.ok_stdin(&["apply", "-f", "-"], crd);
    k.ok(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{name}"),
        "--timeout=30s",
    ]);
}

/// `kubectl patch KIND NAME --type=merge -p PATCH`, to `/status` when `status`.
fn merge_patch<'a>(kind: &'a str, name: &'a str, status: bool, patch: &'a str) -> Vec<&'a str> {
    let mut args = vec!["patch", kind, name, "--type=merge", "-p", patch];
    if status {
        args.push("--subresource=status");
    }
    args
}

fn assert_contains_all(text: &str, wanted: &[&str]) {
    for w in wanted {
        assert!(text.contains(w), "output lacks {w:?}:\n{text}");
    }
}

#[test]
fn explain_and_admission_of_the_workflow_crd() {
    let Some((_emu, k)) = start("explain_and_admission_of_the_workflow_crd") else {
        return;
    };
    let crd = Lyra::new().ok(&["crd"]).stdout;
    apply_crd(&k, &crd, "workflows.lyra.dev");

    // The plural first: kubectl's explain expands short names from its discovery cache before
    // refreshing it, so a kind created after the cache was written is known by `wf` only once
    // some command has refreshed it (so it is on a real cluster).
    let kind = k.ok(&["explain", "workflows"]);
    assert_contains_all(
        &kind,
        &[
            "GROUP:      lyra.dev",
            "KIND:       Workflow",
            "metadata\t<ObjectMeta>",
            "spec\t<Object> -required-",
        ],
    );
    let spec = k.ok(&["explain", "wf.spec"]);
    assert_contains_all(
        &spec,
        &[
            "FIELD: spec <Object>",
            "workflowName\t<string>",
            "The workflow to apply, by name on the controller's load path",
            "deletionPolicy\t<string>",
            "enum: Delete, Orphan",
        ],
    );
    let field = k.ok(&["explain", "wf.spec.deletionPolicy"]);
    assert_contains_all(&field, &["FIELD: deletionPolicy <string>", "ENUM:", "Orphan"]);
    let meta = k.ok(&["explain", "wf.metadata.labels"]);
    assert_contains_all(&meta, &["FIELD: labels <map[string]string>"]);
    // Built-in kinds publish their object fields only, but explain works on them.
    let cm = k.ok(&["explain", "configmaps"]);
    assert_contains_all(
        &cm,
        &["KIND:       ConfigMap", "VERSION:    v1", "metadata\t<ObjectMeta>"],
    );
    let lease = k.ok(&["explain", "leases.metadata.name"]);
    assert_contains_all(&lease, &["GROUP:      coordination.k8s.io", "FIELD: name <string>"]);
    let missing = k.fails(&["explain", "wf.spec.nosuchfield"]);
    assert!(missing.contains("field \"nosuchfield\" does not exist"), "{missing}");

    let wf = |spec: &str| {
        format!(
            "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: demo\n  namespace: default\nspec:\n{spec}"
        )
    };
    // The CRD's CEL rule: exactly one of workflowName and workflow.
    let both = wf("  workflowName: a\n  workflow: {steps: {}}\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &both);
    assert!(
        err.contains(
            "The Workflow \"demo\" is invalid: spec: Invalid value: \"object\": set exactly one of workflowName and workflow"
        ),
        "{err}"
    );
    let neither = wf("  suspend: true\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &neither);
    assert!(err.contains("set exactly one of workflowName and workflow"), "{err}");
    let wrong = wf("  workflowName: a\n  suspend: \"yes\"\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &wrong);
    assert!(
        err.contains(
            "spec.suspend: Invalid value: \"string\": spec.suspend in body must be of type boolean: \"string\""
        ),
        "{err}"
    );
    let good = wf("  workflowName: a\n");
    let out = k.ok_stdin(&["apply", "-f", "-"], &good);
    assert_eq!(out.trim(), "workflow.lyra.dev/demo created");
    // On update too: a merge patch that adds the other one.
    let err = k.fails(&merge_patch(
        "wf",
        "demo",
        false,
        r#"{"spec":{"workflow":{"steps":{}}}}"#,
    ));
    assert!(err.contains("set exactly one of workflowName and workflow"), "{err}");
}

const GADGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.test.example.com
spec:
  group: test.example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, shortNames: [gd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        description: A gadget of the test suite.
        properties:
          spec:
            type: object
            description: What the gadget should be.
            required: [model]
            x-kubernetes-validations:
            - rule: "self.size <= 3 || self.color == 'red'"
              message: big gadgets must be red
            properties:
              model:
                type: string
                description: The gadget's model, fixed at creation.
                x-kubernetes-validations:
                - {rule: "self == oldSelf", message: model is immutable}
              size:
                type: integer
                description: How big, from 1 to 5.
                minimum: 1
                maximum: 5
                default: 1
              color:
                type: string
                description: Its paint.
                enum: [red, green, blue]
              limits:
                type: object
                description: Resource limits.
                properties:
                  cpu: {type: string, description: "CPU cores, as a quantity."}
              ports:
                type: array
                description: Ports it listens on.
                maxItems: 3
                items: {type: integer, minimum: 1, maximum: 65535}
          status:
            type: object
            properties:
              level:
                type: integer
                minimum: 0
"#;

fn gadget(spec: &str) -> String {
    format!("apiVersion: test.example.com/v1\nkind: Gadget\nmetadata:\n  name: g1\n  namespace: default\nspec:\n{spec}")
}

#[test]
fn a_typed_crd_created_at_run_time_is_explained_and_enforced() {
    let Some((_emu, k)) = start("a_typed_crd_created_at_run_time_is_explained_and_enforced") else {
        return;
    };
    apply_crd(&k, GADGET_CRD, "gadgets.test.example.com");

    let spec = k.ok(&["explain", "gadgets.spec"]);
    assert_contains_all(
        &spec,
        &[
            "GROUP:      test.example.com",
            "KIND:       Gadget",
            "VERSION:    v1",
            "FIELD: spec <Object>",
            "What the gadget should be.",
            "color\t<string>",
            "enum: red, green, blue",
            "limits\t<Object>",
            "Resource limits.",
            "model\t<string> -required-",
            "The gadget's model, fixed at creation.",
            "ports\t<[]integer>",
            "size\t<integer>",
            "How big, from 1 to 5.",
        ],
    );
    let nested = k.ok(&["explain", "gd.spec.limits.cpu"]);
    assert_contains_all(&nested, &["FIELD: cpu <string>", "CPU cores, as a quantity."]);

    // Wrongly typed, out of range, not in the enum, missing: all refused, each by field path.
    let bad = gadget("  size: big\n  color: pink\n  ports: [0, 80]\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &bad);
    assert_contains_all(
        &err,
        &[
            "The Gadget \"g1\" is invalid",
            "spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\"",
            "spec.color: Unsupported value: \"pink\": supported values: \"red\", \"green\", \"blue\"",
            "spec.ports[0]: Invalid value: 0: spec.ports[0] in body should be greater than or equal to 1",
            "spec.model: Required value",
        ],
    );
    // The CEL rule, with `self` the spec.
    let big = gadget("  model: m1\n  size: 5\n  color: blue\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &big);
    assert!(
        err.contains("The Gadget \"g1\" is invalid: spec: Invalid value: \"object\": big gadgets must be red"),
        "{err}"
    );
    let ok = gadget("  model: m1\n  size: 5\n  color: red\n");
    assert_eq!(
        k.ok_stdin(&["apply", "-f", "-"], &ok).trim(),
        "gadget.test.example.com/g1 created"
    );
    // A transition rule (`oldSelf`): the model may not change.
    let renamed = gadget("  model: m2\n  size: 5\n  color: red\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &renamed);
    assert!(
        err.contains("spec.model: Invalid value: \"string\": model is immutable"),
        "{err}"
    );
    // Status writes are checked against the status schema.
    let err = k.fails(&merge_patch("gadget", "g1", true, r#"{"status":{"level":-1}}"#));
    assert!(
        err.contains("status.level: Invalid value: -1: status.level in body should be greater than or equal to 0"),
        "{err}"
    );

    // Updating the CRD changes the published schema; the same kubectl cache sees it.
    let updated = GADGET_CRD.replace(
        "          status:\n",
        "              weight:\n                type: number\n                description: Grams, added later.\n          status:\n",
    );
    k.ok_stdin(&["apply", "-f", "-"], &updated);
    let spec = k.ok(&["explain", "gadget.spec"]);
    assert_contains_all(&spec, &["weight\t<number>", "Grams, added later."]);
}

#[test]
fn a_cel_rule_the_emulator_cannot_evaluate_is_warned_about_and_skipped() {
    let Some((_emu, k)) = start("a_cel_rule_the_emulator_cannot_evaluate_is_warned_about_and_skipped") else {
        return;
    };
    // `cel.bind` is standard Kubernetes CEL that the `cel` crate does not evaluate.
    let crd = GADGET_CRD
        .replace(
            "{rule: \"self == oldSelf\", message: model is immutable}",
            "{rule: \"cel.bind(m, self, m == oldSelf)\", message: model is immutable}",
        )
        // A rule that does not even parse: a real apiserver refuses the CRD.
        .replace(
            "                default: 1\n",
            "                default: 1\n                x-kubernetes-validations: [{rule: \"self >\"}]\n",
        );
    let out = k.run_with_stdin(&["apply", "-f", "-"], Some(&crd));
    assert!(out.success, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("Warning: version v1: x-kubernetes-validations at spec.size: ")
            && out.stderr.contains("kube-emulator does not enforce this rule"),
        "{}",
        out.stderr
    );
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/gadgets.test.example.com",
        "--timeout=30s",
    ]);
    let ok = gadget("  model: m1\n");
    assert_eq!(
        k.ok_stdin(&["apply", "-f", "-"], &ok).trim(),
        "gadget.test.example.com/g1 created"
    );
    // The rule is not enforced: the model changes.
    let renamed = gadget("  model: m2\n");
    assert_eq!(
        k.ok_stdin(&["apply", "-f", "-"], &renamed).trim(),
        "gadget.test.example.com/g1 configured"
    );
    // The others still are.
    let big = gadget("  model: m2\n  size: 5\n  color: green\n");
    let err = k.fails_stdin(&["apply", "-f", "-"], &big);
    assert!(err.contains("big gadgets must be red"), "{err}");
}

#[test]
fn an_object_stored_before_a_rule_came_can_still_have_its_status_and_metadata_written() {
    let Some((_emu, k)) = start("an_object_stored_before_a_rule_came_can_still_have_its_status_and_metadata_written")
    else {
        return;
    };
    // Without the transition rule, which is checked on every update.
    let ruled = GADGET_CRD.replace(
        "                x-kubernetes-validations:\n                - {rule: \"self == oldSelf\", message: model is immutable}\n",
        "",
    );
    let unruled = ruled.replace(
        "            x-kubernetes-validations:\n            - rule: \"self.size <= 3 || self.color == 'red'\"\n              message: big gadgets must be red\n",
        "",
    );
    assert!(ruled != GADGET_CRD && unruled != ruled, "the CRD's rules moved");
    apply_crd(&k, &unruled, "gadgets.test.example.com");
    let big = gadget("  model: m1\n  size: 5\n  color: green\n");
    k.ok_stdin(&["apply", "-f", "-"], &big);
    // Then the rule it breaks.
    apply_crd(&k, &ruled, "gadgets.test.example.com");

    // Writes that leave the spec as it is do not trip over it (validation ratcheting)...
    k.ok(&merge_patch("gadget", "g1", true, r#"{"status":{"level":2}}"#));
    k.ok(&["annotate", "gadget", "g1", "seen=yes"]);
    let status = k.ok(&[
        "get",
        "gadget",
        "g1",
        "-o",
        "jsonpath={.status.level} {.metadata.annotations.seen}",
    ]);
    assert_eq!(status.trim(), "2 yes");
    // ...one that changes it does.
    let err = k.fails(&merge_patch(
        "gadget",
        "g1",
        false,
        r#"{"spec":{"limits":{"cpu":"1"}}}"#,
    ));
    assert!(
        err.contains("spec: Invalid value: \"object\": big gadgets must be red"),
        "{err}"
    );
}
