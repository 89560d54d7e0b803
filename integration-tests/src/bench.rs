//! What the benchmarks (`benches/`) share: counts from the environment, percentiles, and a
//! kube-rs client for an emulator.

use std::path::Path;
use std::time::Duration;

/// `$var` as a count, else `default`.
pub fn count(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `p` percentile (0 to 1) of `sorted`, which is not empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A kube-rs client for the cluster `kubeconfig` names (an emulator's).
pub async fn kube_client(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    kube::Client::try_from(config).expect("client")
}
