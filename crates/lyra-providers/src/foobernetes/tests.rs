//! Tests of the Foobernetes provider against real files in temporary directories, including the
//! original's smoke test on its file format.

// Tests report skips on the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lyra_core::value::Value;
use serde_json::json;

use super::*;

use crate::test_support::{cx, cx_at, map};

fn provider(dir: &tempfile::TempDir) -> FoobernetesProvider {
    FoobernetesProvider::new(dir.path().join("deployment.json"))
}

fn file_text(p: &FoobernetesProvider) -> String {
    std::fs::read_to_string(p.file()).unwrap()
}

/// The compatibility corpus beside the checkout, or `None` (test skipped) outside CI.
fn compat_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LYRA_COMPAT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/lyra-compat"));
    if dir.join("expected/deployment.json").is_file() {
        return Some(dir);
    }
    let why = format!(
        "compatibility corpus not found at {} (set LYRA_COMPAT_DIR)",
        dir.display()
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}");
    }
    eprintln!("skipping: {why}");
    None
}

/// `sort file | grep -v "[0-9]\{8,\}"`: the lines without a run of 8+ digits, sorted.
fn smoke_filter(text: &str) -> Vec<&str> {
    let has_long_number = |line: &str| {
        let mut run = 0;
        line.bytes().any(|b| {
            run = if b.is_ascii_digit() { run + 1 } else { 0 };
            run >= 8
        })
    };
    let mut lines: Vec<&str> = text.lines().filter(|l| !has_long_number(l)).collect();
    lines.sort_unstable();
    lines
}

fn digits_of(id: &str, prefix: &str) -> u64 {
    let n = id
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .unwrap_or_else(|| panic!("{id}"));
    assert!(n.len() >= 8 && n.bytes().all(|b| b.is_ascii_digit()), "{id}");
    let n: u64 = n.parse().unwrap();
    assert!(n <= i64::MAX as u64, "{id}");
    n
}

#[test]
fn smoke_filter_drops_lines_with_long_numbers() {
    let text = "b\n  \"i-12345678\": {\na 1234567\n\"10.0.0.1\"";
    assert_eq!(smoke_filter(text), ["\"10.0.0.1\"", "a 1234567", "b"]);
}

/// The original's smoke test: the 7 resources of `workflows/foobernetes.yaml` created by hand in
/// dependency order give `expected/deployment.json` (modulo random ids), and deleting them all
/// gives `expected/deployment.empty.json` exactly.
#[tokio::test]
async fn foobernetes_workflow_matches_the_original_file() {
    let Some(corpus) = compat_dir() else { return };
    let expected = std::fs::read_to_string(corpus.join("expected/deployment.json")).unwrap();
    let expected_empty = std::fs::read(corpus.join("expected/deployment.empty.json")).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let mut made = Vec::new();
    let mut create = async |type_name: &'static str, desired: Value| {
        let created = p.create(&cx(type_name), &map(desired)).await.unwrap();
        // What the engine reads back next run must be what create reported, or it would
        // see a change that is not there.
        let read = p.read(&cx(type_name), &created.external_id, None).await.unwrap();
        assert_eq!(read.as_ref(), Some(&created.actual));
        made.push((type_name, created.external_id.clone()));
        created.external_id
    };

    let database = create(
        "Foobernetes::Instance",
        json!({"location": "eu1", "image": "lyra::database", "cpus": 16, "memory": "64G"}),
    )
    .await;
    let mut app_servers = Vec::new();
    for (name, location) in [("app-server1", "eu1"), ("app-server2", "eu2")] {
        let desired = json!({
            "location": location,
            "image": "lyra::application",
            "config": {"name": name, "databaseID": database},
            "cpus": 4,
            "memory": "8G",
        });
        app_servers.push(create("Foobernetes::Instance", desired).await);
    }
    let mut web_servers = Vec::new();
    for _ in 0..2 {
        let desired = json!({"port": 8080, "appServers": app_servers});
        web_servers.push(create("Foobernetes::Webserver", desired).await);
    }
    for (ip, location, replica, role) in [
        ("10.0.0.1", "eu1", false, "primary"),
        ("10.0.0.2", "eu2", true, "secondary"),
    ] {
        let desired = json!({
            "loadBalancerIP": ip,
            "location": location,
            "replica": replica,
            "policy": "rr",
            "webServerIDs": web_servers,
            "tags": {"team": "lyra team", "role": role},
        });
        create("Foobernetes::Loadbalancer", desired).await;
    }

    let written = file_text(&p);
    assert_eq!(smoke_filter(&written), smoke_filter(&expected), "file:\n{written}");

    // The keys went beside the file, which stays the original's.
    assert_eq!(keys_of(&p).len(), made.len());
    for (type_name, id) in made {
        p.delete(&cx(type_name), &id, &Map::new()).await.unwrap();
    }
    assert_eq!(std::fs::read(p.file()).unwrap(), expected_empty);
    assert_eq!(keys_of(&p), BTreeMap::new());
}

