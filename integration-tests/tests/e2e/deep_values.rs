//! Deep values: one nesting limit (64 levels of lists and maps) from parsing to storage.
//! Deeper input is refused with its file:line:col and never crashes `lyra` (these used to
//! overflow the stack, exit 134); what is accepted is stored, read back, exported, imported
//! and migrated intact; and a record a store cannot decode leaves the rest readable and can
//! be removed. `fuzz_deep_and_wide_values_never_poison_a_store` generates values and YAML
//! shapes around the limit and runs them through validate, apply and read-back on SQLite
//! and Postgres.

use integration_tests::postgres::{PgTestDb, psql};
use integration_tests::{Lyra, Rng, Run, Value, pg_or_skip, step};

const LIMIT: usize = 64;

/// A workflow whose one resource's `input` is `value` (YAML text at line 5, column 14).
fn with_input(value: &str) -> String {
    format!("steps:\n  s:\n    resource: Null::Resource\n    value:\n      input: {value}\n")
}

/// `levels` block mappings, each on its own line indented one more space, under `indent`.
fn block_maps(levels: usize, indent: usize) -> String {
    let mut y = String::with_capacity(levels * (levels / 2 + indent + 4));
    for i in 0..levels {
        y.push('\n');
        y.push_str(&" ".repeat(indent + i));
        y.push_str("a:");
    }
    y.push_str(" 1\n");
    y
}

#[track_caller]
fn assert_too_deep(run: &Run, location: &str) {
    run.expect_code(1);
    run.expect_stderr(&["nests more than 64 levels", location]);
    assert!(run.stderr.len() < 2000, "the message stays short\n{run}");
}

#[test]
fn deep_workflows_data_and_vars_are_refused_with_their_position() {
    let lyra = Lyra::new();
    for levels in [10_000, 100_000] {
        let shapes = [
            (
                "flow_seq",
                format!("{}1{}", "[".repeat(levels), "]".repeat(levels)),
                "flow_seq.yaml:5:",
            ),
            (
                "flow_map",
                format!("{}1{}", "{a: ".repeat(levels), "}".repeat(levels)),
                "flow_map.yaml:5:",
            ),
            // Block sequences nest on one line: `- - - 1`. Level 65 of the document is the
            // 61st list, at column 9 + 60 * 2.
            (
                "block_seq",
                format!("\n        {}1", "- ".repeat(levels)),
                "block_seq.yaml:6:129",
            ),
        ];
        for (name, value, location) in &shapes {
            lyra.write(format!("{name}.yaml"), with_input(value));
            for cmd in ["validate", "plan"] {
                assert_too_deep(&lyra.run(&[cmd, &format!("{name}.yaml")]), location);
            }
            let json = lyra.run(&["validate", &format!("{name}.yaml"), "-o", "json"]);
            json.expect_code(1);
            assert!(
                json.json()["diagnostics"][0]["message"]
                    .as_str()
                    .unwrap()
                    .contains("more than 64"),
                "{json}"
            );
            // The same value as data, and as --var.
            lyra.write("data.yaml", format!("v: {value}\n"));
            lyra.write(
                "uses_v.yaml",
                "parameters: [v]\nsteps:\n  s:\n    resource: Null::Resource\n    value:\n      input: $v\n",
            );
            assert_too_deep(&lyra.run(&["plan", "uses_v.yaml"]), "data.yaml:");
            std::fs::remove_file(lyra.path("data.yaml")).expect("rm data");
            // (100,000 levels would not fit on a command line.)
            if !name.starts_with("block") && levels == 10_000 {
                let run = lyra.run(&["plan", "uses_v.yaml", "--var", &format!("v={value}")]);
                run.expect_code(2);
                run.expect_stderr(&["--var v:", "nests more than 64 levels"]);
            }
        }
    }
    // The file: 10,000 block mappings (one space of indentation each: ~50 MB).
    lyra.write(
        "block_maps.yaml",
        format!(
            "steps:\n  s:\n    resource: Null::Resource\n    value:\n      input:{}",
            block_maps(10_000, 8)
        ),
    );
    assert_too_deep(&lyra.run(&["validate", "block_maps.yaml"]), "block_maps.yaml:66:69");
    // A dotted --var key is as deep as its segments.
    let key = vec!["k"; 65].join(".");
    let run = lyra.run(&["plan", "uses_v.yaml", "--var", &format!("{key}=1")]);
    run.expect_code(2);
    run.expect_stderr(&["nests more than 64 levels"]);
}

