//! Attributes only a provider computes (ids, `Null::Resource`'s `output`) are read-only:
//! setting one could never converge (every apply saw a difference and updated), so `validate`,
//! `plan` and `apply` refuse it, naming the attribute and where it is set. Attributes a
//! provider fills in but lets a workflow pin (`instanceIP`, `loadBalancerIP`) stay settable
//! and converge.

use integration_tests::{Lyra, count};

const SETS_COMPUTED: &str = "\
steps:
  vm:
    resource: Foobernetes::Instance
    value:
      instanceID: i-12345678
      location: eu1
      image: img
      cpus: 1
      memory: 1G
  web:
    resource: Foobernetes::WebServer
    value:
      port: 80
      appServers: []
      webServerID: ws-1
  lb:
    resource: Foobernetes::Loadbalancer
    value:
      loadBalancerID: lb-1
      webServerIDs: []
  echo:
    resource: Null::Resource
    value:
      input: 1
      output: 1
";

#[test]
fn setting_a_computed_attribute_is_refused_with_its_name_and_place() {
    let lyra = Lyra::new();
    lyra.write_workflow("w", SETS_COMPUTED);
    for cmd in ["validate", "plan", "apply"] {
        let run = lyra.run(&[cmd, "w"]);
        run.expect_code(1).expect_stderr(&[
            "attribute 'instanceID' of Foobernetes::Instance in step 'vm' is computed by the provider and cannot be set",
            "workflows/w.yaml:5:7",
            "attribute 'webServerID' of Foobernetes::WebServer in step 'web' is computed",
            "workflows/w.yaml:15:7",
            "attribute 'loadBalancerID' of Foobernetes::LoadBalancer in step 'lb'",
            "attribute 'output' of Null::Resource in step 'echo'",
            "4 problems found",
        ]);
    }
    let json = lyra.run(&["validate", "w", "-o", "json"]);
    json.expect_code(1);
    let errors = json.json()["diagnostics"].as_array().expect("diagnostics").clone();
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert_eq!(
        (errors[0]["line"].as_u64(), errors[0]["column"].as_u64()),
        (Some(5), Some(7))
    );
    assert!(
        errors[0]["help"]
            .as_str()
            .unwrap()
            .contains("returns: {myName: instanceID}"),
        "{errors:?}"
    );
    assert!(!lyra.path("deployment.json").exists(), "nothing was created");
}

#[test]
fn pinned_provided_attributes_converge() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "w",
        "\
returns: [ip, id]
steps:
  vm:
    returns: {ip: instanceIP, id: instanceID}
    resource: Foobernetes::Instance
    value:
      instanceIP: 10.9.9.9
      location: eu1
      image: img
      cpus: 1
      memory: 1G
  lb:
    resource: Foobernetes::LoadBalancer
    value:
      loadBalancerIP: 10.0.0.1
      webServerIDs: [$id]
",
    );
    let first = lyra.ok_json(&["apply", "w"]);
    assert_eq!(count(&first, "created"), 2, "{first:#}");
    assert_eq!(first["returns"]["ip"], "10.9.9.9");
    let again = lyra.ok_json(&["apply", "w"]);
    assert_eq!(count(&again, "unchanged"), 2, "{again:#}");
    assert_eq!(count(&lyra.ok_json(&["plan", "w"]), "unchanged"), 2);
}
