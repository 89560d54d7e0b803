//! The built-in providers against real services: the example `app_database` (a Postgres
//! role with a generated password, its database and a grant on the real server, the
//! credentials in a Secret on the Kubernetes emulator, a configuration file) applied by the
//! CLI, drifted out of band and corrected, taken over by the controller on the same state
//! and deleted through the Workflow object; the password never shown. And creates whose
//! result was never recorded (a crash) adopted rather than made twice.
//!
//! Postgres trusts loopback connections here, so logging in proves nothing about the
//! password: the provider's sessions store passwords as MD5 hashes instead
//! (`?options=-c password_encryption=md5` on its URL), which a query can check
//! (`'md5' || md5(password || role name)`).

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use integration_tests::cluster::Cluster;
use integration_tests::postgres::{postgres_url, psql};
use integration_tests::{Run, Value, cluster_or_skip, count, pg_or_skip, step, steps, wait_until, workspace_dir};

const DEPLOYMENT: &str = "k8s/default/appdb";

/// Names of this run's own: roles and databases are server-wide, shared by every test.
struct Names {
    role: String,
    db: String,
    secret: String,
}

impl Names {
    fn new(what: &str) -> Names {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let tag = format!("{:x}", (nanos as u64) ^ (u64::from(std::process::id()) << 40));
        Names {
            role: format!("lyra_e2e_{what}_{tag}_role"),
            db: format!("lyra_e2e_{what}_{tag}_db"),
            secret: format!("{}-{tag}", what.replace('_', "-")),
        }
    }
}

/// Drops what a failed test left on the server.
impl Drop for Names {
    fn drop(&mut self) {
        let _ = psql(&format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.db));
        let _ = psql(&format!("DROP ROLE IF EXISTS \"{}\"", self.role));
    }
}

/// The provider's server: the test server, its sessions hashing passwords with MD5.
fn provider_url() -> String {
    let url = postgres_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20password_encryption%3Dmd5")
}

/// The test server's URL for database `db`.
fn url_for(db: &str) -> String {
    let url = postgres_url();
    let (base, query) = url.split_once('?').map_or((url.as_str(), ""), |(b, q)| (b, q));
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    if query.is_empty() {
        format!("{server}/{db}")
    } else {
        format!("{server}/{db}?{query}")
    }
}

