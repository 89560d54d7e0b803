//! `lyra import DEPLOYMENT STEP EXTERNAL_ID`: a resource made outside Lyra (here: one whose
//! record was forgotten, then edited by hand in the Foobernetes cloud) is adopted into its
//! step; nothing changes in the cloud until the next apply, whose plan `import` shows.

use integration_tests::{Lyra, step};
use serde_json::json;

const VM: &str = "\
steps:
  db:
    returns: {ip: instanceIP}
    resource: Foobernetes::Instance
    value:
      location: eu1
      image: postgres:14
      cpus: 2
      memory: 4G
  web:
    resource: Foobernetes::Instance
    value:
      location: eu1
      image: nginx
      cpus: 1
      memory: 1G
      config: {db: $ip}
";

/// Applies `vm`, forgets its `web` record and edits that instance by hand: an instance Lyra
/// does not know, unlike the workflow. Returns its id.
fn orphaned_web(lyra: &Lyra) -> String {
    lyra.write_workflow("vm", VM);
    lyra.ok(&["apply", "vm"]);
    let id = lyra.resources("vm")["web"].clone();
    lyra.ok(&["state", "rm", "vm", "web"]);
    let mut cloud = lyra.cloud();
    cloud["Instances"][&id]["Cpus"] = json!(4);
    lyra.write("deployment.json", cloud.to_string());
    id
}

#[test]
fn an_existing_resource_is_adopted_and_the_next_plan_shown() {
    let lyra = Lyra::new();
    let id = orphaned_web(&lyra);
    let before = lyra.cloud();

    let run = lyra.ok(&["import", "vm", "web", &id]);
    assert!(
        run.stdout
            .contains(&format!("Imported Foobernetes::Instance {id:?} as step 'web'")),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("~ web (Foobernetes::Instance) will be updated in place"),
        "{run}"
    );
    assert!(run.stdout.contains("~ cpus: 4 -> 1"), "{run}");
    assert_eq!(lyra.cloud(), before, "import changes no resource");
    assert_eq!(lyra.resources("vm")["web"], id);
    let history = lyra.history("vm");
    assert_eq!(history[0]["operation"], "import", "{history:?}");
    assert!(
        history[0]["note"].as_str().is_some_and(|n| n.contains(&id)),
        "{history:?}"
    );

    // The next apply converges the adopted instance: no new one is made.
    let apply = lyra.ok_json(&["apply", "vm"]);
    assert_eq!(step(&apply, "web")["action"], "update", "{apply:#}");
    assert_eq!(lyra.cloud()["Instances"][&id]["Cpus"], 1);
    assert_eq!(lyra.cloud()["Instances"].as_object().map(|o| o.len()), Some(2));
}

#[test]
fn import_json_is_a_document_with_the_plan() {
    let lyra = Lyra::new();
    let id = orphaned_web(&lyra);
    let doc = lyra.ok_json(&["import", "vm", "web", &id]);
    let errors = super::json_output::schema_errors(&doc, "adopt");
    assert!(errors.is_empty(), "not an adopt document: {errors:#?}\n{doc:#}");
    assert_eq!(doc["step"], "web", "{doc:#}");
    assert_eq!(doc["type"], "Foobernetes::Instance", "{doc:#}");
    assert_eq!(doc["external_id"], id, "{doc:#}");
    assert!(doc["run"].is_i64(), "{doc:#}");
    assert_eq!(step(&doc["plan"], "web")["action"], "update", "{doc:#}");
}

#[test]
fn what_cannot_be_imported_is_refused_and_nothing_recorded() {
    let lyra = Lyra::new();
    let id = orphaned_web(&lyra);
    let runs = lyra.history("vm").len();
    let refused = |args: &[&str], kind: &str| {
        let mut all = vec!["import"];
        all.extend(args);
        all.extend(["-o", "json"]);
        let run = lyra.run(&all);
        run.expect_code(1);
        assert_eq!(run.json()["error"]["kind"], kind, "{run}");
        run
    };
    refused(&["vm", "web", "i-nosuch"], "not_found");
    let typo = refused(&["vm", "wbe", &id], "not_found");
    let near = typo.json()["error"]["did_you_mean"].clone();
    assert!(near.as_array().is_some_and(|n| n.contains(&json!("web"))), "{typo}");
    let db = lyra.resources("vm")["db"].clone();
    refused(&["vm", "db", &db], "conflict");
    refused(&["vm", "web/0", &id], "invalid_input");
    // A name with a line break in it is quoted: it cannot forge a line of the message.
    let forged = lyra.run(&["import", "vm", "web\nerror: forged", &id]);
    forged.expect_code(1);
    assert!(
        !forged.stderr.lines().any(|l| l.starts_with("error: forged")),
        "{forged}"
    );
    assert_eq!(lyra.history("vm").len(), runs, "no run recorded for a refusal");
    assert!(!lyra.resources("vm").contains_key("web"));
}