/// The Go format byte for byte: the original's files, loaded and saved again, are unchanged.
#[test]
fn original_files_round_trip_byte_for_byte() {
    let Some(corpus) = compat_dir() else { return };
    for name in ["expected/deployment.json", "expected/deployment.empty.json"] {
        let original = std::fs::read_to_string(corpus.join(name)).unwrap();
        // The corpus's `deployment.json` gained a final newline when it was checked in; Go
        // wrote none (compare `deployment.empty.json`), so neither do we.
        let original = original.strip_suffix('\n').unwrap_or(&original);
        let loaded = store::load(&corpus.join(name)).unwrap();
        let saved = String::from_utf8(gojson::to_vec(&loaded).unwrap()).unwrap();
        assert_eq!(saved, original, "{name}");
    }
}

#[tokio::test]
async fn create_reports_every_attribute_and_assigns_ids_and_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let first = p
        .create(&cx(INSTANCE), &map(json!({"image": "img", "cpus": "2"})))
        .await
        .unwrap();
    digits_of(&first.external_id, "i");
    assert_eq!(
        Value::Object(first.actual),
        json!({
            "instanceID": first.external_id,
            "instanceIP": "10.0.0.1",
            "location": null,
            "image": "img",
            "config": null,
            "cpus": 2,
            "memory": "",
        })
    );
    let second = p.create(&cx(INSTANCE), &Map::new()).await.unwrap();
    assert_eq!(second.actual["instanceIP"], "10.0.0.2");
    // A pinned address is kept and does not use up one of the cloud's.
    let pinned = p
        .create(&cx(INSTANCE), &map(json!({"instanceIP": "192.168.1.1"})))
        .await
        .unwrap();
    assert_eq!(pinned.actual["instanceIP"], "192.168.1.1");
    assert_eq!(
        p.create(&cx(INSTANCE), &Map::new()).await.unwrap().actual["instanceIP"],
        "10.0.0.3"
    );

    let ws = p.create(&cx(WEB_SERVER), &Map::new()).await.unwrap();
    digits_of(&ws.external_id, "ws");
    assert_eq!(
        Value::Object(ws.actual),
        json!({"webServerID": ws.external_id, "port": 0, "appServers": null})
    );
    let lb = p
        .create(&cx(LOAD_BALANCER), &map(json!({"webServerIDs": []})))
        .await
        .unwrap();
    digits_of(&lb.external_id, "lb");
    assert_eq!(
        Value::Object(lb.actual),
        json!({
            "loadBalancerID": lb.external_id,
            "loadBalancerIP": null,
            "location": null,
            "replica": null,
            "policy": null,
            "webServerIDs": [],
            "tags": null,
        })
    );
    // Go's zero values in the file: "" and 0 for plain fields, null for nil pointers and slices.
    let text = file_text(&p);
    assert!(text.contains("\"AppServers\": null"), "{text}");
    assert!(text.contains("\"WebServerIDs\": []"), "{text}");
    assert!(!text.ends_with('\n'));
}

