//! State URLs a user gets wrong in the ways generated passwords make likely: an unencoded
//! `?`, `&`, `#` or space in the password, a scheme missing its slashes, a libpq keyword
//! string with a quoted value. Every piece of the password stays out of every message: the
//! redacted URL, the reason (an "unknown parameter" that is really the rest of a password),
//! `-o json`, `state migrate`, and the controller's startup log. Found by the hostile
//! acceptance test of issue 9.

use std::process::{Command, Stdio};

use integration_tests::{Lyra, Run, controller_bin, run_command};

/// Two halves of one password, so a leak of either half is caught.
const HEAD: &str = "Zq9hunt";
const TAIL: &str = "Xk4pass";

#[track_caller]
fn assert_no_piece(run: &Run) {
    for piece in [HEAD, TAIL] {
        for (what, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
            assert!(
                !text.contains(piece),
                "{what} shows part of the password ({piece}):\n{run}"
            );
        }
    }
}

/// Each malformed URL and what its message must say instead of the password.
fn urls() -> Vec<(String, &'static str)> {
    vec![
        // The authority ends at the `?`: the rest of the password lands in the query.
        (
            format!("postgres://lyra:{HEAD}?{TAIL}@127.0.0.1/state"),
            "must be percent-encoded",
        ),
        // ... at a good port, so the URL parses.
        (
            format!("postgres://lyra:12345?{HEAD}{TAIL}@127.0.0.1/state"),
            "percent-encoded",
        ),
        (
            format!("postgres://lyra:{HEAD}#{TAIL}@127.0.0.1/state"),
            "invalid state store URL",
        ),
        // An `&` in a password given as a parameter.
        (
            format!("postgres://lyra@127.0.0.1/state?password={HEAD}&{TAIL}"),
            "parameter 2 of the query is unknown",
        ),
        (
            format!("postgres://lyra@127.0.0.1/state?password={HEAD}&{TAIL}=x"),
            "parameter 2 of the query is unknown",
        ),
        // A scheme without its slashes.
        (
            format!("postgres:/lyra:{HEAD}{TAIL}@127.0.0.1/state"),
            "expected sqlite://",
        ),
        (
            format!("postgres:lyra:{HEAD}{TAIL}@127.0.0.1/state"),
            "expected sqlite://",
        ),
        // A libpq keyword string whose quoted password has a space.
        (
            format!("host=127.0.0.1 password='{HEAD} {TAIL}'"),
            "libpq connection string",
        ),
        (
            format!("host=127.0.0.1 password={HEAD} {TAIL}"),
            "libpq connection string",
        ),
    ]
}

#[test]
fn malformed_state_urls_never_show_a_piece_of_the_password() {
    let lyra = Lyra::new();
    for (url, why) in urls() {
        for output in ["text", "json"] {
            let run = lyra.run(&["state", "list", "--state", &url, "-o", output]);
            run.expect_code(1).expect_stderr(&[why]);
            assert_no_piece(&run);
            if output == "json" {
                let error = &run.json()["error"];
                assert_eq!(error["kind"], "state", "{run}");
            }
        }
        for args in [
            vec!["apply", "web"],
            vec!["state", "migrate", "--from", &url, "--to", "other.db"],
            vec!["state", "migrate", "--from", "none.db", "--to", &url],
        ] {
            let mut args = args.clone();
            if args[0] == "apply" {
                args.extend(["--state", &url]);
            }
            let run = lyra.run(&args);
            assert_ne!(run.code, Some(0), "{run}");
            assert_no_piece(&run);
        }
    }
    // A typo of a parameter is still named, with the parameter it is close to; a libpq
    // keyword Lyra does not support is named too.
    let run = lyra.run(&["state", "list", "--state", "postgres://h/db?sslpasword=x"]);
    run.expect_code(1)
        .expect_stderr(&["unknown parameter \"sslpasword\" (did you mean \"sslpassword\"?)"]);
    let run = lyra.run(&["state", "list", "--state", "postgres://h/db?connect_timeout=5"]);
    run.expect_code(1)
        .expect_stderr(&["unknown parameter \"connect_timeout\" (supported:"]);
    // No file was made for any of them (the keyword strings are not paths).
    let made: Vec<_> = std::fs::read_dir(lyra.dir())
        .expect("test dir")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n.to_string_lossy().contains(HEAD))
        .collect();
    assert!(made.is_empty(), "{made:?}");
}

#[test]
fn the_controller_never_logs_a_piece_of_a_malformed_password() {
    let lyra = Lyra::new();
    for (url, why) in urls() {
        let mut cmd = Command::new(controller_bin());
        cmd.current_dir(lyra.dir())
            .args(["--health-addr", "127.0.0.1:0", "--state", &url])
            .env_remove("LYRA_STATE")
            .env("KUBECONFIG", lyra.path("no-kubeconfig"))
            .stdin(Stdio::null());
        let run = run_command(cmd, &["lyra-controller"]);
        assert_eq!(run.code, Some(1), "{run}");
        assert!(run.stderr.contains(why), "{run}");
        assert_no_piece(&run);
    }
}
