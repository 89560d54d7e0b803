//! The provider examples in `examples/workflows/providers/` stay true: every one validates,
//! and those that need nothing outside this machine, or only the test's Postgres server and
//! Kubernetes API emulator, are applied for real: created, applied again with no change,
//! drift corrected, deleted from the state alone. Their secrets never reach an output.

use std::path::PathBuf;

use integration_tests::{Lyra, cluster_or_skip, pg_or_skip, workspace_dir};
use serde_json::Value;

fn examples_dir() -> PathBuf {
    workspace_dir().join("examples/workflows")
}

fn counts(report: &Value) -> (u64, u64) {
    let c = &report["counts"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    (
        n("created") + n("updated") + n("replaced") + n("deleted"),
        n("unchanged"),
    )
}

/// `lyra ARGS -o json` with the examples' load path.
fn apply(lyra: &Lyra, workflow: &str, extra: &[&str]) -> Value {
    let dir = examples_dir();
    let mut args = vec!["apply", workflow, "--workflows", dir.to_str().expect("utf-8 path")];
    args.extend(extra);
    lyra.ok_json(&args)
}

#[test]
fn every_provider_example_validates() {
    let lyra = Lyra::new();
    let dir = examples_dir();
    let mut seen = 0;
    for entry in std::fs::read_dir(dir.join("providers")).expect("examples/workflows/providers") {
        let path = entry.expect("entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let name = format!("providers::{stem}");
        lyra.ok(&["validate", &name, "--workflows", dir.to_str().unwrap()]);
        seen += 1;
    }
    assert!(seen >= 6, "one example per provider, found {seen}");
}

#[test]
fn the_local_examples_apply_converge_and_delete() {
    let lyra = Lyra::new();
    for name in ["providers::files", "providers::commands", "providers::tls"] {
        let first = apply(&lyra, name, &[]);
        assert!(counts(&first).0 > 0, "{name}: {first:#}");
        let again = apply(&lyra, name, &[]);
        assert_eq!(counts(&again).0, 0, "{name}: applied again, nothing changes: {again:#}");
    }
    // The generated secret is in the rendered file and nowhere in any output.
    let env = lyra.read("providers-example/app.env");
    let token = env
        .lines()
        .find_map(|l| l.strip_prefix("APP_TOKEN="))
        .expect("the template was rendered")
        .to_owned();
    assert_eq!(token.len(), 32, "{env}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(lyra.path("providers-example/app.env"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let shown = [
        lyra.ok(&["state", "show", "providers::files", "-o", "json"]).stdout,
        lyra.ok(&["state", "show", "providers::files"]).stdout,
        lyra.ok(&[
            "plan",
            "providers::files",
            "--workflows",
            examples_dir().to_str().unwrap(),
            "-o",
            "json",
        ])
        .stdout,
        lyra.ok(&["state", "show", "providers::tls", "-o", "json"]).stdout,
    ];
    for out in &shown {
        assert!(!out.contains(&token), "the token leaked:\n{out}");
        assert!(!out.contains("PRIVATE KEY"), "a private key leaked:\n{out}");
    }

    // Drift: the file edited and the command's marker removed out of band are put back.
    std::fs::write(lyra.path("providers-example/app.env"), "edited\n").unwrap();
    std::fs::remove_file(lyra.path("providers-example/marker")).unwrap();
    let fixed = apply(&lyra, "providers::files", &[]);
    assert_eq!(counts(&fixed).0, 1, "{fixed:#}");
    assert!(
        lyra.read("providers-example/app.env").contains(&token),
        "same secret, rewritten"
    );
    let fixed = apply(&lyra, "providers::commands", &[]);
    assert_eq!(counts(&fixed).0, 1, "{fixed:#}");
    assert_eq!(lyra.read("providers-example/marker").trim(), "1");
    // A new release updates the marker in place and runs the action again (its triggers).
    let release = apply(&lyra, "providers::commands", &["--var", "commands.release=2"]);
    let actions: Vec<(&str, &str)> = release["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step"].as_str().unwrap(), s["action"].as_str().unwrap()))
        .collect();
    assert!(actions.contains(&("marker", "update")), "{actions:?}");
    assert!(actions.contains(&("announce", "replace")), "{actions:?}");
    assert_eq!(lyra.read("providers-example/marker").trim(), "2");

    for name in ["providers::files", "providers::commands", "providers::tls"] {
        lyra.ok(&["delete", name]);
    }
    for gone in ["app.env", "README", "marker"] {
        assert!(!lyra.path("providers-example").join(gone).exists(), "{gone} deleted");
    }
}

