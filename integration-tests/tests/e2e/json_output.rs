//! `-o json` is total: every command prints exactly one JSON document on stdout, on success
//! and on failure (`{"error": {...}}`, usage errors included), and each document matches its
//! schema in `docs/json/lyra.schema.json` (the reference is docs/json-output.md).

use std::process::Child;
use std::time::Duration;

use integration_tests::{Lyra, Run, Value, sleeps_workflow, wait_until, workspace_dir};

const PAIR: &str = "\
steps:
  one:
    returns: {o: output}
    resource: Null::Resource
    value:
      input: 1
  two:
    resource: Null::Resource
    value:
      input: $o
";

/// A validator for one document type (`$defs/NAME` of the schema file).
fn validator(name: &str) -> jsonschema::Validator {
    let path = workspace_dir().join("docs/json/lyra.schema.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    assert!(schema["$defs"][name].is_object(), "the schema has no $defs/{name}");
    let root = serde_json::json!({
        "$schema": schema["$schema"],
        "$defs": schema["$defs"],
        "$ref": format!("#/$defs/{name}"),
    });
    jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("the schema does not compile: {e}"))
}

/// Where `doc` departs from `$defs/NAME` of the schema file (empty: it conforms). Every e2e
/// module that checks a `-o json` document uses this one.
pub fn schema_errors(doc: &Value, name: &str) -> Vec<String> {
    validator(name)
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Asserts `run` printed exactly one JSON document that matches `$defs/NAME`.
#[track_caller]
fn conforms(run: &Run, name: &str) -> Value {
    // `from_str` refuses anything after the first document.
    let doc: Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document: {e}\n{run}"));
    let errors = schema_errors(&doc, name);
    assert!(errors.is_empty(), "not a {name} document: {errors:#?}\n{run}");
    doc
}

/// Runs `lyra ARGS -o json`, expects `code`, and checks the document against `name`.
#[track_caller]
fn doc(lyra: &Lyra, args: &[&str], code: i32, name: &str) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let run = lyra.run(&all);
    run.expect_code(code);
    conforms(&run, name)
}

/// Runs `lyra ARGS -o json`, expects it to fail with `kind`, and checks the error document:
/// its `exit_code` is the process's.
#[track_caller]
fn error(lyra: &Lyra, args: &[&str], kind: &str, code: i32) -> Value {
    let d = doc(lyra, args, code, "error");
    assert_eq!(d["error"]["kind"], kind, "{d:#}");
    assert_eq!(d["error"]["exit_code"], code, "{d:#}");
    d
}

