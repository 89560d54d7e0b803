//! Building and reading packages without a registry.

use lyra_core::diag::Sources;
use lyra_core::program::{Program, load};
use lyra_core::schema::{AttributeSchema, ResourceSchema, SchemaRegistry};
use lyra_core::types::Type;

use crate::{BuildOptions, Error, Layout, Reference, build};

const MAIN: &str = "\
parameters:
  size:
    type: Integer[1, 9]
    default: 3
    doc: How many.
  token:
    type: Sensitive[String]
returns: [out]
steps:
  thing:
    returns:
      out: output
    resource: Test::Thing
    value:
      input: $size
  inner:
    call: lib::inner
";

const INNER: &str = "\
resource: Test::Other
value:
  input: x
";

/// The resource types the test workflows use.
fn schemas() -> SchemaRegistry {
    let mut schemas = SchemaRegistry::default();
    for name in ["Test::Thing", "Test::Other"] {
        schemas.insert(ResourceSchema::new(
            name,
            vec![
                AttributeSchema::new("input", Type::Any),
                AttributeSchema::new("output", Type::Any).provided(),
            ],
        ));
    }
    schemas
}

fn program(sources: &mut Sources) -> Program {
    let schemas = schemas();
    let mut source = |name: &str| (name == "lib::inner").then(|| ("lib/inner.yaml".to_owned(), INNER.to_owned()));
    load(
        "main",
        ("main.yaml".into(), MAIN.into()),
        &mut source,
        sources,
        &schemas,
    )
    .unwrap_or_else(|d| panic!("{}", d.render(sources)))
}

fn built(opts: &BuildOptions) -> Layout {
    let mut sources = Sources::default();
    build(&program(&mut sources), &sources, opts).expect("build")
}

#[test]
fn the_same_inputs_give_the_same_bytes() {
    let opts = BuildOptions {
        version: Some("1.2.3".into()),
        ..BuildOptions::default()
    };
    let (a, b) = (built(&opts), built(&opts));
    assert_eq!(a.digest, b.digest);
    assert_eq!(a.blobs, b.blobs);
    let dated = built(&BuildOptions {
        created: Some("2024-01-01T00:00:00Z".into()),
        ..opts
    });
    assert_ne!(dated.digest, a.digest);
}

#[test]
fn a_package_holds_its_interface_and_every_called_workflow() {
    let layout = built(&BuildOptions::default());
    let p = layout.package().expect("package");
    let m = &p.manifest;
    assert_eq!((m.name.as_str(), m.version.as_str()), ("main", "0.0.0"));
    assert_eq!(m.parameters[0].ty, "Integer[1, 9]");
    assert_eq!(m.parameters[0].default, Some(serde_json::json!(3)));
    assert_eq!(m.parameters[0].doc.as_deref(), Some("How many."));
    assert!(m.parameters[1].sensitive && m.parameters[1].default.is_none());
    assert_eq!(m.resource_types, ["Test::Other", "Test::Thing"]);
    assert_eq!(p.files.keys().collect::<Vec<_>>(), ["lib::inner", "main"]);
    assert_eq!(p.main().1, MAIN);
    // The package loads by itself: its calls resolve inside it.
    let mut sources = Sources::default();
    let schemas = schemas();
    let loaded = load(&p.manifest.name, p.main(), &mut p.source(), &mut sources, &schemas);
    assert!(loaded.is_ok());
}

#[test]
fn layouts_round_trip_and_tampering_is_refused() {
    let layout = built(&BuildOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("p.tar");
    layout.write(&tar).unwrap();
    layout.write(&dir.path().join("lay")).unwrap();
    for r in [Reference::Tar(tar), Reference::Layout(dir.path().join("lay"))] {
        let read = match &r {
            Reference::Tar(p) => Layout::read_tar(p),
            Reference::Layout(p) => Layout::read_dir(p),
            Reference::Registry(_) => unreachable!(),
        }
        .unwrap();
        assert_eq!(read.digest, layout.digest);
        assert_eq!(read.ref_name, "0.0.0");
    }
    let config = layout.blobs.keys().next().unwrap().clone();
    let path = dir
        .path()
        .join("lay/blobs/sha256")
        .join(config.strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.push(b' ');
    std::fs::write(&path, bytes).unwrap();
    match Layout::read_dir(&dir.path().join("lay")) {
        Err(Error::DigestMismatch { digest, .. }) => assert_eq!(digest, config),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_version_must_be_semver() {
    let mut sources = Sources::default();
    let p = program(&mut sources);
    let e = build(
        &p,
        &sources,
        &BuildOptions {
            version: Some("v1".into()),
            ..BuildOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("'v1' is not a SemVer version"), "{e}");
}
