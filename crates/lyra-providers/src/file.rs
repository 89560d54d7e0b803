//! `File::File`: a file on the local disk, shaped after Terraform's `local_file`.
//!
//! The file's content is exactly one of `content`, `sensitive_content` (a secret: never
//! printed), `source` (the path of a file whose bytes are copied) or `template` (text whose
//! `${name}` placeholders are replaced by the values of `vars`; `$$` is a `$`): workflow
//! strings are never interpolated, so a config file built from values is a template. When a
//! value in `vars` is secret, the engine keeps `vars` secret; the template itself is not. Writes are atomic: the
//! bytes go to a temporary file in the same directory, which is synced and renamed over the
//! target, so a reader sees the old file or the new one, never half of one. Missing parent
//! directories are made with `directory_mode`.
//!
//! `read` reports the file as it is: gone is `None` (the engine makes it again), and content
//! changed out of band comes back under the attribute the workflow uses (`content` or
//! `sensitive_content`), so the engine sees a difference and rewrites it. For `source`, whose
//! value is a path rather than the bytes, `read` returns `source: null` when the file no longer
//! holds the source's current bytes, which the engine sees as a difference too. `mode` is read
//! from the file and changed in place (chmod); `directory_mode` matters only when directories
//! are made, and reads back as recorded.
//!
//! The natural key is the path (also the external id, as the workflow gives it), so `lookup`
//! adopts a file left by a create whose result was never recorded.
//!
//! [`ProvidersConfig::files_root`](crate::ProvidersConfig::files_root) confines paths to a
//! directory: absolute paths, `..` and symbolic links that lead out of it are refused. The
//! check is made on every operation; it does not defend against a concurrent process that
//! swaps a directory for a link between the check and the write.
//!
//! Files are small configuration files: the I/O is done in line, without a blocking pool.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use crate::{invalid, opt_str};
use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};
use sha2::{Digest as _, Sha256};

/// The canonical type name.
pub const FILE: &str = "File::File";

const PATH: &str = "path";
const CONTENT: &str = "content";
const SENSITIVE_CONTENT: &str = "sensitive_content";
const SOURCE: &str = "source";
const TEMPLATE: &str = "template";
const VARS: &str = "vars";
const MODE: &str = "mode";
const DIRECTORY_MODE: &str = "directory_mode";
const SHA256: &str = "sha256";

const DEFAULT_MODE: &str = "0644";
const DEFAULT_DIRECTORY_MODE: &str = "0755";

/// The provider of `File::File`.
#[derive(Debug, Clone, Default)]
pub struct FileProvider {
    root: Option<PathBuf>,
}

impl FileProvider {
    /// Files anywhere (`root` `None`) or only inside `root`.
    pub fn new(root: Option<PathBuf>) -> Self {
        FileProvider { root }
    }
}

fn io_error(what: &str, path: &Path, e: &std::io::Error) -> ProviderError {
    ProviderError::Other(format!("{what} {}: {e}", path.display()))
}

/// A mode such as `0644`: octal digits, at most `07777`.
fn parse_mode(m: &Map, attribute: &str, default: &str) -> Result<u32, ProviderError> {
    let s = opt_str(m, attribute)?.unwrap_or(default);
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|mode| *mode <= 0o7777)
        .ok_or_else(|| invalid(attribute, format!("'{s}' is not an octal file mode such as 0644")))
}

/// How the desired state resolved: what goes in the file.
struct Plan {
    content: Vec<u8>,
    mode: u32,
    directory_mode: u32,
}

