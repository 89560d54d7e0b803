//! Registration (issue 11): `lyra register` makes a package a Kubernetes kind; lyra-controller
//! generates its CRD and runs its objects with the same core as `Workflow`s. Real `lyra`,
//! `lyra-controller`, kubectl, the emulator, a real registry (`docker-registry`) and the
//! shared state (Postgres when reachable, else SQLite).

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::registry::Registry;
use integration_tests::{Run, Value, cluster_or_skip, registry_or_skip, run_command, wait_until};

const CRD: &str = "webapps.workflows.lyra.dev";

/// Version 1: a server whose size comes from the spec, and a Sensitive password from a Secret.
pub(super) const WEBAPP_V1: &str = "\
parameters:
  replicas: {type: 'Integer[1, 4]', default: 1, doc: How many CPUs the server gets.}
  region: {type: 'Enum[eu1, eu2]', doc: Where the server runs.}
  password: {type: Sensitive}
returns: [serverID, login]
steps:
  server:
    returns:
      serverID: instanceID
    resource: Foobernetes::Instance
    value:
      location: $region
      image: web:1
      cpus: $replicas
      memory: 1G
  secret:
    returns:
      login: output
    resource: Null::Resource
    value:
      input: $password
";

/// Version 2: compatible (a new optional parameter with a default; the image changes).
pub(super) const WEBAPP_V2: &str = "\
parameters:
  replicas: {type: 'Integer[1, 4]', default: 1, doc: How many CPUs the server gets.}
  region: {type: 'Enum[eu1, eu2]', doc: Where the server runs.}
  password: {type: Sensitive}
  image: {type: String, default: 'web:2', doc: The server's image.}
returns: [serverID, login]
steps:
  server:
    returns:
      serverID: instanceID
    resource: Foobernetes::Instance
    value:
      location: $region
      image: $image
      cpus: $replicas
      memory: 1G
  secret:
    returns:
      login: output
    resource: Null::Resource
    value:
      input: $password
";

/// Version 3: breaking (`region` removed, `replicas` narrowed).
const WEBAPP_V3: &str = "\
parameters:
  replicas: {type: 'Integer[1, 2]', default: 1}
  password: {type: Sensitive}
returns: [serverID, login]
steps:
  server:
    returns:
      serverID: instanceID
    resource: Foobernetes::Instance
    value:
      location: eu1
      image: web:3
      cpus: $replicas
      memory: 1G
  secret:
    returns:
      login: output
    resource: Null::Resource
    value:
      input: $password
";

const SECRET_VALUE: &str = "hunter2-do-not-show";

/// Packages `workflow` as `webapp` VERSION and pushes it; the reference pinned by digest.
fn publish(c: &Cluster, registry: &Registry, workflow: &str, version: &str) -> (String, String) {
    c.lyra.write_workflow("webapp", workflow);
    let out = format!("webapp-{version}");
    let digest = c
        .lyra
        .ok(&["package", "webapp", "--version", version, "--out", &out])
        .stdout
        .trim()
        .to_owned();
    let pinned = c
        .lyra
        .ok(&["push", &out, &registry.url(&format!("webapp:{version}"))])
        .stdout
        .trim()
        .to_owned();
    assert!(pinned.ends_with(&digest), "{pinned} is not pinned to {digest}");
    (digest, registry.url(&format!("webapp:{version}")))
}

/// `lyra ARGS` with the emulator's KUBECONFIG.
fn lyra_k(c: &Cluster, args: &[&str]) -> Run {
    let mut cmd = c.lyra.command(args);
    cmd.env("KUBECONFIG", c.emulator.kubeconfig_path());
    run_command(cmd, args)
}

/// `text` as one JSON document valid against `$defs/NAME` of docs/json/lyra.schema.json.
#[track_caller]
fn conforms(text: &str, name: &str) -> Value {
    let doc: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not one JSON document: {e}\n{text}"));
    let errors = super::json_output::schema_errors(&doc, name);
    assert!(errors.is_empty(), "not a {name} document: {errors:#?}\n{doc:#}");
    doc
}

fn get_json(c: &Cluster, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend(args);
    all.extend(["-o", "json"]);
    serde_json::from_str(&c.kubectl.ok(&all)).expect("kubectl printed JSON")
}

/// Waits until `check` holds for `kubectl get ARGS -o json`.
#[track_caller]
fn wait_json(c: &Cluster, args: &[&str], what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let ok = wait_until(Duration::from_secs(60), || {
        let mut all = vec!["get"];
        all.extend(args);
        all.extend(["-o", "json"]);
        let out = c.kubectl.run(&all);
        last = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        out.success && check(&last)
    });
    assert!(
        ok,
        "{what}: never happened; last seen {last:#}\n--- controller ---\n{}",
        c.log("r")
    );
    last
}

fn ready(v: &Value) -> bool {
    v["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

pub(super) fn site(replicas: i64) -> String {
    format!(
        "apiVersion: workflows.lyra.dev/v1alpha1\nkind: WebApp\nmetadata:\n  name: site\n  namespace: default\n\
         spec:\n  replicas: {replicas}\n  region: eu2\n  password:\n    secretKeyRef: {{name: db, key: password}}\n"
    )
}

pub(super) fn secret() -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: default\nstringData:\n  password: {SECRET_VALUE}\n"
    )
}

/// Registers v1, runs one object, and returns the v1 digest.
fn registered_with_site(c: &Cluster, registry: &Registry) -> String {
    let (digest, tag_ref) = publish(c, registry, WEBAPP_V1, "1.0.0");
    let run = lyra_k(c, &["register", &tag_ref, "--kind", "WebApp"]);
    run.expect_ok();
    assert!(run.stdout.contains("WebApp") && run.stdout.contains(&digest), "{run}");
    let wfd = wait_json(c, &["wfd", "webapp"], "the definition Ready", ready);
    assert_eq!(wfd["status"]["digest"], digest.as_str());
    assert_eq!(wfd["status"]["crdName"], CRD);
    // The tag was resolved once, at registration: the definition names the digest.
    assert!(wfd["spec"]["package"].as_str().unwrap().ends_with(&digest), "{wfd:#}");
    c.apply(&secret());
    c.apply(&site(2));
    wait_json(c, &["webapp", "site"], "the object Ready", ready);
    digest
}

fn start(c: &Cluster) -> integration_tests::cluster::ControllerProcess {
    c.controller("r", &[])
}

#[test]
fn a_registered_package_is_a_kind_whose_objects_are_applied() {
    let c = cluster_or_skip!();
    let registry = registry_or_skip!();
    // At debug level, so that the search for the secret below covers every log line.
    let _controller = c.controller_logging("r", &[], "debug");
    let digest = registered_with_site(&c, &registry);

    // The kind is served, typed and discoverable.
    let crd = get_json(&c, &["crd", CRD]);
    assert_eq!(crd["spec"]["names"]["kind"], "WebApp");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        spec["properties"]["replicas"]["description"],
        "How many CPUs the server gets."
    );
    assert_eq!(spec["properties"]["region"]["enum"], serde_json::json!(["eu1", "eu2"]));
    // kubectl explains it, parameters and their docs included.
    let explained = c.kubectl.ok(&["explain", "webapps.spec"]);
    for wanted in [
        "KIND:       WebApp",
        "replicas\t<integer>",
        "How many CPUs the server gets.",
        "region\t<string> -required-",
        "Where the server runs.",
        "password\t<Object> -required-",
    ] {
        assert!(explained.contains(wanted), "explain lacks {wanted:?}:\n{explained}");
    }
    // A wrongly typed spec is refused at admission, by field path.
    let wrong = site(2)
        .replace("replicas: 2", "replicas: many")
        .replace("name: site", "name: bad");
    let refused = c.kubectl.fails_stdin(&["apply", "-f", "-"], &wrong);
    assert!(refused.contains("spec.replicas"), "{refused}");
    let out_of_range = site(9).replace("name: site", "name: bad");
    let refused = c.kubectl.fails_stdin(&["apply", "-f", "-"], &out_of_range);
    assert!(refused.contains("spec.replicas"), "{refused}");

    // Its resources exist, its status records the digest it runs, and the deployment is in
    // the shared state under the kind's name.
    let obj = get_json(&c, &["webapp", "site"]);
    assert_eq!(obj["status"]["digest"], digest.as_str(), "{obj:#}");
    let deployment = format!("k8s/default/{CRD}/site");
    assert_eq!(obj["status"]["deployment"], deployment.as_str());
    let cloud = c.cloud();
    let text = cloud.to_string();
    assert!(text.contains("eu2") && text.contains("web:1"), "{cloud:#}");
    let list = c.lyra.ok(&["state", "list"]).stdout;
    assert!(list.contains(&deployment), "{list}");
    // `lyra plan --name` previews the deployment with the same inputs: nothing to change.
    let plan = c.lyra.ok(&[
        "plan",
        "webapp",
        "--name",
        &deployment,
        "--var",
        "region=eu2",
        "--var",
        "replicas=2",
        "--var",
        &format!("password={SECRET_VALUE}"),
    ]);
    assert!(!plan.stdout.contains("create"), "{plan}");

    // The Sensitive parameter came from the Secret and shows nowhere the controller writes.
    let status = obj["status"].to_string();
    assert!(!status.contains(SECRET_VALUE), "the status shows the secret: {status}");
    let events = c.kubectl.ok(&["get", "events", "-A", "-o", "json"]);
    assert!(!events.contains(SECRET_VALUE), "an event shows the secret");
    assert!(
        !c.log("r").contains(SECRET_VALUE),
        "the controller's log shows the secret"
    );
    let described = c.kubectl.ok(&["describe", "webapp", "site"]);
    assert!(!described.contains(SECRET_VALUE));
}

