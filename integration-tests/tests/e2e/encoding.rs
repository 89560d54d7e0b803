//! Text files as editors save them: a UTF-8 byte-order mark is accepted in every file Lyra
//! reads (workflows, the workflows they call, data files, state exports); bytes that are not
//! UTF-8 are an input error (exit 1) naming the file, line, column and byte offset.

use integration_tests::Lyra;

const BOM: &[u8] = b"\xEF\xBB\xBF";

fn with_bom(text: &str) -> Vec<u8> {
    [BOM, text.as_bytes()].concat()
}

const MAIN: &str = "\
parameters:
  size: {type: Integer, lookup: size}
steps:
  one:
    returns: {o: output}
    resource: Null::Resource
    value:
      input: $size
  inner:
    call: helper
";

const HELPER: &str = "\
parameters: [o]
steps:
  h:
    resource: Null::Resource
    value:
      input: $o
";

#[test]
fn byte_order_marks_are_accepted_everywhere() {
    let lyra = Lyra::new();
    lyra.write("workflows/main.yaml", with_bom(MAIN));
    lyra.write("workflows/helper.yaml", with_bom(HELPER));
    lyra.write("data.yaml", with_bom("size: 3\n"));
    lyra.ok(&["validate", "main"]);
    let report = lyra.ok_json(&["apply", "main", "--data", "data.yaml"]);
    assert_eq!(report["counts"]["created"], 2, "{report:#}");

    // A workflow given as a file, and the default ./data.yaml.
    lyra.write("standalone.yaml", with_bom(HELPER));
    lyra.ok(&["plan", "standalone.yaml", "--var", "o=1"]);

    // An export saved again by an editor imports.
    let export = lyra.ok(&["state", "export", "main"]).stdout;
    lyra.write("export.json", with_bom(&export));
    let imported = lyra.ok_json(&["state", "import", "export.json", "--state", "copy.db"]);
    assert_eq!(imported["imported"][0]["deployment"], "main", "{imported:#}");
}

/// Runs `args` and checks it fails as an input error pointing at `at` (`file:line:col`) with
/// the byte offset, in text and in the JSON error document.
#[track_caller]
fn not_utf8(lyra: &Lyra, args: &[&str], at: &str, offset: usize) {
    let text = lyra.run(args);
    text.expect_code(1)
        .expect_stderr(&[at, &format!("byte offset {offset}"), "not valid UTF-8"]);
    let mut json: Vec<&str> = args.to_vec();
    json.extend(["-o", "json"]);
    let run = lyra.run(&json);
    run.expect_code(1);
    let doc = run.json();
    let error = if doc["error"].is_object() { &doc["error"] } else { &doc };
    let (file, rest) = at.split_once(':').expect("file:line:col");
    // The one about that file (a caller's call of it may come first).
    let d = error["diagnostics"]
        .as_array()
        .and_then(|all| all.iter().find(|d| d["file"] == file))
        .unwrap_or_else(|| panic!("no diagnostic about {file}: {doc:#}"));
    let (line, col) = rest.split_once(':').expect("line:col");
    assert_eq!(d["file"], file, "{doc:#}");
    assert_eq!(d["line"].to_string(), line, "{doc:#}");
    assert_eq!(d["column"].to_string(), col, "{doc:#}");
    assert!(
        d["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("byte offset {offset}"))),
        "{doc:#}"
    );
}

#[test]
fn bytes_that_are_not_utf8_are_input_errors_at_the_byte() {
    let lyra = Lyra::new();
    // Latin-1 "é" (0xE9) on line 3, after a BOM: offset counts the file's bytes.
    let mut latin1 = with_bom("steps:\n  one:\n    resource: Null::Resource # caf");
    latin1.extend(b"\xE9\n");
    lyra.write("workflows/latin.yaml", &latin1);
    not_utf8(&lyra, &["validate", "latin"], "workflows/latin.yaml:3:35", 51);
    not_utf8(&lyra, &["plan", "latin"], "workflows/latin.yaml:3:35", 51);

    // A called workflow: reported as what it is, not as an unknown workflow.
    lyra.write("workflows/caller.yaml", "steps:\n  c:\n    call: latin\n");
    not_utf8(&lyra, &["apply", "caller"], "workflows/latin.yaml:3:35", 51);
    let run = lyra.run(&["apply", "caller"]);
    assert!(!run.stderr.contains("not a known workflow"), "{run}");
    run.expect_stderr(&[
        "step 'c' calls 'latin', which cannot be loaded: cannot read workflows/latin.yaml: not valid UTF-8",
    ]);

    // Data files, given or default.
    lyra.write("workflows/ok.yaml", HELPER);
    lyra.write("bad-data.yaml", b"x: 1\ny: \xFF\n");
    not_utf8(
        &lyra,
        &["plan", "ok", "--data", "bad-data.yaml"],
        "bad-data.yaml:2:4",
        8,
    );
    lyra.write("data.yaml", b"x: \xC3\n");
    not_utf8(&lyra, &["plan", "ok"], "data.yaml:1:4", 3);

    // UTF-16 says so.
    lyra.write("workflows/wide.yaml", [0xFF, 0xFE, b's', 0, b':', 0]);
    lyra.run(&["validate", "wide"])
        .expect_code(1)
        .expect_stderr(&["UTF-16"]);
}

#[test]
fn an_import_file_that_is_not_utf8_is_an_input_error() {
    let lyra = Lyra::new();
    lyra.write("export.json", b"{\"format\": \"lyra-state\xFF\"}");
    let run = lyra.run(&["state", "import", "export.json", "-o", "json"]);
    run.expect_code(1)
        .expect_stderr(&["export.json", "byte offset 22", "line 1, column 23"]);
    assert_eq!(run.json()["error"]["kind"], "invalid_input", "{run}");
    assert!(!lyra.path(".lyra").exists(), "nothing was imported");
    // Broken JSON is located too.
    lyra.write("broken.json", "{\n  \"format\": \"lyra-state\",\n  \"version\": x\n}");
    lyra.run(&["state", "import", "broken.json"])
        .expect_code(1)
        .expect_stderr(&["broken.json:3:"]);
}
