//! Deployment names (issue 9, finding F6): one rule (`lyra_core::names`) for every command
//! that takes one. A bad name (empty, control characters, `/` tricks, overlong) is a usage
//! error (exit 2) naming it escaped, before any state store is opened.

use integration_tests::Lyra;

/// Every command taking deployment names, with `{}` where the name goes.
const COMMANDS: &[&[&str]] = &[
    &["apply", "web.yaml", "--name", "{}"],
    &["plan", "web.yaml", "--name", "{}"],
    &["delete", "{}"],
    &["delete", "{}", "--dry-run"],
    &["state", "show", "{}"],
    &["state", "rm", "{}", "one"],
    &["state", "unlock", "{}"],
    &["state", "unlock", "{}", "--force"],
    &["state", "export", "ok", "{}"],
    &["history", "{}"],
];

#[test]
fn bad_deployment_names_are_usage_errors_before_any_store_is_opened() {
    let lyra = Lyra::new();
    lyra.write(
        "web.yaml",
        "steps:\n  one:\n    resource: Null::Resource\n    value: {input: 1}\n",
    );
    let state = lyra.path("no/such/dir/state.db");
    let state = state.to_str().expect("a UTF-8 path");
    let overlong = "x".repeat(513);
    let bad: &[(&str, &str)] = &[
        ("", "the name is empty"),
        ("a\nb", r#""a\nb""#),
        ("a\u{1b}[31mred", "control character"),
        ("/etc/passwd", "'/' only separates"),
        ("a//b", "'/' only separates"),
        ("k8s/../x", "'..' is not allowed"),
        (" web", "starts or ends with a space"),
        ("a\\b", r"'\' is not allowed"),
        (&overlong, "513 bytes long"),
    ];
    for command in COMMANDS {
        for (name, why) in bad {
            let mut args: Vec<&str> = command.iter().map(|a| if *a == "{}" { *name } else { a }).collect();
            args.extend(["--state", state]);
            let run = lyra.run(&args);
            run.expect_code(2);
            run.expect_stderr(&["invalid deployment name", why]);
            // The name is shown escaped: no line of the message comes from it.
            assert!(!run.stderr.lines().any(|l| l.starts_with('b')), "{run}");
            // Under -o json: the one error document, kind usage.
            args.extend(["-o", "json"]);
            let run = lyra.run(&args);
            run.expect_code(2);
            assert_eq!(run.json()["error"]["kind"], "usage", "{run}");
        }
    }
    // `state migrate` takes names too (and two stores).
    let run = lyra.run(&["state", "migrate", "--from", state, "--to", state, "a/../b"]);
    run.expect_code(2);
    run.expect_stderr(&["invalid deployment name \"a/../b\""]);
    assert!(!lyra.path("no").exists(), "a store was created");

    // Good names, with '/' between parts, as the controller's `k8s/<ns>/<name>`.
    let state = lyra.path("state.db");
    let state = state.to_str().expect("a UTF-8 path");
    lyra.ok(&["apply", "web.yaml", "--name", "team/web 2", "--state", state]);
    lyra.ok(&["state", "show", "team/web 2", "--state", state]);
    lyra.ok(&["delete", "team/web 2", "--state", state]);

    // A name derived from a workflow file follows the rule too.
    lyra.write(
        "tab\there.yaml",
        "steps:\n  one:\n    resource: Null::Resource\n    value: {input: 1}\n",
    );
    let run = lyra.run(&["apply", "tab\there.yaml", "--state", state]);
    run.expect_code(2);
    run.expect_stderr(&["cannot name a deployment", "give one with --name"]);
    lyra.ok(&["apply", "tab\there.yaml", "--name", "tab", "--state", state]);
}
