//! OCI image layouts: a package's blobs with `index.json` and `oci-layout`, as a directory
//! or a `.tar`; and reading a package out of its blobs, verifying each against its digest.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use crate::{
    ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, Error, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, Manifest, Package, digest_of,
};

/// The most a package's files may take once unpacked: far above any workflow set, and a
/// bound on what a hostile layer could make us allocate.
const MAX_UNPACKED: u64 = 64 << 20;
/// The most a manifest or config blob may take.
const MAX_SMALL_BLOB: u64 = 4 << 20;

/// A package's blobs in memory: its OCI manifest, config and layer, named by their digests.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The OCI manifest digest (`sha256:…`): the package's digest.
    pub digest: String,
    pub manifest_bytes: Vec<u8>,
    /// Every blob but the manifest (config and layer), by digest.
    pub blobs: BTreeMap<String, Vec<u8>>,
    /// The tag recorded in `index.json` (`org.opencontainers.image.ref.name`): the version.
    pub ref_name: String,
}

/// The parts of an OCI image manifest a package reader needs.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OciManifest {
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

#[derive(Debug, Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

impl Layout {
    pub(crate) fn new(manifest_bytes: Vec<u8>, config: Vec<u8>, layer: Vec<u8>, ref_name: &str) -> Layout {
        let mut blobs = BTreeMap::new();
        blobs.insert(digest_of(&config), config);
        blobs.insert(digest_of(&layer), layer);
        Layout {
            digest: digest_of(&manifest_bytes),
            manifest_bytes,
            blobs,
            ref_name: ref_name.to_owned(),
        }
    }

    /// Every file of the layout (`oci-layout`, `index.json`, `blobs/sha256/…`), sorted.
    fn entries(&self) -> Vec<(String, Vec<u8>)> {
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": MANIFEST_MEDIA_TYPE,
                "artifactType": ARTIFACT_TYPE,
                "digest": self.digest,
                "size": self.manifest_bytes.len(),
                "annotations": { "org.opencontainers.image.ref.name": self.ref_name },
            }],
        });
        let mut out = vec![
            ("oci-layout".to_owned(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
            (
                "index.json".to_owned(),
                serde_json::to_vec(&index).expect("an index serializes"),
            ),
        ];
        let blob_path = |d: &str| format!("blobs/{}", d.replacen(':', "/", 1));
        out.push((blob_path(&self.digest), self.manifest_bytes.clone()));
        for (d, bytes) in &self.blobs {
            out.push((blob_path(d), bytes.clone()));
        }
        out.sort();
        out
    }

    /// Writes the layout to `path`: a `.tar` if the path ends so, else a directory (created;
    /// an existing layout there gains the blobs and its `index.json` is replaced).
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        if path.extension().is_some_and(|e| e == "tar") {
            self.write_tar(path)
        } else {
            self.write_dir(path)
        }
    }

    pub fn write_dir(&self, dir: &Path) -> Result<(), Error> {
        for (rel, bytes) in self.entries() {
            let p = dir.join(&rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            }
            std::fs::write(&p, bytes).map_err(|e| Error::io(&p, e))?;
        }
        Ok(())
    }

    /// A `.tar` of the layout, byte for byte the same for the same package.
    pub fn write_tar(&self, path: &Path) -> Result<(), Error> {
        let mut tar = tar::Builder::new(Vec::new());
        tar.mode(tar::HeaderMode::Deterministic);
        let io = |e| Error::io(path, e);
        for (rel, bytes) in self.entries() {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            tar.append_data(&mut header, &rel, bytes.as_slice()).map_err(io)?;
        }
        let bytes = tar.into_inner().map_err(io)?;
        std::fs::write(path, bytes).map_err(io)
    }

    /// Reads a layout directory, verifying every blob.
    pub fn read_dir(dir: &Path) -> Result<Layout, Error> {
        let location = dir.display().to_string();
        let read = |rel: &str| {
            let p = dir.join(rel);
            // No blob of a package is larger than its unpacked files may be.
            if std::fs::metadata(&p).is_ok_and(|m| m.len() > MAX_UNPACKED) {
                return Err(Error::NotAPackage {
                    location: location.clone(),
                    why: format!("{rel} is larger than a package may be"),
                });
            }
            std::fs::read(&p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound if rel == "index.json" => Error::NotAPackage {
                    location: location.clone(),
                    why: "it has no index.json (an OCI image layout has one; build one with `lyra package`)".into(),
                },
                _ => Error::io(&p, e),
            })
        };
        Layout::read_with(&location, read)
    }

    /// Reads a `.tar` of a layout, verifying every blob.
    pub fn read_tar(path: &Path) -> Result<Layout, Error> {
        let location = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut entries = BTreeMap::new();
        let mut archive = tar::Archive::new(file);
        let not_tar = |e: std::io::Error| Error::NotAPackage {
            location: location.clone(),
            why: format!("it is not a tar of an OCI image layout: {e}"),
        };
        let mut total = 0u64;
        for entry in archive.entries().map_err(not_tar)? {
            let mut entry = entry.map_err(not_tar)?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let name = entry
                .path()
                .map_err(not_tar)?
                .to_string_lossy()
                .trim_start_matches("./")
                .to_owned();
            total += entry.size();
            if total > MAX_UNPACKED {
                return Err(not_tar(std::io::Error::other("it is larger than a package may be")));
            }
            let mut bytes = Vec::with_capacity(entry.size() as usize);
            entry.read_to_end(&mut bytes).map_err(not_tar)?;
            entries.insert(name, bytes);
        }
        Layout::read_with(&location, |rel| {
            entries.remove(rel).ok_or_else(|| Error::NotAPackage {
                location: location.clone(),
                why: format!("it has no {rel}"),
            })
        })
    }

    fn read_with(location: &str, mut read: impl FnMut(&str) -> Result<Vec<u8>, Error>) -> Result<Layout, Error> {
        let not = |why: String| Error::NotAPackage {
            location: location.to_owned(),
            why,
        };
        let index: Index = serde_json::from_slice(&read("index.json")?)
            .map_err(|e| not(format!("its index.json is not valid: {e}")))?;
        let [desc] = index.manifests.as_slice() else {
            return Err(not(format!(
                "its index.json lists {} manifests; a package has exactly one",
                index.manifests.len()
            )));
        };
        let mut blob = |d: &Descriptor| -> Result<Vec<u8>, Error> {
            let rel = blob_rel(d, location)?;
            let bytes = read(&rel)?;
            verify(&d.digest, &bytes, location)?;
            Ok(bytes)
        };
        let manifest_bytes = blob(desc)?;
        let m = parse_manifest(&manifest_bytes, location)?;
        let config = blob(&m.config)?;
        let layer = blob(&m.layers[0])?;
        let mut layout = Layout::new(manifest_bytes, config, layer, "");
        layout.ref_name = layout.package_of(location)?.manifest.version;
        Ok(layout)
    }

    /// The package these blobs hold, with workflow files shown as `name@sha256:…/a/b.yaml`.
    pub fn package(&self) -> Result<Package, Error> {
        self.package_of(&self.digest)
    }

    fn package_of(&self, location: &str) -> Result<Package, Error> {
        let not = |why: String| Error::NotAPackage {
            location: location.to_owned(),
            why,
        };
        let m = parse_manifest(&self.manifest_bytes, location)?;
        let get = |d: &Descriptor| {
            self.blobs
                .get(&d.digest)
                .ok_or_else(|| not(format!("blob {} is missing", d.digest)))
        };
        let manifest: Manifest = serde_json::from_slice(get(&m.config)?)
            .map_err(|e| not(format!("its config blob is not a Lyra package manifest: {e}")))?;
        let files =
            unpack(get(&m.layers[0])?).map_err(|e| not(format!("its layer is not a tar+gzip of workflows: {e}")))?;
        let short = &self.digest[..self.digest.len().min(19)];
        let mut out = BTreeMap::new();
        for entry in &manifest.files {
            if let Err(why) = lyra_core::program::check_workflow_name(&entry.workflow) {
                return Err(not(format!("its manifest lists workflow '{}': {why}", entry.workflow)));
            }
            let text = files
                .get(&entry.path)
                .ok_or_else(|| not(format!("its layer lacks {}, which its manifest lists", entry.path)))?;
            let text = String::from_utf8(text.clone()).map_err(|_| not(format!("{} is not UTF-8", entry.path)))?;
            out.insert(
                entry.workflow.clone(),
                (format!("{}@{short}/{}", manifest.name, entry.path), text),
            );
        }
        if !out.contains_key(&manifest.name) {
            return Err(not(format!(
                "its main workflow {} is not among its files",
                manifest.name
            )));
        }
        Ok(Package {
            digest: self.digest.clone(),
            manifest,
            files: out,
        })
    }
}

