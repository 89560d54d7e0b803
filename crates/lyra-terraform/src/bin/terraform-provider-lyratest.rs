//! `terraform-provider-lyratest`: a small Terraform provider speaking protocol 6, for the
//! bridge's tests (the null provider covers protocol 5). It is started as go-plugin starts a
//! provider (magic cookie, `PLUGIN_PROTOCOL_VERSIONS`) and serves gRPC on a Unix socket,
//! without TLS (as a go-plugin server built without automatic TLS does).
//!
//! One resource type, `lyratest_file`: a file under the provider's `root` setting.
//! - `path` (required; a change replaces), `content`, `secret` (sensitive), `tags`; computed
//!   `id` (the path) and `length`, unknown until apply.
//! - Private state: every plan and apply returns `lyratest-private`, and every later call
//!   fails unless it comes back.
//! - Drift: the file is read back; an edited file shows as a changed `content`.
//! - Faults, chosen by the content: `die:...` exits in the middle of the apply, before
//!   writing; `hang:...` writes the file and `<path>.applied`, then never answers.
//! - Settings: `root` (the directory), `token` (sensitive; any value but `s3cret` is refused).

// A provider's log is its stderr.
#![allow(clippy::print_stderr)]

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

use lyra_terraform::cty::{self, Ty};
use lyra_terraform::proto::tfplugin as pb;
use lyra_terraform::proto::tfplugin6::provider_server::{Provider, ProviderServer};
use lyra_terraform::{MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE};
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

const TYPE: &str = "lyratest_file";
const PRIVATE: &[u8] = b"lyratest-private";

fn resource_type() -> Ty {
    Ty::from_json(&json!(["object", {
        "id": "string", "path": "string", "content": "string", "secret": "string",
        "tags": ["map", "string"], "length": "number"
    }]))
    .expect("the resource type")
}

fn config_type() -> Ty {
    Ty::from_json(&json!(["object", {"root": "string", "token": "string"}])).expect("the config type")
}

fn attr(name: &str, ty: &str, flags: &str) -> pb::schema::Attribute {
    pb::schema::Attribute {
        name: name.to_owned(),
        r#type: ty.as_bytes().to_vec(),
        description: format!("The {name}."),
        required: flags.contains('r'),
        optional: flags.contains('o'),
        computed: flags.contains('c'),
        sensitive: flags.contains('s'),
        ..Default::default()
    }
}

fn error(summary: &str, attribute: Option<&str>) -> pb::Diagnostic {
    use pb::attribute_path::{Step, step::Selector};
    pb::Diagnostic {
        severity: pb::diagnostic::Severity::Error as i32,
        summary: summary.to_owned(),
        detail: String::new(),
        attribute: attribute.map(|a| pb::AttributePath {
            steps: vec![Step {
                selector: Some(Selector::AttributeName(a.to_owned())),
            }],
        }),
    }
}

fn dv(msgpack: Vec<u8>) -> Option<pb::DynamicValue> {
    Some(pb::DynamicValue {
        msgpack,
        json: Vec::new(),
    })
}

fn decode(v: Option<&pb::DynamicValue>, ty: &Ty) -> Result<Value, Status> {
    match v {
        Some(v) if !v.msgpack.is_empty() => cty::decode(&v.msgpack, ty)
            .map(|(v, _)| v)
            .map_err(|e| Status::invalid_argument(e.to_string())),
        Some(v) if !v.json.is_empty() => {
            serde_json::from_slice(&v.json).map_err(|e| Status::invalid_argument(e.to_string()))
        }
        _ => Ok(Value::Null),
    }
}

fn encode(v: &Value) -> Result<Vec<u8>, Status> {
    cty::encode(v, &resource_type()).map_err(|e| Status::internal(e.to_string()))
}

/// `v` encoded, with the attributes `unknown` marked not known yet.
fn encode_with_unknowns(v: &Value, unknown: &[&str]) -> Result<Vec<u8>, Status> {
    let bytes = encode(v)?;
    let mut mp = rmpv::decode::read_value(&mut &bytes[..]).map_err(|e| Status::internal(e.to_string()))?;
    if let rmpv::Value::Map(entries) = &mut mp {
        for (k, v) in entries.iter_mut() {
            if k.as_str().is_some_and(|k| unknown.contains(&k)) {
                *v = rmpv::Value::Ext(0, vec![0]);
            }
        }
    }
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &mp).map_err(|e| Status::internal(e.to_string()))?;
    Ok(out)
}

#[derive(Default)]
struct LyraTest {
    root: Mutex<Option<PathBuf>>,
}

impl LyraTest {
    fn file(&self, path: &str) -> PathBuf {
        let root = self
            .root
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_else(|| PathBuf::from("."));
        root.join(path)
    }

