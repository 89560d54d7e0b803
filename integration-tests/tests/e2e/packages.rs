//! Packages (issue 11): `lyra package` is reproducible, `push` lands the same digest in a real
//! registry (Debian's `docker-registry`, one per test), `inspect` shows the interface, and
//! `apply oci://…@sha256:…` runs what the files run. Damaged blobs, a registry that is down and
//! a tag moved after it was resolved are handled as the issue asks.

use integration_tests::registry::{Registry, layout_blob};
use integration_tests::{Lyra, Run, Value, registry_or_skip};

const SITE: &str = "\
parameters:
  region:
    type: Enum[eu1, eu2]
    default: eu1
  replicas:
    type: Integer[1, 5]
    lookup: site.replicas
returns: [dbID, vpcID]
steps:
  db:
    returns:
      dbID: instanceID
    resource: Foobernetes::Instance
    value:
      location: $region
      image: postgres:17
      cpus: $replicas
      memory: 4G
  net:
    call: net::vpc
    returns: [vpcID]
";

const VPC: &str = "\
returns:
  vpcID: output
resource: Null::Resource
value:
  input: main-vpc
";

/// A test directory holding the `site` workflow, the `net::vpc` it calls, and its data.
fn site() -> Lyra {
    let lyra = Lyra::new();
    lyra.write_workflow("site", SITE);
    lyra.write_workflow("net/vpc", VPC);
    lyra.write("data.yaml", "site:\n  replicas: 2\n");
    lyra
}

/// `lyra package site --version VERSION --out OUT`: the digest it prints.
#[track_caller]
fn package(lyra: &Lyra, version: &str, out: &str) -> String {
    let run = lyra.ok(&["package", "site", "--version", version, "--out", out]);
    let digest = run.stdout.trim().to_owned();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "not a digest: {run}"
    );
    digest
}

/// `lyra push PKG TARGET`: the pinned reference it prints.
#[track_caller]
fn push(lyra: &Lyra, pkg: &str, target: &str) -> String {
    lyra.ok(&["push", pkg, target]).stdout.trim().to_owned()
}

/// The layer digest of a package in a layout directory.
fn layer_digest(layout: &std::path::Path, digest: &str) -> String {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(layout_blob(layout, digest)).expect("read the manifest blob"))
            .expect("the manifest is JSON");
    manifest["layers"][0]["digest"]
        .as_str()
        .expect("a layer digest")
        .to_owned()
}

#[track_caller]
fn expect_failure(run: &Run, needles: &[&str]) {
    run.expect_code(1);
    run.expect_stderr(needles);
}

