//! A resource Lyra was told to forget (`lyra state rm`, `deletionPolicy: Orphan`) is never
//! adopted again by a later create, so a later delete cannot destroy what the user chose to
//! keep; and two state stores never share resources through a common deployment name. An
//! interrupted create is still found again, by the store that holds its pending record, even
//! after `state migrate` moved that record. The real `lyra`, `lyra-controller`, `kubectl`,
//! SQLite files, Postgres and the Foobernetes cloud file.

use std::collections::BTreeSet;
use std::time::Duration;

use integration_tests::{Lyra, Value, cloud_ids, cluster_or_skip, count, pg_or_skip, wait_until, workspace_dir};

const WEB: &str = "\
steps:
  vm:
    resource: Foobernetes::Instance
    value: {location: eu1, image: img, cpus: 1, memory: 1G}
  web:
    resource: Foobernetes::WebServer
    value: {port: 8080, appServers: []}
";

fn instances(cloud: &Value) -> BTreeSet<String> {
    cloud_ids(cloud, "Instances").into_iter().collect()
}

#[test]
fn a_forgotten_resource_is_not_adopted_and_survives_a_later_delete() {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WEB);
    lyra.ok(&["apply", "web"]);
    let old = lyra.resources("web")["vm"].clone();
    let old_entry = lyra.cloud()["Instances"][&old].clone();

    lyra.ok(&["state", "rm", "web", "vm"]);
    let report = lyra.ok_json(&["apply", "web"]);
    assert_eq!(count(&report, "created"), 1, "{report:#}");
    assert_eq!(count(&report, "unchanged"), 1, "{report:#}");
    let new = lyra.resources("web")["vm"].clone();
    assert_ne!(new, old, "a new instance, not the forgotten one");
    assert_eq!(instances(&lyra.cloud()), BTreeSet::from([old.clone(), new.clone()]));
    assert_eq!(
        lyra.cloud()["Instances"][&old],
        old_entry,
        "the forgotten one is untouched"
    );

    // Forgetting the new one too and applying again makes a third: keys never come back.
    lyra.ok(&["state", "rm", "web", "vm"]);
    lyra.ok(&["apply", "web"]);
    let third = lyra.resources("web")["vm"].clone();
    assert!(third != old && third != new, "{third}");

    lyra.ok(&["delete", "web"]);
    assert_eq!(
        instances(&lyra.cloud()),
        BTreeSet::from([old.clone(), new]),
        "only what the state recorded is deleted"
    );
    assert_eq!(lyra.cloud()["Instances"][&old], old_entry);
    assert!(cloud_ids(&lyra.cloud(), "WebServers").is_empty());
}

/// Two stores, one deployment name, one cloud.
#[track_caller]
fn stores_are_independent(lyra: &Lyra, one: &[&str], two: &[&str]) {
    lyra.write_workflow("web", WEB);
    fn run<'a>(store: &[&'a str], args: &[&'a str]) -> Vec<&'a str> {
        let mut all = args.to_vec();
        all.extend(store);
        all
    }
    lyra.ok(&run(one, &["apply", "web"]));
    let report = lyra.ok_json(&run(two, &["apply", "web"]));
    assert_eq!(
        count(&report, "created"),
        2,
        "the second store makes its own: {report:#}"
    );
    let ids = |store: &[&str]| integration_tests::resource_ids(&lyra.ok_json(&run(store, &["state", "show", "web"])));
    let (first, second) = (ids(one), ids(two));
    assert!(
        first.values().all(|id| !second.values().any(|o| o == id)),
        "{first:?} {second:?}"
    );
    assert_eq!(instances(&lyra.cloud()).len(), 2);

    lyra.ok(&run(two, &["delete", "web"]));
    assert_eq!(
        instances(&lyra.cloud()),
        BTreeSet::from([first["vm"].clone()]),
        "deleting in one store leaves the other's"
    );
    let again = lyra.ok_json(&run(one, &["apply", "web"]));
    assert_eq!(count(&again, "unchanged"), 2, "{again:#}");
}

#[test]
fn two_state_files_with_one_deployment_name_share_nothing() {
    stores_are_independent(&Lyra::new(), &[], &["--state", "other.db"]);
}

#[test]
fn two_postgres_schemas_with_one_deployment_name_share_nothing() {
    let one = pg_or_skip!();
    let two = pg_or_skip!();
    stores_are_independent(&Lyra::new(), &["--state", one.url()], &["--state", two.url()]);
}

/// `state migrate` between two spellings of one store is refused (it would drop what it
/// copied): stores are told apart by their ids, not their URLs.
#[test]
fn migrating_a_store_onto_itself_is_refused() {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WEB);
    lyra.ok(&["apply", "web"]);
    let before = lyra.state("web");
    for to in [
        "sqlite:.lyra/state.db",
        "./.lyra/state.db",
        "sqlite://.lyra/state.db?synchronous=full",
    ] {
        lyra.run(&["state", "migrate", "--from", ".lyra/state.db", "--to", to, "--replace"])
            .expect_code(2)
            .expect_stderr(&["the same state store"]);
    }
    assert_eq!(lyra.state("web"), before);
}

