//! What the language reference's bug hunt found, through the real `lyra`: a plan shows the
//! error of every step that failed (and why the others were skipped), a file inside the load
//! path calls what is on the load path, and a call to an unknown workflow lists what is on the
//! load path. (The reference's own examples, run by `docs.rs`, show the rest.)

use integration_tests::{Lyra, step};

/// `db` fails when it is planned or applied (the key is missing), `app` depends on it, `cache`
/// does not.
const FAILING: &str = "\
parameters:
  sizes:
    value: {}
steps:
  db:
    returns:
      dbName: output
    resource: Null::Resource
    value:
      input: $sizes.db
  app:
    resource: Null::Resource
    value:
      input: $dbName
  cache:
    resource: Null::Resource
    value:
      input: independent
";

/// A failed step used to be shown as what it was about to do ("+ db will be created"), its
/// error only in `-o json`; a skipped one not at all. The text now has both, with the same
/// error as the JSON, and the summary says the plan failed.
#[test]
fn a_plan_shows_why_steps_failed_or_were_skipped() {
    let lyra = Lyra::new();
    lyra.write_workflow("failing", FAILING);
    let run = lyra.run(&["plan", "failing"]);
    run.expect_code(1);
    let json = lyra.run(&["plan", "failing", "-o", "json"]);
    json.expect_code(1);
    let report = json.json();
    let error = step(&report, "db")["error"].as_str().expect("db's error").to_owned();
    assert_eq!(error, "workflows/failing.yaml:10:14: $sizes.db does not exist");
    assert_eq!(
        run.stdout,
        format!(
            "  ! app (Null::Resource) skipped: it depends on 'db', which did not complete\n\
             \x20 + cache (Null::Resource) will be created\n\
             \x20     + input = \"independent\"\n\
             \x20 ! db (Null::Resource) failed: {error}\n\
             Plan failed: 1 failed, 1 skipped; 1 to create, 0 to update, 0 to replace, 0 to delete, 0 unchanged.\n"
        ),
        "{run}"
    );
    assert!(!run.stdout.contains("db (Null::Resource) will be"), "{run}");

    // A step that exists and would be updated, but fails: not "will be updated in place".
    lyra.write_workflow("failing", &FAILING.replace("$sizes.db", "v1"));
    lyra.ok(&["apply", "failing"]);
    lyra.write_workflow("failing", FAILING);
    let run = lyra.run(&["plan", "failing"]);
    run.expect_code(1);
    assert!(
        run.stdout
            .contains(&format!("  ! db (Null::Resource) failed: {error}\n")),
        "{run}"
    );
    assert!(!run.stdout.contains("will be updated"), "{run}");
    assert!(
        run.stdout.ends_with(
            "Plan failed: 1 failed, 1 skipped; 0 to create, 0 to update, 0 to replace, 0 to delete, 1 unchanged.\n"
        ),
        "{run}"
    );
    // The apply says the same on stderr.
    let run = lyra.run(&["apply", "failing"]);
    run.expect_code(1).expect_stderr(&[
        &format!("failed: db: {error}\n"),
        "skipped: app: it depends on 'db', which did not complete\n",
    ]);
}

const LIB: &str = "returns: [made]\nsteps:\n  it:\n    returns: {made: output}\n    resource: Null::Resource\n    value: {input: from-the-load-path}\n";

/// `lyra apply workflows/a/b.yaml` is the workflow `a::b`, and its calls are looked up on the
/// load path, as they would be for `lyra apply a::b` (they used to be looked up in
/// `workflows/a/`), however the file is written, and for a `--workflows` load path too.
#[test]
fn a_file_inside_the_load_path_calls_what_is_on_it() {
    let lyra = Lyra::new();
    let caller = "returns: [made]\nsteps:\n  use:\n    call: lib\n    returns: [made]\n";
    lyra.write_workflow("lib", LIB);
    lyra.write_workflow("a/b", caller);
    // Beside the file, a workflow of the same name that must not be the one called.
    lyra.write(
        "workflows/a/lib.yaml",
        LIB.replace("from-the-load-path", "from-beside-the-file"),
    );
    let absolute = lyra.path("workflows/a/b.yaml");
    for file in [
        "workflows/a/b.yaml",
        "./workflows/a/b.yaml",
        "workflows/../workflows/a/b.yaml",
        absolute.to_str().expect("a UTF-8 path"),
    ] {
        let report = lyra.ok_json(&["apply", file]);
        assert_eq!(report["workflow"], "a::b", "{file}: {report:#}");
        assert_eq!(report["deployment"], "a::b", "{file}: {report:#}");
        assert_eq!(report["returns"]["made"], "from-the-load-path", "{file}: {report:#}");
    }

    // The same with a load path given.
    lyra.write("other/lib.yaml", LIB.replace("from-the-load-path", "from-other"));
    lyra.write("other/x/y.yaml", caller);
    let report = lyra.ok_json(&["plan", "other/x/y.yaml", "--workflows", "other"]);
    assert_eq!(report["workflow"], "x::y", "{report:#}");
    let report = lyra.ok_json(&["apply", "other/x/y.yaml", "--workflows", "other"]);
    assert_eq!(report["returns"]["made"], "from-other", "{report:#}");

    // A file outside the load path is named after itself and calls what is beside it...
    lyra.write("elsewhere/lib.yaml", LIB.replace("from-the-load-path", "from-beside"));
    lyra.write("elsewhere/main.yaml", caller);
    let report = lyra.ok_json(&["apply", "elsewhere/main.yaml"]);
    assert_eq!(report["workflow"], "main", "{report:#}");
    assert_eq!(report["returns"]["made"], "from-beside", "{report:#}");
    // ...unless a load path is given.
    let report = lyra.ok_json(&["apply", "elsewhere/main.yaml", "--workflows", "other", "--name", "m2"]);
    assert_eq!(report["returns"]["made"], "from-other", "{report:#}");
}

/// The help of a call to an unknown workflow lists what is on the load path (it used to list
/// only the workflows that were loaded): nested names too, not files that are no workflow
/// names, nor links leading out of the load path.
#[cfg(unix)]
#[test]
fn an_unknown_call_lists_the_load_path() {
    let lyra = Lyra::new();
    lyra.write_workflow("main", "steps:\n  a:\n    call: lib\n  b:\n    call: net::vpcs\n");
    lyra.write_workflow("lib", "steps:\n");
    lyra.write_workflow("net/vpc", "steps:\n");
    lyra.write_workflow("net/zone", "steps:\n");
    lyra.write("workflows/team/web.yml", "steps:\n");
    lyra.write("workflows/not a name.yaml", "steps:\n");
    lyra.write("workflows/README.md", "not a workflow\n");
    lyra.write("outside.yaml", "steps:\n");
    std::os::unix::fs::symlink(lyra.path("outside.yaml"), lyra.path("workflows/link.yaml")).expect("link");
    let expected = "workflows on the load path: lib, main, net::vpc, net::zone, team::web";
    let run = lyra.run(&["validate", "main"]);
    run.expect_code(1)
        .expect_stderr(&["step 'b' calls 'net::vpcs', which is not a known workflow", expected]);
    let run = lyra.run(&["validate", "main", "-o", "json"]);
    run.expect_code(1);
    let report = run.json();
    let diagnostics = report["diagnostics"].as_array().expect("diagnostics");
    assert_eq!(diagnostics.len(), 1, "{report:#}");
    assert_eq!(diagnostics[0]["help"], expected, "{report:#}");
}