#[test]
fn packaging_is_reproducible_and_the_registry_keeps_the_digest() {
    let registry: Registry = registry_or_skip!();
    let lyra = site();
    let first = package(&lyra, "1.0.0", "site.tar");
    let tar = std::fs::read(lyra.path("site.tar")).expect("read site.tar");
    let again = package(&lyra, "1.0.0", "site.tar");
    assert_eq!(first, again, "the same inputs must give the same digest");
    assert_eq!(tar, std::fs::read(lyra.path("site.tar")).unwrap(), "byte for byte");
    // A directory layout of the same package has the same digest.
    assert_eq!(package(&lyra, "1.0.0", "site-dir"), first);
    // Another version is another package.
    assert_ne!(package(&lyra, "1.0.1", "other.tar"), first);
    // SOURCE_DATE_EPOCH sets `created`, so it changes the digest, reproducibly.
    let dated = Lyra::new().with_env("SOURCE_DATE_EPOCH", "1700000000");
    dated.write_workflow("site", SITE);
    dated.write_workflow("net/vpc", VPC);
    let d1 = package(&dated, "1.0.0", "a.tar");
    assert_ne!(d1, first);
    assert_eq!(package(&dated, "1.0.0", "b.tar"), d1);

    // The tag defaults to the version; the registry's digest is ours.
    let pinned = push(&lyra, "site.tar", &registry.url("team/site"));
    assert_eq!(pinned, format!("{}:1.0.0@{first}", registry.url("team/site")));
    assert_eq!(
        registry.manifest_digest("team/site", "1.0.0").as_deref(),
        Some(first.as_str())
    );
    // Pushing the layout directory to another tag gives the same digest again.
    let pinned = push(&lyra, "site-dir", &registry.url("team/site:stable"));
    assert!(pinned.ends_with(&format!(":stable@{first}")), "{pinned}");
    assert_eq!(
        registry.manifest_digest("team/site", "stable").as_deref(),
        Some(first.as_str())
    );

    // inspect shows the interface, from the registry as from the file.
    let remote = lyra.ok_json(&["inspect", &registry.url("team/site:1.0.0")]);
    let local = lyra.ok_json(&["inspect", "site.tar"]);
    assert_eq!(remote, local);
    assert_eq!(remote["name"], "site");
    assert_eq!(remote["version"], "1.0.0");
    assert_eq!(remote["digest"], first.as_str());
    let params = remote["parameters"].as_array().expect("parameters");
    assert_eq!(params.len(), 2, "{remote}");
    assert_eq!(params[0]["name"], "region");
    assert_eq!(params[0]["type"], "Enum['eu1', 'eu2']");
    assert_eq!(params[0]["default"], "eu1");
    assert_eq!(params[1]["name"], "replicas");
    assert_eq!(params[1]["type"], "Integer[1, 5]");
    assert_eq!(params[1]["lookup"], "site.replicas");
    assert_eq!(remote["returns"][0]["name"], "dbID");
    assert_eq!(
        remote["resource_types"],
        serde_json::json!(["Foobernetes::Instance", "Null::Resource"])
    );
    let files: Vec<&str> = remote["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["net/vpc.yaml", "site.yaml"]);
    let text = lyra.ok(&["inspect", &registry.url("team/site:1.0.0")]).stdout;
    assert!(text.contains("region: Enum['eu1', 'eu2'] = \"eu1\""), "{text}");
}

#[test]
fn apply_of_a_pinned_reference_works_like_the_files() {
    let registry = registry_or_skip!();
    let files = site();
    let digest = package(&files, "1.0.0", "site.tar");
    let pinned = push(&files, "site.tar", &registry.url("team/site"));
    files.ok(&["apply", "site"]);

    // Another directory with only the data: the workflows come from the registry.
    let remote = Lyra::new();
    remote.write("data.yaml", "site:\n  replicas: 2\n");
    remote.ok(&["validate", &pinned]);
    remote.ok(&["apply", &pinned]);
    let keys = |l: &Lyra| l.resources("site").into_keys().collect::<Vec<_>>();
    assert_eq!(keys(&remote), keys(&files));
    assert_eq!(keys(&remote), ["db", "net"]);
    let db = |l: &Lyra| {
        let cloud = l.cloud();
        let rows = cloud["Instances"].as_object().expect("instances");
        rows.values().next().cloned().expect("one instance")
    };
    let (a, b) = (db(&files), db(&remote));
    for attr in ["Location", "Image", "Cpus", "Memory"] {
        assert_eq!(a[attr], b[attr], "{attr}: {a} vs {b}");
    }
    // The history records what ran, pinned by digest; the files' run records their name.
    assert_eq!(remote.history("site")[0]["workflow"], format!("site@{digest}").as_str());
    assert_eq!(files.history("site")[0]["workflow"], "site");
    let text = remote.ok(&["history", "site"]).stdout;
    assert!(text.contains(&format!("site@{}", &digest[..19])), "{text}");
    // A tag is resolved to the same digest, and the second apply changes nothing.
    let report = remote.ok_json(&["apply", &registry.url("team/site:1.0.0")]);
    assert_eq!(report["counts"]["unchanged"], 2, "{report}");
    assert_eq!(remote.history("site")[0]["workflow"], format!("site@{digest}").as_str());
}

#[test]
fn a_registry_that_is_down_is_a_clear_error() {
    let lyra = site();
    let port = integration_tests::cluster::free_port();
    let reference = format!("oci://127.0.0.1:{port}/team/site:1.0.0");
    for args in [
        vec!["inspect", reference.as_str()],
        vec!["apply", reference.as_str()],
        vec!["pull", reference.as_str()],
    ] {
        let run = lyra.run(&args);
        expect_failure(
            &run,
            &[&format!("registry 127.0.0.1:{port} cannot be reached"), "is running"],
        );
    }
    package(&lyra, "1.0.0", "site.tar");
    let run = lyra.run(&["push", "site.tar", &reference]);
    expect_failure(&run, &["cannot be reached"]);
    // A malformed reference is a usage error.
    for cmd in ["inspect", "apply"] {
        let run = lyra.run(&[cmd, "oci://127.0.0.1/Bad/Name"]);
        run.expect_code(2);
        run.expect_stderr(&["'Bad/Name' is not a repository name"]);
    }
}

#[test]
fn tampered_blobs_are_refused_naming_the_digest() {
    let registry = registry_or_skip!();
    let lyra = site();
    let digest = package(&lyra, "1.0.0", "layout");
    let layer = layer_digest(&lyra.path("layout"), &digest);
    push(&lyra, "layout", &registry.url("team/site"));

    // In the registry's storage: a pull by digest (nothing cached) refuses the layer.
    let blob = registry.blob_file(&layer);
    let mut bytes = std::fs::read(&blob).expect("the layer is stored");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).expect("tamper with the stored layer");
    let fresh = Lyra::new();
    let pinned = format!("{}@{digest}", registry.url("team/site"));
    for args in [vec!["inspect", pinned.as_str()], vec!["apply", pinned.as_str()]] {
        let run = fresh.run(&args);
        expect_failure(&run, &[&format!("blob {layer}"), "does not match its digest"]);
    }
    assert!(!fresh.path("deployment.json").exists(), "nothing ran");

    // A registry that serves more than the manifest says is cut off at the size it gave.
    let mut grown = bytes.clone();
    grown.extend(std::iter::repeat_n(0u8, 1 << 20));
    std::fs::write(&blob, &grown).expect("grow the stored layer");
    let run = Lyra::new().run(&["inspect", pinned.as_str()]);
    expect_failure(&run, &[&format!("blob {layer}"), "larger than its manifest says"]);

    // In a local layout.
    let local = layout_blob(&lyra.path("layout"), &layer);
    std::fs::write(&local, &bytes).expect("tamper with the layout's layer");
    let run = lyra.run(&["validate", "layout"]);
    expect_failure(&run, &[&format!("blob {layer}"), "does not match its digest"]);
    let run = lyra.run(&["push", "layout", &registry.url("team/other")]);
    expect_failure(&run, &[&format!("blob {layer}")]);
}

