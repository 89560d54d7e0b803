//! `Exec::Command`: something made, read, changed and removed by shell commands, shaped after
//! the community shell provider (`shell_script`) and Terraform's `terraform_data`.
//!
//! Each operation runs its command with the `interpreter` (default `/bin/sh -c`):
//!
//! - `create` (required) makes the thing. Its stdout becomes `output`: the JSON value it
//!   holds when it parses as JSON, else the trimmed text (empty stdout is `null`). When that
//!   is a JSON object with a string `id`, the id is the external id; otherwise the external id
//!   is random (`exec-…`).
//! - `read` (optional) tells what there is now: empty stdout means the thing is gone (the
//!   engine creates it again), anything else becomes the new `output`. Without a `read`
//!   command the state is all there is, and it is returned as recorded.
//! - `update` (optional) changes it in place; its stdout becomes the new `output`. Without an
//!   `update` command any change replaces the resource (delete, then create). With one, only a
//!   change of `triggers` (immutable) replaces.
//! - `delete` (optional) removes it.
//!
//! Every command gets on stdin the JSON of the previous `output` (`null` for `create`), and in
//! its environment the controller's own, then `environment` and `sensitive_environment`, then
//! `LYRA_ID` (the external id; unset for `create`), `LYRA_OPERATION` (`create`, `read`,
//! `update`, `delete`), `LYRA_STEP` and `LYRA_DEPLOYMENT`. It runs in `working_dir`, or the
//! working directory of the program running Lyra.
//!
//! A command that exits nonzero fails the operation (retryably) with its exit status and the
//! last lines of its stderr, where every value of `sensitive_environment` is masked. Its stdout
//! is not masked: a command that prints a secret puts it in `output`, which is not sensitive.
//!
//! Each command runs in a process group of its own; when the run is cancelled or the step times
//! out, the whole group is killed (SIGKILL), grandchildren included.
//!
//! There is no natural key to find a command's work by, so `lookup` is `Unsupported`: after a
//! run died between a create and its record, the engine cannot know whether it ran.
//!
//! [`ProvidersConfig::allow_exec`](crate::ProvidersConfig::allow_exec) `false` (the controller
//! without `--allow-exec`) refuses every operation.

use std::process::Stdio;

use crate::{invalid, opt_str};
use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};
use tokio::io::AsyncWriteExt as _;

/// The canonical type name.
pub const COMMAND: &str = "Exec::Command";

const CREATE: &str = "create";
const READ: &str = "read";
const UPDATE: &str = "update";
const DELETE: &str = "delete";
const ENVIRONMENT: &str = "environment";
const SENSITIVE_ENVIRONMENT: &str = "sensitive_environment";
const WORKING_DIR: &str = "working_dir";
const TRIGGERS: &str = "triggers";
const INTERPRETER: &str = "interpreter";
const OUTPUT: &str = "output";

/// How many of the last lines of stderr an error quotes.
const STDERR_LINES: usize = 20;

/// The message of every operation when commands are not allowed.
pub const DISABLED: &str = "Exec::Command is disabled here: the controller runs commands only with --allow-exec";

/// The provider of `Exec::Command`.
#[derive(Debug, Clone)]
pub struct ExecProvider {
    allowed: bool,
}

impl ExecProvider {
    /// A provider that runs commands, or (`allowed` false) refuses to.
    pub fn new(allowed: bool) -> Self {
        ExecProvider { allowed }
    }

    fn check_allowed(&self) -> Result<(), ProviderError> {
        if self.allowed {
            Ok(())
        } else {
            Err(ProviderError::Config(DISABLED.to_owned()))
        }
    }
}

/// The variables of `attribute` (a hash of strings). Messages name keys only for the
/// non-secret hash, never values.
fn env_vars(m: &Map, attribute: &str) -> Result<Vec<(String, String)>, ProviderError> {
    match m.get(attribute) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(vars)) => vars
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(_) | Value::Bool(_) => Ok((k.clone(), v.to_string())),
                other => Err(invalid(
                    attribute,
                    if attribute == SENSITIVE_ENVIRONMENT {
                        format!("values must be strings, got {}", kind_of(other))
                    } else {
                        format!("{k} must be a string, got {}", kind_of(other))
                    },
                )),
            })
            .collect(),
        Some(other) => Err(invalid(
            attribute,
            format!("expects a hash of strings, got {}", kind_of(other)),
        )),
    }
}

fn default_interpreter() -> Value {
    Value::from(vec!["/bin/sh", "-c"])
}

fn interpreter(m: &Map) -> Result<Vec<String>, ProviderError> {
    match m.get(INTERPRETER) {
        None | Some(Value::Null) => Ok(vec!["/bin/sh".to_owned(), "-c".to_owned()]),
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(invalid(INTERPRETER, format!("expects strings, got {}", kind_of(other)))),
            })
            .collect(),
        Some(_) => Err(invalid(
            INTERPRETER,
            "expects a non-empty array of strings such as [/bin/sh, -c]",
        )),
    }
}

