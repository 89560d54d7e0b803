//! An example provider plugin: `Example::Thing`, kept in a JSON file, and `Example::Null`.
//!
//! `Example::Null` is the built-in `Null::Resource` served from a plugin (`output` echoes
//! `input`, nothing is stored but the engine's record): the overhead benchmark's yardstick for
//! what the plugin protocol itself costs per step. It needs no settings.
//!
//! Configuration: `Example: {file: <path>}`, the JSON file holding the records (an object
//! from id to record). A thing's `name` is its natural key, so `lookup` finds a thing made by
//! a create whose result was lost. A change of `value` between a JSON object and anything
//! else forces a replace (to exercise `replace_reasons`). `delay` (milliseconds) makes each
//! create wait that long first: a slow operation, to exercise cancellation.
//!
//! Misbehaviour on demand, for the tests of how the host copes (environment variables, read
//! at start-up):
//!
//! - `LYRA_EXAMPLE_CRASH_ON=<name>`: the create of the thing named so aborts the process (a
//!   crash, without a core dump). With `LYRA_EXAMPLE_CRASH_MARKER=<file>`, only when that
//!   file does not exist yet; it is created first, so the plugin crashes once.
//! - `LYRA_EXAMPLE_HANG_ON=<name>`: the create of the thing named so never returns.
//! - `LYRA_EXAMPLE_NAMESPACE=<ns>`: serve `<ns>::Thing`, with settings `<ns>`, instead of
//!   `Example` (another schema from the same executable).
#![allow(clippy::print_stderr)]

use std::path::PathBuf;

use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::Type;
use lyra_core::value::{Map, Value};
use tokio::sync::Mutex;

struct Example {
    /// Serialises access to the file.
    lock: Mutex<()>,
    /// `Example`, or `LYRA_EXAMPLE_NAMESPACE`.
    namespace: String,
    crash_on: Option<String>,
    crash_marker: Option<PathBuf>,
    hang_on: Option<String>,
}

impl Example {
    fn from_env() -> Example {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Example {
            lock: Mutex::new(()),
            namespace: var("LYRA_EXAMPLE_NAMESPACE").unwrap_or_else(|| "Example".to_owned()),
            crash_on: var("LYRA_EXAMPLE_CRASH_ON"),
            crash_marker: var("LYRA_EXAMPLE_CRASH_MARKER").map(PathBuf::from),
            hang_on: var("LYRA_EXAMPLE_HANG_ON"),
        }
    }

    fn thing(&self) -> String {
        format!("{}::Thing", self.namespace)
    }

    fn null(&self) -> String {
        format!("{}::Null", self.namespace)
    }

    fn is_null(&self, cx: &OpContext<'_>) -> bool {
        cx.type_name.eq_ignore_ascii_case(&self.null())
    }

    /// `LYRA_EXAMPLE_CRASH_ON` and `LYRA_EXAMPLE_HANG_ON`.
    async fn misbehave(&self, name: &str) {
        if self.crash_on.as_deref() == Some(name) {
            let first = match &self.crash_marker {
                None => true,
                Some(marker) => std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(marker)
                    .is_ok(),
            };
            if first {
                eprintln!("crashing on {name}, as LYRA_EXAMPLE_CRASH_ON says");
                // A crash, not a core file in the tests' directories.
                let mut core = rustix::process::getrlimit(rustix::process::Resource::Core);
                core.current = Some(0);
                let _ = rustix::process::setrlimit(rustix::process::Resource::Core, core);
                std::process::abort();
            }
        }
        if self.hang_on.as_deref() == Some(name) {
            eprintln!("hanging on {name}, as LYRA_EXAMPLE_HANG_ON says");
            std::future::pending::<()>().await;
        }
    }
}

fn file(cx: &OpContext<'_>) -> Result<PathBuf, ProviderError> {
    match cx.config.get("file") {
        Some(Value::String(f)) if !f.is_empty() => Ok(PathBuf::from(f)),
        _ => Err(ProviderError::Config("`file` (a path) is required".to_owned())),
    }
}

async fn load(path: &PathBuf) -> Result<Map, ProviderError> {
    match tokio::fs::read(path).await {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| ProviderError::Other(format!("{}: {e}", path.display())))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Map::new()),
        Err(e) => Err(ProviderError::Other(format!("{}: {e}", path.display()))),
    }
}

async fn save(path: &PathBuf, records: &Map) -> Result<(), ProviderError> {
    let bytes = serde_json::to_vec_pretty(records).map_err(ProviderError::other)?;
    let tmp = path.with_extension("tmp");
    tokio::fs::write(&tmp, bytes)
        .await
        .map_err(|e| ProviderError::Other(format!("{}: {e}", tmp.display())))?;
    tokio::fs::rename(&tmp, path)
        .await
        .map_err(|e| ProviderError::Other(format!("{}: {e}", path.display())))
}

fn name(desired: &Map) -> Result<&str, ProviderError> {
    match desired.get("name") {
        Some(Value::String(n)) if !n.is_empty() => Ok(n),
        _ => Err(ProviderError::InvalidValue {
            attribute: "name".to_owned(),
            message: "a non-empty string is required".to_owned(),
        }),
    }
}

fn record(id: &str, name: &str, value: Option<&Value>) -> Map {
    let mut m = Map::new();
    m.insert("name".to_owned(), Value::String(name.to_owned()));
    m.insert("value".to_owned(), value.cloned().unwrap_or(Value::Null));
    m.insert("id".to_owned(), Value::String(id.to_owned()));
    m
}