#[tokio::test]
async fn update_keeps_ids_and_addresses_and_stores_the_new_state() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let desired = map(json!({"location": "eu1", "image": "a", "cpus": 1, "memory": "1G"}));
    let created = p.create(&cx(INSTANCE), &desired).await.unwrap();
    let id = created.external_id.clone();

    let desired = map(json!({"location": "eu1", "image": "b", "config": {"k": "v"}, "cpus": 8, "memory": "2G"}));
    let updated = p.update(&cx(INSTANCE), &id, &desired, &created.actual).await.unwrap();
    assert_eq!(updated["instanceID"], json!(id));
    assert_eq!(updated["instanceIP"], "10.0.0.1");
    assert_eq!(updated["image"], "b");
    assert_eq!(updated["config"], json!({"k": "v"}));
    assert_eq!(updated["cpus"], 8);
    assert_eq!(p.read(&cx(INSTANCE), &id, None).await.unwrap(), Some(updated));

    let lb = p
        .create(&cx(LOAD_BALANCER), &map(json!({"loadBalancerIP": "10.1.1.1"})))
        .await
        .unwrap();
    let updated = p
        .update(
            &cx(LOAD_BALANCER),
            &lb.external_id,
            &map(json!({"policy": "rr"})),
            &lb.actual,
        )
        .await;
    let updated = updated.unwrap();
    assert_eq!(updated["loadBalancerID"], json!(lb.external_id));
    assert_eq!(updated["loadBalancerIP"], "10.1.1.1");
    assert_eq!(updated["policy"], "rr");

    let ws = p.create(&cx(WEB_SERVER), &map(json!({"port": 80}))).await.unwrap();
    let updated = p
        .update(&cx(WEB_SERVER), &ws.external_id, &map(json!({"port": 81})), &ws.actual)
        .await;
    assert_eq!(
        Value::Object(updated.unwrap()),
        json!({"webServerID": ws.external_id, "port": 81, "appServers": null})
    );

    let err = p
        .update(&cx(WEB_SERVER), "ws-12345678", &Map::new(), &Map::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn unknown_ids_read_as_none_and_delete_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    // No file yet: an empty cloud, and deleting nothing does not create the file.
    assert_eq!(p.read(&cx(INSTANCE), "i-12345678", None).await.unwrap(), None);
    p.delete(&cx(INSTANCE), "i-12345678", &Map::new()).await.unwrap();
    assert!(!p.file().exists());

    let created = p.create(&cx(INSTANCE), &Map::new()).await.unwrap();
    assert_eq!(p.read(&cx(INSTANCE), "i-12345678", None).await.unwrap(), None);
    // Ids are per kind: an instance id is no web server.
    assert_eq!(p.read(&cx(WEB_SERVER), &created.external_id, None).await.unwrap(), None);
    p.delete(&cx(LOAD_BALANCER), "lb-12345678", &Map::new()).await.unwrap();

    p.delete(&cx(INSTANCE), &created.external_id, &Map::new())
        .await
        .unwrap();
    assert_eq!(p.read(&cx(INSTANCE), &created.external_id, None).await.unwrap(), None);
    p.delete(&cx(INSTANCE), &created.external_id, &Map::new())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_corrupt_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    std::fs::write(p.file(), "{\"Instances\": [").unwrap();
    let path = p.file().display().to_string();
    let errors = [
        p.read(&cx(INSTANCE), "i-12345678", None).await.unwrap_err(),
        p.create(&cx(INSTANCE), &Map::new()).await.unwrap_err(),
        p.delete(&cx(INSTANCE), "i-12345678", &Map::new()).await.unwrap_err(),
    ];
    for err in errors {
        match err {
            ProviderError::Other(message) => assert!(message.contains(&path), "{message}"),
            other => panic!("unexpected error {other:?}"),
        }
    }
    // Nothing was overwritten.
    assert_eq!(file_text(&p), "{\"Instances\": [");
}