/// `template` with each `${name}` replaced by `vars[name]` (strings as they are, other values
/// as JSON) and `$$` by `$`. A placeholder with no value is an error naming it (never a value).
fn render(template: &str, vars: &Map) -> Result<String, ProviderError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('{') {
            let Some(end) = inner.find('}') else {
                return Err(invalid(TEMPLATE, "a '${' is not closed by '}'"));
            };
            let name = inner[..end].trim();
            match vars.get(name) {
                Some(Value::String(v)) => out.push_str(v),
                Some(v) => out.push_str(&v.to_string()),
                None => {
                    return Err(invalid(
                        TEMPLATE,
                        format!("'${{{name}}}' has no value in vars (write $$ for a literal $)"),
                    ));
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl FileProvider {
    /// Where `path` (the value of attribute `attribute`) leads, checked against the root.
    /// With `create_dirs`, missing parent directories are made (with `directory_mode`).
    fn resolve(&self, attribute: &str, path: &str, create_dirs: Option<u32>) -> Result<PathBuf, ProviderError> {
        if path.is_empty() {
            return Err(invalid(attribute, "is empty"));
        }
        let given = Path::new(path);
        let Some(root) = &self.root else {
            if let Some(mode) = create_dirs
                && let Some(parent) = given.parent().filter(|p| !p.as_os_str().is_empty())
                && !parent.is_dir()
            {
                make_dirs(parent, mode)?;
            }
            return Ok(given.to_owned());
        };
        let mut relative = PathBuf::new();
        for component in given.components() {
            match component {
                Component::Normal(c) => relative.push(c),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(invalid(
                        attribute,
                        format!("'{path}' has a '..' component: files stay inside the files root"),
                    ));
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(invalid(
                        attribute,
                        format!("'{path}' is absolute: paths are relative to the files root here"),
                    ));
                }
            }
        }
        let Some(name) = relative.file_name().map(ToOwned::to_owned) else {
            return Err(invalid(attribute, format!("'{path}' names no file")));
        };
        let canonical_root = root
            .canonicalize()
            .map_err(|e| ProviderError::Config(format!("the files root {}: {e}", root.display())))?;
        let outside = || {
            invalid(
                attribute,
                format!("'{path}' leads out of the files root through a symbolic link"),
            )
        };
        // Walk down one directory at a time, so that no directory is made through a link that
        // leads out (create_dir_all would follow it).
        let mut dir = canonical_root.clone();
        if let Some(parent) = relative.parent() {
            for c in parent.components() {
                let next = dir.join(c);
                match fs::symlink_metadata(&next) {
                    Ok(_) => {
                        let real = next.canonicalize().map_err(|e| io_error("resolve", &next, &e))?;
                        if !real.starts_with(&canonical_root) {
                            return Err(outside());
                        }
                        dir = real;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => match create_dirs {
                        Some(mode) => {
                            make_dirs(&next, mode)?;
                            dir = next;
                        }
                        // Nothing is there, so neither is the file.
                        None => return Ok(canonical_root.join(&relative)),
                    },
                    Err(e) => return Err(io_error("inspect", &next, &e)),
                }
            }
        }
        let target = dir.join(&name);
        // A link in the file's place: reading follows it, so it must stay inside too (a write
        // replaces the link itself, by rename).
        if fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
            match target.canonicalize() {
                Ok(real) if !real.starts_with(&canonical_root) => return Err(outside()),
                _ => {}
            }
        }
        Ok(target)
    }

    fn plan(&self, desired: &Map) -> Result<Plan, ProviderError> {
        let path = opt_str(desired, PATH)?.ok_or_else(|| invalid(PATH, "is required"))?;
        let mode = parse_mode(desired, MODE, DEFAULT_MODE)?;
        let directory_mode = parse_mode(desired, DIRECTORY_MODE, DEFAULT_DIRECTORY_MODE)?;
        let content = opt_str(desired, CONTENT)?;
        // Only whether it is a string is said of the secret, never any of it.
        let secret = match desired.get(SENSITIVE_CONTENT) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(other) => {
                return Err(invalid(
                    SENSITIVE_CONTENT,
                    format!("expects a string, got {}", kind_of(other)),
                ));
            }
        };
        let source = opt_str(desired, SOURCE)?;
        let template = opt_str(desired, TEMPLATE)?;
        let content = match (content, secret, source, template) {
            (Some(c), None, None, None) | (None, Some(c), None, None) => c.as_bytes().to_vec(),
            (None, None, Some(s), None) => {
                let from = self.resolve(SOURCE, s, None)?;
                fs::read(&from).map_err(|e| io_error("read the source", &from, &e))?
            }
            (None, None, None, Some(t)) => render(t, &vars_of(desired)?)?.into_bytes(),
            _ => {
                return Err(invalid(
                    CONTENT,
                    "set exactly one of content, sensitive_content, source and template",
                ));
            }
        };
        // Checked now, so that a bad path fails before anything is made.
        self.resolve(PATH, path, None)?;
        Ok(Plan {
            content,
            mode,
            directory_mode,
        })
    }

    /// Writes the file of `plan` unless it already holds the bytes, sets its mode, and
    /// returns the actual state.
    fn write(&self, desired: &Map, plan: &Plan) -> Result<Map, ProviderError> {
        let path = opt_str(desired, PATH)?.unwrap_or_default();
        // Resolved again now, making the directories: the first resolution made none, so that
        // a bad content attribute fails before anything is made.
        let target = self.resolve(PATH, path, Some(plan.directory_mode))?;
        let bytes = plan.content.as_slice();
        let same = fs::read(&target).is_ok_and(|b| b == bytes);
        if same {
            fs::set_permissions(&target, fs::Permissions::from_mode(plan.mode))
                .map_err(|e| io_error("chmod", &target, &e))?;
        } else {
            write_atomically(&target, bytes, plan.mode)?;
        }
        let mut actual = desired.clone();
        actual.insert(
            MODE.to_owned(),
            Value::String(mode_spelling(desired, MODE, DEFAULT_MODE, plan.mode)),
        );
        actual.insert(
            DIRECTORY_MODE.to_owned(),
            Value::String(mode_spelling(
                desired,
                DIRECTORY_MODE,
                DEFAULT_DIRECTORY_MODE,
                plan.directory_mode,
            )),
        );
        actual.insert(SHA256.to_owned(), Value::String(sha256_hex(bytes)));
        Ok(actual)
    }

    /// The file at `path` as it is, in the shape of `shape` (the prior or desired state:
    /// which content attribute is used). `None` when there is no file.
    fn observe(&self, path: &str, shape: &Map) -> Result<Option<Map>, ProviderError> {
        let target = self.resolve(PATH, path, None)?;
        let bytes = match fs::read(&target) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("read", &target, &e)),
        };
        let meta = fs::metadata(&target).map_err(|e| io_error("inspect", &target, &e))?;
        let mode = meta.permissions().mode() & 0o7777;
        let mut actual = Map::new();
        actual.insert(PATH.to_owned(), Value::String(path.to_owned()));
        let text = || Value::String(String::from_utf8_lossy(&bytes).into_owned());
        if let Some(source) = opt_str(shape, SOURCE).ok().flatten() {
            // Still a copy of the source as it is now? Otherwise say it is not one.
            let now = self
                .resolve(SOURCE, source, None)
                .ok()
                .and_then(|from| fs::read(from).ok());
            let value = if now.as_deref() == Some(bytes.as_slice()) {
                Value::String(source.to_owned())
            } else {
                Value::Null
            };
            actual.insert(SOURCE.to_owned(), value);
        } else if let Some(template) = opt_str(shape, TEMPLATE).ok().flatten() {
            // Still the template rendered with its vars? Otherwise it holds something else, and
            // a null template says so (the file's text may hold secrets from vars).
            let vars = vars_of(shape).unwrap_or_default();
            let same = render(template, &vars).is_ok_and(|r| r.as_bytes() == bytes.as_slice());
            if same {
                actual.insert(TEMPLATE.to_owned(), Value::String(template.to_owned()));
                actual.insert(VARS.to_owned(), Value::Object(vars));
            } else {
                actual.insert(TEMPLATE.to_owned(), Value::Null);
                actual.insert(VARS.to_owned(), Value::Object(vars));
            }
        } else if shape.get(SENSITIVE_CONTENT).is_some_and(|v| !v.is_null()) {
            actual.insert(SENSITIVE_CONTENT.to_owned(), text());
        } else {
            actual.insert(CONTENT.to_owned(), text());
        }
        let spelled = parse_mode(shape, MODE, DEFAULT_MODE)
            .ok()
            .filter(|m| *m == mode)
            .and_then(|_| opt_str(shape, MODE).ok().flatten().map(str::to_owned))
            .unwrap_or_else(|| format!("{mode:04o}"));
        actual.insert(MODE.to_owned(), Value::String(spelled));
        let dir_mode = opt_str(shape, DIRECTORY_MODE)
            .ok()
            .flatten()
            .unwrap_or(DEFAULT_DIRECTORY_MODE);
        actual.insert(DIRECTORY_MODE.to_owned(), Value::String(dir_mode.to_owned()));
        actual.insert(SHA256.to_owned(), Value::String(sha256_hex(&bytes)));
        Ok(Some(actual))
    }
}

