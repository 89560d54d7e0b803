//! Finding and reading workflows and data: the file-system side of the front end.

use std::path::{Path, PathBuf};

use lyra_core::diag::{Diagnostics, Sources};
use lyra_core::program::Program;
use lyra_core::schema::SchemaRegistry;
use lyra_core::value::{Map, set_dotted};
use lyra_core::yaml::workflow_name;
use lyra_host::{DataError, LoadPath, LookupError, ReadError};

use lyra_package::{Package, Reference, RegistryOptions};

use crate::args::{RegistryArgs, WorkflowArgs};
use crate::exit::Exit;

/// What a command runs: a workflow from files, or a package resolved (once) to its digest.
pub enum Target {
    Files(Located),
    Package(Box<Package>),
}

impl Target {
    /// The main workflow's name: a deployment's default name.
    pub fn name(&self) -> &str {
        match self {
            Target::Files(loc) => &loc.name,
            Target::Package(p) => &p.manifest.name,
        }
    }
}

/// Finds what a workflow argument names: a package (layout, `.tar`, `oci://`), read and
/// verified, or a workflow on the load path or in a file.
pub async fn locate_target(a: &WorkflowArgs) -> Result<Target, Exit> {
    // A malformed `oci://` reference says what is wrong with it, not "workflow not found".
    let detected = if a.workflow.starts_with("oci://") {
        Some(Reference::parse(&a.workflow).map_err(package_error)?)
    } else {
        Reference::detect(&a.workflow)
    };
    match detected {
        Some(reference) => Ok(Target::Package(Box::new(resolve(&reference, &a.registry).await?))),
        None => locate(&a.workflow, a.workflows.as_deref()).map(Target::Files),
    }
}

/// How the CLI reaches registries: the environment's settings plus `--insecure-registry`.
pub fn registry_options(a: &RegistryArgs) -> RegistryOptions {
    let mut opts = RegistryOptions::from_env();
    opts.insecure.extend(a.insecure.iter().cloned());
    opts
}

/// The package `reference` names, pinned by digest.
pub async fn resolve(reference: &Reference, a: &RegistryArgs) -> Result<Package, Exit> {
    lyra_package::resolve(reference, &registry_options(a))
        .await
        .map_err(package_error)
}

/// A package error as the command's failure: a malformed reference is a usage error (exit
/// 2); anything else (unreachable, refused, not a package) fails the command (exit 1).
pub fn package_error(e: lyra_package::Error) -> Exit {
    match e {
        lyra_package::Error::BadReference { .. } => Exit::usage(e.to_string()),
        lyra_package::Error::NotFound { .. } => Exit::new(Exit::FAILURE, crate::exit::kind::NOT_FOUND, e.to_string()),
        e => Exit::failure(e.to_string()),
    }
}

/// Reads, parses and validates a target's program. A package's calls resolve within it.
pub fn parse_target(
    target: &Target,
    schemas: &SchemaRegistry,
    sources: &mut Sources,
) -> Result<Result<Program, Diagnostics>, Exit> {
    match target {
        Target::Files(loc) => parse_program(loc, schemas, sources),
        Target::Package(p) => Ok(lyra_core::program::load(
            &p.manifest.name,
            p.main(),
            &mut p.source(),
            sources,
            schemas,
        )),
    }
}

/// [`parse_target`], with invalid workflows as a failure exit.
/// The workflow a run (plan, apply) runs: located, loaded and checked. Unless the deployment
/// is `named`, the workflow's name names it, so the deployment name rule holds for it too. A
/// package's run records its main workflow pinned by digest (`web@sha256:…`), so the history
/// says exactly what ran; steps are named by the root step, not by this name.
pub async fn load_run(
    workflow: &WorkflowArgs,
    named: bool,
    schemas: &SchemaRegistry,
    sources: &mut Sources,
) -> Result<(Target, Program), Exit> {
    let target = locate_run(workflow, named).await?;
    let program = parse_run(&target, schemas, sources)?;
    Ok((target, program))
}

/// The first half of [`load_run`]: the workflow found, its name checked.
pub async fn locate_run(workflow: &WorkflowArgs, named: bool) -> Result<Target, Exit> {
    let target = locate_target(workflow).await?;
    if !named {
        lyra_core::names::check_deployment_name(target.name()).map_err(|why| {
            Exit::usage(format!(
                "the workflow's name {:?} cannot name a deployment: {why}; give one with --name",
                target.name()
            ))
        })?;
    }
    Ok(target)
}

/// The second half of [`load_run`]: the workflow read and checked.
pub fn parse_run(target: &Target, schemas: &SchemaRegistry, sources: &mut Sources) -> Result<Program, Exit> {
    let mut program = load_target(target, schemas, sources)?;
    if let Target::Package(p) = target {
        std::sync::Arc::make_mut(&mut program.main).name = p.pinned_name();
    }
    Ok(program)
}

pub fn load_target(target: &Target, schemas: &SchemaRegistry, sources: &mut Sources) -> Result<Program, Exit> {
    parse_target(target, schemas, sources)?.map_err(|d| Exit::invalid(&d, sources))
}

/// A workflow given on the command line: a name on the load path, or a file.
pub struct Located {
    pub name: String,
    pub path: PathBuf,
    /// Where called workflows are looked up.
    pub load_path: PathBuf,
}