#[test]
fn deep_types_guards_and_call_chains_are_refused() {
    let lyra = Lyra::new();
    let n = 100_000;
    let ty = format!("{}String{}", "Array[".repeat(n), "]".repeat(n));
    lyra.write(
        "types.yaml",
        format!("parameters:\n  p:\n    type: '{ty}'\n    value: []\nsteps: {{}}\n"),
    );
    assert_too_deep(&lyra.run(&["validate", "types.yaml"]), "types.yaml:3:11");
    for guard in [
        format!("{}a{}", "(".repeat(n), ")".repeat(n)),
        format!("{}a", "!".repeat(n)),
    ] {
        lyra.write(
            "guard.yaml",
            format!(
                "parameters: {{a: {{value: true}}}}\nsteps:\n  s:\n    when: '{guard}'\n    resource: Null::Resource\n"
            ),
        );
        assert_too_deep(&lyra.run(&["validate", "guard.yaml"]), "guard.yaml:4:");
    }
    // A chain of 100 workflows, each calling the next.
    for i in 0..100 {
        let body = if i < 99 {
            format!("steps:\n  next:\n    call: c{}\n", i + 1)
        } else {
            "steps:\n  s:\n    resource: Null::Resource\n".to_owned()
        };
        lyra.write_workflow(&format!("c{i}"), &body);
    }
    let run = lyra.run(&["validate", "c0"]);
    run.expect_code(1);
    run.expect_stderr(&[
        "steps nest 101 levels deep through calls, more than the limit of 64",
        "c0 -> c1 -> c2",
        "workflows/c0.yaml:3:11",
    ]);
    // Long and-chains are fine.
    let chain = vec!["a"; 10_000].join(" and ");
    lyra.write(
        "chain.yaml",
        format!(
            "parameters: {{a: {{value: true}}}}\nsteps:\n  s:\n    when: '{chain}'\n    resource: Null::Resource\n"
        ),
    );
    lyra.ok(&["validate", "chain.yaml"]);
}

/// Values at the limit go everywhere: stored in SQLite, exported, imported, migrated to
/// Postgres and back, planned as no-ops and deleted. A workflow that would build a value
/// deeper than the limit fails that step when it runs, stores nothing deep, and leaves the
/// deployment readable.
#[test]
fn values_at_the_limit_round_trip_through_every_store() {
    let lyra = Lyra::new();
    // The data file is a level itself: its values may nest 63 levels.
    let deep = format!("{}1{}", "[".repeat(LIMIT - 1), "]".repeat(LIMIT - 1));
    lyra.write("data.yaml", format!("v: {deep}\n"));
    lyra.write_workflow(
        "d",
        "parameters: [v]\nreturns: [o]\nsteps:\n  s:\n    returns: {o: output}\n    resource: Null::Resource\n    value:\n      input: $v\n",
    );
    let expected: Value = serde_json::from_str(&deep).expect("json");
    let report = lyra.ok_json(&["apply", "d"]);
    assert_eq!(report["returns"]["o"], expected);
    let show = lyra.state("d");
    assert_eq!(show["resources"][0]["state"]["output"], expected);
    assert_eq!(lyra.ok_json(&["plan", "d"])["counts"]["unchanged"], 1);
    let export = lyra.ok(&["state", "export", "-f", "all.json"]);
    assert!(export.stderr.contains("exported 1 deployment"), "{export}");
    lyra.ok(&["state", "import", "all.json", "--state", "copy.db"]);
    assert_eq!(
        lyra.ok_json(&["state", "show", "d", "--state", "copy.db"])["resources"][0]["state"]["output"],
        expected
    );
    if let Some(pg) = PgTestDb::create_blocking("values_at_the_limit_round_trip") {
        lyra.ok(&["state", "migrate", "--from", "copy.db", "--to", pg.url()]);
        lyra.ok(&["state", "migrate", "--from", pg.url(), "--to", "back.db"]);
        assert_eq!(
            lyra.ok_json(&["state", "show", "d", "--state", "back.db"])["resources"][0]["state"]["output"],
            expected
        );
    }

    // Two levels more, built by the workflow: the step fails; nothing deep is stored.
    lyra.write_workflow(
        "d",
        "parameters: [v]\nsteps:\n  s:\n    resource: Null::Resource\n    value:\n      input: [[$v]]\n",
    );
    let run = lyra.run(&["apply", "d", "-o", "json"]);
    run.expect_code(1);
    let s = step(&run.json(), "s").clone();
    assert!(
        s["error"]
            .as_str()
            .unwrap()
            .contains("workflows/d.yaml:6:16: the value built here nests more than 64"),
        "{s:#}"
    );
    assert_eq!(
        lyra.state("d")["resources"][0]["state"]["output"],
        expected,
        "the record is as it was"
    );
    lyra.ok(&["state", "export"]);
    lyra.ok(&["delete", "d"]);
}

