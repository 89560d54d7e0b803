//! Provider plugins (`lyra-provider-<name>` executables, `lyra_plugin`) beside the built-in
//! providers: each found on the plugin path is started and its types registered.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lyra_core::provider::{Provider, Providers};
use lyra_core::schema::{ResourceSchema, namespace_of};
use lyra_plugin::{PluginProvider, discover};

/// How long a plugin has to start and say what it serves.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The plugin path: `dirs` (flags, `LYRA_PLUGIN_PATH`), then the `plugins` directory beside
/// the load path `workflows` (`./plugins` for `./workflows`), when there is one.
pub fn plugin_path(dirs: &[PathBuf], workflows: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = dirs.to_vec();
    let beside = workflows
        .unwrap_or_else(|| Path::new("workflows"))
        .parent()
        .map_or_else(|| PathBuf::from("plugins"), |p| p.join("plugins"));
    if !out.contains(&beside) {
        out.push(beside);
    }
    out
}

/// Starts every plugin on `path` (side by side) and registers its types. A plugin that
/// cannot start, or that serves a namespace another provider serves, is left out with a
/// warning naming it (returned, for the caller to print): it fails only the steps that would
/// use it, as unknown types. The processes live as long as `providers` holds them.
pub async fn load_plugins(providers: &mut Providers, path: &[PathBuf]) -> Vec<String> {
    let found = discover(path);
    let started = futures::future::join_all(
        found
            .iter()
            .map(|(_, exe)| async move { PluginProvider::start(exe, START_TIMEOUT).await }),
    )
    .await;
    let mut warnings = Vec::new();
    for ((name, exe), result) in found.iter().zip(started) {
        let plugin = match result {
            Ok(p) => p,
            Err(e) => {
                warnings.push(format!("plugin {name} ({}) is not used: {e}", exe.display()));
                continue;
            }
        };
        if let Some(ns) = clash(providers, &plugin.schemas()) {
            warnings.push(format!(
                "plugin {name} ({}) is not used: namespace {ns} is already served by another provider",
                exe.display()
            ));
            continue;
        }
        let plugin: Arc<dyn Provider> = Arc::new(plugin);
        providers.register(&plugin);
    }
    warnings
}

/// The namespace of `schemas` that a provider in `providers` already serves, if any.
pub(crate) fn clash(providers: &Providers, schemas: &[ResourceSchema]) -> Option<String> {
    schemas.iter().map(|s| namespace_of(&s.name).to_owned()).find(|ns| {
        providers
            .schemas()
            .names()
            .iter()
            .any(|t| namespace_of(t).eq_ignore_ascii_case(ns))
    })
}