    fn state(&self, path: &str, tags: &Value, secret: &Value) -> Option<Value> {
        let content = std::fs::read_to_string(self.file(path)).ok()?;
        Some(json!({
            "id": path, "path": path, "length": content.len(), "content": content,
            "tags": tags, "secret": secret,
        }))
    }
}

#[tonic::async_trait]
impl Provider for LyraTest {
    async fn get_provider_schema(
        &self,
        _: Request<pb::GetSchemaRequest>,
    ) -> Result<Response<pb::GetSchemaResponse>, Status> {
        let resource = pb::Schema {
            version: 1,
            block: Some(pb::schema::Block {
                description: "A file under the provider's root.".to_owned(),
                attributes: vec![
                    attr("id", "\"string\"", "c"),
                    attr("path", "\"string\"", "r"),
                    attr("content", "\"string\"", "o"),
                    attr("secret", "\"string\"", "os"),
                    attr("tags", "[\"map\",\"string\"]", "o"),
                    attr("length", "\"number\"", "c"),
                ],
                ..Default::default()
            }),
        };
        let provider = pb::Schema {
            version: 0,
            block: Some(pb::schema::Block {
                attributes: vec![attr("root", "\"string\"", "o"), attr("token", "\"string\"", "os")],
                ..Default::default()
            }),
        };
        Ok(Response::new(pb::GetSchemaResponse {
            provider: Some(provider),
            resource_schemas: HashMap::from([(TYPE.to_owned(), resource)]),
            ..Default::default()
        }))
    }

    async fn validate_provider_config(
        &self,
        _: Request<pb::PrepareConfigRequest>,
    ) -> Result<Response<pb::PrepareConfigResponse>, Status> {
        Ok(Response::new(pb::PrepareConfigResponse::default()))
    }

    async fn upgrade_resource_state(
        &self,
        r: Request<pb::UpgradeRequest>,
    ) -> Result<Response<pb::UpgradeResponse>, Status> {
        let r = r.into_inner();
        let raw = r.raw_state.map(|s| s.json).unwrap_or_default();
        let mut state: Value = serde_json::from_slice(&raw).map_err(|e| Status::invalid_argument(e.to_string()))?;
        // Version 0 called `content` `text`.
        if r.version == 0
            && let Some(m) = state.as_object_mut()
            && let Some(text) = m.remove("text")
        {
            m.insert("content".to_owned(), text);
        }
        Ok(Response::new(pb::UpgradeResponse {
            upgraded_state: dv(encode(&state)?),
            diagnostics: Vec::new(),
        }))
    }

    async fn configure_provider(
        &self,
        r: Request<pb::ConfigureRequest>,
    ) -> Result<Response<pb::ConfigureResponse>, Status> {
        let config = decode(r.into_inner().config.as_ref(), &config_type())?;
        let mut diagnostics = Vec::new();
        if let Some(token) = config["token"].as_str()
            && token != "s3cret"
        {
            diagnostics.push(error("the token is not valid", Some("token")));
        }
        if let Ok(mut root) = self.root.lock() {
            *root = config["root"].as_str().map(PathBuf::from);
        }
        Ok(Response::new(pb::ConfigureResponse { diagnostics }))
    }

    async fn read_resource(&self, r: Request<pb::ReadRequest>) -> Result<Response<pb::ReadResponse>, Status> {
        let r = r.into_inner();
        if r.private != PRIVATE {
            return Ok(Response::new(pb::ReadResponse {
                diagnostics: vec![error("private state was not handed back", None)],
                ..Default::default()
            }));
        }
        let current = decode(r.current_state.as_ref(), &resource_type())?;
        let path = current["path"].as_str().unwrap_or_default();
        let new_state = match self.state(path, &current["tags"], &current["secret"]) {
            Some(s) => encode(&s)?,
            None => cty::null(),
        };
        Ok(Response::new(pb::ReadResponse {
            new_state: dv(new_state),
            diagnostics: Vec::new(),
            private: r.private,
        }))
    }

    async fn plan_resource_change(&self, r: Request<pb::PlanRequest>) -> Result<Response<pb::PlanResponse>, Status> {
        let r = r.into_inner();
        let ty = resource_type();
        let prior = decode(r.prior_state.as_ref(), &ty)?;
        let proposed = decode(r.proposed_new_state.as_ref(), &ty)?;
        if proposed.is_null() {
            return Ok(Response::new(pb::PlanResponse {
                planned_state: dv(cty::null()),
                planned_private: r.prior_private,
                ..Default::default()
            }));
        }
        if !prior.is_null() && r.prior_private != PRIVATE {
            return Ok(Response::new(pb::PlanResponse {
                diagnostics: vec![error("private state was not handed back", None)],
                ..Default::default()
            }));
        }
        let mut planned = proposed.clone();
        let (planned_state, requires_replace) = if prior.is_null() {
            (encode_with_unknowns(&planned, &["id", "length"])?, Vec::new())
        } else {
            use pb::attribute_path::{Step, step::Selector};
            let replace = prior["path"] != proposed["path"];
            planned["id"] = if replace { Value::Null } else { prior["id"].clone() };
            let mut unknown = Vec::new();
            if replace {
                unknown.push("id");
            }
            if replace || prior["content"] != proposed["content"] {
                unknown.push("length");
            } else {
                planned["length"] = prior["length"].clone();
            }
            let paths = if replace {
                vec![pb::AttributePath {
                    steps: vec![Step {
                        selector: Some(Selector::AttributeName("path".to_owned())),
                    }],
                }]
            } else {
                Vec::new()
            };
            (encode_with_unknowns(&planned, &unknown)?, paths)
        };
        Ok(Response::new(pb::PlanResponse {
            planned_state: dv(planned_state),
            requires_replace,
            planned_private: PRIVATE.to_vec(),
            diagnostics: Vec::new(),
            legacy_type_system: false,
        }))
    }

