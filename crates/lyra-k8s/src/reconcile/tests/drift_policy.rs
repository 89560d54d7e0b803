//! `driftPolicy`: what a refresh of an applied spec does about a resource changed outside
//! Lyra. Report says so and changes nothing; Ignore does nothing; Correct (and any spec
//! change) applies, which corrects it.

use super::*;
use crate::status::DRIFTED;

fn cloud_job(policy: DriftPolicy, generation: i64) -> Job {
    Job {
        refresh_interval: Some("1s".to_owned()),
        drift_policy: policy,
        ..job("c", "cloud", generation, json!({}))
    }
}

/// The Foobernetes instance's CPUs, as the cloud has them.
fn cpus(h: &Harness) -> Vec<i64> {
    let cloud: Value =
        serde_json::from_str(&std::fs::read_to_string(h.dir.path().join("deployment.json")).unwrap()).unwrap();
    cloud["Instances"]
        .as_object()
        .unwrap()
        .values()
        .map(|i| i["Cpus"].as_i64().unwrap())
        .collect()
}

/// Someone changes the instance behind Lyra's back.
fn resize(h: &Harness, to: i64) {
    let path = h.dir.path().join("deployment.json");
    let mut cloud: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for i in cloud["Instances"].as_object_mut().unwrap().values_mut() {
        i["Cpus"] = json!(to);
    }
    std::fs::write(&path, cloud.to_string()).unwrap();
}

/// Lets the refresh interval (1s, the shortest there is) pass.
async fn refresh_due() {
    tokio::time::sleep(Duration::from_millis(1050)).await;
}

#[tokio::test]
async fn report_says_what_drifted_and_changes_nothing() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = cloud_job(DriftPolicy::Report, 1);
    rt.apply(&j, None, &r).await.unwrap();
    assert!(is_true(&r.last(), READY), "{:?}", r.last());

    // Nothing drifted yet: said so.
    refresh_due().await;
    rt.apply(&j, Some(&r.last()), &r).await.unwrap();
    let c = condition(&r.last(), DRIFTED).cloned().expect("a Drifted condition");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "NoDrift"), "{c:?}");

    resize(&h, 4);
    refresh_due().await;
    rt.apply(&j, Some(&r.last()), &r).await.unwrap();
    let s = r.last();
    let c = condition(&s, DRIFTED).cloned().expect("a Drifted condition");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Drifted"), "{c:?}");
    assert!(c.message.contains("vm (Foobernetes::Instance): cpus"), "{c:?}");
    assert!(is_true(&s, READY), "the spec is still applied: {s:?}");
    assert_eq!(cpus(&h), [4], "Report changes nothing");
    assert!(
        r.reasons().contains(&"Drifted".to_owned()),
        "an event: {:?}",
        r.reasons()
    );
    assert!(rt.metrics().encode().contains("lyra_drifted_resources 1"));

    // The same drift again: no second event.
    let events = r.reasons().len();
    refresh_due().await;
    rt.apply(&j, Some(&r.last()), &r).await.unwrap();
    assert_eq!(r.reasons().len(), events, "{:?}", r.reasons());
    assert_eq!(cpus(&h), [4]);

    // A spec change is applied, and corrects the drift with it.
    let changed = cloud_job(DriftPolicy::Report, 2);
    rt.apply(&changed, Some(&r.last()), &r).await.unwrap();
    assert_eq!(cpus(&h), [1]);
    let c = condition(&r.last(), DRIFTED).cloned().unwrap();
    assert_eq!(c.status, "False", "{c:?}");
    assert!(rt.metrics().encode().contains("lyra_drifted_resources 0"));
}

#[tokio::test]
async fn ignore_does_nothing_and_correct_corrects() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let ignore = cloud_job(DriftPolicy::Ignore, 1);
    rt.apply(&ignore, None, &r).await.unwrap();
    resize(&h, 8);
    let writes = r.writes();
    refresh_due().await;
    rt.apply(&ignore, Some(&r.last()), &r).await.unwrap();
    assert_eq!(cpus(&h), [8], "Ignore leaves it");
    assert_eq!(r.writes(), writes, "and writes nothing");
    assert!(h.store.history("k8s/ns/c").await.unwrap().len() == 1, "no run");

    // Correct (the default): the refresh applies, which puts it back.
    let correct = cloud_job(DriftPolicy::Correct, 1);
    refresh_due().await;
    rt.apply(&correct, Some(&r.last()), &r).await.unwrap();
    assert_eq!(cpus(&h), [1]);
    assert!(condition(&r.last(), DRIFTED).is_none(), "Correct reports no condition");
}
