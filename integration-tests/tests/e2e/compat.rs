//! The original Lyra's smoke test and sample workflows, run unchanged from the compat corpus.

use std::path::Path;

use integration_tests::{Lyra, Value, cloud_ids, compat_or_skip, count, lines_without_ids, resource_ids, steps};

/// `lyra <command> <workflow>` reading workflows and data from the corpus.
fn run_args(compat: &Path, command: &str, workflow: &str) -> Vec<String> {
    vec![
        command.to_owned(),
        workflow.to_owned(),
        "--workflows".to_owned(),
        compat.join("workflows").display().to_string(),
        "--data".to_owned(),
        compat.join("data.yaml").display().to_string(),
    ]
}

fn with(mut args: Vec<String>, more: &[&str]) -> Vec<String> {
    args.extend(more.iter().map(|s| (*s).to_owned()));
    args
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Deleting leaves the fake cloud exactly as the original left it, and nothing in the state.
#[track_caller]
fn assert_deleted(lyra: &Lyra, compat: &Path, deployment: &str) {
    let report = lyra.ok_json(&["delete", deployment]);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    assert_eq!(
        lyra.read("deployment.json"),
        read(&compat.join("expected").join("deployment.empty.json"))
    );
    let state = lyra.state(deployment);
    assert_eq!(state["resources"], Value::Array(vec![]), "{state:#}");
}

#[test]
fn original_smoke_test_passes() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let expected = read(&compat.join("expected").join("deployment.json"));

    // 1. A clean slate, then apply. (The original's script starts with a delete, which here
    // reports that nothing is recorded instead of pretending to delete it.)
    lyra.run(&["delete", "foobernetes"])
        .expect_code(1)
        .expect_stderr(&["no state at .lyra/state.db"]);
    let first = lyra.ok_json(&with(run_args(&compat, "apply", "foobernetes"), &[]));
    assert_eq!(first["outcome"], "succeeded", "{first:#}");
    assert_eq!(count(&first, "created"), 7, "{first:#}");
    assert!(
        lyra.path(".lyra/state.db").is_file(),
        "the state is kept in ./.lyra/state.db"
    );

    // 2. The file matches the original's, up to the random ids.
    let applied = lyra.read("deployment.json");
    assert_eq!(
        lines_without_ids(&applied),
        lines_without_ids(&expected),
        "deployment.json:\n{applied}"
    );
    // The filter must not hide everything: the ids are there, one line per id and reference.
    assert_eq!(
        applied.lines().count(),
        expected.lines().count(),
        "deployment.json:\n{applied}"
    );

    // The returns are the two load balancers, which exist in the cloud.
    let cloud = lyra.cloud();
    let lbs = cloud_ids(&cloud, "LoadBalancers");
    for key in ["loadBalancerID", "secondaryLoadBalancerID"] {
        let id = first["returns"][key]
            .as_str()
            .unwrap_or_else(|| panic!("no return {key}: {first:#}"));
        assert!(
            lbs.iter().any(|lb| lb == id),
            "{key} {id} is not in deployment.json: {lbs:?}"
        );
    }
    // The state records the same ids as the cloud holds.
    let mut recorded: Vec<String> = resource_ids(&lyra.state("foobernetes")).into_values().collect();
    let mut in_cloud: Vec<String> = ["Instances", "WebServers", "LoadBalancers"]
        .iter()
        .flat_map(|t| cloud_ids(&cloud, t))
        .collect();
    recorded.sort();
    in_cloud.sort();
    assert_eq!(recorded, in_cloud);

    // 3. Applying again changes nothing at all.
    let again = lyra.ok_json(&run_args(&compat, "apply", "foobernetes"));
    assert_eq!(
        lyra.read("deployment.json"),
        applied,
        "a second apply must not touch deployment.json"
    );
    assert_eq!(count(&again, "unchanged"), 7, "{again:#}");
    for key in ["created", "updated", "replaced", "deleted", "failed", "skipped"] {
        assert_eq!(count(&again, key), 0, "{key}: {again:#}");
    }
    assert_eq!(again["returns"], first["returns"]);
    assert!(steps(&again).iter().all(|s| s["action"] == "no-op"), "{again:#}");

    // 4. Delete: the file is exactly the original's empty cloud.
    assert_deleted(&lyra, &compat, "foobernetes");
}

