//! Lyra packages: a workflow and everything it calls, with a manifest of its interface, as an
//! OCI artifact. A package lives in an OCI image layout (a directory, or a `.tar` of one) or in
//! a registry; either way it is named by its manifest digest, which the same inputs always
//! reproduce (see [`build`]).
//!
//! Wire format: an OCI 1.1 image manifest with `artifactType` [`ARTIFACT_TYPE`], a config blob
//! ([`CONFIG_MEDIA_TYPE`]) holding the [`Manifest`] as JSON, and one tar+gzip layer
//! ([`LAYER_MEDIA_TYPE`]) holding the workflow files at `a/b.yaml` for workflow `a::b`.

use std::collections::BTreeMap;

mod build;
mod error;
mod layout;
mod manifest;
mod reference;
mod registry;

pub use build::{BuildOptions, Layout, build};
pub use error::Error;
pub use manifest::{FileEntry, Manifest, Parameter, ReturnValue};
pub use reference::{Reference, RegistryRef};
pub use registry::{RegistryOptions, fetch, pull, push, resolve, resolve_digest};

/// The OCI manifest's `artifactType`.
pub const ARTIFACT_TYPE: &str = "application/vnd.lyra.workflow.v1";
/// The media type of the config blob, which holds the [`Manifest`].
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.lyra.workflow.config.v1+json";
/// The media type of the one layer, a tar+gzip of the workflow files.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.lyra.workflow.layer.v1.tar+gzip";
/// The media type of the OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A package read and verified: its manifest digest, its interface and its workflow files.
#[derive(Debug, Clone)]
pub struct Package {
    /// `sha256:…`, the OCI manifest digest: what pins the package.
    pub digest: String,
    pub manifest: Manifest,
    /// Workflow name (`a::b`) → (display path, text).
    pub files: BTreeMap<String, (String, String)>,
}

impl Package {
    /// The package's workflows as a source for `lyra_core::program::load`: calls resolve
    /// within the package only.
    pub fn source(&self) -> PackageSource<'_> {
        PackageSource { package: self }
    }

    /// The main workflow's display path and text (empty if the package lacks it, which
    /// reading a package refuses, so only a hand-built `Package` can).
    pub fn main(&self) -> (String, String) {
        self.files.get(&self.manifest.name).cloned().unwrap_or_default()
    }

    /// `name@sha256:…`: how runs record the package they ran.
    pub fn pinned_name(&self) -> String {
        format!("{}@{}", self.manifest.name, self.digest)
    }
}

/// The workflows of a [`Package`], for `lyra_core::program::load`.
#[derive(Debug, Clone, Copy)]
pub struct PackageSource<'a> {
    package: &'a Package,
}

impl lyra_core::program::WorkflowSource for PackageSource<'_> {
    fn fetch(&mut self, name: &str) -> Option<(String, String)> {
        self.package.files.get(name).cloned()
    }

    fn names(&mut self) -> Option<Vec<String>> {
        Some(self.package.files.keys().cloned().collect())
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests;