/// `blobs/sha256/<hex>` for a descriptor, refusing digests that are not sha256 hex (they
/// would name paths outside the layout).
pub(crate) fn blob_rel(d: &Descriptor, location: &str) -> Result<String, Error> {
    match d.digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(format!("blobs/sha256/{hex}")),
        _ => Err(Error::NotAPackage {
            location: location.to_owned(),
            why: format!("'{}' is not a sha256 digest", d.digest),
        }),
    }
}

/// Refuses `bytes` unless they hash to `digest`.
pub(crate) fn verify(digest: &str, bytes: &[u8], location: &str) -> Result<(), Error> {
    let actual = digest_of(bytes);
    if actual == digest {
        Ok(())
    } else {
        Err(Error::DigestMismatch {
            digest: digest.to_owned(),
            actual,
            location: location.to_owned(),
        })
    }
}

/// Parses an OCI manifest and checks that it is a Lyra package's.
pub(crate) fn parse_manifest(bytes: &[u8], location: &str) -> Result<OciManifest, Error> {
    let not = |why: String| Error::NotAPackage {
        location: location.to_owned(),
        why,
    };
    if bytes.len() as u64 > MAX_SMALL_BLOB {
        return Err(not("its manifest is too large".into()));
    }
    let m: OciManifest = serde_json::from_slice(bytes).map_err(|e| not(format!("its manifest is not valid: {e}")))?;
    if m.media_type.as_deref().is_some_and(|t| t != MANIFEST_MEDIA_TYPE) {
        return Err(not(format!(
            "its manifest has media type {}",
            m.media_type.unwrap_or_default()
        )));
    }
    if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE) || m.config.media_type != CONFIG_MEDIA_TYPE {
        return Err(not(format!(
            "its artifact type is {}, not {ARTIFACT_TYPE}",
            m.artifact_type.as_deref().unwrap_or(&m.config.media_type)
        )));
    }
    if m.config.size > MAX_SMALL_BLOB {
        return Err(not("its config blob is too large".into()));
    }
    match m.layers.as_slice() {
        [l] if l.media_type == LAYER_MEDIA_TYPE && l.size <= MAX_UNPACKED => Ok(m),
        _ => Err(not(format!("a package has one layer of type {LAYER_MEDIA_TYPE}"))),
    }
}

/// The regular files of a tar+gzip layer, by path.
fn unpack(layer: &[u8]) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let gz = flate2::read::GzDecoder::new(layer);
    let mut archive = tar::Archive::new(gz.take(MAX_UNPACKED));
    let mut out = BTreeMap::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path()?.to_string_lossy().trim_start_matches("./").to_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        out.insert(path, bytes);
    }
    Ok(out)
}