/// A record the store cannot decode (as an older lyra could write: JSON nested deeper than
/// can be read back) does not make the deployment or the store unreadable: `state show`
/// shows the rest and names it, export and migrate go on with everything else and say what
/// they left out, plan and apply refuse with the way out, and `state rm` removes it.
#[test]
fn a_record_the_store_cannot_read_is_named_and_removable() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    let wf = "steps:\n  good:\n    resource: Null::Resource\n    value: {input: 1}\n  bad:\n    resource: Null::Resource\n    value: {input: 2}\n";
    lyra.write_workflow("w", wf);
    lyra.ok(&["apply", "w"]);
    lyra.write_workflow("other", "steps:\n  x:\n    resource: Null::Resource\n");
    lyra.ok(&["apply", "other"]);
    let deep = format!("{{\"input\": {}1{}}}", "[".repeat(200), "]".repeat(200));
    let out = psql(&format!(
        "UPDATE \"{}\".resources SET actual = '{deep}' WHERE deployment = 'w' AND step_id = 'bad'",
        pg.schema()
    ));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let show = lyra.run(&["state", "show", "w", "-o", "json"]);
    show.expect_ok();
    show.expect_stderr(&["step 'bad' (Null::Resource)", "lyra state rm w bad"]);
    let shown = show.json();
    assert_eq!(shown["resources"].as_array().unwrap().len(), 1, "{shown:#}");
    assert_eq!(shown["unreadable"][0]["step"], "bad", "{shown:#}");
    lyra.ok(&["state", "show", "w"]);
    lyra.ok(&["state", "list"]);
    lyra.ok(&["history", "w"]);

    let export = lyra.run(&["state", "export"]);
    export.expect_code(1);
    export.expect_stderr(&["step 'bad'", "not the unreadable records of: w"]);
    let file = export.json();
    assert_eq!(
        file["deployments"].as_array().unwrap().len(),
        2,
        "everything else is exported"
    );

    for cmd in ["plan", "apply"] {
        let run = lyra.run(&[cmd, "w"]);
        run.expect_code(1);
        run.expect_stderr(&["step 'bad' (Null::Resource)", "lyra state rm w bad"]);
    }
    lyra.run(&["delete", "w"])
        .expect_code(1)
        .expect_stderr(&["lyra state rm w bad"]);

    let migrate = lyra.run(&["state", "migrate", "--from", pg.url(), "--to", "local.db"]);
    migrate.expect_code(1);
    migrate.expect_stderr(&["not migrated: w", "step 'bad'"]);
    assert!(migrate.stdout.contains("moved other"), "the rest goes on\n{migrate}");
    assert_eq!(
        lyra.ok_json(&["state", "list"]).as_array().unwrap().len(),
        1,
        "w stays in the source"
    );

    lyra.ok(&["state", "rm", "w", "bad"]);
    let again = lyra.ok_json(&["apply", "w"]);
    assert_eq!(
        (
            again["counts"]["created"].as_u64(),
            again["counts"]["unchanged"].as_u64()
        ),
        (Some(1), Some(1))
    );
    lyra.ok(&["state", "export"]);
}