/// `desired` plus `output`, the echo of `input`: an `Example::Null`.
fn echo(desired: &Map) -> Map {
    let mut actual = desired.clone();
    actual.insert(
        "output".to_owned(),
        desired.get("input").cloned().unwrap_or(Value::Null),
    );
    actual
}

fn find_by_name(records: &Map, name: &str) -> Option<Created> {
    records.iter().find_map(|(id, r)| {
        let r = r.as_object()?;
        (r.get("name").and_then(Value::as_str) == Some(name)).then(|| Created {
            external_id: id.clone(),
            actual: r.clone(),
        })
    })
}

#[async_trait]
impl Provider for Example {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![
            ResourceSchema::new(
                &self.thing(),
                vec![
                    AttributeSchema::new("name", Type::String)
                        .required()
                        .immutable()
                        .doc("The thing's name: unique, its natural key."),
                    AttributeSchema::new("value", Type::Any).doc("Anything."),
                    AttributeSchema::new("id", Type::String)
                        .computed()
                        .doc("The id the provider gave it."),
                ],
            )
            .doc("A record in a JSON file."),
            ResourceSchema::new(
                &self.null(),
                vec![
                    AttributeSchema::new("input", Type::Any).doc("Anything."),
                    AttributeSchema::new("output", Type::Any)
                        .computed()
                        .doc("The echo of `input`."),
                ],
            )
            .doc("Nothing but its record in the engine's state, served by a plugin."),
        ]
    }

    fn config_schemas(&self) -> Vec<ResourceSchema> {
        vec![
            ResourceSchema::new(
                &self.namespace,
                vec![
                    AttributeSchema::new("file", Type::String)
                        .required()
                        .doc("The JSON file holding the records."),
                    AttributeSchema::new("delay", Type::parse("Optional[Integer]").unwrap_or(Type::Any))
                        .doc("Milliseconds each create waits first."),
                ],
            )
            .doc("The example plugin's settings."),
        ]
    }

    fn replace_reasons(&self, _type_name: &str, desired: &Map, actual: &Map) -> Vec<String> {
        let is_object = |m: &Map| m.get("value").is_some_and(Value::is_object);
        if is_object(desired) == is_object(actual) {
            Vec::new()
        } else {
            vec!["value".to_owned()]
        }
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        if self.is_null(cx) {
            // Unique enough for a benchmark's records; no state is kept to look it up in.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            return Ok(Created {
                external_id: format!("null-{}-{nanos:x}", std::process::id()),
                actual: echo(desired),
            });
        }
        let path = file(cx)?;
        let name = name(desired)?;
        self.misbehave(name).await;
        if let Some(ms) = cx.config.get("delay").and_then(Value::as_u64) {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let _guard = self.lock.lock().await;
        let mut records = load(&path).await?;
        if let Some(existing) = find_by_name(&records, name) {
            return Ok(existing);
        }
        let mut n = records.len() + 1;
        while records.contains_key(&format!("thing-{n}")) {
            n += 1;
        }
        let id = format!("thing-{n}");
        let actual = record(&id, name, desired.get("value"));
        records.insert(id.clone(), Value::Object(actual.clone()));
        save(&path, &records).await?;
        eprintln!("created {id} ({name})");
        Ok(Created {
            external_id: id,
            actual,
        })
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        if self.is_null(cx) {
            return Ok(prior.cloned());
        }
        let path = file(cx)?;
        let _guard = self.lock.lock().await;
        let records = load(&path).await?;
        Ok(records.get(external_id).and_then(Value::as_object).cloned())
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        _prior: &Map,
    ) -> Result<Map, ProviderError> {
        if self.is_null(cx) {
            return Ok(echo(desired));
        }
        let path = file(cx)?;
        let name = name(desired)?;
        let _guard = self.lock.lock().await;
        let mut records = load(&path).await?;
        let Some(Value::Object(current)) = records.get(external_id) else {
            return Err(ProviderError::NotFound {
                type_name: self.thing(),
                external_id: external_id.to_owned(),
            });
        };
        if current.get("name").and_then(Value::as_str) != Some(name) {
            return Err(ProviderError::InvalidValue {
                attribute: "name".to_owned(),
                message: "immutable: cannot change in place".to_owned(),
            });
        }
        let actual = record(external_id, name, desired.get("value"));
        records.insert(external_id.to_owned(), Value::Object(actual.clone()));
        save(&path, &records).await?;
        Ok(actual)
    }

    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, _prior: &Map) -> Result<(), ProviderError> {
        if self.is_null(cx) {
            return Ok(());
        }
        let path = file(cx)?;
        let _guard = self.lock.lock().await;
        let mut records = load(&path).await?;
        if records.remove(external_id).is_some() {
            save(&path, &records).await?;
        }
        Ok(())
    }

    async fn lookup(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Lookup, ProviderError> {
        if self.is_null(cx) {
            return Ok(Lookup::Absent);
        }
        let path = file(cx)?;
        let name = name(desired)?;
        let _guard = self.lock.lock().await;
        let records = load(&path).await?;
        Ok(find_by_name(&records, name).map_or(Lookup::Absent, Lookup::Found))
    }
}

#[tokio::main]
async fn main() {
    if let Err(e) = lyra_plugin::serve(Example::from_env()).await {
        eprintln!("lyra-provider-example: {e}");
        std::process::exit(1);
    }
}
