//! Bad input gets a clear error naming the file, line and column, a non-zero exit, no panic,
//! and loses nothing.

use integration_tests::{Lyra, Run};

/// Runs `validate`, `plan` and `apply` on workflow `name` and checks each fails with `code`
/// and says every one of `needles` on stderr. Returns the apply's run.
#[track_caller]
fn rejected(lyra: &Lyra, name: &str, code: i32, needles: &[&str]) -> Run {
    for command in ["validate", "plan"] {
        lyra.run(&[command, name]).expect_code(code).expect_stderr(needles);
    }
    let run = lyra.run(&["apply", name]);
    run.expect_code(code).expect_stderr(needles);
    assert!(run.stdout.is_empty(), "nothing on stdout\n{run}");
    run
}

/// The error points at `file:line:col` and draws a caret under the spot.
#[track_caller]
fn assert_located(run: &Run, location: &str) {
    assert!(run.stderr.contains(location), "no location {location}\n{run}");
    assert!(
        run.stderr
            .lines()
            .any(|l| l.trim_start().starts_with('|') && l.contains('^')),
        "no caret line\n{run}"
    );
}

#[test]
fn malformed_yaml() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "bad",
        "steps:\n  a:\n    resource: Null::Resource\n    value:\n      input: [1, 2\n  b: x\n",
    );
    let run = rejected(&lyra, "bad", 1, &["malformed YAML", "workflows/bad.yaml:"]);
    assert_located(&run, "workflows/bad.yaml:");
    lyra.write_workflow("tab", "steps:\n\ta: 1\n");
    assert_located(&rejected(&lyra, "tab", 1, &["malformed YAML"]), "workflows/tab.yaml:2:");
    lyra.write_workflow("empty", "");
    rejected(&lyra, "empty", 1, &["empty", "workflows/empty.yaml"]);
    lyra.write_workflow("list", "- a\n- b\n");
    rejected(&lyra, "list", 1, &["workflows/list.yaml:1:"]);
    lyra.write_workflow("anchors", "steps:\n  a: &x\n    resource: Null::Resource\n  b: *x\n");
    rejected(&lyra, "anchors", 1, &["workflows/anchors.yaml:"]);
    assert!(!lyra.path("deployment.json").exists());
}

#[test]
fn unknown_keys() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "k",
        "steps:\n  a:\n    resource: Null::Resource\n    colour: blue\n    value:\n      input: 1\n",
    );
    let run = rejected(&lyra, "k", 1, &["colour", "'a'"]);
    assert_located(&run, "workflows/k.yaml:4:5");
    lyra.write_workflow(
        "attr",
        "steps:\n  a:\n    resource: Null::Resource\n    value:\n      inptu: 1\n",
    );
    let run = rejected(&lyra, "attr", 1, &["inptu", "Null::Resource"]);
    assert_located(&run, "workflows/attr.yaml:5:7");
    assert!(
        run.stderr.contains("input"),
        "the help lists the real attributes\n{run}"
    );
}

#[test]
fn wrong_literal_types_name_the_attribute() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "t",
        "steps:\n  db:\n    resource: Foobernetes::Instance\n    value:\n      location: eu1\n      image: img\n      cpus: lots\n      memory: 8G\n",
    );
    let run = rejected(&lyra, "t", 1, &["cpus", "Integer", "db"]);
    assert_located(&run, "workflows/t.yaml:7:7");
    lyra.write_workflow(
        "t2",
        "steps:\n  lb:\n    resource: Foobernetes::LoadBalancer\n    value:\n      webServerIDs: notalist\n      tags: {a: [1]}\n",
    );
    rejected(&lyra, "t2", 1, &["webServerIDs", "tags"]);
    assert!(!lyra.path("deployment.json").exists(), "nothing was created");
}

