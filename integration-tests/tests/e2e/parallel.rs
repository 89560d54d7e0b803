//! Parallelism sanity: independent steps run at once up to --concurrency, and every one of
//! them is recorded. Correctness checks, not performance targets (those are benchmarks).

use std::collections::BTreeSet;

use integration_tests::{Lyra, count, sleeps_workflow, steps};

#[test]
fn twenty_independent_sleeps_all_complete_and_are_recorded() {
    let lyra = Lyra::new();
    lyra.write_workflow("par", &sleeps_workflow(20, "200ms"));
    let report = lyra.ok_json(&["apply", "par", "--concurrency", "20"]);
    assert_eq!(count(&report, "created"), 20, "{report:#}");
    assert!(steps(&report).iter().all(|s| s["status"] == "done"), "{report:#}");
    let ids = lyra.resources("par");
    assert_eq!(ids.len(), 20);
    assert_eq!(ids.values().collect::<BTreeSet<_>>().len(), 20, "distinct external ids");
    // Run one after the other they would take 20 x 200ms at least; any overlap is enough.
    let ms = report["duration_ms"].as_u64().expect("duration_ms");
    assert!(ms < 20 * 200, "the steps did not overlap: {ms}ms");
}

#[test]
fn the_concurrency_limit_is_respected() {
    let lyra = Lyra::new();
    lyra.write_workflow("lim", &sleeps_workflow(6, "150ms"));
    let report = lyra.ok_json(&["apply", "lim", "--concurrency", "2"]);
    assert_eq!(count(&report, "created"), 6, "{report:#}");
    // Two at a time: three rounds of 150ms at least.
    let ms = report["duration_ms"].as_u64().expect("duration_ms");
    assert!(ms >= 3 * 150, "6 sleeps of 150ms, 2 at a time, took only {ms}ms");
}

#[test]
fn dependent_steps_wait_for_their_inputs() {
    let lyra = Lyra::new();
    // A chain a -> b -> c of sleeps, each reading the previous one's return.
    lyra.write_workflow(
        "chain",
        "steps:\n  a:\n    returns: {ra: create_duration}\n    resource: Time::Sleep\n    value:\n      create_duration: 100ms\n  b:\n    returns: {rb: create_duration}\n    resource: Time::Sleep\n    value:\n      create_duration: $ra\n  c:\n    resource: Time::Sleep\n    value:\n      create_duration: $rb\n",
    );
    let report = lyra.ok_json(&["apply", "chain", "--concurrency", "10"]);
    let order: Vec<&str> = steps(&report).iter().filter_map(|s| s["step"].as_str()).collect();
    assert_eq!(order, ["a", "b", "c"], "{report:#}");
    let ms = report["duration_ms"].as_u64().expect("duration_ms");
    assert!(ms >= 300, "a chain of three 100ms sleeps took only {ms}ms");
    let deps: Vec<(String, serde_json::Value)> = lyra.state("chain")["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| {
            (
                r["step"].as_str().unwrap_or_default().to_owned(),
                r["depends_on"].clone(),
            )
        })
        .collect();
    assert!(deps.contains(&("c".to_owned(), serde_json::json!(["b"]))), "{deps:?}");
    assert!(deps.contains(&("b".to_owned(), serde_json::json!(["a"]))), "{deps:?}");
}