/// An export file with a value deeper than the limit is refused by import, naming it; one
/// too deep for JSON itself is refused as malformed. Neither crashes.
#[test]
fn import_refuses_values_too_deep() {
    let lyra = Lyra::new();
    for (levels, expected) in [
        (100, "nests more than 64 levels"),
        (100_000, "recursion limit exceeded"),
    ] {
        let value = format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        let file = format!(
            "{{\"format\":\"lyra-state\",\"version\":1,\"deployments\":[{{\"deployment\":\"d\",\"workflow\":null,\
             \"resources\":[{{\"step\":\"s\",\"type\":\"Null::Resource\",\"external_id\":\"x\",\"desired\":{{\"input\":{value}}},\
             \"actual\":{{}},\"depends_on\":[],\"managed\":true}}],\"history\":[]}}]}}"
        );
        lyra.write("in.json", file);
        let run = lyra.run(&["state", "import", "in.json"]);
        run.expect_code(1);
        run.expect_stderr(&[expected]);
    }
    assert!(lyra.ok_json(&["state", "list"]).as_array().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------
// Generated values and YAML shapes.

/// A random value nesting exactly `depth` levels (0: a scalar); some levels are `wide`.
fn gen_value(rng: &mut Rng, depth: usize, wide: bool) -> Value {
    // Built from the inside out, so that deep values need no recursion.
    let mut v = gen_scalar(rng);
    for level in 0..depth {
        let siblings = if wide && rng.below(20) == 0 { 300 } else { rng.below(3) };
        let mut items: Vec<Value> = (0..siblings)
            .map(|_| {
                if level > 0 && rng.below(4) == 0 {
                    // A shallow sibling container.
                    Value::Array(vec![gen_scalar(rng)])
                } else {
                    gen_scalar(rng)
                }
            })
            .collect();
        items.insert(rng.below(items.len() + 1), v);
        v = if rng.below(2) == 0 {
            Value::Array(items)
        } else {
            Value::Object(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, x)| (format!("k{i}"), x))
                    .collect(),
            )
        };
    }
    v
}

fn gen_scalar(rng: &mut Rng) -> Value {
    match rng.below(7) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => Value::from(rng.below(1_000_000) as i64 - 500_000),
        3 => Value::String(String::new()),
        4 => Value::String("quote \" backslash \\ colon: hash # dash - brackets [{}]".to_owned()),
        5 => Value::String("naïve ünïcödé ✓ 🦀".to_owned()),
        _ => Value::String(format!("s{}", rng.below(1000))),
    }
}

/// YAML text for `v` at `indent`, each container in flow or block style at random (block
/// containers may hold flow ones, not the reverse). Flow text is JSON, which is YAML.
/// `inline`: whether the text follows a `key:` or `-` on the same line.
fn yaml(rng: &mut Rng, v: &Value, indent: usize, out: &mut String) {
    let block = matches!(v, Value::Array(a) if !a.is_empty()) || matches!(v, Value::Object(m) if !m.is_empty());
    if !block || rng.below(3) == 0 {
        out.push(' ');
        out.push_str(&serde_json::to_string(v).expect("json"));
        return;
    }
    let pad = " ".repeat(indent);
    match v {
        Value::Array(items) => {
            for item in items {
                out.push('\n');
                out.push_str(&pad);
                out.push('-');
                yaml(rng, item, indent + 1, out);
            }
        }
        Value::Object(m) => {
            for (k, item) in m {
                out.push('\n');
                out.push_str(&pad);
                out.push_str(k);
                out.push(':');
                yaml(rng, item, indent + 1, out);
            }
        }
        _ => unreachable!("scalars are flow"),
    }
}

/// Where a generated value goes, and how deep it may be there.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// A literal in the workflow: four levels of workflow around it.
    Workflow,
    /// A value in the data file: the file's map is a level.
    Data,
    /// `--var v=...`: the data map is a level.
    Var,
}

impl Place {
    fn max(self) -> usize {
        match self {
            Place::Workflow => LIMIT - 4,
            Place::Data | Place::Var => LIMIT - 1,
        }
    }
}

