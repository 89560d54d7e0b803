//! `--target STEP`: plan, apply and delete restricted to a step and what it depends on (for a
//! delete: what depends on it), with a warning that the rest is left as it is.

use integration_tests::{Lyra, note_contains, steps_with_action};

const VMS: &str = "\
steps:
  db:
    returns: {ip: instanceIP}
    resource: Foobernetes::Instance
    value: {location: eu1, image: postgres, cpus: 2, memory: 4G}
  web:
    resource: Foobernetes::Instance
    value: {location: eu1, image: nginx, cpus: 1, memory: 1G, config: {db: $ip}}
  cache:
    resource: Foobernetes::Instance
    value: {location: eu1, image: redis, cpus: 1, memory: 1G}
";

fn instances(lyra: &Lyra) -> usize {
    lyra.cloud()["Instances"].as_object().map_or(0, |o| o.len())
}

#[test]
fn plan_and_apply_run_the_target_and_what_it_depends_on() {
    let lyra = Lyra::new();
    lyra.write_workflow("vms", VMS);

    let plan = lyra.run(&["plan", "vms", "--target", "web", "-o", "json"]);
    plan.expect_ok()
        .expect_stderr(&["warning: only web and what it depends on is planned"]);
    assert_eq!(steps_with_action(&plan.json(), "create"), ["db", "web"]);

    let apply = lyra.run(&["apply", "vms", "--target", "db"]);
    apply.expect_ok().expect_stderr(&["warning: only db"]);
    assert_eq!(lyra.resources("vms").keys().collect::<Vec<_>>(), ["db"]);
    assert_eq!(instances(&lyra), 1);
    let history = lyra.history("vms");
    assert!(note_contains(&history[0], "only db"), "{history:?}");

    // A typo is a usage error, not a run of nothing.
    let typo = lyra.run(&["apply", "vms", "--target", "wbe", "-o", "json"]);
    typo.expect_code(2);
    let near = typo.json()["error"]["did_you_mean"].clone();
    assert!(near.as_array().is_some_and(|n| n.iter().any(|x| x == "web")), "{typo}");
    // Saved plans are whole.
    lyra.run(&["plan", "vms", "--target", "db", "--out", "p.json"])
        .expect_code(2);

    let all = lyra.ok_json(&["apply", "vms"]);
    assert_eq!(steps_with_action(&all, "create"), ["cache", "web"]);
    assert_eq!(instances(&lyra), 3);
}

#[test]
fn a_targeted_delete_takes_what_depends_on_it_and_leaves_the_rest() {
    let lyra = Lyra::new();
    lyra.write_workflow("vms", VMS);
    lyra.ok(&["apply", "vms"]);

    let dry = lyra.ok_json(&["delete", "vms", "--dry-run", "--target", "db"]);
    assert_eq!(steps_with_action(&dry, "delete"), ["db", "web"]);
    assert_eq!(instances(&lyra), 3, "a dry run deletes nothing");

    let missing = lyra.run(&["delete", "vms", "--target", "nosuch", "-o", "json"]);
    missing.expect_code(1);
    assert_eq!(missing.json()["error"]["kind"], "not_found");

    lyra.ok(&["delete", "vms", "--target", "db"])
        .expect_stderr(&["warning: only db and what was built from it is deleted"]);
    assert_eq!(lyra.resources("vms").keys().collect::<Vec<_>>(), ["cache"]);
    assert_eq!(instances(&lyra), 1);
}
