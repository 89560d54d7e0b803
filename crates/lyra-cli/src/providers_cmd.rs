//! `lyra providers`: every resource type and provider setting the engine knows, with the flags
//! validation uses (required, provided, computed, immutable, sensitive).

use lyra_core::schema::{AttributeSchema, ResourceSchema, SchemaRegistry};
use lyra_providers::ProvidersConfig;
use serde::Serialize;

use crate::args::{Output, ProvidersArgs};
use crate::exit::Exit;
use crate::{json, print};

/// The JSON shape of `lyra providers -o json` (a CLI contract, apart from the engine's schema
/// types).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProvidersJson<'a> {
    types: Vec<TypeJson<'a>>,
    /// Provider settings (`providers:` in the main workflow), by namespace.
    settings: Vec<TypeJson<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TypeJson<'a> {
    name: &'a str,
    doc: &'a str,
    attributes: Vec<AttributeJson<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AttributeJson<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    ty: String,
    required: bool,
    provided: bool,
    computed: bool,
    immutable: bool,
    sensitive: bool,
    doc: &'a str,
}

fn type_json(s: &ResourceSchema) -> TypeJson<'_> {
    TypeJson {
        name: &s.name,
        doc: &s.doc,
        attributes: s.attributes.iter().map(attribute_json).collect(),
    }
}

fn attribute_json(a: &AttributeSchema) -> AttributeJson<'_> {
    AttributeJson {
        name: &a.name,
        ty: a.ty.to_string(),
        required: a.required,
        provided: a.provided,
        computed: a.computed,
        immutable: a.immutable,
        sensitive: a.is_secret(),
        doc: &a.doc,
    }
}

/// The schemas `filter` names (a type like `Postgres::Role`, or a namespace like `Postgres`;
/// case-insensitive), or all.
fn selected<'s>(
    schemas: &'s SchemaRegistry,
    filter: Option<&str>,
) -> (Vec<&'s ResourceSchema>, Vec<&'s ResourceSchema>) {
    let matches = |name: &str| {
        filter.is_none_or(|f| {
            let f = f.to_ascii_lowercase();
            let n = name.to_ascii_lowercase();
            n == f || lyra_core::schema::namespace_of(&n) == f
        })
    };
    let types = schemas
        .names()
        .into_iter()
        .filter(|n| matches(n))
        .filter_map(|n| schemas.get(n))
        .collect();
    let settings = schemas
        .config_names()
        .into_iter()
        .filter(|n| matches(n))
        .filter_map(|n| schemas.config(n))
        .collect();
    (types, settings)
}

fn flags(a: &AttributeSchema) -> String {
    let mut f = Vec::new();
    if a.required {
        f.push("required");
    }
    if a.computed {
        f.push("computed");
    } else if a.provided {
        f.push("provided");
    }
    if a.immutable {
        f.push("immutable");
    }
    if a.is_secret() {
        f.push("sensitive");
    }
    f.join(", ")
}

fn text(title: &str, s: &ResourceSchema) -> String {
    let mut out = format!("{title}{}\n", s.name);
    if !s.doc.is_empty() {
        out.push_str(&format!("  {}\n", s.doc));
    }
    let rows: Vec<Vec<String>> = s
        .attributes
        .iter()
        .map(|a| vec![format!("  {}", a.name), a.ty.to_string(), flags(a), a.doc.clone()])
        .collect();
    out.push_str(&crate::output::table(
        &["  ATTRIBUTE", "TYPE", "FLAGS", "DESCRIPTION"],
        &rows,
    ));
    out.push('\n');
    out
}

pub async fn providers(a: &ProvidersArgs, out: Output) -> Result<(), Exit> {
    let providers = crate::providers_with_plugins(&ProvidersConfig::default(), None).await;
    let schemas = providers.schemas();
    let (types, settings) = selected(schemas, a.name.as_deref());
    if types.is_empty() && settings.is_empty() {
        let name = a.name.as_deref().unwrap_or_default();
        let known = schemas.names().join(", ");
        return Err(Exit::usage(format!(
            "no resource type or provider '{name}'; known types: {known}"
        )));
    }
    match out {
        Output::Json => json(&ProvidersJson {
            types: types.into_iter().map(type_json).collect(),
            settings: settings.into_iter().map(type_json).collect(),
        }),
        Output::Text => {
            let mut s = String::new();
            for t in settings {
                s.push_str(&text("provider settings: ", t));
            }
            for t in types {
                s.push_str(&text("", t));
            }
            print(&s)
        }
    }
}