/// One generated case: validate (workflow) or plan, apply, and read back through state show,
/// export and a no-op plan. Whatever happens, the store stays readable.
fn run_case(lyra: &Lyra, rng: &mut Rng, case: usize, place: Place, depth: usize) {
    // A command line holds at most 128 KiB: no wide values for --var.
    let value = gen_value(rng, depth, !matches!(place, Place::Var));
    let deployment = format!("case{case}");
    let mut text = String::new();
    yaml(rng, &value, 8, &mut text);
    let mut vars: Vec<String> = Vec::new();
    let workflow = match place {
        Place::Workflow => format!("steps:\n  s:\n    resource: Null::Resource\n    value:\n      input:{text}\n"),
        Place::Data | Place::Var => {
            if let Place::Data = place {
                let mut data = String::from("v:");
                yaml(rng, &value, 1, &mut data);
                lyra.write(format!("data{case}.yaml"), data + "\n");
                vars.extend(["--data".to_owned(), format!("data{case}.yaml")]);
            } else {
                vars.extend([
                    "--var".to_owned(),
                    format!("v={}", serde_json::to_string(&value).expect("json")),
                ]);
            }
            "parameters: [v]\nsteps:\n  s:\n    resource: Null::Resource\n    value:\n      input: $v\n".to_owned()
        }
    };
    lyra.write(format!("w{case}.yaml"), &workflow);
    let file = format!("w{case}.yaml");
    let fits = depth <= place.max();
    let mut args = vec![
        "apply".to_owned(),
        file.clone(),
        "--name".to_owned(),
        deployment.clone(),
        "-o".to_owned(),
        "json".to_owned(),
    ];
    args.extend(vars.iter().cloned());
    let apply = lyra.run(&args);
    let context = || {
        format!(
            "case {case}: {place:?} depth {depth}\n--- workflow ---\n{}",
            clip(&workflow)
        )
    };
    if fits {
        assert_eq!(apply.code, Some(0), "{apply}\n{}", context());
        let shown = lyra.state(&deployment);
        assert_eq!(
            shown["resources"][0]["state"]["input"],
            value,
            "read back\n{}",
            context()
        );
        assert_eq!(shown["resources"][0]["state"]["output"], value, "echoed\n{}", context());
        let mut plan = args.clone();
        plan[0] = "plan".to_owned();
        let plan = lyra.run(&plan);
        assert_eq!(plan.code, Some(0), "{plan}");
        assert_eq!(plan.json()["counts"]["unchanged"], 1, "{plan}\n{}", context());
    } else {
        let expected = if matches!(place, Place::Var) { 2 } else { 1 };
        assert_eq!(apply.code, Some(expected), "{apply}\n{}", context());
        assert!(
            apply.stderr.contains("nests more than 64 levels"),
            "{apply}\n{}",
            context()
        );
        if !matches!(place, Place::Var) {
            let at = if matches!(place, Place::Data) {
                format!("data{case}.yaml:")
            } else {
                format!("{file}:")
            };
            assert!(apply.stderr.contains(&at), "names the file: {apply}");
        }
    }
    // Never poisoned: everything recorded so far reads back.
    lyra.ok(&["state", "list"]);
    let export = lyra.ok(&["state", "export"]);
    let _: Value = serde_json::from_str(&export.stdout).expect("the export is JSON");
}

fn clip(s: &str) -> &str {
    let mut end = s.len().min(3000);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn fuzz_on(lyra: &Lyra, seed: u64) {
    let mut rng = Rng::new(seed);
    // Depths around each place's limit, some far beyond it, some shallow and wide.
    let offsets: [isize; 9] = [-40, -3, -1, 0, 1, 2, 10, 100, 1000];
    let mut case = 0;
    for place in [Place::Workflow, Place::Data, Place::Var] {
        for &off in &offsets {
            let depth = (place.max() as isize + off).max(0) as usize;
            run_case(lyra, &mut rng, case, place, depth);
            case += 1;
        }
    }
    lyra.ok(&["state", "show", "case0"]);
}

#[test]
fn fuzz_deep_and_wide_values_never_poison_a_store() {
    let sqlite = Lyra::new();
    fuzz_on(&sqlite, 0x6465_6570);
    let pg = pg_or_skip!();
    let postgres = Lyra::new().with_state(pg.url());
    fuzz_on(&postgres, 0x6465_6571);
}
