//! `lyra package`, `push`, `pull` and `inspect`: packages as OCI artifacts (lyra-package).

use std::path::PathBuf;

use lyra_core::diag::Sources;
use lyra_package::{BuildOptions, Package, Reference};
use lyra_providers::ProvidersConfig;
use serde_json::json;

use crate::args::{InspectArgs, Output, PackageArgs, PullArgs, PushArgs};
use crate::exit::Exit;
use crate::load::{self, package_error, registry_options};
use crate::{json, print, warn};

/// `NAME-VERSION.tar` in the working directory (`a::b` becomes `a-b`).
fn default_out(name: &str, version: &str) -> PathBuf {
    PathBuf::from(format!("{}-{version}.tar", name.replace("::", "-")))
}

pub async fn package(a: &PackageArgs, out: Output) -> Result<(), Exit> {
    // A workflow may use plugins' types: they are known as they are to `validate`.
    let providers = crate::providers_with_plugins(&ProvidersConfig::default(), a.workflows.as_deref()).await;
    let loc = load::locate(&a.workflow, a.workflows.as_deref())?;
    let mut sources = Sources::default();
    let program = load::load_program(&loc, providers.schemas(), &mut sources)?;
    let opts = BuildOptions::from_env(a.version.clone()).map_err(|e| Exit::usage(e.to_string()))?;
    let layout = lyra_package::build(&program, &sources, &opts).map_err(|e| match e {
        lyra_package::Error::Build { .. } => Exit::usage(e.to_string()),
        e => Exit::failure(e.to_string()),
    })?;
    let version = layout.ref_name.clone();
    let path = a
        .out
        .clone()
        .unwrap_or_else(|| default_out(&program.main.name, &version));
    layout.write(&path).map_err(package_error)?;
    if out == Output::Json {
        return json(&json!({
            "name": program.main.name,
            "version": version,
            "digest": layout.digest,
            "path": path.display().to_string(),
        }));
    }
    warn(&format!(
        "packaged {} {version} into {}\n",
        program.main.name,
        path.display()
    ));
    print(&format!("{}\n", layout.digest))
}

/// A local package argument: a layout directory or a `.tar` of one.
fn local(arg: &str) -> Result<Reference, Exit> {
    match Reference::parse(arg).map_err(package_error)? {
        Reference::Registry(_) => Err(Exit::usage(format!(
            "'{arg}' is in a registry: push takes a local package (a layout directory or a .tar); use `lyra pull` first"
        ))),
        r => Ok(r),
    }
}

pub async fn push(a: &PushArgs, out: Output) -> Result<(), Exit> {
    let source = local(&a.package)?;
    let target = match Reference::parse(&a.target).map_err(package_error)? {
        Reference::Registry(r) if r.digest.is_none() => r,
        Reference::Registry(_) => {
            return Err(Exit::usage(format!(
                "push to '{}': give a tag, not a digest (the digest is the package's own)",
                a.target
            )));
        }
        _ => {
            return Err(Exit::usage(format!(
                "push to '{}': expected oci://HOST[:PORT]/REPOSITORY[:TAG]",
                a.target
            )));
        }
    };
    let opts = registry_options(&a.registry);
    let layout = lyra_package::fetch(&source, &opts).await.map_err(package_error)?;
    let pinned = lyra_package::push(&layout, &target, &opts)
        .await
        .map_err(package_error)?;
    if out == Output::Json {
        return json(&json!({ "reference": pinned.to_string(), "digest": layout.digest }));
    }
    print(&format!("{pinned}\n"))
}

pub async fn pull(a: &PullArgs, out: Output) -> Result<(), Exit> {
    let reference = Reference::parse(&a.reference).map_err(package_error)?;
    let opts = registry_options(&a.registry);
    let layout = lyra_package::fetch(&reference, &opts).await.map_err(package_error)?;
    let package = layout.package().map_err(package_error)?;
    let path = a
        .out
        .clone()
        .unwrap_or_else(|| default_out(&package.manifest.name, &package.manifest.version));
    layout.write(&path).map_err(package_error)?;
    let pinned = reference.pinned(&package.digest).to_string();
    if out == Output::Json {
        return json(&json!({
            "reference": pinned,
            "name": package.manifest.name,
            "version": package.manifest.version,
            "digest": package.digest,
            "path": path.display().to_string(),
        }));
    }
    warn(&format!("pulled {pinned} into {}\n", path.display()));
    print(&format!("{}\n", package.digest))
}

pub async fn inspect(a: &InspectArgs, out: Output) -> Result<(), Exit> {
    let reference = Reference::parse(&a.reference).map_err(package_error)?;
    let package = load::resolve(&reference, &a.registry).await?;
    if out == Output::Json {
        return json(&inspect_json(&package));
    }
    print(&inspect_text(&package))
}

fn inspect_json(p: &Package) -> serde_json::Value {
    let m = &p.manifest;
    json!({
        "name": m.name,
        "version": m.version,
        "digest": p.digest,
        "parameters": m.parameters.iter().map(|p| {
            let mut v = json!({ "name": p.name, "type": p.ty, "sensitive": p.sensitive });
            if let Some(d) = &p.default { v["default"] = d.clone(); }
            if let Some(d) = &p.doc { v["doc"] = json!(d); }
            if let Some(l) = &p.lookup { v["lookup"] = json!(l); }
            v
        }).collect::<Vec<_>>(),
        "returns": m.returns.iter().map(|r| json!({ "name": r.name, "type": r.ty })).collect::<Vec<_>>(),
        "resource_types": m.resource_types,
        "files": m.files.iter().map(|f| json!({ "workflow": f.workflow, "path": f.path })).collect::<Vec<_>>(),
    })
}

fn inspect_text(p: &Package) -> String {
    let m = &p.manifest;
    let mut s = format!(
        "name:     {}\nversion:  {}\ndigest:   {}\n",
        m.name, m.version, p.digest
    );
    s.push_str("parameters:");
    if m.parameters.is_empty() {
        s.push_str(" (none)");
    }
    s.push('\n');
    for param in &m.parameters {
        s.push_str(&format!("  {}: {}", param.name, param.ty));
        if let Some(d) = &param.default {
            s.push_str(&format!(" = {d}"));
        }
        if let Some(l) = &param.lookup {
            s.push_str(&format!(" (lookup {l})"));
        }
        if let Some(d) = &param.doc {
            s.push_str(&format!("  # {d}"));
        }
        s.push('\n');
    }
    s.push_str("returns:");
    if m.returns.is_empty() {
        s.push_str(" (none)");
    }
    s.push('\n');
    for r in &m.returns {
        s.push_str(&format!("  {}: {}\n", r.name, r.ty));
    }
    s.push_str(&format!("resource types: {}\n", m.resource_types.join(", ")));
    s.push_str("files:\n");
    for f in &m.files {
        s.push_str(&format!("  {} ({})\n", f.path, f.workflow));
    }
    s
}
