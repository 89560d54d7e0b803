//! The chart's RBAC is exactly what the controller calls (issue 12): the chart installed with
//! real helm (two replicas, so leader election is on), one replica started from the rendered
//! Deployment, and every feature exercised: a Workflow applied and deleted, the webhook's
//! certificate made and its CA injected, a package registered as a kind, an object of that
//! kind waiting for its Secret, an upgrade, deletions. The emulator records every API call by
//! user; each call the controller made must be allowed by the rules the chart installed, and
//! every rule must be used by some call.

use std::collections::BTreeSet;
use std::time::Duration;

use integration_tests::helm::{CONTROLLER_USER, ChartCluster};
use integration_tests::kubectl::Kubectl;
use integration_tests::{Lyra, Value, registry_or_skip, wait_until};
use kube_emulator::AuditRecord;

use super::registration::{WEBAPP_V1, WEBAPP_V2, secret, site};

/// Rules that the scenario cannot make the controller use, and why they are needed: `get`
/// of a watched object is the controller's check after a finalizer patch whose `test` failed
/// (its cache was behind the server), which a test cannot bring about on purpose.
const NOT_EXERCISED: &[(&str, &str, &str)] = &[
    ("get", "lyra.dev", "workflows"),
    ("get", "lyra.dev", "workflowdefinitions"),
    ("get", "workflows.lyra.dev", "*"),
];

/// One RBAC rule where it applies: cluster-wide (a ClusterRole) or in one namespace (a Role).
#[derive(Debug)]
struct Rule {
    namespace: Option<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
    verbs: Vec<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

/// The rules bound to the controller's service account, as installed.
fn installed_rules(kubectl: &Kubectl) -> Vec<Rule> {
    let get = |what: &str| -> Vec<Value> {
        let list: Value = serde_json::from_str(&kubectl.ok(&["get", what, "-A", "-o", "json"])).expect("JSON");
        list["items"].as_array().expect("items").clone()
    };
    let sa = ("lyra-system", "lyra");
    let bound = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["kind"] == "ServiceAccount" && s["namespace"] == sa.0 && s["name"] == sa.1)
    };
    let mut rules = Vec::new();
    for (bindings, roles) in [("clusterrolebindings", "clusterroles"), ("rolebindings", "roles")] {
        let roles = get(roles);
        for b in get(bindings).iter().filter(|b| bound(b)) {
            let namespace = b["metadata"]["namespace"].as_str().map(str::to_owned);
            let role = roles
                .iter()
                .find(|r| {
                    r["metadata"]["name"] == b["roleRef"]["name"]
                        && r["metadata"]["namespace"].as_str() == namespace.as_deref()
                })
                .unwrap_or_else(|| panic!("binding {} names no installed role", b["metadata"]["name"]));
            for r in role["rules"].as_array().into_iter().flatten() {
                rules.push(Rule {
                    namespace: namespace.clone(),
                    groups: strings(&r["apiGroups"]),
                    resources: strings(&r["resources"]),
                    names: strings(&r["resourceNames"]),
                    verbs: strings(&r["verbs"]),
                });
            }
        }
    }
    rules
}

/// `resource` or `resource/subresource`, as rules name it.
fn resource_of(call: &AuditRecord) -> String {
    if call.subresource.is_empty() {
        call.resource.clone()
    } else {
        format!("{}/{}", call.resource, call.subresource)
    }
}

/// Whether `rule` allows `call` as the apiserver's RBAC authorizer decides.
fn allows(rule: &Rule, call: &AuditRecord) -> bool {
    let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
    // `*` is every resource but none of their subresources; `*/status` every one's status.
    let resource = |r: &String| match r.split_once('/') {
        _ if *r == resource_of(call) => true,
        None => r == "*" && call.subresource.is_empty(),
        Some((res, sub)) => res == "*" && (sub == "*" || sub == call.subresource) && !call.subresource.is_empty(),
    };
    rule.namespace.as_deref().is_none_or(|ns| call.namespace == ns)
        && any(&rule.groups, &call.api_group)
        && rule.resources.iter().any(resource)
        && any(&rule.verbs, &call.verb)
        && (rule.names.is_empty() || rule.names.contains(&call.name))
}

