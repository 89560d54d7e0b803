use serde_json::json;

use super::*;

fn workflow(text: &str) -> Workflow {
    lyra_core::yaml::parse_workflow("webapp", lyra_core::diag::FileId(0), text).expect("valid workflow")
}

const WEBAPP: &str = "\
parameters:
  replicas: {type: 'Integer[1, 5]', default: 2, doc: How many web servers.}
  region: {type: 'Enum[eu1, eu2]', lookup: web.region}
  tags: {type: 'Hash[String, String]'}
  owner: {type: 'Optional[String]'}
  password: {type: Sensitive}
  ports: {type: 'Array[Integer]'}
  size: {type: 'Struct[{cpus => Integer, memory => Optional[String]}]'}
  port: {type: 'Variant[Integer, String]'}
  constant: {value: 7}
steps: {}
";

fn names() -> KindNames {
    KindNames::new("WebApp", None)
}

fn package() -> PackageInfo {
    PackageInfo {
        definition: "webapp".to_owned(),
        digest: "sha256:abc".to_owned(),
        version: "1.0.0".to_owned(),
    }
}

fn schema(text: &str) -> JSONSchemaProps {
    spec_schema(&workflow(text)).expect("schema")
}

#[test]
fn names_default_to_the_kind_in_lower_case() {
    let n = KindNames::new("WebApp", None);
    assert_eq!((n.plural.as_str(), n.singular.as_str()), ("webapps", "webapp"));
    assert_eq!(n.crd_name(), "webapps.workflows.lyra.dev");
    assert_eq!(KindNames::new("Policy", Some("x.io")).plural, "policies");
    assert_eq!(KindNames::new("Gateway", None).plural, "gateways");
    assert_eq!(KindNames::new("Ingress", None).plural, "ingresses");
}

#[test]
fn every_type_maps_to_a_structural_schema() {
    let s = serde_json::to_value(schema(WEBAPP)).unwrap();
    let p = &s["properties"];
    assert_eq!(
        p["replicas"],
        json!({"type": "integer", "format": "int64", "minimum": 1.0, "maximum": 5.0, "default": 2, "description": "How many web servers."})
    );
    assert_eq!(p["region"], json!({"type": "string", "enum": ["eu1", "eu2"]}));
    assert_eq!(
        p["tags"],
        json!({"type": "object", "additionalProperties": {"type": "string"}})
    );
    assert_eq!(p["owner"], json!({"type": "string", "nullable": true}));
    assert_eq!(p["password"]["required"], json!(["secretKeyRef"]));
    assert_eq!(
        p["password"]["properties"]["secretKeyRef"]["required"],
        json!(["name", "key"])
    );
    assert_eq!(
        p["ports"],
        json!({"type": "array", "items": {"type": "integer", "format": "int64"}})
    );
    assert_eq!(p["size"]["required"], json!(["cpus"]));
    assert_eq!(p["port"], json!({"x-kubernetes-int-or-string": true}));
    // A parameter with a value is a constant of the workflow, not an input.
    assert!(p.get("constant").is_none());
    assert!(p[SETTINGS_KEY]["properties"]["deletionPolicy"]["enum"].is_array());
    // Required: neither Optional nor defaulted.
    assert_eq!(
        s["required"],
        json!(["region", "tags", "password", "ports", "size", "port"])
    );
}

#[test]
fn reserved_names_and_nested_secrets_are_refused() {
    let e = spec_schema(&workflow("parameters: [lyra]\nsteps: {}\n")).unwrap_err();
    assert_eq!(e, KindError::Reserved("lyra".to_owned()));
    assert!(e.to_string().contains("rename the parameter"), "{e}");
    let e = spec_schema(&workflow(
        "parameters:\n  a: {type: 'Array[Sensitive[String]]'}\nsteps: {}\n",
    ))
    .unwrap_err();
    assert_eq!(
        e,
        KindError::NestedSensitive {
            param: "a".to_owned(),
            within: "list"
        }
    );
}

#[test]
fn the_crd_is_namespaced_with_status_and_columns() {
    let crd = generate_crd(&names(), &workflow(WEBAPP), &package()).unwrap();
    let c = serde_json::to_value(&crd).unwrap();
    assert_eq!(c["metadata"]["name"], "webapps.workflows.lyra.dev");
    assert_eq!(c["metadata"]["annotations"][DIGEST_ANNOTATION], "sha256:abc");
    assert!(
        c["metadata"].get("ownerReferences").is_none(),
        "a definition never owns its CRD's lifetime"
    );
    assert_eq!(c["spec"]["scope"], "Namespaced");
    assert_eq!(c["spec"]["names"]["categories"], json!(["lyra"]));
    let v = &c["spec"]["versions"][0];
    assert_eq!(v["subresources"], json!({"status": {}}));
    let columns: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Phase", "Ready", "Steps", "Approval", "Drifted", "Age"]);
    let root = &v["schema"]["openAPIV3Schema"];
    assert!(root["properties"]["status"]["properties"]["conditions"].is_object());
    assert_eq!(root["properties"]["spec"]["properties"]["replicas"]["maximum"], 5.0);
    let bad = generate_crd(&KindNames::new("web-app", None), &workflow(WEBAPP), &package()).unwrap_err();
    assert!(matches!(bad, KindError::BadKind(_)));
}

