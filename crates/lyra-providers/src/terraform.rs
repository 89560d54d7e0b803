//! Terraform providers (`lyra_terraform`) beside the built-in providers and the Lyra plugins:
//! each `terraform-provider-<name>` on the plugin path is started, and its resource types are
//! registered as `Tf<Name>::<Type>`.

use std::path::PathBuf;
use std::sync::Arc;

use lyra_core::provider::{Provider, Providers};
use lyra_terraform::TerraformProvider;

use crate::plugins::{START_TIMEOUT, clash};

/// Starts every Terraform provider on `path` (side by side) and registers its types. One that
/// cannot start, or whose namespace another provider serves, is left out with a warning naming
/// it (returned, for the caller to print). The processes live as long as `providers` holds
/// them.
pub async fn load_terraform_providers(providers: &mut Providers, path: &[PathBuf]) -> Vec<String> {
    let found = lyra_terraform::discover(path);
    let started = futures::future::join_all(
        found
            .iter()
            .map(|(name, exe)| async move { TerraformProvider::start(name, exe, START_TIMEOUT).await }),
    )
    .await;
    let mut warnings = Vec::new();
    for ((name, exe), result) in found.iter().zip(started) {
        let provider = match result {
            Ok(p) => p,
            Err(e) => {
                warnings.push(format!("terraform provider {name} is not used: {e}"));
                continue;
            }
        };
        if let Some(ns) = clash(providers, &provider.schemas()) {
            warnings.push(format!(
                "terraform provider {name} ({}) is not used: namespace {ns} is already served by another provider",
                exe.display()
            ));
            continue;
        }
        let provider: Arc<dyn Provider> = Arc::new(provider);
        providers.register(&provider);
    }
    warnings
}
