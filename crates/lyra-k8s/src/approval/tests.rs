use std::time::Duration;

use lyra_core::report::{AttrChange, Mode, Status};
use lyra_core::state::{ChangeCounts, Outcome};
use serde_json::json;

use super::*;

fn step(id: &str, action: Action, changes: Vec<AttrChange>) -> StepReport {
    StepReport {
        id: id.into(),
        type_name: Some("Null::Resource".into()),
        action,
        status: Status::Planned,
        external_id: None,
        duration: Duration::from_millis(7),
        error: None,
        changes,
        refused: false,
    }
}

fn change(path: &str, old: Option<Value>, new: Option<Value>, sensitive: bool) -> AttrChange {
    AttrChange {
        attribute: path.into(),
        path: path.into(),
        old,
        new,
        forces_replace: false,
        sensitive,
    }
}

fn plan(steps: Vec<StepReport>) -> Report {
    Report {
        mode: Mode::Plan,
        deployment: "k8s/ns/x".into(),
        workflow: Some("pair".into()),
        outcome: Outcome::Succeeded,
        run: None,
        returns: Map::new(),
        sensitive_returns: vec![],
        counts: ChangeCounts {
            created: 1,
            updated: 1,
            ..ChangeCounts::default()
        },
        steps,
        duration: Duration::from_millis(3),
    }
}

fn sample() -> Report {
    plan(vec![
        step(
            "b",
            Action::Update,
            vec![change("input", Some(json!("x")), Some(json!("y")), false)],
        ),
        step(
            "a",
            Action::Create,
            vec![change("input", None, Some(json!("(sensitive)")), true)],
        ),
        step("c", Action::Noop, vec![]),
    ])
}

fn hash_with(key: &str, r: &Report, data: Value, sources: &Sources) -> String {
    let Value::Object(data) = data else {
        panic!("data is a map")
    };
    plan_hash(
        key,
        r,
        &PlanInputs {
            deployment: "k8s/ns/x",
            workflow: "pair",
            digest: None,
            sources,
            data: &data,
            state: None,
        },
    )
}

#[test]
fn canonical_json_sorts_keys_at_every_level() {
    let a = json!({"b": 1, "a": {"d": [1, {"z": 0, "y": 1}], "c": null}});
    assert_eq!(canonical(&a), r#"{"a":{"c":null,"d":[1,{"y":1,"z":0}]},"b":1}"#);
}

#[test]
fn the_hash_is_stable_and_covers_every_input() {
    let mut sources = Sources::default();
    sources.add("pair.yaml", "steps: {}\n");
    let r = sample();
    let base = hash_with("store", &r, json!({"greeting": "hi"}), &sources);
    // Stable: the order steps finished in and their durations do not count.
    let mut reordered = sample();
    reordered.steps.reverse();
    reordered.steps[0].duration = Duration::from_secs(9);
    assert_eq!(
        hash_with("store", &reordered, json!({"greeting": "hi"}), &sources),
        base
    );
    // Each input moves it: the data, the workflow text, the changes, the key.
    assert_ne!(hash_with("store", &r, json!({"greeting": "ho"}), &sources), base);
    let mut edited = Sources::default();
    edited.add("pair.yaml", "steps: {} # edited\n");
    assert_ne!(hash_with("store", &r, json!({"greeting": "hi"}), &edited), base);
    let mut other = sample();
    other.steps[0].changes[0].new = Some(json!("z"));
    assert_ne!(hash_with("store", &other, json!({"greeting": "hi"}), &sources), base);
    assert_ne!(
        hash_with("another store", &r, json!({"greeting": "hi"}), &sources),
        base
    );
}

#[test]
fn secrets_reach_the_hash_only_keyed_and_never_the_status() {
    let sources = Sources::default();
    let r = sample();
    let one = hash_with("store", &r, json!({"password": "s3cret-one"}), &sources);
    let two = hash_with("store", &r, json!({"password": "s3cret-two"}), &sources);
    // The same masked plan, two secrets: two hashes.
    assert_ne!(one, two);
    // Not the plain digest of anything a guesser could rebuild without the store's key:
    // the same inputs under another key give another hash.
    assert_ne!(hash_with("guess", &r, json!({"password": "s3cret-one"}), &sources), one);
    // A change marked sensitive is masked in the status even if a value slipped through.
    let mut leaky = sample();
    leaky.steps[1].changes[0].new = Some(json!("s3cret-one"));
    let status = plan_status(&leaky, one, Some(1));
    let text = serde_json::to_string(&status).unwrap();
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains("(sensitive)"), "{text}");
}

#[test]
fn the_status_lists_changed_steps_by_id_with_counts() {
    let s = plan_status(&sample(), "sha256:ab".into(), Some(3));
    let steps: Vec<(&str, &str)> = s.changes.iter().map(|c| (c.step.as_str(), c.action.as_str())).collect();
    assert_eq!(steps, [("a", "create"), ("b", "update")]);
    assert_eq!(s.changes[1].attributes[0].old.as_deref(), Some("\"x\""));
    assert_eq!(s.changes[0].attributes[0].old, None);
    assert_eq!((s.create, s.update, s.changes_omitted), (1, 1, 0));
    assert_eq!(
        s.summary,
        "1 to create, 1 to update, 0 to replace, 0 to delete, 0 unchanged"
    );
    assert!(changes_anything(&sample()));
    let mut unchanged = plan(vec![step("c", Action::Noop, vec![])]);
    unchanged.counts = ChangeCounts {
        unchanged: 1,
        ..ChangeCounts::default()
    };
    assert!(!changes_anything(&unchanged));
}

#[test]
fn a_plan_too_big_for_the_status_says_what_it_left_out() {
    let big = json!("x".repeat(400));
    let steps = (0..400)
        .map(|i| {
            step(
                &format!("s{i:03}"),
                Action::Update,
                vec![change("input", Some(big.clone()), Some(big.clone()), false)],
            )
        })
        .collect();
    let s = plan_status(&plan(steps), "sha256:ab".into(), None);
    assert!(s.changes_omitted > 0);
    assert_eq!(s.changes.len() + usize::try_from(s.changes_omitted).unwrap(), 400);
    assert!(serde_json::to_vec(&s.changes).unwrap().len() <= PLAN_BUDGET);
}