#[test]
fn a_cycle_is_named() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "cyc",
        "steps:\n  a:\n    returns: {x: output}\n    resource: Null::Resource\n    value:\n      input: $y\n  b:\n    returns: {y: output}\n    resource: Null::Resource\n    value:\n      input: $x\n",
    );
    let run = rejected(&lyra, "cyc", 1, &["cycle"]);
    assert!(
        run.stderr.contains("a -> b -> a") || run.stderr.contains("b -> a -> b"),
        "the cycle is printed\n{run}"
    );
    lyra.run(&["graph", "cyc"]).expect_code(1).expect_stderr(&["cycle"]);
    // A longer one, through three steps.
    lyra.write_workflow(
        "cyc3",
        "steps:\n  a:\n    returns: {x: output}\n    resource: Null::Resource\n    value: {input: $z}\n  b:\n    returns: {y: output}\n    resource: Null::Resource\n    value: {input: $x}\n  c:\n    returns: {z: output}\n    resource: Null::Resource\n    value: {input: $y}\n",
    );
    let run = rejected(&lyra, "cyc3", 1, &["cycle"]);
    assert!(
        ["a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c"]
            .iter()
            .any(|c| run.stderr.contains(c)),
        "the cycle is printed\n{run}"
    );
}

#[test]
fn a_missing_lookup_key_is_named() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "l",
        "parameters:\n  p:\n    lookup: some.missing_key\nsteps:\n  a:\n    resource: Null::Resource\n    value:\n      input: $p\n",
    );
    // validate does not read data; plan and apply do.
    lyra.ok(&["validate", "l"]);
    for command in ["plan", "apply"] {
        let run = lyra.run(&[command, "l"]);
        run.expect_code(1).expect_stderr(&["some.missing_key"]);
        assert_located(&run, "workflows/l.yaml:2:3");
    }
    // Present in a data file (nested) or a --var: fine.
    lyra.write("data.yaml", "some:\n  missing_key: here\n");
    lyra.ok(&["plan", "l"]);
    lyra.ok(&["plan", "l", "--data", "/dev/null", "--var", "some.missing_key=x"]);
}

#[test]
fn a_missing_workflow_is_a_usage_error() {
    let lyra = Lyra::new();
    for command in ["validate", "plan", "apply", "graph"] {
        lyra.run(&[command, "nowhere"])
            .expect_code(2)
            .expect_stderr(&["nowhere", "not found"]);
    }
    lyra.write_workflow("here", "steps: {}\n");
    lyra.run(&["plan", "nowhere"])
        .expect_code(2)
        .expect_stderr(&["workflows/nowhere.yaml"]);
}

#[test]
fn a_bad_state_file_is_refused_and_left_alone() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "n",
        "steps:\n  a:\n    resource: Null::Resource\n    value:\n      input: 1\n",
    );
    std::fs::create_dir(lyra.path("a-directory")).expect("mkdir");
    let garbage = b"this is not a database\n\x00\x01\x02 and never was\n".repeat(300);
    lyra.write("garbage.db", &garbage);
    for state in ["a-directory", "garbage.db"] {
        for args in [
            &["apply", "n", "--state", state][..],
            &["plan", "n", "--state", state],
            &["delete", "n", "--state", state],
            &["state", "list", "--state", state],
            &["state", "show", "n", "--state", state],
            &["history", "n", "--state", state],
        ] {
            let run = lyra.run(args);
            assert_ne!(run.code, Some(0), "{run}");
            run.expect_stderr(&["state", state]);
        }
    }
    assert_eq!(
        std::fs::read(lyra.path("garbage.db")).expect("read"),
        garbage,
        "the file is not touched"
    );
    assert_eq!(std::fs::read_dir(lyra.path("a-directory")).expect("ls").count(), 0);
    assert!(!lyra.path(".lyra").exists());
}

#[test]
fn a_value_with_two_producers() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "dup",
        "steps:\n  a:\n    returns: {x: output}\n    resource: Null::Resource\n    value:\n      input: 1\n  b:\n    returns: {x: output}\n    resource: Null::Resource\n    value:\n      input: 2\n",
    );
    let run = rejected(&lyra, "dup", 1, &["'x'", "'a'", "'b'"]);
    assert_located(&run, "workflows/dup.yaml:");
    lyra.write_workflow(
        "dupstep",
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: 1}\n  a:\n    resource: Null::Resource\n    value: {input: 2}\n",
    );
    rejected(&lyra, "dupstep", 1, &["'a'", "workflows/dupstep.yaml:5:"]);
}