#[test]
fn upgrades_roll_out_compatible_changes_and_refuse_breaking_ones() {
    let c = cluster_or_skip!();
    let registry = registry_or_skip!();
    let _controller = start(&c);
    let v1 = registered_with_site(&c, &registry);

    // Compatible: the object converges on the new digest, and the new image is deployed.
    let (v2, v2_ref) = publish(&c, &registry, WEBAPP_V2, "2.0.0");
    assert_ne!(v1, v2);
    let dry = lyra_k(&c, &["register", &v2_ref, "--dry-run"]);
    dry.expect_ok();
    assert!(
        dry.stdout.contains("default/site"),
        "the dry run lists the object: {dry}"
    );
    assert!(
        dry.stdout.contains("spec.image: added (compatible)"),
        "the schema diff: {dry}"
    );
    // The object's plan under the new version: its server's image changes in place.
    assert!(dry.stdout.contains("image: \"web:1\" -> \"web:2\""), "the plan: {dry}");
    assert!(dry.stdout.contains("1 to update"), "the plan: {dry}");
    // The same as one JSON document of the documented shape.
    let doc = lyra_k(&c, &["register", &v2_ref, "--dry-run", "-o", "json"]);
    doc.expect_ok();
    let doc = conforms(&doc.stdout, "register");
    assert_eq!(
        doc["instances"][0]["deployment"],
        format!("k8s/default/{CRD}/site").as_str()
    );
    assert_eq!(doc["instances"][0]["plan"]["counts"]["updated"], 1, "{doc:#}");
    // A dry run changes nothing.
    assert_eq!(get_json(&c, &["wfd", "webapp"])["status"]["digest"], v1.as_str());
    lyra_k(&c, &["register", &v2_ref]).expect_ok();
    wait_json(&c, &["webapp", "site"], "the object on v2", |o| {
        o["status"]["digest"] == v2.as_str() && ready(o)
    });
    assert!(c.cloud().to_string().contains("web:2"));
    let change = &get_json(&c, &["wfd", "webapp"])["status"]["lastSchemaChange"];
    assert_eq!(change["toDigest"], v2.as_str(), "{change:#}");
    assert_eq!(change["fromDigest"], v1.as_str(), "{change:#}");
    assert!(change["changes"].to_string().contains("image"), "{change:#}");

    // Breaking: refused by the CLI with every change listed; nothing changes.
    let (v3, v3_ref) = publish(&c, &registry, WEBAPP_V3, "3.0.0");
    let refused = lyra_k(&c, &["register", &v3_ref]);
    refused.expect_code(1);
    assert!(refused.stderr.contains("region"), "{refused}");
    assert!(refused.stderr.contains("replicas"), "{refused}");
    assert!(refused.stderr.contains("--allow-breaking"), "{refused}");
    assert_eq!(get_json(&c, &["wfd", "webapp"])["status"]["digest"], v2.as_str());

    // Applied behind the CLI's back, the controller refuses it too, and keeps serving v2.
    let v3_pinned = format!("{v3_ref}@{v3}");
    let mut patched = get_json(&c, &["wfd", "webapp"]);
    patched["spec"]["package"] = Value::String(v3_pinned);
    patched["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    patched["metadata"].as_object_mut().unwrap().remove("managedFields");
    c.apply(&patched.to_string());
    let stalled = wait_json(&c, &["wfd", "webapp"], "the upgrade refused", |d| {
        d["status"]["breakingChanges"].as_array().is_some_and(|b| !b.is_empty())
    });
    let listed = stalled["status"]["breakingChanges"].to_string();
    assert!(listed.contains("region"), "{stalled:#}");
    let crd = get_json(&c, &["crd", CRD]);
    assert!(
        crd["metadata"]["annotations"].to_string().contains(&v2),
        "the CRD stays at v2"
    );
}

#[test]
fn deleting_a_definition_waits_for_its_objects_and_never_deletes_them() {
    let c = cluster_or_skip!();
    let registry = registry_or_skip!();
    let _controller = start(&c);
    registered_with_site(&c, &registry);

    c.kubectl.ok(&["delete", "wfd", "webapp", "--wait=false"]);
    let waiting = wait_json(&c, &["wfd", "webapp"], "the deletion waiting", |d| {
        d["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("waits for 1 object"))
    });
    assert_eq!(waiting["status"]["instances"], 1);
    // And an event says so.
    let said = wait_until(Duration::from_secs(30), || {
        c.kubectl
            .run(&["get", "events", "-A", "-o", "json"])
            .stdout
            .contains("WaitingForInstances")
    });
    assert!(said, "no WaitingForInstances event");
    // The object and its resources are untouched, the CRD is still served.
    assert!(ready(&get_json(&c, &["webapp", "site"])));
    get_json(&c, &["crd", CRD]);
    assert!(c.cloud().to_string().contains("web:1"));

    // Deleting the object lets the definition, and then the CRD, go.
    c.kubectl.ok(&["delete", "webapp", "site", "--timeout=60s"]);
    let gone = wait_until(Duration::from_secs(60), || {
        !c.kubectl.run(&["get", "wfd", "webapp"]).success && !c.kubectl.run(&["get", "crd", CRD]).success
    });
    assert!(gone, "the definition and its CRD should be gone:\n{}", c.log("r"));
}

#[test]
fn a_second_definition_cannot_take_a_registered_kind() {
    let c = cluster_or_skip!();
    let registry = registry_or_skip!();
    let _controller = start(&c);
    let digest = registered_with_site(&c, &registry);
    let (_, tag_ref) = publish(&c, &registry, WEBAPP_V2, "2.0.0");

    // Through the CLI: refused, naming the owner.
    let refused = lyra_k(&c, &["register", &tag_ref, "--name", "other", "--kind", "WebApp"]);
    refused.expect_code(1);
    assert!(refused.stderr.contains("WorkflowDefinition webapp"), "{refused}");

    // Through the API: the controller stalls it, naming the owner; the owner keeps working.
    c.apply(&format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: WorkflowDefinition\nmetadata:\n  name: thief\n\
         spec:\n  package: {tag_ref}\n  kind: WebApp\n  plural: webapps\n"
    ));
    let thief = wait_json(&c, &["wfd", "thief"], "the thief stalled", |d| {
        d["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Stalled" && c["status"] == "True"))
    });
    assert!(
        thief["status"]["message"]
            .as_str()
            .unwrap()
            .contains("WorkflowDefinition webapp"),
        "{thief:#}"
    );
    let owner = get_json(&c, &["wfd", "webapp"]);
    assert!(ready(&owner));
    assert_eq!(owner["status"]["digest"], digest.as_str());
    let crd = get_json(&c, &["crd", CRD]);
    assert_eq!(crd["metadata"]["annotations"]["lyra.dev/definition"], "webapp");

    // A registered kind cannot be renamed (its objects would lose their controller).
    c.kubectl.ok(&[
        "patch",
        "wfd",
        "webapp",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"plural":"apps"}}"#,
    ]);
    wait_json(&c, &["wfd", "webapp"], "the rename refused", |d| {
        d["status"]["conditions"].to_string().contains("cannot change")
    });
    assert!(ready(&get_json(&c, &["webapp", "site"])));
    assert!(!c.kubectl.run(&["get", "crd", "apps.workflows.lyra.dev"]).success);
}

