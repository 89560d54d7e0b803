//! End-to-end tests of the real `lyra` binary: one test binary (fast to link, one place to
//! look), one module per concern. Build the binary first: `cargo build -p lyra-cli`.
//!
//! Every test has its own temporary working directory (see `integration_tests::Lyra`), so
//! they run in parallel. Tests marked `#[ignore = "BUG: ..."]` assert the correct behaviour
//! of a known bug; run them with `cargo test -p integration-tests -- --ignored`.

mod e2e {
    mod bad_input;
    mod cli;
    mod compat;
    mod computed_attributes;
    mod controller;
    #[cfg(unix)]
    mod crash;
    mod deep_values;
    mod failures;
    mod fuzz;
    mod guards;
    mod kube_concurrency;
    mod kube_emulator;
    mod kube_rs_controller;
    mod leases;
    mod lifecycle;
    mod parallel;
    mod postgres;
    mod secrets;
    mod sharing;
    mod state_cmds;
}
