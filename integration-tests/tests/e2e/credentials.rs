//! State URLs carry credentials (a password in the userinfo or in `?password=`): they never
//! show in messages (text or `-o json`), the controller's logs, `--help`, or anything stored
//! (history notes, exports, later migrations). The real `lyra` and `lyra-controller` binaries
//! against the real Postgres server (which trusts local connections, so a password in the URL
//! is accepted and ignored).

use std::process::{Command, Stdio};
use std::time::Duration;

use integration_tests::{Lyra, Run, cluster_or_skip, controller_bin, pg_or_skip, run_command, wait_until};

const SECRET: &str = "hunter2-Zq9";

/// `url` with `user:SECRET@` as its userinfo and `password=SECRET` added to its query.
fn with_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let user = authority
        .rsplit_once('@')
        .map_or("postgres", |(u, _)| u.split(':').next().unwrap_or("postgres"));
    let sep = if tail.contains('?') { '&' } else { '?' };
    format!("{scheme}://{user}:{SECRET}@{host}{tail}{sep}password={SECRET}")
}

#[track_caller]
fn assert_no_secret(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} shows the password:\n{text}");
}

#[track_caller]
fn assert_run_has_no_secret(run: &Run) {
    assert_no_secret("stdout", &run.stdout);
    assert_no_secret("stderr", &run.stderr);
}

/// Unreachable servers, bad URLs and parameters: every failure names the store without its
/// credentials, in text and in `-o json`, from the flag and from `LYRA_STATE`.
#[test]
fn failing_state_urls_never_show_the_password() {
    let lyra = Lyra::new();
    let unreachable = format!("postgres://lyra:{SECRET}@127.0.0.1:1/state?password={SECRET}&schema=s");
    for args in [
        vec!["state", "list"],
        vec!["state", "list", "-o", "json"],
        vec!["history", "web", "-o", "json"],
        vec!["delete", "web"],
    ] {
        let mut with_flag = args.clone();
        with_flag.extend(["--state", &unreachable]);
        let run = lyra.run(&with_flag);
        run.expect_code(1).expect_stderr(&["127.0.0.1:1", "password=***"]);
        assert_run_has_no_secret(&run);
    }
    let env = Lyra::new().with_state(&unreachable);
    let run = env.run(&["state", "list", "-o", "json"]);
    run.expect_code(1).expect_stderr(&["127.0.0.1:1"]);
    assert_run_has_no_secret(&run);

    // URLs lyra-state refuses: the message says why, never with the secret.
    for (url, why) in [
        (format!("postgress://u:{SECRET}@h/db"), "expected sqlite://"),
        (format!("mysql://u:{SECRET}@h:99999/db"), "expected sqlite://"),
        (
            format!("postgres://h/db?sslpassword={SECRET}"),
            "unknown parameter \"sslpassword\"",
        ),
        (format!("postgres://u:{SECRET}@h/db?schema=Bad"), "schema"),
        (format!("sqlite:s.db?key={SECRET}"), "unknown parameter \"key\""),
        (format!("host=h user=u password={SECRET}"), "libpq connection string"),
        (format!("postgres://u:{SECRET}@h:port/db"), "invalid state store URL"),
    ] {
        for output in ["text", "json"] {
            let run = lyra.run(&["state", "list", "--state", &url, "-o", output]);
            run.expect_code(1).expect_stderr(&[why]);
            assert_run_has_no_secret(&run);
        }
        let run = lyra.run(&["state", "migrate", "--from", &url, "--to", "other.db"]);
        run.expect_code(1);
        assert_run_has_no_secret(&run);
    }
    assert!(
        !lyra.path(format!("host=h user=u password={SECRET}")).exists(),
        "a libpq string is not a SQLite file name"
    );

    // `--help` shows where LYRA_STATE comes from, not its value.
    for args in [
        vec!["state", "list", "--help"],
        vec!["apply", "--help"],
        vec!["state", "export", "--help"],
    ] {
        let run = env.ok(&args);
        assert!(run.stdout.contains("LYRA_STATE"), "{run}");
        assert_run_has_no_secret(&run);
    }
}

