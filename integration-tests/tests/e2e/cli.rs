//! The command line as a contract: help, exit codes, output formats, the state and history
//! commands, the graph.

use integration_tests::{Lyra, Run, compat_or_skip, count, run_command};

const PAIR: &str = "\
returns: [first, second]
steps:
  one:
    returns: {first: output}
    resource: Null::Resource
    value:
      input: 1
  two:
    returns: {second: output}
    resource: Null::Resource
    value:
      input: $first
";

#[test]
fn help_documents_exit_codes_and_options() {
    let lyra = Lyra::new();
    let help = lyra.ok(&["--help"]).stdout;
    for needle in [
        "Exit codes",
        "130",
        "usage error",
        "validate",
        "plan",
        "apply",
        "delete",
        "graph",
        "state",
        "history",
    ] {
        assert!(
            help.contains(needle),
            "lyra --help does not mention {needle:?}:\n{help}"
        );
    }
    let apply = lyra.ok(&["apply", "--help"]).stdout;
    for needle in [
        "--workflows",
        "--data",
        "--var",
        "--name",
        "--state",
        "--concurrency",
        "--output",
        "json",
    ] {
        assert!(
            apply.contains(needle),
            "lyra apply --help does not mention {needle:?}:\n{apply}"
        );
    }
    let version = lyra.ok(&["--version"]).stdout;
    assert!(version.starts_with("lyra "), "{version}");
}

#[test]
fn usage_errors_exit_2() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    for args in [
        &["apply", "pair", "--no-such-flag"][..],
        &["frobnicate"],
        &["apply"],
        &["apply", "pair", "--concurrency", "0"],
        &["apply", "pair", "-o", "yaml"],
        &["apply", "pair", "--var", "no-equals-sign"],
        &["apply", "pair", "--data", "missing.yaml"],
        &["plan", "no_such_workflow"],
        &["graph", "no_such_workflow"],
    ] {
        let run = lyra.run(args);
        run.expect_code(2);
        assert!(!run.stderr.trim().is_empty(), "a usage error says why\n{run}");
    }
    assert!(!lyra.path(".lyra").exists(), "usage errors create no state");
}

#[test]
fn json_output_is_clean_even_with_progress() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    // -v prints a line per step on stderr; stdout stays one JSON document.
    let run = lyra.ok(&["apply", "pair", "-v", "-o", "json"]);
    let report = run.json();
    assert_eq!(report["operation"], "apply");
    assert_eq!(report["deployment"], "pair");
    assert_eq!(report["workflow"], "pair");
    assert_eq!(count(&report, "created"), 2, "{report:#}");
    assert_eq!(report["returns"], serde_json::json!({"first": 1, "second": 1}));
    assert!(
        run.stderr.contains("one") && run.stderr.contains("two"),
        "-v shows the steps on stderr\n{run}"
    );

    // Text: the returns are data on stdout, the summary goes to stderr.
    let text = lyra.ok(&["apply", "pair"]);
    assert_eq!(text.stdout, "first: 1\nsecond: 1\n", "{text}");
    assert!(
        text.stderr.contains("apply succeeded") && text.stderr.contains("2 unchanged"),
        "{text}"
    );
    let plan = lyra.ok(&["plan", "pair"]).stdout;
    assert!(plan.contains("No changes. 2 resources are up to date."), "{plan}");
}

