//! Secrets through every CLI output: one deployment with sensitive parameters goes through
//! create, update (a provider echoing the old and new secret), no-op, replace, a failing step
//! whose provider quotes the secret, a bad input, `state rm` and delete, and every command's
//! stdout and stderr, text and `-o json`, with `-v`, is searched for every secret value used.
//! Only `state export` carries them: it moves the state, and its help says so. The keys of a
//! secret hash are secrets too, also as the ids of a collection over it.

use integration_tests::{Lyra, Run, step};

const WORKFLOW: &str = "\
parameters:
  password: Sensitive[String]
  delay: Sensitive[String]
  zone: String
returns: [token, copy, ip]
steps:
  login:
    returns: {token: output}
    resource: Null::Resource
    value:
      input: $password
      triggers_replace: $zone
  relay:
    returns: {copy: output}
    resource: Null::Resource
    value:
      input: {nested: [$token, plain]}
  wait:
    resource: Time::Sleep
    value:
      create_duration: $delay
  vm:
    returns: {ip: instanceIP}
    resource: Foobernetes::Instance
    value:
      location: $zone
      image: $password
      cpus: 1
      memory: 1G
";

/// Every secret any step of the test uses.
const SECRETS: &[&str] = &[
    "first-Pa55w0rd",
    "second-Pa55w0rd",
    "third-Pa55w0rd",
    "77-bad-duration-Pa55w0rd",
];

struct Outputs {
    lyra: Lyra,
    runs: Vec<Run>,
}

impl Outputs {
    /// Runs `lyra ARGS` expecting `code`, keeping the output for the final search.
    #[track_caller]
    fn run(&mut self, code: i32, args: &[&str]) -> &Run {
        let run = self.lyra.run(args);
        run.expect_code(code);
        self.runs.push(run);
        self.runs.last().expect("just pushed")
    }

    /// The stage's run in text and JSON, with the given secrets.
    #[track_caller]
    fn both(&mut self, code: i32, args: &[&str]) -> (String, serde_json::Value) {
        let text = self.run(code, args).stdout.clone();
        let mut json_args = args.to_vec();
        json_args.extend(["-o", "json"]);
        let json = self.run(code, &json_args).json();
        (text, json)
    }

    /// Everything that reads the state, in text and JSON.
    fn read_back(&mut self) {
        self.read_back_of("web");
    }

    /// Everything that reads the state of `deployment`, in text and JSON.
    fn read_back_of(&mut self, deployment: &str) {
        for args in [
            vec!["state", "show", deployment],
            vec!["state", "list"],
            vec!["history", deployment],
            vec!["output", deployment],
            vec!["delete", deployment, "--dry-run"],
        ] {
            self.both(0, &args);
        }
    }
}

fn vars(password: &str, delay: &str, zone: &str) -> Vec<String> {
    vec![
        "--var".to_owned(),
        format!("password={password}"),
        "--var".to_owned(),
        format!("delay={delay}"),
        "--var".to_owned(),
        format!("zone={zone}"),
    ]
}

fn with<'a>(args: &[&'a str], extra: &'a [String]) -> Vec<&'a str> {
    args.iter().copied().chain(extra.iter().map(String::as_str)).collect()
}