/// `vars`, an empty map when unset.
fn vars_of(m: &Map) -> Result<Map, ProviderError> {
    match m.get(VARS) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(v)) => Ok(v.clone()),
        Some(other) => Err(invalid(VARS, format!("expects a hash, got {}", kind_of(other)))),
    }
}

/// The workflow's own spelling of a mode (`644` stays `644`) when it has one.
fn mode_spelling(desired: &Map, attribute: &str, default: &str, mode: u32) -> String {
    opt_str(desired, attribute).ok().flatten().map_or_else(
        || {
            if mode == 0o644 || mode == 0o755 {
                default.to_owned()
            } else {
                format!("{mode:04o}")
            }
        },
        str::to_owned,
    )
}

/// Makes `dir` and its missing parents, each with `mode` (set explicitly: the umask would
/// otherwise narrow it).
fn make_dirs(dir: &Path, mode: u32) -> Result<(), ProviderError> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        missing.push(d.to_owned());
        at = d.parent();
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => fs::set_permissions(d, fs::Permissions::from_mode(mode)).map_err(|e| io_error("chmod", d, &e))?,
            // Made by someone else meanwhile: fine.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_error("create the directory", d, &e)),
        }
    }
    Ok(())
}

/// A temporary file next to `target`, synced, renamed over it, and the directory synced, so
/// the new file is whole and durable.
fn write_atomically(target: &Path, bytes: &[u8], mode: u32) -> Result<(), ProviderError> {
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".lyra-")
        .tempfile_in(&dir)
        .map_err(|e| io_error("create a temporary file in", &dir, &e))?;
    tmp.write_all(bytes).map_err(|e| io_error("write", tmp.path(), &e))?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| io_error("chmod", tmp.path(), &e))?;
    tmp.as_file().sync_all().map_err(|e| io_error("sync", tmp.path(), &e))?;
    tmp.persist(target)
        .map_err(|e| io_error("rename over", target, &e.error))?;
    if let Ok(d) = fs::File::open(&dir) {
        // Best effort: some file systems cannot sync a directory; the file itself is synced.
        let _ = d.sync_all();
    }
    Ok(())
}