/// What a crash between a create and its record leaves, made through a file a user could
/// import: the deployment's `vm` turned back into a pending record with `key` (or none, as
/// Lyra versions before keys were recorded wrote it).
fn pending_export(lyra: &Lyra, deployment: &str, key: Option<&str>) -> String {
    let run = lyra.ok(&["state", "export", deployment]);
    let mut export: Value = serde_json::from_str(&run.stdout).expect("export JSON");
    let resources = export["deployments"][0]["resources"].as_array_mut().expect("resources");
    let vm = resources.iter_mut().find(|r| r["step"] == "vm").expect("vm");
    vm["pending"] = Value::Bool(true);
    vm["external_id"] = Value::String(String::new());
    vm["actual"] = serde_json::json!({});
    if let Some(key) = key {
        vm["create_key"] = Value::String(key.to_owned());
    }
    export.to_string()
}

/// The idempotency index beside the cloud file: key → id.
fn keys(lyra: &Lyra) -> serde_json::Map<String, Value> {
    serde_json::from_str(&lyra.read("deployment.json.lyra-keys")).expect("keys JSON")
}

/// A pending create is finished by the store that holds its record: through `state migrate`
/// its key moves with it, so the target finds the instance instead of making a duplicate.
#[test]
fn a_migrated_pending_create_is_found_by_the_target_store() {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WEB);
    lyra.ok(&["apply", "web"]);
    let made = lyra.resources("web")["vm"].clone();
    let (key, _) = keys(&lyra)
        .into_iter()
        .find(|(_, id)| *id == made)
        .expect("a key for the instance");
    assert!(key.ends_with("/web/vm") && key.len() > "web/vm".len() + 36, "{key}");
    lyra.write("crashed.json", pending_export(&lyra, "web", Some(&key)));
    lyra.ok(&["state", "import", "crashed.json", "--replace"]);
    assert_eq!(lyra.state("web")["resources"][0]["pending"], true, "vm is pending");

    lyra.ok(&["state", "migrate", "--from", ".lyra/state.db", "--to", "other.db"]);
    let report = lyra.ok_json(&["apply", "web", "--state", "other.db"]);
    assert_eq!(
        count(&report, "created"),
        0,
        "the pending create is adopted: {report:#}"
    );
    let state = lyra.ok_json(&["state", "show", "web", "--state", "other.db"]);
    assert_eq!(
        integration_tests::resource_ids(&state)["vm"],
        made,
        "found, not made again"
    );
    assert_eq!(instances(&lyra.cloud()), BTreeSet::from([made]), "no duplicate");
}

/// A pending record written before keys were recorded (an old export, an upgraded store)
/// is looked up under the key those versions used, `<deployment>/<step id>`.
#[test]
fn a_pending_create_from_before_store_keys_is_found_under_the_old_key() {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WEB);
    lyra.ok(&["apply", "web"]);
    let made = lyra.resources("web")["vm"].clone();
    // The index as an older Lyra wrote it.
    let mut old = serde_json::Map::new();
    for (key, id) in keys(&lyra) {
        let step = key.rsplit('/').next().expect("step").to_owned();
        old.insert(format!("web/{step}"), id);
    }
    lyra.write("deployment.json.lyra-keys", Value::Object(old).to_string());
    lyra.write("crashed.json", pending_export(&lyra, "web", None));
    lyra.ok(&["state", "import", "crashed.json", "--replace"]);

    let report = lyra.ok_json(&["apply", "web"]);
    assert_eq!(count(&report, "created"), 0, "{report:#}");
    assert_eq!(lyra.resources("web")["vm"], made, "found under the old key");
    assert_eq!(instances(&lyra.cloud()), BTreeSet::from([made]));
}

fn webapp_object(extra: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: keep\n  namespace: default\nspec:\n  workflowName: webapp\n  data:\n    webapp: {{region: eu1, replicas: 1, cache: false}}\n{extra}"
    )
}

/// `deletionPolicy: Orphan`, then the same object again: new resources, and deleting it
/// deletes only those.
#[test]
fn orphaned_resources_are_not_adopted_by_a_recreated_workflow() {
    let cluster = cluster_or_skip!();
    let yaml = std::fs::read_to_string(workspace_dir().join("examples/workflows/webapp.yaml")).expect("example");
    cluster.lyra.write_workflow("webapp", &yaml);
    let _controller = cluster.controller("c1", &[]);
    cluster.apply(&webapp_object("  deletionPolicy: Orphan\n"));
    cluster.wait_for("keep", "condition=Ready", "90s");
    let orphaned = cluster.cloud();
    let kept = instances(&orphaned);
    assert_eq!(kept.len(), 2, "{orphaned:#}");
    cluster.kubectl.ok(&["delete", "wf", "keep", "--timeout=60s"]);
    assert_eq!(cluster.cloud(), orphaned, "orphaned resources stay as they were");

    cluster.apply(&webapp_object(""));
    cluster.wait_for("keep", "condition=Ready", "90s");
    let now = instances(&cluster.cloud());
    assert_eq!(
        now.len(),
        4,
        "new instances beside the orphaned ones: {:#}",
        cluster.cloud()
    );
    assert!(kept.is_subset(&now));
    let wf = cluster.workflow("keep");
    let ids: Vec<&str> = wf["status"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["externalId"].as_str())
        .collect();
    assert!(!ids.is_empty() && ids.iter().all(|id| !kept.contains(*id)), "{wf:#}");

    cluster.kubectl.ok(&["delete", "wf", "keep", "--timeout=60s"]);
    let gone = wait_until(Duration::from_secs(60), || instances(&cluster.cloud()) == kept);
    assert!(gone, "left: {:#}", cluster.cloud());
    for table in ["Instances", "WebServers", "LoadBalancers"] {
        assert_eq!(
            cluster.cloud()[table],
            orphaned[table],
            "{table}: the orphaned resources survive, untouched"
        );
    }
}