#[test]
fn a_missing_secret_is_waited_for_and_a_package_that_cannot_be_a_kind_is_stalled() {
    let c = cluster_or_skip!();
    let registry = registry_or_skip!();
    let _controller = start(&c);
    let (_, tag_ref) = publish(&c, &registry, WEBAPP_V1, "1.0.0");
    lyra_k(&c, &["register", &tag_ref, "--kind", "WebApp"]).expect_ok();
    wait_json(&c, &["wfd", "webapp"], "the definition Ready", ready);

    // The Secret is not there yet: retried (not stalled), the status naming it.
    c.apply(&site(2));
    let waiting = wait_json(&c, &["webapp", "site"], "the object waiting for its Secret", |o| {
        o["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Secret db not found"))
    });
    assert!(!ready(&waiting));
    c.apply(&secret());
    wait_json(
        &c,
        &["webapp", "site"],
        "the object Ready once the Secret exists",
        ready,
    );

    // A parameter named like Lyra's settings key cannot be a field of the kind: Stalled,
    // saying why; nothing is generated.
    let (_, reserved_ref) = publish(
        &c,
        &registry,
        "parameters:\n  lyra: {type: String}\nsteps: {}\n",
        "9.0.0",
    );
    lyra_k(
        &c,
        &["register", &reserved_ref, "--kind", "Reserved", "--name", "reserved"],
    )
    .expect_code(1);
    c.apply(&format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: WorkflowDefinition\nmetadata:\n  name: reserved\n\
         spec:\n  package: {reserved_ref}\n  kind: Reserved\n  plural: reserveds\n"
    ));
    let stalled = wait_json(&c, &["wfd", "reserved"], "the definition Stalled", |d| {
        d["status"]["conditions"].to_string().contains("Lyra's own settings")
    });
    assert!(
        stalled["status"]["conditions"].to_string().contains("InvalidPackage"),
        "{stalled:#}"
    );
    assert!(!c.kubectl.run(&["get", "crd", "reserveds.workflows.lyra.dev"]).success);
}