#[test]
fn the_postgres_example_provisions_and_the_state_alone_deletes() {
    let _db = pg_or_skip!();
    let lyra = Lyra::new();
    let suffix = format!("{:08x}", rand::random::<u32>());
    let (name, reporting) = (format!("lyra_ex_{suffix}"), format!("lyra_ex_{suffix}_r"));
    let url = "postgres://postgres@127.0.0.1:5432/test";
    let vars = [
        "--var".to_owned(),
        format!("postgres.url={url}"),
        "--var".to_owned(),
        format!("postgres.name={name}"),
        "--var".to_owned(),
        format!("postgres.reporting_name={reporting}"),
    ];
    let vars: Vec<&str> = vars.iter().map(String::as_str).collect();
    let first = apply(&lyra, "providers::postgres", &vars);
    assert_eq!(counts(&first), (5, 0), "{first:#}");
    let sql = |q: &str| integration_tests::postgres::psql_value(q);
    assert_eq!(
        sql(&format!(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = '{name}'"
        )),
        name,
        "the database is owned by the role"
    );
    assert_eq!(
        sql(&format!(
            "SELECT has_database_privilege('{reporting}', '{name}', 'CONNECT')"
        )),
        "t"
    );
    let again = apply(&lyra, "providers::postgres", &vars);
    assert_eq!(counts(&again), (0, 5), "{again:#}");
    // Drift: the privilege revoked out of band is granted again.
    sql(&format!(
        "REVOKE CONNECT ON DATABASE \"{name}\" FROM \"{reporting}\", PUBLIC"
    ));
    let fixed = apply(&lyra, "providers::postgres", &vars);
    assert_eq!(counts(&fixed).0, 1, "{fixed:#}");
    assert_eq!(
        sql(&format!(
            "SELECT has_database_privilege('{reporting}', '{name}', 'CONNECT')"
        )),
        "t"
    );
    // `lyra delete` has no workflow and no --var: the recorded provider settings reach the
    // server.
    lyra.ok(&["delete", "providers::postgres"]);
    assert_eq!(
        sql(&format!(
            "SELECT count(*) FROM pg_roles WHERE rolname IN ('{name}', '{reporting}')"
        )),
        "0"
    );
    assert_eq!(
        sql(&format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'")),
        "0"
    );
}

#[test]
fn the_kubernetes_example_applies_objects_and_corrects_drift() {
    let cluster = cluster_or_skip!();
    let lyra = Lyra::new();
    let kubeconfig = cluster
        .emulator
        .kubeconfig_path()
        .to_str()
        .expect("utf-8 path")
        .to_owned();
    let path_var = format!("kubernetes.path={kubeconfig}");
    let vars = ["--var", &path_var, "--var", "kubernetes.replicas=0"];
    // The emulator runs no Deployment controller: the test reports the rollout done (zero
    // replicas, the generation observed), and the apply's `wait: {for: Rollout}` returns then.
    let dir = examples_dir();
    let mut args = vec!["apply", "providers::kubernetes", "--workflows", dir.to_str().unwrap()];
    args.extend(vars);
    args.extend(["-o", "json"]);
    let mut child = lyra.spawn("apply", &args);
    // Play the Deployment controller: report the rollout done once the object exists.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = cluster.kubectl.run(&["get", "deployment", "hello", "-o", "json"]);
        if out.success {
            let d: Value = serde_json::from_str(&out.stdout).expect("json");
            let generation = d["metadata"]["generation"].as_i64().unwrap_or(1);
            let status = serde_json::json!({"status": {"observedGeneration": generation, "replicas": 0, "updatedReplicas": 0, "availableReplicas": 0, "readyReplicas": 0}});
            cluster.kubectl.ok(&[
                "patch",
                "deployment",
                "hello",
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ]);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the Deployment was never applied");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let status = child.wait().expect("wait");
    let (stdout, stderr) = lyra.spawned_output("apply");
    assert!(status.success(), "{stdout}\n{stderr}");
    let cm: Value =
        serde_json::from_str(&cluster.kubectl.ok(&["get", "configmap", "hello-config", "-o", "json"])).unwrap();
    assert_eq!(cm["data"]["greeting"], "hello from lyra");
    assert_eq!(cm["metadata"]["annotations"]["lyra.dev/step"], "config");
    let managed = cluster.kubectl.ok(&[
        "get",
        "configmap",
        "hello-config",
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    let fields = serde_json::from_str::<Value>(&managed).unwrap()["metadata"]["managedFields"].to_string();
    assert!(
        fields.contains("\"manager\":\"lyra\""),
        "applied as field manager lyra: {fields}"
    );

    // Drift: a field the manifest sets, changed with kubectl, is corrected; a label someone
    // else adds is not ours and stays.
    cluster.kubectl.ok(&[
        "patch",
        "configmap",
        "hello-config",
        "--type=merge",
        "-p",
        r#"{"data":{"greeting":"edited"}}"#,
    ]);
    cluster
        .kubectl
        .ok(&["label", "configmap", "hello-config", "team=other"]);
    let mut args = vec!["plan", "providers::kubernetes", "--workflows", dir.to_str().unwrap()];
    args.extend(vars);
    let plan = lyra.ok(&args).stdout;
    assert!(
        plan.contains("~ config (Kubernetes::Object) will be updated in place"),
        "{plan}"
    );
    assert!(!plan.contains("team"), "a label not ours is no drift: {plan}");
    let mut args = vec!["apply", "providers::kubernetes", "--workflows", dir.to_str().unwrap()];
    args.extend(vars);
    args.extend(["-o", "json"]);
    let fixed = lyra.ok(&args).json();
    assert!(counts(&fixed).0 >= 1, "{fixed:#}");
    let cm: Value =
        serde_json::from_str(&cluster.kubectl.ok(&["get", "configmap", "hello-config", "-o", "json"])).unwrap();
    assert_eq!(cm["data"]["greeting"], "hello from lyra");
    assert_eq!(cm["metadata"]["labels"]["team"], "other");

    lyra.ok(&["delete", "providers::kubernetes"]);
    assert!(
        !cluster.kubectl.run(&["get", "configmap", "hello-config"]).success,
        "deleted"
    );
    assert!(!cluster.kubectl.run(&["get", "deployment", "hello"]).success, "deleted");
}