#[test]
fn every_command_prints_one_document_that_matches_its_schema() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);

    // Before anything is recorded.
    error(&lyra, &["state", "list"], "no_state", 1);
    doc(&lyra, &["plan", "pair"], 0, "report");
    doc(&lyra, &["validate", "pair"], 0, "validation");
    doc(&lyra, &["fmt", "--diff"], 0, "fmt");
    let graph = doc(&lyra, &["graph", "pair"], 0, "graph");
    assert_eq!(graph["edges"], serde_json::json!([{"from": "one", "to": "two"}]));
    doc(&lyra, &["crd"], 0, "crd");
    let providers = doc(&lyra, &["providers"], 0, "providers");
    assert!(
        providers["types"].as_array().is_some_and(|t| t.len() > 10),
        "{providers:#}"
    );
    let one = doc(&lyra, &["providers", "postgres"], 0, "providers");
    assert_eq!(one["settings"][0]["name"], "Postgres", "{one:#}");
    error(&lyra, &["providers", "Nosuch::Type"], "usage", 2);

    // Runs and the state.
    let apply = doc(&lyra, &["apply", "pair"], 0, "report");
    // Stable fields: present on every row, null when empty.
    for s in apply["steps"].as_array().expect("steps") {
        assert!(s["error"].is_null() && s["changes"].is_array(), "{s:#}");
    }
    doc(&lyra, &["apply", "pair", "--name", "other"], 0, "report");
    doc(&lyra, &["plan", "pair", "--out", "pair.plan"], 0, "report");
    doc(&lyra, &["show", "pair.plan"], 0, "show");
    doc(&lyra, &["state", "list"], 0, "state_list");
    doc(&lyra, &["state", "show", "pair"], 0, "state_show");
    doc(&lyra, &["drift", "pair"], 0, "drift");
    doc(&lyra, &["output", "pair"], 0, "output");
    let history = doc(&lyra, &["history", "pair"], 0, "history");
    assert_eq!(history[0]["changes"][0]["step"], "one", "{history:#}");
    assert!(history[0]["note"].is_null(), "{history:#}");
    doc(&lyra, &["drift", "pair", "--refresh-state"], 0, "drift");
    doc(&lyra, &["state", "unlock", "pair"], 0, "unlock");
    doc(&lyra, &["state", "unlock", "pair", "--force"], 0, "unlock");
    doc(&lyra, &["state", "export"], 0, "export");
    doc(
        &lyra,
        &["state", "export", "pair", "--file", "pair.json"],
        0,
        "export_summary",
    );
    doc(
        &lyra,
        &["state", "import", "pair.json", "--state", "copy.db"],
        0,
        "import",
    );
    doc(
        &lyra,
        &["state", "migrate", "--from", "copy.db", "--to", "moved.db"],
        0,
        "migrate",
    );
    doc(&lyra, &["delete", "other", "--dry-run"], 0, "report");
    doc(&lyra, &["state", "rm", "other", "two"], 0, "state_rm");
    let history = doc(&lyra, &["history", "other"], 0, "history");
    assert_eq!(history[0]["note"], "forgot 1 resource(s) without deleting them");
    doc(&lyra, &["delete", "other"], 0, "report");

    // Failures, each with its kind and exit code.
    error(&lyra, &["state", "show", "nosuch"], "not_found", 1);
    error(&lyra, &["history", "nosuch"], "not_found", 1);
    error(&lyra, &["apply", "pair.plan", "--var", "extra=1"], "stale_plan", 1);
    lyra.write("cut.plan", r#"{"format": "lyra-plan/1", "depl"#);
    error(&lyra, &["show", "cut.plan"], "invalid_input", 1);
    error(&lyra, &["drift", "nosuch"], "not_found", 1);
    error(&lyra, &["delete", "nosuch"], "not_found", 1);
    error(&lyra, &["state", "rm", "pair", "nosuch"], "not_found", 1);
    error(&lyra, &["state", "unlock", "nosuch"], "not_found", 1);
    error(&lyra, &["state", "export", "nosuch"], "not_found", 1);
    error(&lyra, &["state", "import", "pair.json"], "conflict", 1);
    lyra.write("not-an-export.json", "[]");
    error(&lyra, &["state", "import", "not-an-export.json"], "invalid_input", 1);
    error(&lyra, &["state", "import", "missing.json"], "usage", 2);
    error(
        &lyra,
        &["state", "migrate", "--from", "a.db", "--to", "a.db"],
        "usage",
        2,
    );
    error(
        &lyra,
        &["state", "migrate", "--from", ".lyra/state.db", "--to", "m.db", "nosuch"],
        "not_found",
        1,
    );
    // Lookups of files (issue 9 F7): a workflow or data file that is not there is a usage
    // error for every command that reads one (exit.rs, `kind::USAGE`), never a generic failure.
    for cmd in ["validate", "plan", "apply", "graph"] {
        error(&lyra, &[cmd, "nosuch"], "usage", 2);
    }
    for cmd in ["plan", "apply"] {
        let missing = error(&lyra, &[cmd, "pair", "--data", "nosuch.yaml"], "usage", 2);
        assert!(
            missing["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("nosuch.yaml")),
            "{missing:#}"
        );
    }
    error(&lyra, &["plan", "pair", "--var", "novalue"], "usage", 2);
    lyra.write_workflow("bad", "steps:\n  a:\n    resource: Nope::Thing\n");
    let invalid = error(&lyra, &["apply", "bad"], "invalid_input", 1);
    let d = &invalid["error"]["diagnostics"][0];
    assert_eq!(
        (d["file"].as_str(), d["line"].as_u64()),
        (Some("workflows/bad.yaml"), Some(3))
    );
    doc(&lyra, &["validate", "bad"], 1, "validation");
    lyra.write_workflow("needs", "parameters: [size]\nsteps: {}\n");
    error(&lyra, &["plan", "needs"], "invalid_input", 1);
    error(
        &lyra,
        &["state", "list", "--state", "postgres://u@h/d?schema=Bad"],
        "state",
        1,
    );
}

/// clap's own errors, where `-o json` was asked for: the error document, kind `usage`.
#[test]
fn usage_errors_under_json_are_documents_too() {
    let lyra = Lyra::new();
    for args in [
        vec!["-o", "json", "frobnicate"],
        vec!["state", "show", "-o", "json"],
        vec!["apply", "--no-such-flag", "x", "--output=json"],
        vec!["plan", "x", "--concurrency", "0", "-ojson"],
        vec!["-o", "json"],
    ] {
        let run = lyra.run(&args);
        run.expect_code(2);
        let d = conforms(&run, "error");
        assert_eq!(d["error"]["kind"], "usage", "{run}");
        assert!(
            d["error"]["usage"].as_str().is_some_and(|u| u.starts_with("error:")),
            "{run}"
        );
    }
    // Without -o json, clap's text as before; help is not an error.
    let run = lyra.run(&["frobnicate"]);
    run.expect_code(2);
    assert!(
        run.stdout.is_empty() && run.stderr.contains("unrecognized subcommand"),
        "{run}"
    );
    lyra.ok(&["state", "list", "--help", "-o", "json"]);
}

/// A refused writer: exit 3, the holder in the document.
#[test]
fn a_lock_refusal_is_a_document_with_the_holder() {
    let lyra = Lyra::new();
    lyra.write_workflow("slow", &sleeps_workflow(8, "1s"));
    lyra.init_state();
    let mut holder: Child = lyra.spawn("holder", &["apply", "slow", "--concurrency", "1"]);
    // Held, and the run recorded (a first run takes the lease before the deployment exists).
    let held = wait_until(Duration::from_secs(60), || {
        let run = lyra.run(&["state", "unlock", "slow", "-o", "json"]);
        run.code == Some(0) && run.json()["lease"].is_object() && lyra.run(&["history", "slow"]).code == Some(0)
    });
    assert!(
        held,
        "the holder never took the lease: {:?}",
        lyra.spawned_output("holder")
    );
    for args in [
        &["apply", "slow"][..],
        &["delete", "slow"],
        &["state", "rm", "slow", "s000"],
    ] {
        let d = error(&lyra, args, "locked", 3);
        assert_eq!(d["error"]["deployment"], "slow", "{d:#}");
        assert_eq!(d["error"]["lease"]["operation"], "apply", "{d:#}");
    }
    doc(&lyra, &["state", "unlock", "slow"], 0, "unlock");
    holder.kill().expect("kill");
    holder.wait().expect("wait");
}
