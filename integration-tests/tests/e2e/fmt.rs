//! `lyra fmt`: canonical layout of workflow YAML, comments kept, meaning never changed.

use std::path::{Path, PathBuf};

use integration_tests::{Lyra, Run, Value, assert_sane, compat_or_skip, run_command, workspace_dir};
use yaml_rust2::{Yaml, YamlLoader};

/// A workflow as people write it: 4-space and 3-space indentation, a sequence at its key's
/// column, extra spaces after `:` and `-`, trailing whitespace, a run of blank lines, comments
/// everywhere, a block scalar and a flow collection.
const MESSY: &str = "\
# The messy one.
returns:    [first, second]
steps:
    # the first step
    one:
        returns: {first: output}   # a flow mapping, kept as written
        resource: Null::Resource
        value:
            input:
            -   alpha
            - beta\x20\x20\x20
            -     name: gamma
                  port:    8080



    two:
       returns: {second: output}
       resource: Null::Resource
       value:
           input:
               ref: $first
               script: |
                       echo one
                         echo indented
               # commented-out: true
";

/// What `lyra fmt` makes of [`MESSY`].
const FORMATTED: &str = "\
# The messy one.
returns: [first, second]
steps:
  # the first step
  one:
    returns: {first: output} # a flow mapping, kept as written
    resource: Null::Resource
    value:
      input:
        - alpha
        - beta
        - name: gamma
          port: 8080

  two:
    returns: {second: output}
    resource: Null::Resource
    value:
      input:
        ref: $first
        script: |
          echo one
            echo indented
        # commented-out: true
";

/// `lyra ARGS` with `input` on stdin.
#[track_caller]
fn with_stdin(lyra: &Lyra, args: &[&str], input: &str) -> Run {
    let path = lyra.write(".stdin.yaml", input);
    let mut cmd = lyra.command(args);
    cmd.stdin(std::fs::File::open(&path).expect("open the stdin file"));
    let run = run_command(cmd, args);
    assert_sane(&run);
    run
}

/// A plan's steps and counts (its duration aside).
#[track_caller]
fn plan(lyra: &Lyra, workflow: &str) -> (Value, Value) {
    let report = lyra.ok_json(&["plan", workflow]);
    (report["steps"].clone(), report["counts"].clone())
}

#[test]
fn a_messy_workflow_is_formatted_and_means_the_same() {
    let lyra = Lyra::new();
    lyra.write_workflow("messy", MESSY);
    lyra.ok(&["validate", "messy"]);
    let before = plan(&lyra, "messy");

    let check = lyra.run(&["fmt", "--check"]);
    check.expect_code(1);
    assert_eq!(check.stdout, "workflows/messy.yaml\n", "{check}");
    assert_eq!(lyra.read("workflows/messy.yaml"), MESSY, "--check wrote the file");

    let run = lyra.ok(&["fmt"]);
    assert_eq!(run.stdout, "workflows/messy.yaml\n", "{run}");
    let after = lyra.read("workflows/messy.yaml");
    assert_eq!(after, FORMATTED);
    for comment in [
        "# The messy one.",
        "# the first step",
        "# a flow mapping, kept as written",
        "# commented-out: true",
    ] {
        assert!(after.contains(comment), "the comment {comment:?} is gone:\n{after}");
    }

    lyra.ok(&["validate", "messy"]);
    assert_eq!(plan(&lyra, "messy"), before, "the plan changed");
    assert_eq!(lyra.run(&["fmt", "--check"]).expect_ok().stdout, "");
    // Formatting a formatted file changes nothing.
    assert_eq!(lyra.ok(&["fmt"]).stdout, "");
    assert_eq!(lyra.read("workflows/messy.yaml"), FORMATTED);
}

#[test]
fn diff_shows_the_change_and_writes_nothing() {
    let lyra = Lyra::new();
    lyra.write_workflow("messy", MESSY);
    let run = lyra.ok(&["fmt", "--diff", "workflows"]);
    assert!(
        run.stdout
            .starts_with("--- workflows/messy.yaml\n+++ workflows/messy.yaml\n@@ -1,"),
        "{run}"
    );
    assert!(
        run.stdout.contains("\n-    one:\n") && run.stdout.contains("\n+  one:\n"),
        "{run}"
    );
    assert_eq!(lyra.read("workflows/messy.yaml"), MESSY);
    // With --check as well, the diff and exit 1.
    let run = lyra.run(&["fmt", "--check", "--diff"]);
    run.expect_code(1);
    assert!(run.stdout.starts_with("--- workflows/messy.yaml"), "{run}");
}