#[test]
fn foober_iter_collects_load_balancers() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let report = lyra.ok_json(&run_args(&compat, "apply", "foober_iter"));
    assert_eq!(count(&report, "created"), 7, "{report:#}");

    let returned = report["returns"]["loadbalancers"]
        .as_array()
        .unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(returned.len(), 2, "{report:#}");
    let cloud = lyra.cloud();
    let lbs = cloud_ids(&cloud, "LoadBalancers");
    assert_eq!(lbs.len(), 2, "{cloud:#}");
    for id in returned {
        let id = id.as_str().expect("an id string");
        assert!(lbs.iter().any(|lb| lb == id), "{id} not in {lbs:?}");
    }
    assert_ne!(returned[0], returned[1]);
    // In iteration order: the primary first.
    let first = returned[0].as_str().unwrap_or_default();
    assert_eq!(cloud["LoadBalancers"][first]["Tags"]["role"], "primary", "{cloud:#}");
    assert_eq!(
        cloud["LoadBalancers"][first]["Policy"], "rr",
        "looked up $policies.lb_policy"
    );
    // Both load balancers point at both web servers.
    let mut webs = cloud_ids(&cloud, "WebServers");
    webs.sort();
    for lb in &lbs {
        let mut pointed: Vec<String> = cloud["LoadBalancers"][lb]["WebServerIDs"]
            .as_array()
            .expect("WebServerIDs")
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
            .collect();
        pointed.sort();
        assert_eq!(pointed, webs);
    }
    let ids: Vec<String> = resource_ids(&lyra.state("foober_iter")).into_keys().collect();
    assert_eq!(
        ids,
        [
            "appServers/0",
            "appServers/1",
            "database",
            "loadbalancers/0",
            "loadbalancers/1",
            "webServers/0",
            "webServers/1"
        ]
    );

    let again = lyra.ok_json(&run_args(&compat, "apply", "foober_iter"));
    assert_eq!(count(&again, "unchanged"), 7, "{again:#}");
    assert_eq!(again["returns"], report["returns"]);
    assert_deleted(&lyra, &compat, "foober_iter");
}

#[test]
fn sample_alias_returns_the_aliased_attribute() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let report = lyra.ok_json(&run_args(&compat, "apply", "sample_alias"));
    assert_eq!(count(&report, "created"), 1, "{report:#}");
    let id = report["returns"]["databaseID"]
        .as_str()
        .unwrap_or_else(|| panic!("{report:#}"));
    let cloud = lyra.cloud();
    assert_eq!(cloud["Instances"][id]["Image"], "lyra::database", "{cloud:#}");
    assert_eq!(
        resource_ids(&lyra.state("sample_alias"))
            .into_values()
            .collect::<Vec<_>>(),
        [id]
    );
    assert_deleted(&lyra, &compat, "sample_alias");
}

#[test]
fn sample_output_hash_returns_a_hash() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let report = lyra.ok_json(&run_args(&compat, "apply", "sample_output_hash"));
    let db = report["returns"]["database"]
        .as_object()
        .unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(db.keys().collect::<Vec<_>>(), ["id", "ip"], "{report:#}");
    let id = db["id"].as_str().expect("id");
    let cloud = lyra.cloud();
    assert_eq!(cloud["Instances"][id]["InstanceIP"], db["ip"], "{cloud:#}");
    assert_deleted(&lyra, &compat, "sample_output_hash");
}

#[test]
fn varstep_returns_the_declared_hash_of_vars() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let args = with(
        run_args(&compat, "apply", "varstep"),
        &["--var", "var_a=alpha", "--var", "var_b=beta", "--var", "var_c=gamma"],
    );
    let report = lyra.ok_json(&args);
    // The declared return, not the original's quirk of returning a, b and c.
    assert_eq!(
        report["returns"],
        serde_json::json!({"v": {"x": "alpha", "y": "beta", "z": "gamma"}}),
        "{report:#}"
    );
    // Without the vars, the lookups fail and name the missing key.
    lyra.run(&[
        "apply",
        "varstep",
        "--workflows",
        &compat.join("workflows").display().to_string(),
    ])
    .expect_code(1)
    .expect_stderr(&["var_a"]);
    lyra.ok(&["delete", "varstep"]);
    assert_eq!(lyra.state("varstep")["resources"], Value::Array(vec![]));
}

#[test]
fn compat_workflows_are_valid() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let dir = compat.join("workflows").display().to_string();
    for w in [
        "foobernetes",
        "foober_iter",
        "sample_alias",
        "sample_output_hash",
        "varstep",
    ] {
        let report = lyra.ok_json(&["validate", w, "--workflows", &dir]);
        assert_eq!(report["valid"], true, "{report:#}");
        assert_eq!(report["diagnostics"], Value::Array(vec![]), "{report:#}");
    }
}