/// One value (`-t -A`: unaligned, no headers) of a query on the server at `url`.
#[track_caller]
fn query_at(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
        .output()
        .expect("run psql (is the PostgreSQL client installed?)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A query in the test database.
#[track_caller]
fn query(sql: &str) -> String {
    query_at(&postgres_url(), sql)
}

/// A query in database `db`.
#[track_caller]
fn query_in(db: &str, sql: &str) -> String {
    query_at(&url_for(db), sql)
}

/// Whether role `role` exists with a login and exactly `password` (its MD5 hash).
fn role_has_password(role: &str, password: &str) -> bool {
    query(&format!(
        "SELECT rolcanlogin AND rolpassword = 'md5' || md5('{password}' || rolname) FROM pg_authid WHERE rolname = '{role}'"
    )) == "t"
}

fn role_exists(role: &str) -> bool {
    query(&format!("SELECT count(*) FROM pg_roles WHERE rolname = '{role}'")) == "1"
}

/// The owner of database `db`, or "" when there is none of that name.
fn database_owner(db: &str) -> String {
    query(&format!(
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = '{db}'"
    ))
}

/// The configuration file's text, as the example's template renders it.
fn config_text(names: &Names, host: &str) -> String {
    format!(
        "[database]\nhost = {host}\nport = 5432\nname = {}\nuser = {}\n",
        names.db, names.role
    )
}

/// The data the CLI and the controller both give (YAML, indented by `indent`).
fn data(names: &Names, host: &str, indent: &str) -> String {
    format!(
        "{indent}app_database:\n\
         {indent}  url: '{url}'\n\
         {indent}  database: {db}\n\
         {indent}  role: {role}\n\
         {indent}  secret: {secret}\n\
         {indent}  host: {host}\n",
        url = provider_url(),
        db = names.db,
        role = names.role,
        secret = names.secret,
    )
}

fn install_example(cluster: &Cluster, names: &Names) {
    let yaml = std::fs::read_to_string(workspace_dir().join("examples/workflows/app_database.yaml")).expect("example");
    cluster.lyra.write_workflow("app_database", &yaml);
    let kubeconfig = cluster.emulator.kubeconfig_path().display().to_string();
    cluster.lyra.write(
        "app.data.yaml",
        format!("{}  kubeconfig: '{kubeconfig}'\n", data(names, "127.0.0.1", "")),
    );
}

/// `lyra ARGS` on the example's deployment and data.
fn cli(cluster: &Cluster, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend(["--name", DEPLOYMENT, "--data", "app.data.yaml"]);
    cluster.lyra.run(&all)
}

/// The Secret as JSON; `None` when it is not there.
fn get_secret(cluster: &Cluster, name: &str) -> Option<Value> {
    let out = cluster
        .kubectl
        .run(&["get", "secret", name, "-n", "default", "-o", "json"]);
    if !out.success {
        assert!(out.stderr.contains("NotFound"), "{}", out.stderr);
        return None;
    }
    Some(serde_json::from_str(&out.stdout).expect("kubectl printed JSON"))
}

/// One key of a Secret's `data`, decoded.
fn secret_value(secret: &Value, key: &str) -> String {
    let b64 = secret["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no data.{key} in {secret:#}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64 in the Secret");
    String::from_utf8(bytes).expect("UTF-8 in the Secret")
}

fn sha256_of(path: &std::path::Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("run sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[track_caller]
fn assert_hidden(password: &str, what: &str, text: &str) {
    assert!(!text.contains(password), "{what} shows the generated password:\n{text}");
}

#[track_caller]
fn assert_run_hides(password: &str, run: &Run) {
    assert_hidden(
        password,
        &format!("lyra {}", run.args.join(" ")),
        &format!("{}\n{}", run.stdout, run.stderr),
    );
}

/// Changes the Secret's password out of band.
fn tamper(cluster: &Cluster, name: &str) {
    let tampered = base64::engine::general_purpose::STANDARD.encode("tampered-value");
    cluster.kubectl.ok(&[
        "patch",
        "secret",
        name,
        "-n",
        "default",
        "--type",
        "merge",
        "-p",
        &format!("{{\"data\":{{\"password\":\"{tampered}\"}}}}"),
    ]);
}

/// Every step of a report is a no-op.
#[track_caller]
fn assert_all_noop(report: &Value) {
    assert_eq!(count(report, "unchanged"), 6, "{report:#}");
    for key in ["created", "updated", "replaced", "deleted", "failed"] {
        assert_eq!(count(report, key), 0, "{key}: {report:#}");
    }
    assert!(steps(report).iter().all(|s| s["action"] == "no-op"), "{report:#}");
}

fn condition_is(wf: &Value, kind: &str, status: &str) -> bool {
    wf["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == kind && c["status"] == status))
}

fn workflow_object(names: &Names, host: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: appdb\n  namespace: default\nspec:\n  workflowName: app_database\n  data:\n{}",
        data(names, host, "    ")
    )
}

/// The example end to end: CLI apply and re-apply, drift and its correction, the controller
/// taking over the same deployment, then deleting it through the Workflow object.
#[test]
fn app_database_from_the_cli_then_the_controller() {
    let _pg = pg_or_skip!();
    let cluster = cluster_or_skip!();
    let names = Names::new("appdb");
    install_example(&cluster, &names);
    let file = cluster.lyra.path("app_database/app.ini");

    // Apply from the CLI.
    let plan = cli(&cluster, &["plan", "app_database", "-o", "json"]);
    plan.expect_ok();
    assert_eq!(count(&plan.json(), "created"), 6, "{plan}");
    let applied = cli(&cluster, &["apply", "app_database", "-o", "json"]);
    applied.expect_ok();
    let report = applied.json();
    assert_eq!(count(&report, "created"), 6, "{report:#}");
    assert_eq!(report["returns"]["appDatabase"], names.db.as_str(), "{report:#}");

    // The Secret holds the generated password, and the role has it.
    let secret = get_secret(&cluster, &names.secret).expect("the Secret was made");
    let password = secret_value(&secret, "password");
    assert_eq!(password.len(), 24, "{password}");
    assert!(password.chars().all(|c| c.is_ascii_alphanumeric()), "special: false");
    assert!(
        role_has_password(&names.role, &password),
        "the role's password is the Secret's"
    );
    assert_eq!(database_owner(&names.db), names.role, "the role owns the database");
    let login = Command::new("psql")
        .args(["-X", "-t", "-A", "-c", "SELECT current_user, current_database()"])
        .arg("-d")
        .arg(format!(
            "postgres://{}:{password}@127.0.0.1:5432/{}",
            names.role, names.db
        ))
        .output()
        .expect("psql");
    assert_eq!(
        String::from_utf8_lossy(&login.stdout).trim(),
        format!("{}|{}", names.role, names.db),
        "the role logs in to its database: {}",
        String::from_utf8_lossy(&login.stderr)
    );
    assert_eq!(
        query_in(
            &names.db,
            &format!(
                "SELECT has_schema_privilege('{0}', 'public', 'CREATE') AND has_schema_privilege('{0}', 'public', 'USAGE')",
                names.role
            )
        ),
        "t",
        "the grant"
    );

    // The configuration file.
    assert_eq!(
        cluster.lyra.read("app_database/app.ini"),
        config_text(&names, "127.0.0.1")
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).expect("the file").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o640);
    }
    assert_eq!(
        report["returns"]["configSha256"],
        sha256_of(&file).as_str(),
        "{report:#}"
    );

    // Again: nothing to do.
    let again = cli(&cluster, &["apply", "app_database", "-o", "json"]);
    again.expect_ok();
    assert_all_noop(&again.json());
    let text_again = cli(&cluster, &["apply", "app_database"]);
    text_again.expect_ok();
    let text_plan = cli(&cluster, &["plan", "app_database"]);
    text_plan.expect_ok();
    let verbose_plan = cli(&cluster, &["plan", "app_database", "-v"]);
    verbose_plan.expect_ok();
    let show = cluster.lyra.run(&["state", "show", DEPLOYMENT, "-o", "json"]);
    show.expect_ok();
    let history = cluster.lyra.run(&["history", DEPLOYMENT, "-o", "json"]);
    history.expect_ok();
    for run in [
        &plan,
        &applied,
        &again,
        &text_again,
        &text_plan,
        &verbose_plan,
        &show,
        &history,
    ] {
        assert_run_hides(&password, run);
    }
    assert!(show.stdout.contains("(sensitive)"), "{show}");
    // The search above can find it: the export carries the values.
    let export = cluster.lyra.ok(&["state", "export", DEPLOYMENT]);
    assert!(export.stdout.contains(&password), "the export keeps the password");

    // Drift: the Secret's password changed out of band, the file deleted.
    tamper(&cluster, &names.secret);
    assert_eq!(
        secret_value(&get_secret(&cluster, &names.secret).expect("Secret"), "password"),
        "tampered-value"
    );
    std::fs::remove_file(&file).expect("delete the file");
    let drift = cli(&cluster, &["plan", "app_database", "-o", "json"]);
    drift.expect_ok();
    assert_run_hides(&password, &drift);
    let drift = drift.json();
    assert_eq!(step(&drift, "secret")["action"], "update", "{drift:#}");
    assert_eq!(step(&drift, "config")["action"], "create", "{drift:#}");
    assert_eq!(count(&drift, "unchanged"), 4, "{drift:#}");
    let fixed = cli(&cluster, &["apply", "app_database", "-o", "json"]);
    fixed.expect_ok();
    assert_run_hides(&password, &fixed);
    let fixed = fixed.json();
    assert_eq!(
        (count(&fixed, "updated"), count(&fixed, "created")),
        (1, 1),
        "{fixed:#}"
    );
    assert_eq!(
        secret_value(&get_secret(&cluster, &names.secret).expect("Secret"), "password"),
        password,
        "the password is put back"
    );
    assert_eq!(
        cluster.lyra.read("app_database/app.ini"),
        config_text(&names, "127.0.0.1")
    );
    assert_all_noop(&cli(&cluster, &["apply", "app_database", "-o", "json"]).json());

    // The controller takes the same deployment over: nothing to change.
    let root = cluster.lyra.dir().display().to_string();
    let _controller = cluster.controller("c1", &["--files-root", &root]);
    cluster.apply(&workflow_object(&names, "127.0.0.1"));
    cluster.wait_for("appdb", "condition=Ready", "120s");
    let wf = cluster.workflow("appdb");
    let wf_steps = wf["status"]["steps"].as_array().expect("status.steps");
    assert_eq!(wf_steps.len(), 6, "{wf:#}");
    assert!(
        wf_steps.iter().all(|s| s["lastAction"] == "no-op"),
        "the CLI's resources are the controller's: {wf:#}"
    );
    assert!(role_has_password(&names.role, &password), "the password is kept");
    let history = cluster.lyra.history(DEPLOYMENT);
    assert_eq!(history[0]["actor"], "controller/default/appdb", "{history:#?}");
    assert_eq!(wf["status"]["lastRun"]["id"], history[0]["id"], "{wf:#}");

    // A change through spec.data (a line of the file) while the Secret drifted out of band:
    // the controller rewrites the file and puts the password back, the Secret now with the
    // owner labels; the role keeps its password.
    tamper(&cluster, &names.secret);
    cluster.apply(&workflow_object(&names, "localhost"));
    let wf = cluster.wait_until_status("appdb", Duration::from_secs(120), |wf| {
        wf["status"]["observedGeneration"] == 2 && condition_is(wf, "Ready", "True")
    });
    let mut changed: Vec<&str> = wf["status"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["lastAction"] != "no-op")
        .filter_map(|s| s["name"].as_str())
        .collect();
    changed.sort_unstable();
    assert_eq!(changed, ["config", "secret"], "{wf:#}");
    assert_eq!(
        cluster.lyra.read("app_database/app.ini"),
        config_text(&names, "localhost")
    );
    let secret = get_secret(&cluster, &names.secret).expect("Secret");
    assert_eq!(secret_value(&secret, "password"), password, "the password is put back");
    assert_eq!(
        secret["metadata"]["labels"]["lyra.dev/owner-name"], "appdb",
        "{secret:#}"
    );
    assert_eq!(
        secret["metadata"]["labels"]["lyra.dev/owner-namespace"], "default",
        "{secret:#}"
    );
    assert!(role_has_password(&names.role, &password), "the password is kept");
    assert_eq!(
        wf["status"]["returns"]["configSha256"],
        sha256_of(&file).as_str(),
        "{wf:#}"
    );
    let status = serde_json::to_string(&wf).expect("JSON");
    assert_hidden(&password, "the Workflow's status", &status);
    let described = cluster.kubectl.ok(&["describe", "wf", "appdb"]);
    assert_hidden(&password, "kubectl describe", &described);

    // Deleting the object deletes it all.
    cluster.kubectl.ok(&["delete", "wf", "appdb", "--timeout=120s"]);
    assert!(!role_exists(&names.role), "the role was dropped");
    assert_eq!(database_owner(&names.db), "", "the database was dropped");
    assert!(get_secret(&cluster, &names.secret).is_none(), "the Secret was deleted");
    assert!(!file.exists(), "the file was deleted");
    assert_hidden(&password, "the controller's log", &cluster.log("c1"));
    assert!(!cluster.log("c1").is_empty());
}

const ADOPT: &str = "\
parameters:
  dbUrl: {type: 'Sensitive[String]'}
  roleName: String
  mapName: String
  kubeconfig: String
providers:
  Postgres: {url: $dbUrl}
  Kubernetes: {config_path: $kubeconfig}
steps:
  role:
    resource: Postgres::Role
    value: {name: $roleName, login: true, password: not-a-secret-here}
  map:
    resource: Kubernetes::Object
    value:
      manifest:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: $mapName, namespace: default}
        data: {greeting: hello}
";

/// A crash between a create and its record leaves a pending record (made here as in
/// `adoption.rs`: an export with the records turned pending, imported back). The next apply
/// finds the role and the ConfigMap by their natural keys and adopts them: no "already
/// exists", no second object.
#[test]
fn pending_creates_of_a_role_and_a_config_map_are_adopted() {
    let _pg = pg_or_skip!();
    let cluster = cluster_or_skip!();
    let names = Names::new("adopt");
    let lyra = &cluster.lyra;
    lyra.write_workflow("adopt", ADOPT);
    lyra.write(
        "adopt.data.yaml",
        format!(
            "dbUrl: '{}'\nroleName: {}\nmapName: {}\nkubeconfig: '{}'\n",
            provider_url(),
            names.role,
            names.secret,
            cluster.emulator.kubeconfig_path().display()
        ),
    );
    let args = ["apply", "adopt", "--data", "adopt.data.yaml"];
    let first = lyra.ok_json(&args);
    assert_eq!(count(&first, "created"), 2, "{first:#}");
    let made = lyra.resources("adopt");
    assert!(role_has_password(&names.role, "not-a-secret-here"));
    let uid = |c: &Cluster| {
        let text = c
            .kubectl
            .ok(&["get", "configmap", &names.secret, "-n", "default", "-o", "json"]);
        let v: Value = serde_json::from_str(&text).expect("JSON");
        v["metadata"]["uid"].as_str().expect("uid").to_owned()
    };
    let map_uid = uid(&cluster);

    // The crash: both records pending, with no external id and nothing known.
    let export = lyra.ok(&["state", "export", "adopt"]).stdout;
    let mut export: Value = serde_json::from_str(&export).expect("export JSON");
    for r in export["deployments"][0]["resources"].as_array_mut().expect("resources") {
        r["pending"] = Value::Bool(true);
        r["external_id"] = Value::String(String::new());
        r["actual"] = serde_json::json!({});
    }
    lyra.write("crashed.json", export.to_string());
    lyra.ok(&["state", "import", "crashed.json", "--replace"]);
    let pending = lyra.state("adopt");
    assert!(
        pending["resources"]
            .as_array()
            .is_some_and(|rs| rs.iter().all(|r| r["pending"] == true)),
        "{pending:#}"
    );

    let report = lyra.ok_json(&args);
    assert_eq!(count(&report, "created"), 0, "adopted, not made again: {report:#}");
    assert_eq!(count(&report, "failed"), 0, "{report:#}");
    assert_eq!(lyra.resources("adopt"), made, "the same external ids");
    assert!(role_exists(&names.role));
    assert!(
        role_has_password(&names.role, "not-a-secret-here"),
        "the password is set again"
    );
    assert_eq!(uid(&cluster), map_uid, "the same ConfigMap, not a new one");
    let state = lyra.state("adopt");
    assert!(
        state["resources"]
            .as_array()
            .is_some_and(|rs| rs.iter().all(|r| r["pending"] == false)),
        "{state:#}"
    );
    let again = lyra.ok_json(&args);
    assert_eq!(count(&again, "unchanged"), 2, "{again:#}");

    lyra.ok(&["delete", "adopt"]);
    assert!(
        !role_exists(&names.role),
        "the adopted role is deleted with the deployment"
    );
    let gone = wait_until(Duration::from_secs(30), || {
        !cluster
            .kubectl
            .run(&["get", "configmap", &names.secret, "-n", "default"])
            .success
    });
    assert!(gone, "the adopted ConfigMap is deleted with the deployment");
}

/// A manifest that holds a password is masked where it is shown, but its other strings (its
/// kind `Secret`, its namespace, its name) are not secrets: another step's values and a literal
/// return that contain them are shown as they are (`lyra_core::secret::Secrets::add_derived`).
#[test]
fn strings_beside_a_secret_are_not_masked_elsewhere() {
    let lyra = integration_tests::Lyra::new();
    lyra.write_workflow(
        "beside",
        "\
parameters:
  pw: {type: 'Sensitive[String]', value: s3cr3t-value}
returns:
  where:
    value: default
steps:
  secret:
    resource: Null::Resource
    value:
      input: {kind: Secret, metadata: {namespace: default, name: app-db}, password: $pw}
  other:
    resource: Null::Resource
    value:
      input: namespace default, database app-db
",
    );
    let report = lyra.ok_json(&["apply", "beside"]);
    assert_eq!(report["returns"]["where"], "default", "{report:#}");
    let other = step(&report, "other");
    assert_eq!(
        other["changes"][0]["new"], "namespace default, database app-db",
        "{report:#}"
    );
    assert!(!lyra.ok(&["state", "show", "beside"]).stdout.contains("s3cr3t-value"));
}

/// The controller runs workflows anyone who may create a Workflow object writes: it runs no
/// command unless started with `--allow-exec`, and writes files only inside `--files-root`.
/// Both refusals name the step and say why; nothing is run or written.
#[test]
fn the_controller_runs_no_command_and_writes_no_file_outside_its_root() {
    let cluster = cluster_or_skip!();
    let root = cluster.lyra.path("files-root");
    std::fs::create_dir_all(&root).expect("files root");
    let outside = cluster.lyra.path("outside.txt");
    let _controller = cluster.controller("c1", &["--files-root", root.to_str().expect("utf-8 path")]);
    let marker = cluster.lyra.path("ran");
    cluster.apply(&format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: hostile\n  namespace: default\nspec:\n  workflow:\n    steps:\n      run:\n        resource: Exec::Command\n        value:\n          create: touch {marker}\n      escape:\n        resource: File::File\n        value:\n          path: ../outside.txt\n          content: pwned\n      absolute:\n        resource: File::File\n        value:\n          path: {outside}\n          content: pwned\n      inside:\n        resource: File::File\n        value:\n          path: conf/ok.txt\n          content: fine\n",
        marker = marker.display(),
        outside = outside.display(),
    ));
    let wf = cluster.wait_until_status("hostile", Duration::from_secs(60), |wf| {
        wf["status"]["steps"]
            .as_array()
            .is_some_and(|s| s.iter().filter(|s| s["lastError"].is_string()).count() == 3)
    });
    let errors: std::collections::BTreeMap<&str, &str> = wf["status"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| Some((s["name"].as_str()?, s["lastError"].as_str()?)))
        .collect();
    assert!(errors["run"].contains("--allow-exec"), "{errors:#?}");
    assert!(errors["escape"].contains("'..'"), "{errors:#?}");
    assert!(errors["absolute"].contains("is absolute"), "{errors:#?}");
    assert!(!errors.contains_key("inside"), "{errors:#?}");
    // Refusals only: the same input would fail the same way, so it waits for a change.
    let wf = cluster.wait_until_status("hostile", Duration::from_secs(30), |wf| {
        condition_is(wf, "Stalled", "True")
    });
    let stalled = wf["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Stalled"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(stalled["reason"], "ProviderRefused", "{wf:#}");
    assert!(!marker.exists(), "no command ran");
    assert!(!outside.exists(), "nothing was written outside the files root");
    assert_eq!(
        std::fs::read_to_string(root.join("conf/ok.txt")).expect("written inside"),
        "fine"
    );
}
