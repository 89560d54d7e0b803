//! Building a package from a validated program, reproducibly: the same workflow files,
//! version and annotations give the same bytes and so the same digest.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, SystemTime};

use lyra_core::diag::Sources;
use lyra_core::program::Program;
use serde_json::json;

use crate::manifest::{FileEntry, Manifest, path_of};
use crate::{ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, Error, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, digest_of};

pub use crate::layout::Layout;

/// What a package records beyond its workflows.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// SemVer; `0.0.0` when not given.
    pub version: Option<String>,
    /// `org.opencontainers.image.created`, RFC 3339. Unset: the time `SOURCE_DATE_EPOCH`
    /// says (see [`BuildOptions::from_env`]), else the Unix epoch, so that packaging the same
    /// inputs twice gives the same digest.
    pub created: Option<String>,
    /// `org.opencontainers.image.source`: where the workflows come from (a repository URL).
    pub source: Option<String>,
    /// `org.opencontainers.image.revision`: the source revision (a commit).
    pub revision: Option<String>,
}

/// The fixed `created` time of a package built without `SOURCE_DATE_EPOCH`.
pub const DEFAULT_CREATED: &str = "1970-01-01T00:00:00Z";

impl BuildOptions {
    /// Options with `created` from `SOURCE_DATE_EPOCH` (seconds since the epoch, the
    /// reproducible-builds convention), `source` from `LYRA_PACKAGE_SOURCE` and `revision`
    /// from `LYRA_PACKAGE_REVISION`, when set.
    pub fn from_env(version: Option<String>) -> Result<BuildOptions, Error> {
        let created = match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(s) => {
                let secs: u64 = s.trim().parse().map_err(|_| Error::Build {
                    name: "the package".into(),
                    why: format!("SOURCE_DATE_EPOCH='{s}' is not a number of seconds"),
                })?;
                let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
                Some(humantime::format_rfc3339_seconds(t).to_string())
            }
            Err(_) => None,
        };
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Ok(BuildOptions {
            version,
            created,
            source: var("LYRA_PACKAGE_SOURCE"),
            revision: var("LYRA_PACKAGE_REVISION"),
        })
    }
}

/// Builds the package of a validated `program` whose files `sources` holds: the manifest of
/// its interface, and every workflow it loaded, in one layer.
pub fn build(program: &Program, sources: &Sources, opts: &BuildOptions) -> Result<Layout, Error> {
    let name = program.main.name.clone();
    let version = opts.version.clone().unwrap_or_else(|| "0.0.0".to_owned());
    if let Err(e) = semver::Version::parse(&version) {
        return Err(Error::Build {
            name,
            why: format!("--version '{version}' is not a SemVer version (like 1.2.3): {e}"),
        });
    }
    let mut files: BTreeMap<String, (String, &str)> = BTreeMap::new();
    for wf in program.workflows.values().chain(std::iter::once(&program.main)) {
        let text = sources
            .get(wf.file)
            .map(|f| f.text.as_str())
            .ok_or_else(|| Error::Build {
                name: name.clone(),
                why: format!("the source of workflow {} is missing", wf.name),
            })?;
        files.insert(path_of(&wf.name), (wf.name.clone(), text));
    }
    let mut manifest = Manifest::of_program(program, &version);
    manifest.files = files
        .iter()
        .map(|(path, (workflow, _))| FileEntry {
            workflow: workflow.clone(),
            path: path.clone(),
        })
        .collect();

    let layer = layer_bytes(files.iter().map(|(p, (_, t))| (p.as_str(), t.as_bytes())))
        .map_err(|e| Error::io("the package layer", e))?;
    let config = serde_json::to_vec(&manifest).expect("a manifest serializes");
    let created = opts.created.clone().unwrap_or_else(|| DEFAULT_CREATED.to_owned());
    let mut annotations = BTreeMap::new();
    annotations.insert("org.opencontainers.image.created", created);
    annotations.insert("org.opencontainers.image.title", name.clone());
    annotations.insert("org.opencontainers.image.version", version.clone());
    if let Some(s) = &opts.source {
        annotations.insert("org.opencontainers.image.source", s.clone());
    }
    if let Some(r) = &opts.revision {
        annotations.insert("org.opencontainers.image.revision", r.clone());
    }
    let oci_manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": digest_of(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": LAYER_MEDIA_TYPE,
            "digest": digest_of(&layer),
            "size": layer.len(),
            "annotations": { "org.opencontainers.image.title": "workflows.tar.gz" },
        }],
        "annotations": annotations,
    });
    let manifest_bytes = serde_json::to_vec(&oci_manifest).expect("a manifest serializes");
    Ok(Layout::new(manifest_bytes, config, layer, &version))
}

/// The layer: a tar of `files` (sorted by path) with fixed times, owners and modes, gzipped
/// with a fixed header, so that its bytes depend on the files alone.
fn layer_bytes<'a>(files: impl Iterator<Item = (&'a str, &'a [u8])>) -> std::io::Result<Vec<u8>> {
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    for (path, data) in files {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        tar.append_data(&mut header, path, data)?;
    }
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    gz.finish()
}