#[test]
fn an_unknown_resource_type() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "u",
        "steps:\n  a:\n    resource: Nope::Thing\n    value:\n      input: 1\n",
    );
    let run = rejected(&lyra, "u", 1, &["Nope::Thing", "Null::Resource"]);
    assert_located(&run, "workflows/u.yaml:3:15");
    // Type names are case-insensitive, as in the original.
    lyra.write_workflow(
        "case",
        "steps:\n  a:\n    resource: null::RESOURCE\n    value:\n      input: 1\n",
    );
    lyra.ok(&["validate", "case"]);
}

#[test]
fn a_value_nobody_produces() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "np",
        "steps:\n  a:\n    resource: Null::Resource\n    value:\n      input: $nothing\n",
    );
    let run = rejected(&lyra, "np", 1, &["nothing"]);
    assert_located(&run, "workflows/np.yaml:5:14");
}

#[test]
fn bad_guards_and_bad_data() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "g",
        "parameters:\n  a: {value: true}\nsteps:\n  c:\n    when: \"a and (((\"\n    resource: Null::Resource\n    value: {input: 1}\n",
    );
    rejected(&lyra, "g", 1, &["guard", "workflows/g.yaml:5:"]);
    lyra.write_workflow(
        "ok",
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: 1}\n",
    );
    lyra.write("bad-data.yaml", "a: [1,\nb: 2\n");
    lyra.run(&["plan", "ok", "--data", "bad-data.yaml"])
        .expect_code(1)
        .expect_stderr(&["bad-data.yaml:"]);
    lyra.run(&["plan", "ok", "--var", "a={x"])
        .expect_code(2)
        .expect_stderr(&["--var"]);
    lyra.write("workflows/binary.yaml", [0xff, 0xfe, 0x00, 0x80, b'\n']);
    let run = lyra.run(&["validate", "binary"]);
    assert_ne!(run.code, Some(0), "{run}");
    run.expect_stderr(&["binary.yaml"]);
}

#[test]
fn validate_json_lists_every_error() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "multi",
        "\
steps:
  a:
    resource: Nope::Thing
    value:
      input: 1
  b:
    resource: Null::Resource
    value:
      inptu: 1
  c:
    resource: Foobernetes::Instance
    value:
      image: x
      cpus: lots
      memory: 1G
  d:
    resource: Null::Resource
    value:
      input: $nothing
",
    );
    let run = lyra.run(&["validate", "multi", "-o", "json"]);
    run.expect_code(1);
    let report = run.json();
    assert_eq!(report["workflow"], "multi");
    assert_eq!(report["valid"], false);
    let errors = report["diagnostics"].as_array().unwrap_or_else(|| panic!("{report:#}"));
    let found: Vec<(u64, u64)> = errors
        .iter()
        .map(|e| (e["line"].as_u64().unwrap_or(0), e["column"].as_u64().unwrap_or(0)))
        .collect();
    for spot in [(3, 15), (9, 7), (14, 7), (19, 14)] {
        assert!(found.contains(&spot), "no error at {spot:?}: {report:#}");
    }
    assert_eq!(errors.len(), 4, "{report:#}");
    for e in errors {
        assert_eq!(e["file"], "workflows/multi.yaml", "{e}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }
    // The text form reports them all too.
    let text = lyra.run(&["validate", "multi"]);
    text.expect_code(1)
        .expect_stderr(&["4 problems found", "Nope::Thing", "inptu", "cpus", "nothing"]);

    lyra.write_workflow("fine", "steps:\n  a:\n    resource: Null::Resource\n");
    assert_eq!(
        lyra.ok_json(&["validate", "fine"]),
        serde_json::json!({"workflow": "fine", "valid": true, "diagnostics": []})
    );
}

/// "Validation reports all errors at once": an unknown key in one step does not hide the
/// errors of the others.
#[test]
fn validate_reports_structural_and_semantic_errors_together() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "mixed",
        "steps:\n  a:\n    resource: Nope::Thing\n    value:\n      input: 1\n  b:\n    resource: Null::Resource\n    colour: red\n    value:\n      input: 1\n",
    );
    let report = lyra.run(&["validate", "mixed", "-o", "json"]).json();
    let messages: Vec<&str> = report["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(messages.iter().any(|m| m.contains("colour")), "{report:#}");
    assert!(messages.iter().any(|m| m.contains("Nope::Thing")), "{report:#}");
}