#[test]
fn no_cli_output_shows_a_secret() {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WORKFLOW);
    let mut out = Outputs { lyra, runs: Vec::new() };
    let masked = "(sensitive)";

    // Create.
    let v = vars(SECRETS[0], "1ms", "eu1");
    let (plan, _) = out.both(0, &with(&["plan", "web"], &v));
    assert!(plan.contains(masked), "{plan}");
    let (returns, report) = out.both(0, &with(&["apply", "web", "-v"], &v));
    assert!(returns.contains("token: \"(sensitive)\""), "{returns}");
    assert!(
        returns.contains("copy: \"(sensitive)\""),
        "derived through a provider: {returns}"
    );
    assert!(returns.contains("ip: \"10.0.0."), "not secret: {returns}");
    assert_eq!(report["counts"]["unchanged"], 4, "{report:#}");
    out.read_back();

    // Update: `output` echoes the old secret until the apply, the new one after it.
    let v = vars(SECRETS[1], "1ms", "eu1");
    let (_, plan) = out.both(0, &with(&["plan", "web"], &v));
    assert_eq!(step(&plan, "login")["action"], "update", "{plan:#}");
    assert_eq!(plan["returns"]["token"], masked, "{plan:#}");
    out.both(0, &with(&["apply", "web", "-v"], &v));
    // No-op.
    let (_, report) = out.both(0, &with(&["apply", "web", "-v"], &v));
    assert_eq!(report["counts"]["unchanged"], 4, "{report:#}");
    out.read_back();

    // Replace (the zone changes), with a new secret.
    let v = vars(SECRETS[2], "1ms", "eu2");
    let (_, plan) = out.both(0, &with(&["plan", "web"], &v));
    assert_eq!(step(&plan, "login")["action"], "replace", "{plan:#}");
    out.run(0, &with(&["apply", "web", "-v"], &v));

    // A failure: Time::Sleep quotes the bad duration in its error.
    let v = vars(SECRETS[2], SECRETS[3], "eu2");
    let (_, report) = out.both(1, &with(&["apply", "web", "-v"], &v));
    let wait = step(&report, "wait");
    assert_eq!(wait["status"], "failed", "{report:#}");
    let error = wait["error"].as_str().expect("an error");
    assert!(error.contains("'(sensitive)' is not a duration"), "{error}");
    out.read_back();

    // Bad input: a secret of the wrong type.
    let mut v = vars(SECRETS[2], "1ms", "eu2");
    v[1] = format!("password=[{}]", SECRETS[0]);
    for args in [["plan", "web"], ["apply", "web"]] {
        let run = out.run(1, &with(&args, &v));
        assert!(run.stderr.contains("the sensitive value is not shown"), "{run}");
        out.run(1, &with(&[args[0], args[1], "-o", "json"], &v));
    }

    // The export carries the current secret (and says so in its help).
    let export = out.lyra.run(&["state", "export"]);
    export.expect_ok();
    assert!(export.stdout.contains(SECRETS[2]), "{export}");
    let help = out.lyra.run(&["state", "export", "--help"]);
    assert!(help.stdout.contains("secrets included"), "{help}");

    // Forget one resource; delete the rest.
    out.run(0, &["state", "rm", "web", "relay", "-o", "json"]);
    out.run(0, &["delete", "web", "-v"]);
    out.both(0, &["history", "web"]);

    assert!(out.runs.len() > 40, "{} runs", out.runs.len());
    for run in &out.runs {
        for secret in SECRETS {
            assert!(
                !run.stdout.contains(secret) && !run.stderr.contains(secret),
                "{secret} leaked:\n{run}"
            );
        }
    }
}

/// A collection over a secret hash (issue 9, F5): its keys are as secret as its values, so
/// the iterations' ids are digests of the keys, stable from run to run.
const KEYED: &str = "\
parameters:
  users: Sensitive
returns: [made]
steps:
  accounts:
    eachPair: $users
    as: [name, role]
    into: made
    step:
      returns: output
      resource: Null::Resource
      value:
        input: {user: $name, role: $role}
";

/// The keys of the secret hash.
const KEYS: &[&str] = &["alice-K3yS3cret", "bob-K3yS3cret", "carol-K3yS3cret"];

#[test]
fn no_cli_output_shows_a_key_of_a_secret_hash() {
    let lyra = Lyra::new();
    lyra.write_workflow("team", KEYED);
    let mut out = Outputs { lyra, runs: Vec::new() };
    let users = |keys: &[&str]| {
        let entries: Vec<String> = keys.iter().map(|k| format!("{k}: {}", k.len())).collect();
        vec!["--var".to_owned(), format!("users={{{}}}", entries.join(", "))]
    };
    let ids = |report: &serde_json::Value| -> Vec<String> {
        let mut ids: Vec<String> = report["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .filter(|s| s["type"] == "Null::Resource")
            .map(|s| s["step"].as_str().expect("a step id").to_owned())
            .collect();
        ids.sort();
        ids
    };

    let two = users(&KEYS[..2]);
    out.both(0, &with(&["plan", "team"], &two));
    let report = out.run(0, &with(&["apply", "team", "-v", "-o", "json"], &two)).json();
    assert_eq!(report["counts"]["created"], 2, "{report:#}");
    let first = ids(&report);
    assert_eq!(first.len(), 2, "{report:#}");
    for id in &first {
        let digest = id.strip_prefix("accounts/").expect("under the collection");
        assert!(
            digest.len() == 16 && digest.chars().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );
    }
    // Stable: the same keys name the same resources, and a new key adds exactly one.
    let (_, report) = out.both(0, &with(&["apply", "team", "-v"], &two));
    assert_eq!(report["counts"]["unchanged"], 2, "{report:#}");
    out.read_back_of("team");
    let three = users(KEYS);
    let report = out.run(0, &with(&["apply", "team", "-v", "-o", "json"], &three)).json();
    assert_eq!(report["counts"]["created"], 1, "{report:#}");
    assert_eq!(report["counts"]["unchanged"], 2, "{report:#}");
    let all = ids(&report);
    assert!(first.iter().all(|id| all.contains(id)), "{first:?} {all:?}");
    out.read_back_of("team");

    // A removed key deletes exactly its resource.
    let report = out
        .run(0, &with(&["apply", "team", "-o", "json"], &users(&KEYS[1..])))
        .json();
    assert_eq!(report["counts"]["deleted"], 1, "{report:#}");
    out.run(0, &["delete", "team", "-v"]);
    out.both(0, &["history", "team"]);

    for run in &out.runs {
        for key in KEYS {
            assert!(
                !run.stdout.contains(key) && !run.stderr.contains(key),
                "{key} leaked:\n{run}"
            );
        }
    }
}