#[test]
fn a_moved_tag_leaves_a_pinned_reference_on_the_old_package() {
    let registry = registry_or_skip!();
    let lyra = site();
    let old = package(&lyra, "1.0.0", "old.tar");
    let old_ref = push(&lyra, "old.tar", &registry.url("team/site:stable"));
    lyra.write_workflow("site", &SITE.replace("memory: 4G", "memory: 8G"));
    let new = package(&lyra, "1.1.0", "new.tar");
    push(&lyra, "new.tar", &registry.url("team/site:stable"));
    assert_ne!(old, new);
    assert_eq!(
        registry.manifest_digest("team/site", "stable").as_deref(),
        Some(new.as_str())
    );

    // Resolved before the move, pinned: still the old package, whatever the tag says now.
    let fresh = Lyra::new();
    fresh.write("data.yaml", "site:\n  replicas: 2\n");
    let shown = fresh.ok_json(&["inspect", &old_ref]);
    assert_eq!(
        (&shown["digest"], &shown["version"]),
        (&Value::from(old.as_str()), &Value::from("1.0.0"))
    );
    fresh.ok(&["apply", &old_ref]);
    let cloud = fresh.cloud();
    let db = cloud["Instances"]
        .as_object()
        .expect("instances")
        .values()
        .next()
        .expect("one instance");
    assert_eq!(db["Memory"], "4G");
    assert_eq!(
        fresh.ok_json(&["inspect", &registry.url("team/site:stable")])["digest"],
        new.as_str()
    );

    // Pulls are cached by digest: with the registry gone, the pinned package still resolves,
    // and `pull` writes a layout with the same digest.
    drop(registry);
    assert_eq!(fresh.ok_json(&["inspect", &old_ref])["digest"], old.as_str());
    let pulled = fresh.ok(&["pull", &old_ref, "--out", "pulled"]).stdout;
    assert_eq!(pulled.trim(), old);
    assert_eq!(fresh.ok_json(&["inspect", "pulled"])["digest"], old.as_str());
}