#[tokio::test]
async fn null_and_empty_files_load_like_go() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    std::fs::write(p.file(), "").unwrap();
    assert_eq!(p.read(&cx(INSTANCE), "i-12345678", None).await.unwrap(), None);

    // Go leaves fields that are null or missing at their zero values.
    let text = r#"{"LoadBalancers": null, "Instances": {"i-12345678":
        {"InstanceID": "i-12345678", "Image": null, "Cpus": null}}}"#;
    std::fs::write(p.file(), text).unwrap();
    let read = p.read(&cx(INSTANCE), "i-12345678", None).await.unwrap().unwrap();
    assert_eq!(read["image"], "");
    assert_eq!(read["cpus"], 0);
    assert_eq!(read["memory"], "");
}

#[tokio::test]
async fn bad_values_and_unknown_types_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let err = p
        .create(&cx(INSTANCE), &map(json!({"cpus": "many"})))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "cpus"),
        "{err:?}"
    );
    let err = p
        .create(&cx(LOAD_BALANCER), &map(json!({"tags": {"a": [1]}})))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "tags"),
        "{err:?}"
    );
    let err = p.create(&cx("Foobernetes::Database"), &Map::new()).await.unwrap_err();
    assert!(err.to_string().contains("Foobernetes::Database"), "{err}");
    assert!(!p.file().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(provider(&dir));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let p = Arc::clone(&p);
            tokio::spawn(async move {
                let desired = map(json!({"image": format!("img-{i}"), "cpus": i}));
                p.create(&cx(INSTANCE), &desired).await.unwrap()
            })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut ips = HashSet::new();
    for task in tasks {
        let created = task.await.unwrap();
        digits_of(&created.external_id, "i");
        ips.insert(created.actual["instanceIP"].as_str().unwrap().to_owned());
        ids.insert(created.external_id);
    }
    assert_eq!(ids.len(), 50);
    assert_eq!(ips, (1..=50).map(|k| format!("10.0.0.{k}")).collect::<HashSet<_>>());

    let deployment = store::load(p.file()).unwrap();
    assert_eq!(deployment.instances.keys().cloned().collect::<HashSet<_>>(), ids);
    // One key per create, each naming its own resource.
    let keys = keys_of(&p);
    assert_eq!(keys.len(), 50);
    assert_eq!(keys.values().cloned().collect::<HashSet<_>>(), ids);
    // Every save renamed its temporary file away.
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["deployment.json", "deployment.json.lock", "deployment.json.lyra-keys"]
    );
}

/// Creates `n` instances for steps `<prefix>/<i>`, each through its own task, and returns their ids.
async fn create_many(p: Arc<FoobernetesProvider>, prefix: &str, n: usize) -> HashSet<String> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let p = Arc::clone(&p);
            let step = String::leak(format!("{prefix}/{i}"));
            tokio::spawn(async move {
                let desired = map(json!({"image": "img", "cpus": 1}));
                p.create(&cx_at(INSTANCE, step), &desired).await.unwrap().external_id
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for task in tasks {
        ids.insert(task.await.unwrap());
    }
    ids
}

/// Asserts that the file beside `p` holds exactly `ids`, each with its key.
fn assert_cloud_holds(p: &FoobernetesProvider, ids: &HashSet<String>) {
    let deployment = store::load(p.file()).unwrap();
    let stored: HashSet<String> = deployment.instances.keys().cloned().collect();
    let lost = ids.difference(&stored).count();
    assert_eq!(lost, 0, "{lost} of {} resources lost", ids.len());
    assert_eq!(&stored, ids);
    let keys = keys_of(p);
    assert_eq!(keys.values().cloned().collect::<HashSet<_>>(), *ids);
}

/// Two providers on one file, as two processes would have: their in-process locks are distinct,
/// so only the OS lock (one open file description each, like two processes) keeps them apart.
#[test]
fn providers_sharing_a_file_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deployment.json");
    let runs: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|prefix| {
            let file = file.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(create_many(Arc::new(FoobernetesProvider::new(file)), prefix, 100))
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for run in runs {
        ids.extend(run.join().unwrap());
    }
    assert_eq!(ids.len(), 200);
    assert_cloud_holds(&FoobernetesProvider::new(file), &ids);
}

const CHILD_FILE: &str = "LYRA_TEST_FOOBERNETES_CHILD_FILE";

/// The second process of [`processes_sharing_a_file_lose_no_update`]; does nothing on its own
/// (like `lyra-state`'s crash child, it is a test only so the test binary can run it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process_creating_instances() {
    let Some(file) = std::env::var_os(CHILD_FILE).map(PathBuf::from) else {
        return;
    };
    // Tells the parent to start, so that the two really overlap.
    std::fs::write(file.with_file_name("child-ready"), "").unwrap();
    let ids = create_many(Arc::new(FoobernetesProvider::new(&file)), "child", 100).await;
    let mut ids: Vec<_> = ids.into_iter().collect();
    ids.sort();
    std::fs::write(file.with_file_name("child-ids"), ids.join("\n")).unwrap();
}