#[test]
fn the_charts_rbac_is_exactly_the_calls_the_controller_makes() {
    let registry = registry_or_skip!();
    let Some(c) = ChartCluster::install(
        "the_charts_rbac_is_exactly_the_calls_the_controller_makes",
        &["--set", "replicaCount=2"],
    ) else {
        return;
    };
    let (kubectl, emu) = (&c.kubectl, &c.emulator);
    let pod = c.replica("lyra-0");
    let ready = |what: &[&str]| {
        let mut args = vec!["wait", "--for=condition=Ready", "--timeout=60s"];
        args.extend(what);
        kubectl.ok(&args);
    };

    // A Workflow, applied, then deleted through the finalizer.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: hello\n  namespace: default\n\
         spec:\n  workflow:\n    steps:\n      hello:\n        resource: Null::Resource\n        value:\n          input: hi\n",
    );
    ready(&["workflow/hello"]);
    // Runs on request that change nothing repeat their events' notes ("applied: no
    // changes"): a repeat joins the earlier event's series. Asked for until one does.
    let mut asked = 0;
    let repeated = wait_until(Duration::from_secs(60), || {
        let events: Value =
            serde_json::from_str(&kubectl.ok(&["get", "events.events.k8s.io", "-o", "json"])).expect("JSON");
        let series = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["series"]["count"].as_i64().is_some_and(|n| n >= 2));
        if !series {
            asked += 1;
            let request = format!("lyra.dev/reconcile-requested-at=again-{asked}");
            kubectl.ok(&["annotate", "--overwrite", "workflow", "hello", &request]);
        }
        series
    });
    assert!(repeated, "a second run repeated no event:\n{}", pod.log());
    kubectl.ok(&["delete", "workflow", "hello", "--timeout=60s"]);

    // The webhook's certificate renewed (here: made for other names): an update of its Secret.
    let ca = || {
        kubectl.ok(&[
            "get",
            "validatingwebhookconfiguration",
            "lyra",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ])
    };
    let before = ca();
    kubectl.ok(&[
        "annotate",
        "secret",
        "-n",
        "lyra-system",
        "lyra-webhook-tls",
        "--overwrite",
        "lyra.dev/webhook-dns-names=old.example",
    ]);
    let renewed = wait_until(Duration::from_secs(60), || ca() != before);
    assert!(renewed, "the certificate was not renewed:\n{}", pod.log());

    // A package registered as a kind; an object waiting for its Secret; an upgrade; the object and the definition deleted.
    let lyra = Lyra::new();
    let push = |workflow: &str, version: &str| registry.publish(&lyra, "webapp", workflow, version);
    let definition = |package: &str| {
        format!(
            "apiVersion: lyra.dev/v1alpha1\nkind: WorkflowDefinition\nmetadata:\n  name: webapp\n\
             spec:\n  package: {package}\n  kind: WebApp\n  plural: webapps\n"
        )
    };
    kubectl.ok_stdin(&["apply", "-f", "-"], &definition(&push(WEBAPP_V1, "1.0.0")));
    ready(&["wfd/webapp"]);
    kubectl.ok_stdin(&["apply", "-f", "-"], &site(2));
    kubectl.ok_stdin(&["apply", "-f", "-"], &secret());
    ready(&["webapp/site"]);
    kubectl.ok_stdin(&["apply", "-f", "-"], &definition(&push(WEBAPP_V2, "2.0.0")));
    let upgraded = wait_until(Duration::from_secs(60), || {
        kubectl
            .ok(&["get", "wfd", "webapp", "-o", "jsonpath={.status.version}"])
            .contains("2.0.0")
    });
    assert!(upgraded, "the definition was not upgraded");
    kubectl.ok(&["delete", "webapp", "site", "--timeout=60s"]);
    kubectl.ok(&["delete", "wfd", "webapp", "--timeout=60s"]);
    let unregistered = wait_until(Duration::from_secs(60), || {
        !kubectl.run(&["get", "crd", "webapps.workflows.lyra.dev"]).success
    });
    assert!(unregistered, "the registered kind's CRD was not deleted");
    drop(pod);

    // Discovery, OpenAPI and health are non-resource requests every user may make.
    let calls: Vec<AuditRecord> = emu
        .requests_by(CONTROLLER_USER)
        .into_iter()
        .filter(|r| !r.resource.is_empty())
        .collect();
    assert!(!calls.is_empty(), "the emulator recorded no call of {CONTROLLER_USER}");
    let rules = installed_rules(kubectl);

    // Every call is allowed...
    let denied: BTreeSet<String> = calls
        .iter()
        .filter(|c| !rules.iter().any(|r| allows(r, c)))
        .map(|c| format!("{c:?}"))
        .collect();
    assert!(denied.is_empty(), "calls the chart's RBAC does not allow:\n{denied:#?}");
    // ...and every verb of every rule is used.
    let mut unused = Vec::new();
    for rule in &rules {
        for group in &rule.groups {
            for resource in &rule.resources {
                for verb in &rule.verbs {
                    let one = Rule {
                        namespace: rule.namespace.clone(),
                        groups: vec![group.clone()],
                        resources: vec![resource.clone()],
                        names: rule.names.clone(),
                        verbs: vec![verb.clone()],
                    };
                    let excused = NOT_EXERCISED.contains(&(verb.as_str(), group.as_str(), resource.as_str()));
                    if !excused && !calls.iter().any(|c| allows(&one, c)) {
                        unused.push(format!(
                            "{verb} {group}/{resource} {:?} in {:?}",
                            rule.names, rule.namespace
                        ));
                    }
                }
            }
        }
    }
    let made: BTreeSet<String> = calls
        .iter()
        .map(|c| {
            format!(
                "{} {}/{} {} in {:?}",
                c.verb,
                c.api_group,
                resource_of(c),
                c.name,
                c.namespace
            )
        })
        .collect();
    assert!(
        unused.is_empty(),
        "rules no call needed:\n{unused:#?}\nthe calls made:\n{made:#?}"
    );
    // The excuses stay true: each names a rule the chart has.
    for (verb, group, resource) in NOT_EXERCISED {
        assert!(
            rules.iter().any(|r| r.verbs.iter().any(|v| v == verb)
                && r.groups.iter().any(|g| g == group)
                && r.resources.iter().any(|x| x == resource)),
            "NOT_EXERCISED names {verb} {group}/{resource}, which the chart does not grant"
        );
    }
}