#[test]
fn a_broken_file_is_reported_and_left_alone() {
    let lyra = Lyra::new();
    lyra.write_workflow("good", "steps:\n    a:\n        resource: Null::Resource\n");
    let broken = "steps:\n  a:\n    resource: Null::Resource\n   oops: 1\n";
    lyra.write_workflow("broken", broken);
    let run = lyra.run(&["fmt"]);
    run.expect_code(1);
    run.expect_stderr(&[
        "malformed YAML",
        "workflows/broken.yaml:4:",
        "1 file could not be formatted",
    ]);
    assert_eq!(lyra.read("workflows/broken.yaml"), broken);
    assert_eq!(
        lyra.read("workflows/good.yaml"),
        "steps:\n  a:\n    resource: Null::Resource\n"
    );
    assert_eq!(run.stdout, "workflows/good.yaml\n", "{run}");
}

#[test]
fn json_is_one_document() {
    let lyra = Lyra::new();
    lyra.write_workflow("messy", MESSY);
    lyra.write_workflow("tidy", FORMATTED);
    lyra.write_workflow("zbroken", "a: [1\n");
    let run = lyra.run(&["fmt", "--check", "-o", "json"]);
    run.expect_code(1);
    let doc = run.json();
    assert_eq!(doc["changed"], 1, "{doc:#}");
    let files = doc["files"].as_array().expect("files is an array");
    let row = |path: &str| {
        files
            .iter()
            .find(|f| f["path"] == path)
            .unwrap_or_else(|| panic!("no row for {path}: {doc:#}"))
    };
    assert_eq!(files.len(), 3, "{doc:#}");
    assert_eq!(row("workflows/messy.yaml")["changed"], true);
    assert_eq!(row("workflows/messy.yaml")["diagnostics"], serde_json::json!([]));
    assert_eq!(row("workflows/tidy.yaml")["changed"], false);
    let broken = row("workflows/zbroken.yaml");
    assert_eq!(broken["changed"], false);
    assert_eq!(broken["diagnostics"][0]["file"], "workflows/zbroken.yaml");
    assert_eq!(broken["diagnostics"][0]["line"], 2);
    assert!(
        broken["diagnostics"][0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("malformed YAML")),
        "{doc:#}"
    );
    assert_eq!(lyra.read("workflows/messy.yaml"), MESSY, "--check wrote the file");

    std::fs::remove_file(lyra.path("workflows/zbroken.yaml")).expect("remove the broken file");
    let doc = lyra.ok_json(&["fmt", "--diff"]);
    assert_eq!(doc["changed"], 1, "{doc:#}");
    assert!(
        doc["files"][0]["diff"].as_str().is_some_and(|d| d.contains("+  one:")),
        "{doc:#}"
    );
    assert_eq!(doc["files"][1]["diff"], Value::Null);
    let doc = lyra.ok_json(&["fmt"]);
    assert_eq!(doc["changed"], 1, "{doc:#}");
    assert_eq!(lyra.read("workflows/messy.yaml"), FORMATTED);
}

#[test]
fn stdin_is_formatted_to_stdout() {
    let lyra = Lyra::new();
    let run = with_stdin(&lyra, &["fmt", "-"], MESSY);
    run.expect_ok();
    assert_eq!(run.stdout, FORMATTED);
    with_stdin(&lyra, &["fmt", "--check", "-"], MESSY).expect_code(1);
    let run = with_stdin(&lyra, &["fmt", "--check", "-"], FORMATTED);
    run.expect_ok();
    assert_eq!(run.stdout, "");
    let doc = with_stdin(&lyra, &["fmt", "-", "-o", "json"], MESSY).expect_ok().json();
    assert_eq!(doc["files"][0]["path"], "-");
    assert_eq!(doc["files"][0]["changed"], true);
    assert_eq!(doc["files"][0]["formatted"], FORMATTED);
    let run = with_stdin(&lyra, &["fmt", "-"], "a: {\n");
    run.expect_code(1);
    run.expect_stderr(&["malformed YAML", "-:2:1"]);
    lyra.run(&["fmt", "-", "workflows"]).expect_code(2);
}

