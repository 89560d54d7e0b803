//! End-to-end tests of the real `lyra` binary: one test binary (fast to link, one place to
//! look), one module per concern. Build the binary first: `cargo build -p lyra-cli`.
//!
//! Every test has its own temporary working directory (see `integration_tests::Lyra`), so
//! they run in parallel. Tests marked `#[ignore = "BUG: ..."]` assert the correct behaviour
//! of a known bug; run them with `cargo test -p integration-tests -- --ignored`.

// Tests report skips and diagnostics on the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod e2e {
    mod admission;
    mod adoption;
    mod bad_input;
    mod chart;
    mod cli;
    mod colour;
    mod compat;
    mod computed_attributes;
    #[cfg(unix)]
    mod confirm;
    mod controller;
    mod controller_approval;
    mod controller_deep;
    mod controller_deletes;
    mod controller_drift;
    mod controller_events;
    mod controller_inline;
    mod controller_limits;
    mod controller_recovery;
    mod controller_secrets;
    #[cfg(unix)]
    mod crash;
    mod credentials;
    mod deep_values;
    mod deployment_names;
    mod docs;
    mod drift;
    mod encoding;
    mod explain;
    mod failures;
    #[cfg(unix)]
    mod fencing;
    mod fmt;
    mod fuzz;
    mod guards;
    mod helm_install;
    mod hostile_urls;
    mod import;
    mod json_output;
    mod kube_concurrency;
    mod kube_emulator;
    mod kube_rs_controller;
    mod kube_webhook_api;
    mod kube_webhooks;
    mod language;
    mod leases;
    mod lifecycle;
    #[cfg(unix)]
    mod load_path;
    mod output;
    mod packages;
    mod parallel;
    mod plugins;
    mod postgres;
    mod provider_examples;
    mod rbac;
    mod real_providers;
    mod registration;
    mod saved_plans;
    mod secrets;
    mod sharing;
    #[cfg(unix)]
    mod signals;
    mod state_cmds;
    mod target;
    mod terraform;
    mod unknown;
}
