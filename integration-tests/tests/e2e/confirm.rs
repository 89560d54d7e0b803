//! The question before `apply` and `delete` on a terminal, through a real pseudo-terminal
//! (util-linux `script`): the plan is shown, only `yes` goes on, `--yes` skips the question,
//! and nothing is asked when there is nothing to change or stdin is not a terminal.

use integration_tests::Lyra;

const PAIR: &str = "\
steps:
  one:
    returns: {x: output}
    resource: Null::Resource
    value:
      input: a
  two:
    resource: Null::Resource
    value:
      input: $x
";

const QUESTION: &str = "Only 'yes' is accepted";

/// Runs `lyra ARGS` on a pseudo-terminal in `lyra`'s directory, typing `answer`.
fn on_terminal(lyra: &Lyra, args: &str, answer: &str) -> (i32, String) {
    let cloud = lyra.path("deployment.json");
    lyra.on_terminal(
        args,
        answer,
        &[("LYRA_FOOBERNETES_FILE", cloud.to_str().expect("utf-8"))],
    )
}

fn deployments(lyra: &Lyra) -> usize {
    let list = lyra.run(&["state", "list", "-o", "json"]);
    if list.code == Some(1) {
        return 0; // no state yet
    }
    list.json().as_array().map_or(0, Vec::len)
}

#[test]
fn apply_and_delete_ask_on_a_terminal() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);

    let (code, shown) = on_terminal(&lyra, "apply pair", "no\n");
    assert_eq!(code, 1, "{shown}");
    assert!(
        shown.contains("one (Null::Resource) will be created"),
        "the plan is shown: {shown}"
    );
    assert!(shown.contains(QUESTION) && shown.contains("apply cancelled"), "{shown}");
    assert_eq!(deployments(&lyra), 0, "declined: nothing recorded");

    // An end of input declines too.
    let (code, _) = on_terminal(&lyra, "apply pair", "");
    assert_eq!(code, 1);
    assert_eq!(deployments(&lyra), 0);

    let (code, shown) = on_terminal(&lyra, "apply pair", "yes\n");
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("apply succeeded: 2 created"), "{shown}");
    // On a terminal the run is shown live: a spinner naming what runs, a line per step.
    assert!(shown.contains("✓ one (Null::Resource) created"), "{shown}");
    assert!(shown.contains("running: "), "{shown}");
    assert_eq!(lyra.resources("pair").len(), 2);

    // Nothing to change: nothing to ask.
    let (code, shown) = on_terminal(&lyra, "apply pair", "no\n");
    assert_eq!(code, 0, "{shown}");
    assert!(!shown.contains(QUESTION), "{shown}");

    let (code, shown) = on_terminal(&lyra, "delete pair", "nope\n");
    assert_eq!(code, 1, "{shown}");
    assert!(
        shown.contains("will be deleted") && shown.contains("delete cancelled"),
        "{shown}"
    );
    assert_eq!(lyra.resources("pair").len(), 2, "declined: nothing deleted");

    let (code, shown) = on_terminal(&lyra, "delete pair --yes", "");
    assert_eq!(code, 0, "{shown}");
    assert!(!shown.contains(QUESTION), "--yes does not ask: {shown}");
    assert!(lyra.resources("pair").is_empty());
}

#[test]
fn nothing_is_asked_without_a_terminal_or_under_json() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    // stdin is not a terminal (the test harness gives /dev/null): no question, applied.
    let run = lyra.ok(&["apply", "pair"]);
    assert!(!run.stderr.contains(QUESTION), "{run}");
    lyra.write_workflow("pair", &PAIR.replace("input: a", "input: b"));
    // JSON is for machines: no question even on a terminal.
    let (code, shown) = on_terminal(&lyra, "apply pair -o json", "");
    assert_eq!(code, 0, "{shown}");
    assert!(!shown.contains(QUESTION), "{shown}");
}