#[async_trait]
impl Provider for FileProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![
            ResourceSchema::new(
                FILE,
                vec![
                    AttributeSchema::new(PATH, Type::String)
                        .required()
                        .immutable()
                        .doc("Where the file is; relative paths resolve against the working directory (or, in the controller, inside its files root). The external id."),
                    AttributeSchema::new(CONTENT, Type::optional(Type::String))
                        .doc("The file's content. Exactly one of content, sensitive_content, source and template."),
                    AttributeSchema::new(SENSITIVE_CONTENT, Type::optional(Type::Sensitive(Box::new(Type::String))))
                        .sensitive()
                        .doc("The file's content, a secret: never printed."),
                    AttributeSchema::new(SOURCE, Type::optional(Type::String))
                        .doc("The path of a file whose bytes are copied; reads back null when the file no longer holds them."),
                    AttributeSchema::new(TEMPLATE, Type::optional(Type::String))
                        .doc("Text whose ${name} placeholders are replaced by the values of vars ($$ is a $); reads back null when the file holds something else."),
                    AttributeSchema::new(VARS, Type::optional(Type::Hash(Box::new(Type::String), Box::new(Type::Any))))
                        .doc("The values of the template's placeholders: strings as they are, other values as JSON."),
                    AttributeSchema::new(MODE, Type::optional(Type::String))
                        .provided()
                        .doc("The file's permissions, in octal (default 0644); changed in place."),
                    AttributeSchema::new(DIRECTORY_MODE, Type::optional(Type::String))
                        .provided()
                        .doc("The permissions of parent directories made for the file (default 0755)."),
                    AttributeSchema::new(SHA256, Type::String)
                        .computed()
                        .doc("The SHA-256 digest of the content, in hex."),
                ],
            )
            .doc("A file on the local disk, written atomically (like Terraform's local_file)."),
        ]
    }

    async fn create(&self, _cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let plan = self.plan(desired)?;
        let actual = self.write(desired, &plan)?;
        Ok(Created {
            external_id: opt_str(desired, PATH)?.unwrap_or_default().to_owned(),
            actual,
        })
    }

    async fn read(
        &self,
        _cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        self.observe(external_id, prior.unwrap_or(&Map::new()))
    }

    async fn update(
        &self,
        _cx: &OpContext<'_>,
        _external_id: &str,
        desired: &Map,
        _prior: &Map,
    ) -> Result<Map, ProviderError> {
        let plan = self.plan(desired)?;
        self.write(desired, &plan)
    }

    async fn delete(&self, _cx: &OpContext<'_>, external_id: &str, _prior: &Map) -> Result<(), ProviderError> {
        let target = self.resolve(PATH, external_id, None)?;
        match fs::remove_file(&target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("remove", &target, &e)),
        }
    }

    /// By the path: a file there is adopted as it is (the engine then rewrites it if its
    /// content or mode differ), no file is `Absent`.
    async fn lookup(&self, _cx: &OpContext<'_>, desired: &Map) -> Result<Lookup, ProviderError> {
        let path = opt_str(desired, PATH)?.ok_or_else(|| invalid(PATH, "is required"))?;
        Ok(match self.observe(path, desired)? {
            Some(actual) => Lookup::Found(Created {
                external_id: path.to_owned(),
                actual,
            }),
            None => Lookup::Absent,
        })
    }
}

#[cfg(test)]
mod tests;