/// Two real processes, this test and a copy of the test binary running the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_sharing_a_file_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deployment.json");
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "foobernetes::tests::child_process_creating_instances",
            "--exact",
            "--test-threads=1",
        ])
        .env(CHILD_FILE, &file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ready = dir.path().join("child-ready");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ready.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut ids = create_many(Arc::new(provider(&dir)), "parent", 100).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success(), "child: {out:?}");
    let child_ids = std::fs::read_to_string(dir.path().join("child-ids"))
        .unwrap_or_else(|e| panic!("the child ran no test ({e}): {out:?}"));
    ids.extend(child_ids.lines().map(str::to_owned));
    assert_eq!(ids.len(), 200);
    assert_cloud_holds(&provider(&dir), &ids);
}

#[test]
fn ids_always_have_at_least_eight_digits() {
    for _ in 0..100_000 {
        digits_of(&new_id("i"), "i");
    }
}

#[test]
fn schemas_mark_provided_and_immutable_attributes() {
    let p = FoobernetesProvider::new("unused.json");
    let schemas = p.schemas();
    let find = |name: &str| schemas.iter().find(|s| s.name == name).unwrap();
    let marks = |schema: &str, attr: &str| {
        let a = find(schema).attribute(attr).unwrap();
        (a.provided, a.immutable)
    };
    assert_eq!(marks(INSTANCE, "instanceID"), (true, false));
    assert_eq!(marks(INSTANCE, "instanceIP"), (true, false));
    assert_eq!(marks(INSTANCE, "location"), (false, true));
    assert_eq!(marks(INSTANCE, "image"), (false, false));
    assert_eq!(marks(WEB_SERVER, "webServerID"), (true, false));
    assert_eq!(marks(LOAD_BALANCER, "loadBalancerID"), (true, false));
    assert_eq!(marks(LOAD_BALANCER, "loadBalancerIP"), (true, false));
    assert_eq!(marks(LOAD_BALANCER, "location"), (false, true));
    assert_eq!(
        find(LOAD_BALANCER).attribute("tags").unwrap().ty.to_string(),
        "Optional[Hash[String, String]]"
    );
    assert_eq!(
        find(WEB_SERVER).attribute("appServers").unwrap().ty.to_string(),
        "Array[String]"
    );
}

fn keys_of(p: &FoobernetesProvider) -> BTreeMap<String, String> {
    store::load_keys(&p.keys_file()).unwrap().as_map().clone()
}

fn found(lookup: Lookup) -> Created {
    match lookup {
        Lookup::Found(created) => created,
        other => panic!("expected a resource, got {other:?}"),
    }
}

#[test]
fn the_key_file_sits_beside_the_foobernetes_file() {
    assert_eq!(
        FoobernetesProvider::new("/x/deployment.json").keys_file(),
        Path::new("/x/deployment.json.lyra-keys")
    );
    assert_eq!(
        FoobernetesProvider::new("cloud").keys_file(),
        Path::new("cloud.lyra-keys")
    );
}

