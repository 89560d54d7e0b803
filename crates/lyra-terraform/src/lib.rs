//! Terraform providers as Lyra providers.
//!
//! Lyra is a client of Terraform's provider plugin protocol: it starts a provider binary as
//! Terraform does (HashiCorp's go-plugin handshake, gRPC over the Unix socket the provider
//! announces, automatic mutual TLS), reads its schema and drives its resources through the
//! provider's own planning (`PlanResourceChange`, `ApplyResourceChange`, `ReadResource`,
//! `UpgradeResourceState`, `ImportResourceState`), protocol 5 or 6.
//!
//! - Names: the `null` provider's `null_resource` is `TfNull::Resource`: `Tf`, the provider's
//!   name in CamelCase, `::`, the resource type without the provider's prefix in CamelCase.
//!   Its configuration block is the namespace's settings (`providers: {TfNull: {...}}`).
//! - Values: each attribute keeps its name; cty types map to Lyra's ([`cty::Ty::to_lyra`]);
//!   required, optional+computed (`provided`), computed and sensitive carry over; nested blocks
//!   are attributes holding a hash (single) or an array of hashes (list, set).
//! - State: the record's actual state is the provider's state object, plus, under
//!   [`STATE_KEY`], what Lyra must hand back (the provider's private bytes and the schema
//!   version the state was written with).
//! - Discovery: executables named as Terraform names them (`terraform-provider-<name>`,
//!   usually `_v<version>` after it), directly in a plugin directory or in Terraform's mirror
//!   layout beneath it (`<host>/<namespace>/<name>/<version>/<os>_<arch>/`).

pub mod cty;
mod launch;
mod provider;
mod schema;
mod tls;

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

pub use launch::{MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE};
pub use provider::TerraformProvider;
pub use schema::{lyra_namespace, lyra_type_name};

/// The generated messages of Terraform's plugin protocol (shared by both versions) and the
/// version 5 and 6 services.
#[allow(clippy::all, clippy::pedantic, unused_qualifications, rust_2018_idioms, missing_docs)]
pub mod proto {
    pub mod tfplugin {
        tonic::include_proto!("tfplugin");
    }
    pub mod tfplugin5 {
        tonic::include_proto!("tfplugin5");
    }
    pub mod tfplugin6 {
        tonic::include_proto!("tfplugin6");
    }
}

/// The key of a resource's actual state under which the bridge keeps the provider's private
/// state (base64) and the state's schema version: `{"private": "...", "schema_version": 0}`.
pub const STATE_KEY: &str = "lyra:terraform";

/// The prefix of Terraform provider executables.
pub const EXECUTABLE_PREFIX: &str = "terraform-provider-";

/// Why a Terraform provider could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum TerraformError {
    #[error("terraform provider {}: cannot start it: {source}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("terraform provider {}: no handshake within {}{}", path.display(), humantime::format_duration(*timeout), tail(stderr))]
    HandshakeTimeout {
        path: PathBuf,
        timeout: Duration,
        stderr: Vec<String>,
    },
    #[error("terraform provider {}: exited before its handshake{}{}", path.display(), status.map(|s| format!(" ({s})")).unwrap_or_default(), tail(stderr))]
    Exited {
        path: PathBuf,
        status: Option<ExitStatus>,
        stderr: Vec<String>,
    },
    #[error("terraform provider {}: {message}", path.display())]
    Handshake { path: PathBuf, message: String },
    #[error("terraform provider {}: TLS: {message}", path.display())]
    Tls { path: PathBuf, message: String },
    #[error("terraform provider {}: cannot connect: {message}", path.display())]
    Connect { path: PathBuf, message: String },
    #[error("terraform provider {}: cannot get its schema: {message}", path.display())]
    Schema { path: PathBuf, message: String },
}

fn tail(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its last stderr lines:\n{}", lines.join("\n"))
    }
}

/// The provider name in a Terraform provider executable's file name:
/// `terraform-provider-null_v2.1.2_x4` is `null`.
pub fn provider_name(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix(EXECUTABLE_PREFIX)?;
    let name = rest.split_once("_v").map_or(rest, |(n, _)| n);
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    ok.then_some(name)
}

/// How deep beneath a plugin directory Terraform's mirror layout puts executables.
const MIRROR_DEPTH: usize = 5;

/// The Terraform providers in `dirs`, as `(name, path)` sorted by name: executables named
/// `terraform-provider-<name>[_v<version>...]`, in a directory or in Terraform's mirror layout
/// beneath it. A name found in several directories is taken from the first that has it; within
/// one directory, from the highest version.
pub fn discover(dirs: &[PathBuf]) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for dir in dirs {
        let mut here: Vec<(String, Vec<u64>, PathBuf)> = Vec::new();
        walk(dir, MIRROR_DEPTH, &mut here);
        // Highest version first, then the first path.
        here.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        for (name, _, path) in here {
            if !found.iter().any(|(n, _)| *n == name) {
                found.push((name, path));
            }
        }
    }
    found.sort();
    found
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<(String, Vec<u64>, PathBuf)>) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        // Follows symbolic links.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if depth > 0 {
                walk(&path, depth - 1, out);
            }
            continue;
        }
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if let Some(name) = provider_name(file_name)
            && meta.permissions().mode() & 0o111 != 0
        {
            out.push((name.to_owned(), version_of(file_name), path));
        }
    }
}

/// The numeric version parts of `terraform-provider-x_v2.1.2_x4` (`[2, 1, 2]`).
fn version_of(file_name: &str) -> Vec<u64> {
    file_name
        .split_once("_v")
        .map(|(_, v)| v.split('_').next().unwrap_or(""))
        .unwrap_or("")
        .split(['.', '-'])
        .map_while(|p| p.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_come_from_terraform_file_names() {
        assert_eq!(provider_name("terraform-provider-null_v2.1.2_x4"), Some("null"));
        assert_eq!(
            provider_name("terraform-provider-google-beta_v5.0.0"),
            Some("google-beta")
        );
        assert_eq!(provider_name("terraform-provider-lyratest"), Some("lyratest"));
        assert_eq!(provider_name("terraform-provider-"), None);
        assert_eq!(provider_name("lyra-provider-x"), None);
        assert_eq!(provider_name("terraform-provider-a b"), None);
    }

    #[test]
    fn discovery_finds_flat_and_mirrored_executables_and_the_highest_version() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let put = |rel: &str, mode: u32| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        put("terraform-provider-null_v2.1.2_x4", 0o755);
        put("terraform-provider-null_v2.10.0_x4", 0o755);
        put(
            "registry.terraform.io/hashicorp/random/3.6.0/linux_amd64/terraform-provider-random_v3.6.0_x5",
            0o755,
        );
        put("terraform-provider-notexec_v1.0.0", 0o644);
        put("README", 0o755);
        let found = discover(&[dir.path().to_path_buf()]);
        let names: Vec<_> = found
            .iter()
            .map(|(n, p)| (n.as_str(), p.file_name().unwrap().to_str().unwrap().to_owned()))
            .collect();
        assert_eq!(
            names,
            [
                ("null", "terraform-provider-null_v2.10.0_x4".to_owned()),
                ("random", "terraform-provider-random_v3.6.0_x5".to_owned())
            ]
        );
    }
}