pub fn locate(workflow: &str, workflows: Option<&Path>) -> Result<Located, Exit> {
    let load_path = workflows.map_or_else(|| PathBuf::from("workflows"), Path::to_path_buf);
    let as_path = Path::new(workflow);
    if as_path.is_file() {
        let path = as_path.to_path_buf();
        // A file inside the load path is named by its place there, like the original, and
        // calls what is on it. A file elsewhere is named after itself and calls what is beside
        // it, unless a load path was given.
        if let Some(rel) = inside(&path, &load_path) {
            return Ok(Located {
                name: workflow_name(&rel),
                path,
                load_path,
            });
        }
        let name = workflow_name(&path.file_name().unwrap_or_default().to_string_lossy());
        let load_path = if workflows.is_some() {
            load_path
        } else {
            path.parent().map_or(load_path, Path::to_path_buf)
        };
        return Ok(Located { name, path, load_path });
    }
    // Not a file: a name, which must stay inside the load path. The user named no file
    // outside it, so none is read (its contents could end up in a message).
    match LoadPath::new(&load_path).find(workflow) {
        Ok(path) => Ok(Located {
            name: workflow.to_owned(),
            path,
            load_path,
        }),
        Err(e @ LookupError::NotFound { .. }) => {
            let hint = if load_path.is_dir() {
                ""
            } else {
                "; use --workflows DIR"
            };
            Err(Exit::usage(format!(
                "workflow '{workflow}' not found: no file '{workflow}' and {e}{hint}"
            )))
        }
        Err(e @ LookupError::InvalidName { .. }) => Err(Exit::usage(format!(
            "workflow '{workflow}' not found: there is no file '{workflow}', and {e}"
        ))),
        Err(e) => Err(Exit::usage(format!("workflow '{workflow}': {e}"))),
    }
}

/// Where `file` lies inside `dir`, as a `/`-separated relative path, if it does. Both are
/// compared as they really are (`./workflows/a.yaml`, an absolute path, a linked directory),
/// but a linked file is placed by its own name, not by what it links to.
fn inside(file: &Path, dir: &Path) -> Option<String> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let dir = dir.canonicalize().ok()?;
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let real = parent.canonicalize().ok()?.join(file.file_name()?);
    let rel = real.strip_prefix(&dir).ok()?;
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    Some(parts?.join("/"))
}

/// Reads, parses and validates the workflow and everything it calls. Invalid workflows
/// come back as diagnostics, for the caller to print as text or JSON.
pub fn parse_program(
    loc: &Located,
    schemas: &SchemaRegistry,
    sources: &mut Sources,
) -> Result<Result<Program, Diagnostics>, Exit> {
    let shown = loc.path.display().to_string();
    let text = match lyra_host::read_text(&loc.path) {
        Ok(text) => text,
        Err(ReadError::Io(e)) => return Err(Exit::usage(format!("cannot read {shown}: {e}"))),
        // Input, not usage: reported like any other problem in the file.
        Err(e) => return Ok(Err(e.diagnostics(&shown, sources))),
    };
    Ok(lyra_host::load_program(
        &loc.name,
        (shown, text),
        &LoadPath::new(&loc.load_path),
        schemas,
        sources,
    ))
}

/// [`parse_program`], with invalid workflows as a failure exit.
pub fn load_program(loc: &Located, schemas: &SchemaRegistry, sources: &mut Sources) -> Result<Program, Exit> {
    parse_program(loc, schemas, sources)?.map_err(|d| Exit::invalid(&d, sources))
}

/// The lookup data: the data file (explicit, or ./data.yaml when present), then `--var`s.
pub fn load_data(data: Option<&Path>, vars: &[String], sources: &mut Sources) -> Result<Map, Exit> {
    let path = match data {
        Some(p) => Some(p.to_path_buf()),
        None => Some(PathBuf::from("data.yaml")).filter(|p| p.is_file()),
    };
    let mut map = match path {
        None => Map::new(),
        Some(p) => lyra_host::read_data_file(&p, sources).map_err(|e| match e {
            DataError::Read(e) => Exit::usage(format!("cannot read data file {}: {e}", p.display())),
            DataError::Invalid(d) => Exit::invalid(&d, sources),
        })?,
    };
    for v in vars {
        let (key, raw) = v
            .split_once('=')
            .or_else(|| v.split_once(':'))
            .ok_or_else(|| Exit::usage(format!("--var '{v}': expected KEY=VALUE")))?;
        if key.is_empty() {
            return Err(Exit::usage(format!("--var '{v}': the key is empty")));
        }
        let value = lyra_host::parse_var_value(raw).map_err(|e| Exit::usage(format!("--var {key}: {e}")))?;
        if lyra_core::value::dotted_too_deep(key, &value) {
            return Err(Exit::usage(format!(
                "--var {}: {}",
                key.chars().take(80).collect::<String>(),
                lyra_core::value::too_deep_message("the key and value together")
            )));
        }
        set_dotted(&mut map, key, value);
    }
    Ok(map)
}

/// Renders diagnostics for a person.
pub fn render(d: &Diagnostics, sources: &Sources) -> String {
    let n = d.len();
    format!(
        "{}\n{n} problem{} found",
        d.render(sources).trim_end(),
        if n == 1 { "" } else { "s" }
    )
}
