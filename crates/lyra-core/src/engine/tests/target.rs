//! `--target`: a run restricted to some steps and what they depend on leaves the rest of the
//! deployment as recorded; a targeted delete takes the dependents with it.

use super::*;

const ALL: &str = "
returns: [x]
steps:
  a:
    returns: {x: id}
    resource: Test::Thing
    value: {input: 1}
  b:
    resource: Test::Thing
    value: {input: {from: $x}}
  c:
    resource: Test::Thing
    value: {input: 3}
";

fn targets(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn targeted(f: &Fixture, yaml: &str, mode: Mode, only: &[&str]) -> Report {
    let mut sources = Sources::default();
    let prog = load(yaml, &f.providers, &mut sources);
    let engine = engine_for(&f.providers, &f.store, &Quiet, &sources, &f.cancel);
    let data = Map::new();
    let only = targets(only);
    block_on(async {
        match mode {
            Mode::Plan => engine.plan_targets(&prog, "d", &data, &only).await,
            Mode::Apply => engine.apply_targets(&prog, "d", &data, "test", &only).await,
            Mode::Delete => engine.delete_targets("d", "test", &only).await,
        }
    })
    .unwrap()
}

fn ids(r: &Report) -> Vec<(&str, Action)> {
    let mut v: Vec<(&str, Action)> = r.steps.iter().map(|s| (s.id.as_str(), s.action)).collect();
    v.sort_by_key(|(id, _)| *id);
    v
}

#[test]
fn a_target_runs_with_what_it_depends_on_and_nothing_else() {
    let f = Fixture::new();
    let first = targeted(&f, ALL, Mode::Apply, &["b"]);
    assert_eq!(ids(&first), [("a", Action::Create), ("b", Action::Create)]);
    assert_eq!(f.ids(), ["a", "b"]);
    assert!(first.returns.is_empty(), "a partial apply returns nothing");
    f.run(ALL, json!({}), Mode::Apply);
    assert_eq!(f.ids(), ["a", "b", "c"]);

    // c is gone from the workflow and b changed: targeting b updates it, and c, left out,
    // is not taken for garbage.
    let edited = ALL
        .replace("{from: $x}", "{from: $x, more: 1}")
        .replace("  c:\n    resource: Test::Thing\n    value: {input: 3}\n", "");
    let plan = targeted(&f, &edited, Mode::Plan, &["b"]);
    assert_eq!(ids(&plan), [("a", Action::Noop), ("b", Action::Update)]);
    let apply = targeted(&f, &edited, Mode::Apply, &["b"]);
    assert_eq!(ids(&apply), [("a", Action::Noop), ("b", Action::Update)]);
    assert_eq!(f.ids(), ["a", "b", "c"]);
    let ends = f.store.ends.lock().unwrap();
    assert!(
        ends.last()
            .and_then(|e| e.note.as_deref())
            .is_some_and(|n| n.contains("only b")),
        "the history says it was partial"
    );
    assert!(ends.last().is_some_and(|e| e.returns.is_none()), "no returns recorded");
    drop(ends);
    // Untargeted, the same workflow deletes c.
    let full = f.run(&edited, json!({}), Mode::Plan);
    assert!(ids(&full).contains(&("c", Action::Delete)), "{:?}", ids(&full));
}

#[test]
fn a_targeted_delete_takes_the_dependents_first() {
    let f = Fixture::new();
    f.run(ALL, json!({}), Mode::Apply);
    let r = targeted(&f, ALL, Mode::Delete, &["a"]);
    let deleted: Vec<&str> = r.steps.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(deleted, ["b", "a"], "b was built from a: it goes first");
    assert_eq!(f.ids(), ["c"]);
}