/// Checks everything a later operation will need, so that a bad value fails now.
fn check(desired: &Map) -> Result<(), ProviderError> {
    opt_str(desired, CREATE)?.ok_or_else(|| invalid(CREATE, "is required"))?;
    for a in [READ, UPDATE, DELETE, WORKING_DIR] {
        opt_str(desired, a)?;
    }
    env_vars(desired, ENVIRONMENT)?;
    env_vars(desired, SENSITIVE_ENVIRONMENT)?;
    interpreter(desired)?;
    Ok(())
}

/// `stdout` as a value: its JSON when it is JSON, else the trimmed text; `null` when empty.
fn parse_output(stdout: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stdout);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(trimmed).unwrap_or_else(|_| Value::String(trimmed.to_owned()))
}

/// Kills the process group of a command still running when its future is dropped (a cancel, a
/// step timeout): `kill_on_drop` alone would kill the shell and leave what it started.
struct GroupGuard {
    pgid: Option<rustix::process::Pid>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            // Gone already is fine: nothing is left to kill.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

/// What runs one command: the state it belongs to and who asks.
struct Run<'a> {
    cx: &'a OpContext<'a>,
    operation: &'static str,
    external_id: Option<&'a str>,
    /// The state whose interpreter, environment and working directory are used.
    state: &'a Map,
}

impl Run<'_> {
    /// Runs `script` with `stdin` and returns its stdout, or the error of a failed command.
    async fn run(&self, script: &str, stdin: &Value) -> Result<Vec<u8>, ProviderError> {
        let interpreter = interpreter(self.state)?;
        let secrets = env_vars(self.state, SENSITIVE_ENVIRONMENT)?;
        let mut command = tokio::process::Command::new(&interpreter[0]);
        command
            .args(&interpreter[1..])
            .arg(script)
            .envs(env_vars(self.state, ENVIRONMENT)?)
            .envs(secrets.iter().cloned())
            .env("LYRA_OPERATION", self.operation)
            .env("LYRA_STEP", self.cx.step_id)
            .env("LYRA_DEPLOYMENT", self.cx.deployment)
            .env_remove("LYRA_ID")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        if let Some(id) = self.external_id {
            command.env("LYRA_ID", id);
        }
        if let Some(dir) = opt_str(self.state, WORKING_DIR)? {
            command.current_dir(dir);
        }
        let what = format!("{COMMAND} {}", self.operation);
        let mut child = command
            .spawn()
            .map_err(|e| ProviderError::Other(format!("{what}: cannot start {}: {e}", interpreter[0])))?;
        let mut guard = GroupGuard {
            pgid: child
                .id()
                .and_then(|id| rustix::process::Pid::from_raw(id.cast_signed())),
        };
        let input = serde_json::to_vec(stdin).unwrap_or_default();
        let mut pipe = child.stdin.take();
        let feed = async move {
            if let Some(p) = pipe.as_mut() {
                // A command that does not read its stdin closes the pipe: not an error.
                let _ = p.write_all(&input).await;
                let _ = p.shutdown().await;
            }
            drop(pipe);
        };
        let output = crate::cancellable(self.cx, async {
            let (output, ()) = tokio::join!(child.wait_with_output(), feed);
            output.map_err(|e| ProviderError::Other(format!("{what}: {e}")))
        })
        .await?;
        // Reaped: the group's id may be anyone's now.
        guard.pgid = None;
        if output.status.success() {
            return Ok(output.stdout);
        }
        let status = match output.status.code() {
            Some(code) => format!("exited with status {code}"),
            None => format!("was killed ({})", output.status),
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let mut tail = lines[lines.len().saturating_sub(STDERR_LINES)..].join("\n");
        for (_, secret) in &secrets {
            if !secret.is_empty() {
                tail = tail.replace(secret.as_str(), "(sensitive)");
            }
        }
        Err(ProviderError::Other(if tail.trim().is_empty() {
            format!("{what} command {status}")
        } else {
            format!("{what} command {status}; stderr:\n{tail}")
        }))
    }
}

/// `desired` with the interpreter it runs with and `output`.
fn actual_of(desired: &Map, output: Value) -> Map {
    let mut actual = desired.clone();
    if actual.get(INTERPRETER).is_none_or(Value::is_null) {
        actual.insert(INTERPRETER.to_owned(), default_interpreter());
    }
    actual.insert(OUTPUT.to_owned(), output);
    actual
}

