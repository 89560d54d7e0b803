//! Saved plans: `lyra plan --out FILE` then `lyra apply FILE` applies exactly the plan, or
//! refuses (exit 1, `stale_plan`, nothing changed) naming what moved since: the state, the
//! workflow, the data, a `--var`. A plan file holds no secret in clear; `lyra show FILE`
//! prints it; a damaged file or one for another state is refused. And `--detailed-exitcode`.

use integration_tests::{Lyra, Run, Value};

const WEB: &str = "\
parameters:
  size: Integer
  password: Sensitive[String]
steps:
  web:
    resource: Null::Resource
    value:
      input: $size
  login:
    resource: Null::Resource
    value:
      input: $password
";

const SECRET: &str = "hunter2-Pa55";

/// A working directory with the `web` workflow and `size: 1` in data.yaml.
fn setup() -> Lyra {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WEB);
    lyra.write("data.yaml", "size: 1\n");
    lyra
}

fn pw() -> String {
    format!("password={SECRET}")
}

/// The recorded `input` of step `web`.
fn recorded_size(lyra: &Lyra) -> Value {
    let state = lyra.ok(&["state", "show", "web", "-o", "json"]).json();
    let web = state["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["step"] == "web"))
        .unwrap_or_else(|| panic!("no step web: {state:#}"));
    web["state"]["input"].clone()
}

fn history_len(lyra: &Lyra) -> usize {
    lyra.ok(&["history", "web", "-o", "json"])
        .json()
        .as_array()
        .map_or(0, Vec::len)
}

/// Asserts `run` refused a stale plan: exit 1, `stale_plan`, each of `needles` named.
#[track_caller]
fn refused(run: &Run, needles: &[&str]) {
    run.expect_code(1);
    run.expect_stderr(&["is stale, so nothing was changed"]);
    run.expect_stderr(needles);
}

#[test]
fn a_saved_plan_applies_exactly_what_it_showed() {
    let lyra = setup();
    let plan = lyra.ok(&["plan", "web", "--var", &pw(), "--out", "web.plan"]);
    assert!(plan.stdout.contains("web (Null::Resource) will be created"), "{plan}");
    plan.expect_stderr(&["Saved the plan to web.plan"]);
    let apply = lyra.ok(&["apply", "web.plan", "--var", &pw(), "-o", "json"]).json();
    assert_eq!(apply["operation"], "apply", "{apply:#}");
    assert_eq!(apply["counts"]["created"], 2, "{apply:#}");
    assert_eq!(recorded_size(&lyra), 1);
    let history = lyra.ok(&["history", "web", "-o", "json"]).json();
    assert_eq!(history.as_array().map(Vec::len), Some(1), "{history:#}");
    assert_eq!(history[0]["operation"], "apply");
    assert_eq!(history[0]["counts"]["created"], 2);

    // An update, planned and applied.
    lyra.write("data.yaml", "size: 2\n");
    let plan = lyra.ok(&["plan", "web", "--var", &pw(), "--out", "web.plan"]);
    assert!(plan.stdout.contains("~ input: 1 -> 2"), "{plan}");
    let apply = lyra.ok(&["apply", "web.plan", "--var", &pw(), "-o", "json"]).json();
    assert_eq!(apply["counts"]["updated"], 1, "{apply:#}");
    assert_eq!(recorded_size(&lyra), 2);

    // A plan of no changes applies to nothing, after the same checks.
    lyra.ok(&["plan", "web", "--var", &pw(), "--out", "same.plan"]);
    let apply = lyra.ok(&["apply", "same.plan", "--var", &pw(), "-o", "json"]).json();
    assert_eq!(apply["counts"]["unchanged"], 2, "{apply:#}");
    assert_eq!(apply["counts"]["updated"], 0, "{apply:#}");
    // The plan file was used up by nothing: applying it again still matches.
    lyra.ok(&["apply", "same.plan", "--var", &pw()]);
}

#[test]
fn a_plan_is_refused_when_the_state_moved_since() {
    let lyra = setup();
    lyra.ok(&["apply", "web", "--var", &pw()]);
    lyra.write("data.yaml", "size: 2\n");
    lyra.ok(&["plan", "web", "--var", &pw(), "--out", "web.plan"]);
    // Someone applies another value in between.
    lyra.ok(&["apply", "web", "--var", &pw(), "--var", "size=3"]);
    let runs = history_len(&lyra);
    let run = lyra.run(&["apply", "web.plan", "--var", &pw()]);
    refused(
        &run,
        &["the deployment's state changed since the plan (run 2: apply by"],
    );
    assert_eq!(recorded_size(&lyra), 3, "nothing changed");
    assert_eq!(history_len(&lyra), runs, "not even a run recorded");

    // `lyra state rm` in between.
    lyra.ok(&["plan", "web", "--var", &pw(), "--var", "size=3", "--out", "web.plan"]);
    lyra.ok(&["state", "rm", "web", "login"]);
    let run = lyra.run(&["apply", "web.plan", "--var", &pw(), "--var", "size=3", "-o", "json"]);
    refused(&run, &["state changed since the plan (run 3: forget by", "step login:"]);
    let doc = run.json();
    assert_eq!(doc["error"]["kind"], "stale_plan", "{doc:#}");
    assert_eq!(doc["error"]["plan_file"], "web.plan", "{doc:#}");
    let errors = super::json_output::schema_errors(&doc, "error");
    assert!(errors.is_empty(), "{errors:#?}");
    let state = lyra.ok(&["state", "show", "web", "-o", "json"]).json();
    assert_eq!(state["resources"].as_array().map(Vec::len), Some(1), "{state:#}");
}

#[test]
fn a_plan_is_refused_when_the_workflow_or_the_data_moved() {
    let lyra = setup();
    lyra.ok(&["apply", "web", "--var", &pw()]);
    lyra.ok(&["plan", "web", "--var", &pw(), "--var", "size=5", "--out", "web.plan"]);

    // The workflow edited.
    lyra.write_workflow("web", &WEB.replace("input: $size", "input: [$size]"));
    refused(
        &lyra.run(&["apply", "web.plan", "--var", &pw(), "--var", "size=5"]),
        &["the workflow file workflows/web.yaml changed"],
    );
    lyra.write_workflow("web", WEB);

    // The data file edited (even where a --var overrides it).
    lyra.write("data.yaml", "size: 1\nzone: b\n");
    refused(
        &lyra.run(&["apply", "web.plan", "--var", &pw(), "--var", "size=5"]),
        &["the data file data.yaml changed"],
    );
    lyra.write("data.yaml", "size: 1\n");

    // A --var with another value, or left out.
    refused(
        &lyra.run(&["apply", "web.plan", "--var", &pw(), "--var", "size=6"]),
        &["--var size has another value", "step web: the plan"],
    );
    refused(
        &lyra.run(&["apply", "web.plan", "--var", &pw()]),
        &["the --vars are not those of the plan (then: password, size; now: password)"],
    );
    assert_eq!(recorded_size(&lyra), 1, "nothing changed");
    assert_eq!(history_len(&lyra), 1);

    // As planned, it applies.
    lyra.ok(&["apply", "web.plan", "--var", &pw(), "--var", "size=5"]);
    assert_eq!(recorded_size(&lyra), 5);
}

#[test]
fn a_plan_file_holds_no_secret_in_clear() {
    let lyra = setup();
    // The secret from a --var, and from the data file.
    lyra.ok(&["plan", "web", "--var", &pw(), "--out", "var.plan"]);
    lyra.write("data.yaml", format!("size: 1\npassword: {SECRET}\n"));
    lyra.ok(&["plan", "web", "--out", "data.plan"]);
    for file in ["var.plan", "data.plan"] {
        let bytes = std::fs::read(lyra.path(file)).expect("the plan file");
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(SECRET), "{file} holds the secret:\n{text}");
        assert!(text.contains("(sensitive)"), "{file}:\n{text}");
        for out in [
            lyra.ok(&["show", file]).stdout,
            lyra.ok(&["show", file, "-o", "json"]).stdout,
        ] {
            assert!(!out.contains(SECRET), "{out}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(lyra.path(file))
                .expect("metadata")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{file}");
        }
    }
    let apply = lyra.ok(&["apply", "data.plan"]);
    assert!(
        !apply.stdout.contains(SECRET) && !apply.stderr.contains(SECRET),
        "{apply}"
    );
}

#[test]
fn show_prints_the_plan_and_what_it_was_made_from() {
    let lyra = setup();
    lyra.ok(&["plan", "web", "--var", &pw(), "--name", "staging", "--out", "web.plan"]);
    let text = lyra.ok(&["show", "web.plan"]).stdout;
    for needle in [
        "deployment: staging",
        "workflow:   web",
        "data:       data.yaml",
        "--var:      password",
        "+ web (Null::Resource) will be created",
        "Plan: 2 to create",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    let doc = lyra.ok(&["show", "web.plan", "-o", "json"]).json();
    let errors = super::json_output::schema_errors(&doc, "show");
    assert!(errors.is_empty(), "{errors:#?}\n{doc:#}");
    assert_eq!(doc["deployment"], "staging");
    assert_eq!(doc["plan"]["operation"], "plan");
    assert_eq!(doc["data"]["vars"], serde_json::json!(["password"]));
    // The saved plan is the one `plan -o json` prints.
    let plan = lyra
        .ok(&["plan", "web", "--var", &pw(), "--name", "staging", "-o", "json"])
        .json();
    assert_eq!(doc["plan"]["counts"], plan["counts"]);
    assert_eq!(doc["plan"]["steps"].as_array().map(Vec::len), Some(2));

    // The deployment is the plan's: another --name is refused.
    let run = lyra.run(&["apply", "web.plan", "--var", &pw(), "--name", "prod"]);
    run.expect_code(1);
    run.expect_stderr(&["web.plan is a plan for the deployment 'staging', not 'prod'"]);
}

#[test]
fn detailed_exit_codes_say_whether_anything_would_change() {
    let lyra = setup();
    let code = |args: &[&str]| lyra.run(args).code;
    assert_eq!(code(&["plan", "web", "--var", &pw(), "--detailed-exitcode"]), Some(4));
    assert_eq!(
        code(&["plan", "web", "--var", &pw(), "--detailed-exitcode", "-o", "json"]),
        Some(4)
    );
    // Without the flag a plan with changes succeeds as ever.
    assert_eq!(code(&["plan", "web", "--var", &pw()]), Some(0));
    assert_eq!(
        code(&[
            "plan",
            "web",
            "--var",
            &pw(),
            "--detailed-exitcode",
            "--out",
            "web.plan"
        ]),
        Some(4)
    );
    lyra.ok(&["apply", "web", "--var", &pw()]);
    assert_eq!(code(&["plan", "web", "--var", &pw(), "--detailed-exitcode"]), Some(0));
    // An error is 1 (a parameter without a value), a usage error 2.
    assert_eq!(code(&["plan", "web", "--detailed-exitcode"]), Some(1));
    assert_eq!(code(&["plan", "nosuch", "--detailed-exitcode"]), Some(2));
    assert_eq!(code(&["delete", "web", "--dry-run", "--detailed-exitcode"]), Some(4));
    assert_eq!(
        code(&["delete", "web", "--detailed-exitcode"]),
        Some(2),
        "needs --dry-run"
    );
    lyra.ok(&["state", "rm", "web", "web", "login"]);
    assert_eq!(code(&["delete", "web", "--dry-run", "--detailed-exitcode"]), Some(0));
    assert_eq!(code(&["delete", "nosuch", "--dry-run", "--detailed-exitcode"]), Some(1));
}

#[test]
fn damaged_foreign_and_edited_plan_files_are_refused() {
    let lyra = setup();
    lyra.ok(&["plan", "web", "--var", &pw(), "--out", "web.plan"]);
    let text = lyra.read("web.plan");

    lyra.write("cut.plan", &text[..text.len() / 2]);
    for args in [&["apply", "cut.plan"][..], &["show", "cut.plan"]] {
        let run = lyra.run(args);
        run.expect_code(1);
        run.expect_stderr(&["cut.plan: not a usable plan file: it is not valid JSON"]);
    }
    let doc = lyra.run(&["apply", "cut.plan", "-o", "json"]).json();
    assert_eq!(doc["error"]["kind"], "invalid_input", "{doc:#}");
    assert_eq!(doc["error"]["plan_file"], "cut.plan", "{doc:#}");

    lyra.write("future.plan", text.replace("lyra-plan/1", "lyra-plan/9"));
    let run = lyra.run(&["apply", "future.plan", "--var", &pw()]);
    run.expect_code(1);
    run.expect_stderr(&["future.plan: not a usable plan file: its format is \"lyra-plan/9\""]);

    // Edited by hand: the summary made to look harmless.
    let mut edited: Value = serde_json::from_str(&text).expect("JSON");
    edited["plan_text"] = "No changes.\n".into();
    lyra.write("edited.plan", serde_json::to_string(&edited).expect("JSON"));
    let run = lyra.run(&["apply", "edited.plan", "--var", &pw()]);
    run.expect_code(1);
    run.expect_stderr(&["edited.plan: not a usable plan file: it was changed after it was written"]);

    // Another state store.
    lyra.ok(&["apply", "web", "--var", &pw(), "--state", "other.db"]);
    let run = lyra.run(&["apply", "web.plan", "--var", &pw(), "--state", "other.db", "-o", "json"]);
    run.expect_code(1);
    run.expect_stderr(&["web.plan was made against another state store (.lyra/state.db), not other.db"]);
    assert_eq!(run.json()["error"]["kind"], "stale_plan");
    assert!(
        lyra.run(&["history", "web"]).code == Some(1),
        "nothing recorded in the plan's state"
    );

    // What is none of this stays a workflow (and a missing one a usage error).
    let run = lyra.run(&["apply", "missing.plan"]);
    run.expect_code(2);
    assert_eq!(lyra.run(&["show", "missing.plan"]).code, Some(2));
    lyra.write(
        "workflow.json",
        r#"{"steps": {"a": {"resource": "Null::Resource", "value": {"input": 1}}}}"#,
    );
    let run = lyra.run(&["show", "workflow.json"]);
    run.expect_code(1);
    run.expect_stderr(&["it is not a plan file"]);
}

#[test]
fn a_plan_of_a_package_is_pinned_by_its_digest() {
    let lyra = setup();
    lyra.ok(&["package", "web", "--out", "web.tar"]);
    lyra.ok(&["plan", "web.tar", "--var", &pw(), "--out", "web.plan"]);
    let shown = lyra.ok(&["show", "web.plan", "-o", "json"]).json();
    assert_eq!(shown["workflow"]["kind"], "package", "{shown:#}");
    let digest = shown["workflow"]["digest"].as_str().unwrap_or_default().to_owned();
    assert!(digest.starts_with("sha256:"), "{shown:#}");
    let apply = lyra.ok(&["apply", "web.plan", "--var", &pw(), "-o", "json"]).json();
    assert_eq!(apply["workflow"], format!("web@{digest}"), "{apply:#}");

    // The same path, another package.
    lyra.ok(&[
        "plan",
        "web.tar",
        "--var",
        &pw(),
        "--var",
        "size=2",
        "--out",
        "web.plan",
    ]);
    lyra.write_workflow("web", &WEB.replace("input: $size", "input: [$size]"));
    lyra.ok(&["package", "web", "--out", "web.tar"]);
    let run = lyra.run(&["apply", "web.plan", "--var", &pw(), "--var", "size=2"]);
    refused(&run, &["the package web.tar is now sha256:"]);
    assert!(
        !run.stderr.contains("workflow file"),
        "the files are the package's: {run}"
    );
    assert_eq!(recorded_size(&lyra), 1);
}

#[test]
fn help_documents_saved_plans_and_exit_code_4() {
    let lyra = Lyra::new();
    let help = lyra.ok(&["--help"]).stdout;
    for needle in ["4    changes pending", "show"] {
        assert!(
            help.contains(needle),
            "lyra --help does not mention {needle:?}:\n{help}"
        );
    }
    let plan = lyra.ok(&["plan", "--help"]).stdout;
    for needle in ["--out <FILE>", "--detailed-exitcode", "lyra apply FILE"] {
        assert!(
            plan.contains(needle),
            "lyra plan --help does not mention {needle:?}:\n{plan}"
        );
    }
    let apply = lyra.ok(&["apply", "--help"]).stdout;
    assert!(apply.contains("stale_plan"), "{apply}");
    let delete = lyra.ok(&["delete", "--help"]).stdout;
    assert!(delete.contains("--detailed-exitcode"), "{delete}");
}

/// What providers read is part of the plan: the cloud edited behind Lyra's back between the
/// plan and its apply changes the plan, and the apply refuses, touching nothing.
#[test]
fn a_plan_is_refused_when_a_provider_reads_otherwise() {
    let lyra = Lyra::new();
    let read = |p: &str| {
        std::fs::read_to_string(integration_tests::workspace_dir().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
    };
    lyra.write_workflow("webapp", &read("examples/workflows/webapp.yaml"));
    lyra.write("data.yaml", read("examples/data.yaml"));
    lyra.ok(&["apply", "webapp"]);
    let plan = lyra.ok(&["plan", "webapp", "--out", "webapp.plan"]);
    assert!(plan.stdout.starts_with("No changes."), "{plan}");

    let db = lyra.resources("webapp")["db"].clone();
    let mut cloud = lyra.cloud();
    cloud["Instances"][&db]["Cpus"] = 8.into();
    lyra.write(
        "deployment.json",
        serde_json::to_string_pretty(&cloud).expect("JSON") + "\n",
    );
    let edited = lyra.read("deployment.json");
    let runs = lyra.history("webapp").len();

    refused(
        &lyra.run(&["apply", "webapp.plan"]),
        &["step db: the plan now updates `cpus` (was: changes nothing)"],
    );
    assert!(
        !lyra.run(&["apply", "webapp.plan"]).stderr.contains("state changed"),
        "a plan reads, it records nothing"
    );
    assert_eq!(lyra.read("deployment.json"), edited, "the cloud is as it was edited");
    assert_eq!(lyra.history("webapp").len(), runs);
}