#[test]
fn paths_are_files_and_directories() {
    let lyra = Lyra::new();
    lyra.write("a/one.yaml", "x:    1\n");
    lyra.write("a/b/two.yml", "y:    2\n");
    lyra.write("a/notes.txt", "z:    3\n");
    lyra.write("a/.hidden/three.yaml", "w:    4\n");
    lyra.write("single.conf", "v:    5\n");
    let run = lyra.ok(&["fmt", "a", "single.conf"]);
    assert_eq!(run.stdout, "a/b/two.yml\na/one.yaml\nsingle.conf\n", "{run}");
    assert_eq!(lyra.read("a/one.yaml"), "x: 1\n");
    assert_eq!(lyra.read("a/notes.txt"), "z:    3\n");
    assert_eq!(lyra.read("a/.hidden/three.yaml"), "w:    4\n");
    // Without workflows/, the working directory (hidden directories left out).
    assert_eq!(lyra.ok(&["fmt", "--check"]).stdout, "");
    lyra.run(&["fmt", "missing.yaml"]).expect_code(2);
}

#[cfg(unix)]
#[test]
fn rewriting_keeps_permissions() {
    use std::os::unix::fs::PermissionsExt as _;
    let lyra = Lyra::new();
    let path = lyra.write_workflow("w", "a:    1\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    lyra.ok(&["fmt"]);
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o640);
    assert_eq!(lyra.read("workflows/w.yaml"), "a: 1\n");
}

/// Every YAML file under `dir` (hidden ones left out, as `lyra fmt` does), relative to it.
fn yaml_files(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir.join(rel))
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.join(rel).display()))
        .map(|e| e.expect("a directory entry"))
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = rel.join(&name);
        if entry.file_type().expect("file type").is_dir() {
            yaml_files(dir, &path, out);
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(path);
        }
    }
}

/// The documents of a YAML text, or `None` when it is not YAML.
fn data(text: &str) -> Option<Vec<Yaml>> {
    YamlLoader::load_from_str(text.strip_prefix('\u{feff}').unwrap_or(text)).ok()
}

/// Copies the YAML files of `source` (never written) into the test's directory under `into`,
/// formats the copies, and checks each formatted file parses to the data of its original and
/// is formatted; files that are not YAML (Helm templates) must be reported and left as they
/// are. Returns how many files were formatted.
#[track_caller]
fn formats_keeping_meaning(lyra: &Lyra, source: &Path, into: &str) -> usize {
    let mut files = Vec::new();
    yaml_files(source, Path::new(""), &mut files);
    assert!(!files.is_empty(), "no YAML under {}", source.display());
    for rel in &files {
        let bytes = std::fs::read(source.join(rel)).expect("read an original");
        lyra.write(Path::new(into).join(rel), bytes);
    }
    let doc = lyra.run(&["fmt", into, "-o", "json"]).json();
    let mut formatted = 0;
    for rel in &files {
        let original = String::from_utf8(std::fs::read(source.join(rel)).expect("read")).expect("UTF-8");
        let copy = lyra.read(Path::new(into).join(rel));
        let shown = Path::new(into).join(rel).display().to_string();
        let row = doc["files"]
            .as_array()
            .and_then(|f| f.iter().find(|r| r["path"] == shown.as_str()))
            .unwrap_or_else(|| panic!("no row for {shown}: {doc:#}"));
        match data(&original) {
            Some(before) => {
                assert_eq!(
                    row["diagnostics"],
                    serde_json::json!([]),
                    "{shown} was not formatted: {doc:#}"
                );
                assert_eq!(data(&copy).as_ref(), Some(&before), "{shown} changed meaning:\n{copy}");
                formatted += 1;
            }
            None => {
                assert_ne!(
                    row["diagnostics"],
                    serde_json::json!([]),
                    "{shown} is not YAML: {doc:#}"
                );
                assert_eq!(copy, original, "{shown} is not YAML, and was written");
            }
        }
    }
    // Formatted once, formatted for good.
    let again = lyra.run(&["fmt", "--check", "-o", "json", into]).json();
    assert_eq!(again["changed"], 0, "not idempotent: {again:#}");
    formatted
}

#[test]
fn the_compat_corpus_keeps_its_meaning() {
    let compat = compat_or_skip!();
    let lyra = Lyra::new();
    let n = formats_keeping_meaning(&lyra, &compat, "compat");
    assert!(n >= 5, "only {n} files formatted");
    // The formatted workflows still validate.
    for wf in ["foobernetes", "foober_iter"] {
        let path = format!("compat/workflows/{wf}.yaml");
        if lyra.path(&path).is_file() {
            lyra.ok(&["validate", &path]);
        }
    }
}

#[test]
fn the_examples_keep_their_meaning() {
    let lyra = Lyra::new();
    let n = formats_keeping_meaning(&lyra, &workspace_dir().join("examples"), "examples");
    assert!(n >= 10, "only {n} files formatted");
}