#[test]
fn state_list_show_and_history() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    // Nothing applied yet: there is no state to list, and listing does not create one.
    let none = lyra.run(&["state", "list", "-o", "json"]);
    none.expect_code(1).expect_stderr(&["no state at .lyra/state.db"]);
    assert_eq!(none.json()["error"]["kind"], "no_state", "{none}");
    assert!(!lyra.path(".lyra").exists(), "state list created the state");
    lyra.ok(&["apply", "pair"]);
    lyra.write_workflow("pair", &PAIR.replace("input: 1", "input: 2"));
    lyra.ok(&["apply", "pair"]);
    lyra.ok(&["apply", "pair", "--name", "other"]);

    let list = lyra.ok_json(&["state", "list"]);
    let entries = list.as_array().unwrap_or_else(|| panic!("not an array: {list}"));
    let pair = entries
        .iter()
        .find(|d| d["deployment"] == "pair")
        .unwrap_or_else(|| panic!("{list:#}"));
    assert_eq!(pair["workflow"], "pair");
    assert_eq!(pair["resource_count"], 2);
    assert_eq!(pair["last_run"]["outcome"], "succeeded");
    assert!(entries.iter().any(|d| d["deployment"] == "other"), "{list:#}");
    let text = lyra.ok(&["state", "list"]).stdout;
    assert!(
        text.contains("DEPLOYMENT") && text.contains("pair") && text.contains("other"),
        "{text}"
    );

    let shown = lyra.state("pair");
    assert_eq!(shown["deployment"], "pair");
    let one = shown["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["step"] == "one"))
        .expect("one");
    assert_eq!(one["type"], "Null::Resource");
    assert_eq!(one["managed"], true);
    assert_eq!(one["state"]["output"], 2);
    let two = shown["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["step"] == "two"))
        .expect("two");
    assert_eq!(two["depends_on"], serde_json::json!(["one"]));
    lyra.run(&["state", "show", "nobody"])
        .expect_code(1)
        .expect_stderr(&["nobody"]);

    lyra.ok(&["delete", "pair"]);
    let history = lyra.history("pair");
    assert_eq!(history.len(), 3, "{history:#?}");
    let ids: Vec<i64> = history.iter().filter_map(|r| r["id"].as_i64()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    let ops: Vec<(&str, &str)> = history
        .iter()
        .map(|r| {
            (
                r["operation"].as_str().unwrap_or_default(),
                r["outcome"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        ops,
        [("delete", "succeeded"), ("apply", "succeeded"), ("apply", "succeeded")]
    );
    assert_eq!(history[0]["counts"]["deleted"], 2);
    assert_eq!(history[1]["counts"]["updated"], 2, "{history:#?}");
    assert_eq!(history[2]["counts"]["created"], 2);
    for r in &history {
        // RFC 3339 UTC to the millisecond: ordered as strings.
        let (started, finished) = (r["started_at"].as_str(), r["finished_at"].as_str());
        assert!(
            started.is_some_and(|s| s.ends_with('Z')) && started <= finished,
            "{r:#}"
        );
    }
    let text = lyra.ok(&["history", "pair"]).stdout;
    assert!(text.lines().count() == 4 && text.contains("delete"), "{text}");
}

#[test]
fn graph_as_dot_and_mermaid() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let dir = compat.join("workflows").display().to_string();
    let dot = lyra
        .ok(&["graph", "foobernetes", "--workflows", &dir, "--format", "dot"])
        .stdout;
    assert!(dot.trim_start().starts_with("digraph"), "{dot}");
    for edge in [
        "\"database\" -> \"app-server1\"",
        "\"database\" -> \"app-server2\"",
        "\"app-server1\" -> \"web-servers\"",
        "\"web-server2\" -> \"secondary-loadbalancer\"",
    ] {
        assert!(dot.contains(edge), "no edge {edge}:\n{dot}");
    }
    assert_eq!(dot.matches(" -> ").count(), 10, "{dot}");
    assert!(
        !dot.contains("\"loadbalancer\" -> "),
        "nothing depends on the load balancer:\n{dot}"
    );

    let mermaid = lyra
        .ok(&["graph", "foobernetes", "--workflows", &dir, "--format", "mermaid"])
        .stdout;
    assert!(mermaid.starts_with("flowchart"), "{mermaid}");
    assert_eq!(mermaid.matches(" --> ").count(), 10, "{mermaid}");
    // The default format is DOT.
    assert_eq!(lyra.ok(&["graph", "foobernetes", "--workflows", &dir]).stdout, dot);
}

#[test]
fn env_vars_set_the_load_path_and_state() {
    let lyra = Lyra::new();
    lyra.write("elsewhere/pair.yaml", PAIR);
    let mut cmd = lyra.command(&["apply", "pair", "-o", "json"]);
    cmd.env("LYRA_WORKFLOWS", lyra.path("elsewhere"))
        .env("LYRA_STATE", lyra.path("custom.db"));
    let run = run_command(cmd, &["apply", "pair", "-o", "json"]);
    run.expect_ok();
    assert!(
        lyra.path("custom.db").is_file(),
        "LYRA_STATE names the state file\n{run}"
    );
    assert!(!lyra.path(".lyra").exists());
    lyra.ok(&["apply", "elsewhere/pair.yaml", "--state", "custom.db"]);
    let again = lyra.ok_json(&["plan", "elsewhere/pair.yaml", "--state", "custom.db"]);
    assert_eq!(
        count(&again, "unchanged"),
        2,
        "a workflow given as a file path: {again:#}"
    );
}

/// Lyra should not die when stderr cannot be written (`lyra apply x 2>&1 | head -1`, a full
/// disk): progress and summaries are best effort. Today a write error on stderr panics with
/// exit 101, after a successful apply, and with -v in the middle of it.
#[test]
#[cfg(target_os = "linux")]
fn a_broken_stderr_does_not_break_an_apply() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("open /dev/full")
    };
    for args in [&["apply", "pair"][..], &["apply", "pair", "-v"]] {
        let mut cmd = lyra.command(args);
        let status = cmd
            .stdout(std::process::Stdio::null())
            .stderr(full())
            .status()
            .expect("run lyra");
        let shown = Run {
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            status,
            code: status.code(),
            stdout: String::new(),
            stderr: "(written to /dev/full)".to_owned(),
        };
        shown.expect_ok();
        assert_eq!(lyra.resources("pair").len(), 2, "{shown}");
    }
}