/// `state migrate` notes where a deployment came from without the password; `history`,
/// `state export` and a second migration carry no credential either.
#[test]
fn migrations_never_store_the_password() {
    let pg = pg_or_skip!();
    let secret_url = with_password(pg.url());
    let lyra = Lyra::new();
    lyra.write_workflow(
        "web",
        "steps:\n  vm:\n    resource: Null::Resource\n    value: {input: x}\n",
    );
    lyra.ok(&["apply", "web"]);

    let run = lyra.ok(&["state", "migrate", "--from", ".lyra/state.db", "--to", &secret_url]);
    assert_run_has_no_secret(&run);
    let history = lyra.ok(&["history", "web", "--state", &secret_url, "-o", "json"]);
    assert_run_has_no_secret(&history);
    let history = history.json();
    let note = history[0]["note"].as_str().expect("a note");
    assert!(note.starts_with("migrated from .lyra/state.db (store "), "{note}");

    // And back, so the note names the Postgres store, and a second hop copies both notes.
    let run = lyra.ok(&["state", "migrate", "--from", &secret_url, "--to", "back.db"]);
    assert_run_has_no_secret(&run);
    let run = lyra.ok(&["state", "migrate", "--from", "back.db", "--to", "third.db"]);
    assert_run_has_no_secret(&run);
    let history = lyra.ok(&["history", "web", "--state", "third.db", "-o", "json"]);
    assert_run_has_no_secret(&history);
    let notes: Vec<String> = history
        .json()
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|r| r["note"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(
        notes[1].contains("127.0.0.1") && notes[1].contains(":***@") && notes[1].contains("password=***"),
        "the Postgres hop is noted, without its password: {notes:?}"
    );
    let text = lyra.ok(&["history", "web", "--state", "third.db"]);
    assert_run_has_no_secret(&text);
    let export = lyra.ok(&["state", "export", "--state", "third.db"]);
    assert_run_has_no_secret(&export);
    lyra.ok(&["state", "export", "--state", "third.db", "-f", "web.json"]);
    assert_no_secret("the export file", &lyra.read("web.json"));
    for db in ["back.db", "third.db"] {
        assert_no_secret(db, &String::from_utf8_lossy(&std::fs::read(lyra.path(db)).expect("db")));
    }
}

/// `PGPASSWORD` is the way to give the password without putting it in the URL (or on the
/// command line, where `ps` shows it).
#[test]
fn pgpassword_keeps_the_password_out_of_the_url() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url()).with_env("PGPASSWORD", SECRET);
    lyra.write_workflow(
        "web",
        "steps:\n  vm:\n    resource: Null::Resource\n    value: {input: x}\n",
    );
    let run = lyra.ok(&["apply", "web"]);
    assert_run_has_no_secret(&run);
    let run = lyra.ok(&["state", "list"]);
    assert_run_has_no_secret(&run);
}

/// The controller's startup failure (and its log) names the state without the password.
#[test]
fn controller_startup_failure_hides_the_password() {
    let lyra = Lyra::new();
    let url = format!("postgres://lyra:{SECRET}@127.0.0.1:1/state?password={SECRET}");
    for (flag, env) in [(Some(url.as_str()), None), (None, Some(url.as_str()))] {
        let mut cmd = Command::new(controller_bin());
        cmd.current_dir(lyra.dir())
            .args(["--health-addr", "127.0.0.1:0", "--log-format", "text"])
            .env_remove("LYRA_STATE")
            .env("KUBECONFIG", lyra.path("no-kubeconfig"))
            .stdin(Stdio::null());
        if let Some(url) = flag {
            cmd.args(["--state", url]);
        }
        if let Some(url) = env {
            cmd.env("LYRA_STATE", url);
        }
        let run = run_command(cmd, &["lyra-controller"]);
        assert_eq!(run.code, Some(1), "{run}");
        assert!(run.stderr.contains("127.0.0.1:1"), "{run}");
        assert_run_has_no_secret(&run);
    }
    let help = run_command(
        {
            let mut cmd = Command::new(controller_bin());
            cmd.arg("--help").env("LYRA_STATE", &url);
            cmd
        },
        &["lyra-controller", "--help"],
    );
    assert!(help.stdout.contains("LYRA_STATE"), "{help}");
    assert_run_has_no_secret(&help);
}

/// A running controller logs which state it uses, without the password (sqlx's debug logs
/// included).
#[test]
fn controller_logs_never_show_the_password() {
    let pg = pg_or_skip!();
    let cluster = cluster_or_skip!();
    let lyra = &cluster.lyra;
    let log = lyra.path("controller.log");
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new(controller_bin())
        .current_dir(lyra.dir())
        .args(["--state", &with_password(pg.url()), "--health-addr", "127.0.0.1:0"])
        .env_remove("LYRA_STATE")
        .env("KUBECONFIG", cluster.emulator.kubeconfig_path())
        .env(
            "RUST_LOG",
            "debug,kube=warn,hyper=warn,hyper_util=warn,tower=warn,h2=warn,rustls=warn",
        )
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start lyra-controller");
    let running = wait_until(Duration::from_secs(60), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("controller running"))
    });
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).expect("log");
    let tail = &text[text.len().saturating_sub(4000)..];
    assert!(running, "the controller did not start:\n{tail}");
    let line = text.lines().find(|l| l.contains("controller running")).expect("logged");
    assert!(line.contains("127.0.0.1") && line.contains("password=***"), "{line}");
    assert_no_secret("the controller's log", &text);
}
