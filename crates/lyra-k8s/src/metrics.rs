//! Prometheus metrics of the controller, served on `/metrics`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::crd::Phase;
use crate::reason::Reason;

type Labels = Vec<(String, String)>;

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    duration: Histogram,
    steps: Family<Labels, Counter>,
    phases: Family<Labels, Gauge>,
    /// Each object's phase, so the by-phase gauge can move objects between phases.
    known: Mutex<HashMap<String, Phase>>,
    drifted: Gauge,
    /// Each object's drifted resources (its last drift check), summed in `drifted`.
    drifts: Mutex<HashMap<String, i64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("lyra");
        let reconciles = Family::<Labels, Counter>::default();
        let failures = Family::<Labels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        let steps = Family::<Labels, Counter>::default();
        let phases = Family::<Labels, Gauge>::default();
        registry.register("reconciles", "Reconciles run, by kind and result", reconciles.clone());
        registry.register(
            "reconcile_failures",
            "Reconciles that failed, by reason",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles took",
            duration.clone(),
        );
        registry.register(
            "steps_applied",
            "Resource operations done by the controller's runs, by action",
            steps.clone(),
        );
        registry.register("workflows", "Workflow objects by phase", phases.clone());
        let drifted = Gauge::default();
        registry.register(
            "drifted_resources",
            "Resources found changed outside Lyra (or gone) by the last drift check of each object (driftPolicy Report)",
            drifted.clone(),
        );
        for p in Phase::ALL {
            phases.get_or_create(&phase_label(p)).set(0);
        }
        Metrics {
            registry,
            reconciles,
            failures,
            duration,
            steps,
            phases,
            known: Mutex::new(HashMap::new()),
            drifted,
            drifts: Mutex::new(HashMap::new()),
        }
    }

    pub fn reconciled(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn failed(&self, reason: Reason) {
        self.failures
            .get_or_create(&vec![("reason".to_owned(), reason.as_str().to_owned())])
            .inc();
    }

    pub fn steps(&self, action: &str, n: u64) {
        if n > 0 {
            self.steps
                .get_or_create(&vec![("action".to_owned(), action.to_owned())])
                .inc_by(n);
        }
    }

    /// Records how many of `key`'s resources its last drift check found drifted (0 once an
    /// apply corrected them).
    pub fn drift(&self, key: &str, n: usize) {
        let mut drifts = self.drifts.lock().expect("metrics lock");
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let old = if n == 0 {
            drifts.remove(key)
        } else {
            drifts.insert(key.to_owned(), n)
        };
        self.drifted.inc_by(n - old.unwrap_or(0));
    }

    /// Records `key`'s phase; `None` when the object is gone.
    pub fn phase(&self, key: &str, phase: Option<Phase>) {
        if phase.is_none() {
            self.drift(key, 0);
        }
        let mut known = self.known.lock().expect("metrics lock");
        let old = match phase {
            Some(p) => known.insert(key.to_owned(), p),
            None => known.remove(key),
        };
        if old == phase {
            return;
        }
        if let Some(o) = old {
            self.phases.get_or_create(&phase_label(o)).dec();
        }
        if let Some(p) = phase {
            self.phases.get_or_create(&phase_label(p)).inc();
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

fn phase_label(p: Phase) -> Labels {
    vec![("phase".to_owned(), p.as_str().to_owned())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_move_between_gauges() {
        let m = Metrics::new();
        m.phase("a", Some(Phase::Applying));
        m.phase("b", Some(Phase::Applying));
        m.phase("a", Some(Phase::Ready));
        m.phase("b", None);
        m.reconciled("ok", Duration::from_millis(20));
        m.steps("create", 3);
        let text = m.encode();
        assert!(text.contains(r#"lyra_workflows{phase="Ready"} 1"#), "{text}");
        assert!(text.contains(r#"lyra_workflows{phase="Applying"} 0"#), "{text}");
        assert!(text.contains(r#"lyra_reconciles_total{result="ok"} 1"#), "{text}");
        assert!(
            text.contains(r#"lyra_steps_applied_total{action="create"} 3"#),
            "{text}"
        );
        assert!(text.contains("lyra_reconcile_duration_seconds_count 1"), "{text}");
    }

    #[test]
    fn drifted_resources_sum_the_objects_last_checks() {
        let m = Metrics::new();
        m.drift("a", 2);
        m.drift("b", 3);
        m.drift("a", 1);
        assert!(m.encode().contains("lyra_drifted_resources 4"), "{}", m.encode());
        m.drift("b", 0);
        m.phase("a", None);
        assert!(m.encode().contains("lyra_drifted_resources 0"), "{}", m.encode());
    }
}