    async fn apply_resource_change(&self, r: Request<pb::ApplyRequest>) -> Result<Response<pb::ApplyResponse>, Status> {
        let r = r.into_inner();
        let ty = resource_type();
        let prior = decode(r.prior_state.as_ref(), &ty)?;
        let planned = decode(r.planned_state.as_ref(), &ty)?;
        if r.planned_private != PRIVATE {
            return Ok(Response::new(pb::ApplyResponse {
                diagnostics: vec![error("private state was not handed back", None)],
                ..Default::default()
            }));
        }
        if planned.is_null() {
            let path = prior["path"].as_str().unwrap_or_default();
            match std::fs::remove_file(self.file(path)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Status::internal(e.to_string())),
            }
            return Ok(Response::new(pb::ApplyResponse {
                new_state: dv(cty::null()),
                ..Default::default()
            }));
        }
        let path = planned["path"].as_str().unwrap_or_default().to_owned();
        let content = planned["content"].as_str().unwrap_or_default().to_owned();
        if content.starts_with("die:") {
            eprintln!("lyratest: dying in the middle of applying {path}, as asked");
            std::process::exit(3);
        }
        if let Some(old) = prior["path"].as_str()
            && old != path
        {
            let _ = std::fs::remove_file(self.file(old));
        }
        let file = self.file(&path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Status::internal(e.to_string()))?;
        }
        std::fs::write(&file, &content).map_err(|e| Status::internal(e.to_string()))?;
        if content.starts_with("hang:") {
            let mut marker = file.into_os_string();
            marker.push(".applied");
            let _ = std::fs::write(marker, std::process::id().to_string());
            std::future::pending::<()>().await;
        }
        let state = json!({
            "id": path, "path": path, "content": content, "length": content.len(),
            "tags": planned["tags"], "secret": planned["secret"],
        });
        Ok(Response::new(pb::ApplyResponse {
            new_state: dv(encode(&state)?),
            private: PRIVATE.to_vec(),
            diagnostics: Vec::new(),
            legacy_type_system: false,
        }))
    }

    async fn import_resource_state(
        &self,
        r: Request<pb::ImportRequest>,
    ) -> Result<Response<pb::ImportResponse>, Status> {
        let r = r.into_inner();
        let imported_resources = match self.state(&r.id, &Value::Null, &Value::Null) {
            Some(s) => vec![pb::ImportedResource {
                type_name: TYPE.to_owned(),
                state: dv(encode(&s)?),
                private: PRIVATE.to_vec(),
            }],
            None => Vec::new(),
        };
        Ok(Response::new(pb::ImportResponse {
            imported_resources,
            diagnostics: Vec::new(),
        }))
    }

    async fn stop_provider(&self, _: Request<pb::StopRequest>) -> Result<Response<pb::StopResponse>, Status> {
        Ok(Response::new(pb::StopResponse::default()))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::var(MAGIC_COOKIE_KEY).as_deref() != Ok(MAGIC_COOKIE_VALUE) {
        eprintln!("This binary is a Terraform provider plugin: Terraform (or Lyra) starts it.");
        std::process::exit(1);
    }
    let versions = std::env::var("PLUGIN_PROTOCOL_VERSIONS").unwrap_or_default();
    if !versions.split(',').any(|v| v.trim() == "6") {
        eprintln!("lyratest speaks Terraform plugin protocol 6; the client offers {versions:?}");
        std::process::exit(1);
    }
    let dir = tempfile::Builder::new()
        .prefix("lyratest-")
        .tempdir()
        .expect("a directory for the socket");
    let socket = dir.path().join("provider.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind the socket");
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "1|6|unix|{}|grpc|", socket.display());
        let _ = out.flush();
    }
    let served = tonic::transport::Server::builder()
        .add_service(ProviderServer::new(LyraTest::default()))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await;
    if let Err(e) = served {
        eprintln!("lyratest: {e}");
        std::process::exit(1);
    }
}