#[test]
fn the_lock_file_sits_beside_the_foobernetes_file() {
    assert_eq!(
        FoobernetesProvider::new("/x/deployment.json").lock_file(),
        Path::new("/x/deployment.json.lock")
    );
}

#[tokio::test]
async fn a_second_create_for_a_key_returns_the_first_resource() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let cx = cx_at(INSTANCE, "db");
    assert!(matches!(p.lookup(&cx, &Map::new()).await.unwrap(), Lookup::Absent));

    let desired = map(json!({"image": "db", "cpus": 4}));
    let first = p.create(&cx, &desired).await.unwrap();
    let file = file_text(&p);
    let again = p.create(&cx, &desired).await.unwrap();
    assert_eq!(again.external_id, first.external_id);
    assert_eq!(again.actual, first.actual);
    // Not even rewritten, and the address counter was not used up.
    assert_eq!(file_text(&p), file);
    assert_eq!(store::load(p.file()).unwrap().instances.len(), 1);

    // A changed desired state still gets the existing resource, as it is: the engine
    // sees the difference and updates it.
    let changed = p.create(&cx, &map(json!({"image": "db2", "cpus": 8}))).await.unwrap();
    assert_eq!(changed.external_id, first.external_id);
    assert_eq!(changed.actual, first.actual);

    let looked_up = found(p.lookup(&cx, &Map::new()).await.unwrap());
    assert_eq!(looked_up.external_id, first.external_id);
    assert_eq!(looked_up.actual, first.actual);
    assert_eq!(keys_of(&p), BTreeMap::from([("test/db".to_owned(), first.external_id)]));
    // The key is the step's, not the type's: another kind of resource finds nothing under it.
    assert!(matches!(
        p.lookup(&cx_at(WEB_SERVER, "db"), &Map::new()).await.unwrap(),
        Lookup::Absent
    ));
}

#[tokio::test]
async fn different_keys_make_different_resources() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let a = p.create(&cx_at(WEB_SERVER, "a"), &Map::new()).await.unwrap();
    let b = p.create(&cx_at(WEB_SERVER, "b"), &Map::new()).await.unwrap();
    let other = OpContext {
        deployment: "other",
        idempotency_key: Some("other/a"),
        ..cx_at(WEB_SERVER, "a")
    };
    let c = p.create(&other, &Map::new()).await.unwrap();
    let ids: HashSet<_> = [&a, &b, &c].map(|c| c.external_id.clone()).into();
    assert_eq!(ids.len(), 3);
    assert_eq!(store::load(p.file()).unwrap().web_servers.len(), 3);
    assert_eq!(
        found(p.lookup(&other, &Map::new()).await.unwrap()).external_id,
        c.external_id
    );
    assert_eq!(
        keys_of(&p),
        BTreeMap::from([
            ("other/a".to_owned(), c.external_id),
            ("test/a".to_owned(), a.external_id),
            ("test/b".to_owned(), b.external_id),
        ])
    );
}

/// A crash after the key file was written and before `deployment.json` was: the retried create
/// makes the resource under the id the key names, exactly once.
#[tokio::test]
async fn a_create_interrupted_between_the_two_writes_is_finished_under_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let existing = p.create(&cx_at(INSTANCE, "other"), &Map::new()).await.unwrap();
    let deployment_before = file_text(&p);
    std::fs::write(
        p.keys_file(),
        format!(
            "{{\"test/db\": \"i-123456789\", \"test/other\": \"{}\"}}",
            existing.external_id
        ),
    )
    .unwrap();

    let cx = cx_at(INSTANCE, "db");
    // A dangling key is no resource.
    assert!(matches!(p.lookup(&cx, &Map::new()).await.unwrap(), Lookup::Absent));
    assert_eq!(file_text(&p), deployment_before);

    let desired = map(json!({"image": "db"}));
    let created = p.create(&cx, &desired).await.unwrap();
    assert_eq!(created.external_id, "i-123456789");
    assert_eq!(created.actual["instanceID"], "i-123456789");
    assert_eq!(created.actual["image"], "db");
    let again = p.create(&cx, &desired).await.unwrap();
    assert_eq!(again.external_id, "i-123456789");
    let instances = store::load(p.file()).unwrap().instances;
    assert_eq!(
        instances.into_keys().collect::<BTreeSet<_>>(),
        BTreeSet::from([existing.external_id, "i-123456789".to_owned()])
    );
    assert_eq!(found(p.lookup(&cx, &Map::new()).await.unwrap()).actual, created.actual);
    assert_eq!(keys_of(&p).len(), 2);
}