#[async_trait]
impl Provider for ExecProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        let hash_of_strings = Type::hash(Type::String, Type::String);
        vec![
            ResourceSchema::new(
                COMMAND,
                vec![
                    AttributeSchema::new(CREATE, Type::String)
                        .required()
                        .doc("The command that makes the thing; its stdout (JSON, or text) becomes output, and a JSON object's string id the external id."),
                    AttributeSchema::new(READ, Type::optional(Type::String))
                        .doc("The command that tells what there is: empty stdout means gone, anything else the new output. Without it the state is all there is."),
                    AttributeSchema::new(UPDATE, Type::optional(Type::String))
                        .doc("The command that changes the thing in place; without it any change replaces the resource."),
                    AttributeSchema::new(DELETE, Type::optional(Type::String))
                        .doc("The command that removes the thing."),
                    AttributeSchema::new(ENVIRONMENT, Type::optional(hash_of_strings.clone()))
                        .doc("Variables added to the commands' environment."),
                    AttributeSchema::new(SENSITIVE_ENVIRONMENT, Type::optional(Type::Sensitive(Box::new(hash_of_strings))))
                        .sensitive()
                        .doc("Secret variables added to the commands' environment; masked in error messages."),
                    AttributeSchema::new(WORKING_DIR, Type::optional(Type::String))
                        .doc("Where the commands run (default: the working directory of the program running Lyra)."),
                    AttributeSchema::new(TRIGGERS, Type::Any)
                        .immutable()
                        .doc("Any value; a change replaces the resource."),
                    AttributeSchema::new(INTERPRETER, Type::optional(Type::array(Type::String)))
                        .provided()
                        .doc("The program and arguments the command is appended to (default [/bin/sh, -c])."),
                    AttributeSchema::new(OUTPUT, Type::Any)
                        .computed()
                        .doc("The last create, update or read command's stdout: its JSON value, or the trimmed text."),
                ],
            )
            .doc("Something made, read, changed and removed by shell commands (like the shell provider). Stdin of every command is the JSON of the previous output."),
        ]
    }

    /// Without an `update` command, every change of a setting replaces the resource.
    fn replace_reasons(&self, _type_name: &str, desired: &Map, actual: &Map) -> Vec<String> {
        if opt_str(desired, UPDATE).ok().flatten().is_some() {
            return Vec::new();
        }
        let norm = |m: &Map, a: &str| match m.get(a) {
            None | Some(Value::Null) if a == INTERPRETER => default_interpreter(),
            None => Value::Null,
            Some(v) => v.clone(),
        };
        [
            CREATE,
            READ,
            UPDATE,
            DELETE,
            ENVIRONMENT,
            SENSITIVE_ENVIRONMENT,
            WORKING_DIR,
            INTERPRETER,
        ]
        .into_iter()
        .filter(|a| norm(desired, a) != norm(actual, a))
        .map(str::to_owned)
        .collect()
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        self.check_allowed()?;
        check(desired)?;
        let script = opt_str(desired, CREATE)?.unwrap_or_default();
        let run = Run {
            cx,
            operation: CREATE,
            external_id: None,
            state: desired,
        };
        let output = parse_output(&run.run(script, &Value::Null).await?);
        let external_id = match output.get("id") {
            Some(Value::String(id)) if !id.is_empty() => id.clone(),
            _ => crate::random_hex_id("exec"),
        };
        Ok(Created {
            external_id,
            actual: actual_of(desired, output),
        })
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        self.check_allowed()?;
        let Some(prior) = prior else {
            return Ok(None);
        };
        let Some(script) = opt_str(prior, READ)? else {
            return Ok(Some(prior.clone()));
        };
        let run = Run {
            cx,
            operation: READ,
            external_id: Some(external_id),
            state: prior,
        };
        let previous = prior.get(OUTPUT).cloned().unwrap_or(Value::Null);
        let stdout = run.run(script, &previous).await?;
        Ok(match parse_output(&stdout) {
            Value::Null => None,
            output => {
                let mut actual = prior.clone();
                actual.insert(OUTPUT.to_owned(), output);
                Some(actual)
            }
        })
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        prior: &Map,
    ) -> Result<Map, ProviderError> {
        self.check_allowed()?;
        check(desired)?;
        let previous = prior.get(OUTPUT).cloned().unwrap_or(Value::Null);
        // The engine replaces instead when there is no update command (replace_reasons); with
        // nothing to run, the new settings are simply recorded.
        let Some(script) = opt_str(desired, UPDATE)? else {
            return Ok(actual_of(desired, previous));
        };
        let run = Run {
            cx,
            operation: UPDATE,
            external_id: Some(external_id),
            state: desired,
        };
        let output = parse_output(&run.run(script, &previous).await?);
        Ok(actual_of(desired, output))
    }

    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, prior: &Map) -> Result<(), ProviderError> {
        self.check_allowed()?;
        let Some(script) = opt_str(prior, DELETE)? else {
            return Ok(());
        };
        let run = Run {
            cx,
            operation: DELETE,
            external_id: Some(external_id),
            state: prior,
        };
        let previous = prior.get(OUTPUT).cloned().unwrap_or(Value::Null);
        run.run(script, &previous).await.map(drop)
    }

    /// `Unsupported`: a command's work has no natural key to find it by.
    async fn lookup(&self, _cx: &OpContext<'_>, _desired: &Map) -> Result<Lookup, ProviderError> {
        self.check_allowed()?;
        Ok(Lookup::Unsupported)
    }
}

#[cfg(test)]
mod tests;