fn changes(old: &str, new: &str) -> Vec<String> {
    schema_changes(&schema(old), &schema(new))
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn compatible_changes_are_not_breaking() {
    let old = "parameters:\n  n: {type: 'Integer[1, 5]'}\n  e: {type: 'Enum[a, b]'}\nsteps: {}\n";
    let new = "parameters:\n  n: {type: 'Integer[0, 9]', doc: Count.}\n  e: {type: 'Enum[a, b, c]'}\n  extra: {type: 'Optional[String]'}\n  d: {type: String, default: x}\nsteps: {}\n";
    assert_eq!(
        changes(old, new),
        [
            "spec.d: added (compatible)",
            "spec.e: enum widened: now also accepts \"c\" (compatible)",
            "spec.extra: added (compatible)",
            "spec.n: description changed (compatible)",
            "spec.n: minimum changed from 1 to 0 (compatible)",
            "spec.n: maximum changed from 5 to 9 (compatible)",
        ]
    );
    assert!(changes(WEBAPP, WEBAPP).is_empty());
}

#[test]
fn breaking_changes_are_each_listed() {
    let old = "parameters:\n  n: {type: 'Integer[1, 5]'}\n  e: {type: 'Enum[a, b]'}\n  gone: String\n  s: String\n  o: {type: 'Optional[String]'}\n  t: {type: 'Array[String]'}\nsteps: {}\n";
    let new = "parameters:\n  n: {type: 'Integer[2, 5]'}\n  e: {type: 'Enum[a]'}\n  s: Integer\n  o: String\n  t: {type: 'Array[Integer]'}\n  req: String\nsteps: {}\n";
    assert_eq!(
        changes(old, new),
        [
            "spec.e: enum narrowed: no longer accepts \"b\" (breaking)",
            "spec.gone: removed (breaking)",
            "spec.n: minimum changed from 1 to 2 (breaking)",
            "spec.o: now required (breaking)",
            "spec.o: no longer accepts null (breaking)",
            "spec.req: added, required (breaking)",
            "spec.s: type changed from string to integer (breaking)",
            "spec.t[*]: type changed from string to integer (breaking)",
        ]
    );
}

#[test]
fn an_instance_spec_becomes_the_data_the_parameters_read() {
    let wf = workflow(WEBAPP);
    let spec = json!({
        "replicas": 3,
        "region": "eu2",
        "tags": {"team": "web"},
        "password": {"secretKeyRef": {"name": "db", "key": "pw"}},
        "unknown": 1,
        "lyra": {"deletionPolicy": "Orphan", "suspend": true, "refreshInterval": "5m", "approval": "Manual",
                 "driftPolicy": "Report"}
    });
    let mut i = InstanceSpec::parse(&wf, &spec).unwrap();
    assert_eq!(
        i.data,
        json!({"replicas": 3, "web": {"region": "eu2"}, "tags": {"team": "web"}})
    );
    assert_eq!(i.deletion_policy, DeletionPolicy::Orphan);
    assert!(i.suspend);
    assert_eq!(i.approval, Approval::Manual);
    assert_eq!(i.drift_policy, DriftPolicy::Report);
    assert_eq!(i.refresh_interval.as_deref(), Some("5m"));
    assert_eq!(i.secret_refs.len(), 1);
    let r = i.secret_refs[0].clone();
    assert_eq!(
        (r.param.as_str(), r.name.as_str(), r.key.as_str()),
        ("password", "db", "pw")
    );
    i.insert_secret(&r, "s3cret".to_owned());
    assert_eq!(i.data["password"], "s3cret");

    let inline = InstanceSpec::parse(&wf, &json!({"password": "s3cret"})).unwrap_err();
    assert!(
        inline.contains("spec.password") && !inline.contains("s3cret"),
        "{inline}"
    );
    let policy = InstanceSpec::parse(&wf, &json!({"lyra": {"deletionPolicy": "Keep"}})).unwrap_err();
    assert!(policy.contains("spec.lyra.deletionPolicy"), "{policy}");
    let approval = InstanceSpec::parse(&wf, &json!({"lyra": {"approval": "Later"}})).unwrap_err();
    assert!(approval.contains("spec.lyra.approval"), "{approval}");
    assert_eq!(
        InstanceSpec::parse(&wf, &json!({})).unwrap().approval,
        Approval::Automatic
    );
    let drift = InstanceSpec::parse(&wf, &json!({"lyra": {"driftPolicy": "Fix"}})).unwrap_err();
    assert!(drift.contains("spec.lyra.driftPolicy"), "{drift}");
    assert_eq!(
        InstanceSpec::parse(&wf, &json!({})).unwrap().drift_policy,
        DriftPolicy::Correct
    );
}