#[test]
fn an_invalid_workflow_is_not_packaged() {
    let lyra = site();
    lyra.write_workflow(
        "site",
        "steps:\n  db:\n    resource: Foobernetes::Instance\n    value:\n      location: $nowhere\n",
    );
    let validate = lyra.run(&["validate", "site"]);
    let run = lyra.run(&["package", "site", "--out", "site.tar"]);
    assert_eq!(run.code, validate.code, "{run}");
    expect_failure(&run, &["workflows/site.yaml:5:", "nowhere"]);
    assert!(!lyra.path("site.tar").exists(), "nothing written");
    // A version that is not SemVer is refused too.
    lyra.write_workflow("site", SITE);
    let run = lyra.run(&["package", "site", "--version", "one", "--out", "site.tar"]);
    run.expect_code(2);
    run.expect_stderr(&["'one' is not a SemVer version"]);
}

/// `alice` / `s3cret`, bcrypt (cost 4: quick), as `htpasswd -B` writes it.
const ALICE: &str = "alice:$2b$04$1TvRGIaF0jZVi72nexJGiuDPr0nTnK1GXNd2EoWD8T5rruQnpdsfC";

#[test]
fn credentials_come_from_the_environment_or_the_docker_config() {
    let registry = match Registry::start_with_auth(ALICE) {
        Some(r) => r,
        None => return,
    };
    let lyra = site();
    package(&lyra, "1.0.0", "site.tar");
    let target = registry.url("team/site");
    // Anonymous: refused, saying how to give credentials, and never showing any.
    let run = lyra.run(&["push", "site.tar", &target]);
    expect_failure(&run, &["access denied", "LYRA_REGISTRY_USERNAME"]);

    let env = site()
        .with_env("LYRA_REGISTRY_USERNAME", "alice")
        .with_env("LYRA_REGISTRY_PASSWORD", "s3cret");
    package(&env, "1.0.0", "site.tar");
    let pinned = push(&env, "site.tar", &target);
    assert_eq!(env.ok_json(&["inspect", &pinned])["name"], "site");

    // A wrong password is refused too, and not echoed.
    let wrong = Lyra::new()
        .with_env("LYRA_REGISTRY_USERNAME", "alice")
        .with_env("LYRA_REGISTRY_PASSWORD", "hunter2");
    let run = wrong.run(&["inspect", &pinned]);
    expect_failure(&run, &["access denied"]);
    assert!(!run.stderr.contains("hunter2"), "{run}");

    // The Docker config's `auths` (DOCKER_CONFIG points into the test directory).
    let docker = Lyra::new();
    docker.write(
        ".docker/config.json",
        format!(
            r#"{{"auths": {{"{}": {{"auth": "YWxpY2U6czNjcmV0"}}}}}}"#,
            registry.addr()
        ),
    );
    assert_eq!(
        docker.ok_json(&["inspect", &pinned])["digest"],
        env.ok_json(&["inspect", &pinned])["digest"]
    );
}

/// Asserts `doc` matches `$defs/NAME` of docs/json/lyra.schema.json.
#[track_caller]
fn conforms(doc: &Value, name: &str) {
    let errors = super::json_output::schema_errors(doc, name);
    assert!(errors.is_empty(), "not a {name} document: {errors:#?}\n{doc:#}");
}

#[test]
fn package_commands_print_documents_that_match_their_schemas() {
    let registry = registry_or_skip!();
    let lyra = site();
    let package = lyra.ok_json(&["package", "site", "--version", "2.0.0", "--out", "site.tar"]);
    conforms(&package, "package");
    assert_eq!(package["path"], "site.tar");
    let pushed = lyra.ok_json(&["push", "site.tar", &registry.url("team/site")]);
    conforms(&pushed, "push");
    assert_eq!(pushed["digest"], package["digest"]);
    let pulled = lyra.ok_json(&["pull", pushed["reference"].as_str().unwrap(), "--out", "pulled.tar"]);
    conforms(&pulled, "pull");
    assert_eq!(
        std::fs::read(lyra.path("pulled.tar")).unwrap(),
        std::fs::read(lyra.path("site.tar")).unwrap(),
        "a pulled package is the pushed one, byte for byte"
    );
    conforms(&lyra.ok_json(&["inspect", "pulled.tar"]), "inspect");
    // Failures are error documents.
    let run = lyra.run(&["inspect", "nowhere.tar", "-o", "json"]);
    run.expect_code(1);
    conforms(&run.json(), "error");
}