#[test]
fn a_restarted_controller_serves_the_registered_kinds_again() {
    let c = cluster_or_skip!();
    let registry = registry_or_skip!();
    let mut first = start(&c);
    registered_with_site(&c, &registry);
    first.terminate();

    // Registered with no controller running: the next one serves it from the start.
    let (_, other_ref) = publish(&c, &registry, WEBAPP_V1, "1.0.1");
    lyra_k(&c, &["register", &other_ref, "--kind", "Shop", "--name", "shop"]).expect_ok();
    let _second = c.controller("r2", &[]);
    wait_json(&c, &["wfd", "shop"], "the new definition Ready", ready);
    c.apply(&site(3).replace("name: site", "name: more"));
    let more = wait_json(&c, &["webapp", "more"], "an object made after the restart Ready", ready);
    assert_eq!(more["status"]["deployment"], format!("k8s/default/{CRD}/more").as_str());
    c.apply(
        &site(2)
            .replace("kind: WebApp", "kind: Shop")
            .replace("name: site", "name: corner"),
    );
    wait_json(&c, &["shops", "corner"], "an object of the new kind Ready", ready);
}

/// A registered kind configures a real provider from a Secret: the package's `providers:`
/// block reads a `Sensitive` parameter, which an object of the kind gives as a
/// `secretKeyRef`. The controller provisions a Postgres role with it, and deleting the object
/// drops the role; the URL (with its password) shows nowhere the controller writes.
#[test]
fn a_registered_kind_configures_a_provider_from_a_secret() {
    let _pg = integration_tests::pg_or_skip!();
    let c = cluster_or_skip!();
    let registry = registry_or_skip!();
    let _controller = c.controller_logging("r", &[], "debug");
    let role = format!("lyra_kind_{:08x}", rand::random::<u32>());
    // Trust authentication ignores the password: it is there to be hunted for.
    let url = "postgres://postgres:url-pw-do-not-show@127.0.0.1:5432/test";
    c.lyra.write_workflow(
        "pgapp",
        "parameters:\n  dbUrl:\n    type: Sensitive[String]\n    doc: The server, from a Secret.\n  roleName:\n    type: String\nproviders:\n  Postgres:\n    url: $dbUrl\nsteps:\n  role:\n    resource: Postgres::Role\n    value:\n      name: $roleName\n      login: true\n",
    );
    c.lyra
        .ok(&["package", "pgapp", "--version", "1.0.0", "--out", "pgapp-1"]);
    let reference = registry.url("pgapp:1.0.0");
    c.lyra.ok(&["push", "pgapp-1", &reference]);
    lyra_k(&c, &["register", &reference, "--kind", "PgApp"]).expect_ok();
    wait_json(&c, &["wfd", "pgapp"], "the definition Ready", ready);
    c.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pg\n  namespace: default\nstringData:\n  url: {url}\n"
    ));
    c.apply(&format!(
        "apiVersion: workflows.lyra.dev/v1alpha1\nkind: PgApp\nmetadata:\n  name: app\n  namespace: default\n\
         spec:\n  roleName: {role}\n  dbUrl:\n    secretKeyRef: {{name: pg, key: url}}\n"
    ));
    let obj = wait_json(&c, &["pgapp", "app"], "the object Ready", ready);
    let exists = |r: &str| {
        integration_tests::postgres::psql_value(&format!("SELECT count(*) FROM pg_roles WHERE rolname = '{r}'"))
    };
    assert_eq!(exists(&role), "1", "the role was made: {obj:#}");
    for (what, text) in [
        ("status", obj["status"].to_string()),
        ("events", c.kubectl.ok(&["get", "events", "-A", "-o", "json"])),
        ("log", c.log("r")),
    ] {
        assert!(
            !text.contains("url-pw-do-not-show"),
            "the {what} shows the URL's password"
        );
    }
    c.kubectl
        .ok(&["delete", "pgapp", "app", "--wait=true", "--timeout=60s"]);
    assert!(
        wait_until(Duration::from_secs(30), || exists(&role) == "0"),
        "deleting the object dropped the role"
    );
}