/// A key left naming an id of another kind (the step's type changed) is not reused for it.
#[tokio::test]
async fn a_key_naming_another_kind_of_id_gets_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    std::fs::write(p.keys_file(), r#"{"test/x": "i-123456789"}"#).unwrap();
    let created = p.create(&cx_at(WEB_SERVER, "x"), &Map::new()).await.unwrap();
    digits_of(&created.external_id, "ws");
    assert_eq!(keys_of(&p)["test/x"], created.external_id);
}

#[tokio::test]
async fn delete_drops_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let cx = cx_at(LOAD_BALANCER, "lb");
    let keep = p.create(&cx_at(LOAD_BALANCER, "keep"), &Map::new()).await.unwrap();
    let first = p.create(&cx, &Map::new()).await.unwrap();
    p.delete(&cx, &first.external_id, &first.actual).await.unwrap();
    assert!(matches!(p.lookup(&cx, &Map::new()).await.unwrap(), Lookup::Absent));
    assert_eq!(
        keys_of(&p),
        BTreeMap::from([("test/keep".to_owned(), keep.external_id.clone())])
    );

    // Created again after the delete (a replace): a new resource, not the old id revived.
    let second = p.create(&cx, &Map::new()).await.unwrap();
    assert_ne!(second.external_id, first.external_id);
    assert_eq!(
        found(p.lookup(&cx, &Map::new()).await.unwrap()).external_id,
        second.external_id
    );

    // A key left dangling by a resource removed behind Lyra's back goes with the delete too.
    let deployment = store::load(p.file()).unwrap();
    let mut emptied = deployment.clone();
    emptied.load_balancers.remove(&second.external_id);
    store::save(p.file(), &emptied).unwrap();
    p.delete(&cx, &second.external_id, &second.actual).await.unwrap();
    assert_eq!(keys_of(&p).len(), 1);
    // The key file is a sorted, pretty JSON object.
    assert_eq!(
        std::fs::read_to_string(p.keys_file()).unwrap(),
        format!("{{\n  \"test/keep\": \"{}\"\n}}\n", keep.external_id)
    );
}

#[tokio::test]
async fn a_corrupt_key_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    std::fs::write(p.keys_file(), "[1, 2]").unwrap();
    let err = p.create(&cx(INSTANCE), &Map::new()).await.unwrap_err();
    assert!(err.to_string().contains(&p.keys_file().display().to_string()), "{err}");
    assert!(p.lookup(&cx(INSTANCE), &Map::new()).await.is_err());
    assert!(!p.file().exists());
    // An emptied key file is an empty index, like an emptied cloud.
    std::fs::write(p.keys_file(), "\n").unwrap();
    assert!(matches!(
        p.lookup(&cx(INSTANCE), &Map::new()).await.unwrap(),
        Lookup::Absent
    ));
}

#[test]
fn files_with_a_byte_order_mark_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deployment.json");
    std::fs::write(&path, b"\xEF\xBB\xBF{}\n").unwrap();
    store::load(&path).expect("a cloud file saved with a BOM");
    let keys = dir.path().join("deployment.json.lyra-keys");
    std::fs::write(&keys, b"\xEF\xBB\xBF{\"d/s\": \"i-123456789\"}").unwrap();
    assert_eq!(store::load_keys(&keys).unwrap().as_map().len(), 1);
}
