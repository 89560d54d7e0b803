//! Registration benchmark: one package registered as 50 kinds with `lyra register`, then 20
//! objects of each kind, against the emulator, a real registry (`docker-registry`) and the real
//! `lyra-controller`. Prints the time from `lyra register` to the kind being served (its
//! definition Ready: CRD established, objects watched), the controller's memory per registered
//! kind, and the time until every object is Ready.
//!
//! ```sh
//! cargo build --release -p lyra-controller -p lyra-cli
//! cargo bench -p integration-tests --bench registration
//! ```
//!
//! `LYRA_BENCH_KINDS` and `LYRA_BENCH_INSTANCES` change the counts (default 50 and 20). The
//! state is Postgres when reachable (a schema of its own), else a SQLite file.

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::bench::{count, kube_client, percentile};
use integration_tests::cluster::free_port;
use integration_tests::postgres::PgTestDb;
use integration_tests::registry::Registry;
use integration_tests::{controller_bin, lyra_bin};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube_emulator::KubeEmulator;

// The emulator serves from this process: the allocator of its binary and of the controller,
// so that glibc's malloc does not take the CPU the controller is measured on.
#[global_allocator]
static ALLOCATOR: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;

const WORKFLOW: &str = "\
parameters:
  size: {type: 'Enum[small, large]', default: small, doc: How big.}
  owner: {type: String, doc: Who runs it.}
steps:
  one:
    resource: Null::Resource
    value:
      input: $size
  two:
    resource: Null::Resource
    value:
      input: $owner
";

fn rss_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn ready(data: &serde_json::Value) -> bool {
    data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

#[tokio::main]
async fn main() {
    let kinds = count("LYRA_BENCH_KINDS", 50);
    let per_kind = count("LYRA_BENCH_INSTANCES", 20);
    let Some(registry) = Registry::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("workflows")).expect("workflows dir");
    std::fs::write(dir.path().join("workflows/app.yaml"), WORKFLOW).expect("workflow");
    let schema = PgTestDb::create("registration_bench").await;
    let state = schema.as_ref().map_or_else(
        || dir.path().join("state.db").display().to_string(),
        |s| s.url().to_owned(),
    );
    let emulator = KubeEmulator::start().await.expect("emulator");
    let kubeconfig = emulator.kubeconfig_path().to_path_buf();
    let run = |bin: &std::path::Path, args: &[&str], stdin: Option<&str>| -> String {
        let mut child = Command::new(bin)
            .args(args)
            .current_dir(dir.path())
            .env("KUBECONFIG", &kubeconfig)
            .env("KUBECACHEDIR", dir.path().join(".kube-cache"))
            .env("LYRA_CACHE_DIR", dir.path().join(".cache"))
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a command");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("write");
        }
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{} {args:?} failed", bin.display());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let kubectl = std::path::Path::new("kubectl");
    let lyra = lyra_bin();
    let crds = run(&lyra, &["crd"], None);
    run(kubectl, &["apply", "-f", "-"], Some(&crds));
    run(
        &lyra,
        &["package", "app", "--version", "1.0.0", "--out", "app-1.0.0"],
        None,
    );
    let reference = registry.url("app:1.0.0");
    run(&lyra, &["push", "app-1.0.0", &reference], None);

    let health = format!("127.0.0.1:{}", free_port());
    let mut controller = Command::new(controller_bin())
        .args(["--state", &state, "--workflows", "workflows", "--health-addr", &health])
        .current_dir(dir.path())
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .env("LYRA_CACHE_DIR", dir.path().join(".controller-cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("lyra-controller");
    let pid = controller.id();

    let client = kube_client(emulator.kubeconfig_path()).await;
    let wfd = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("lyra.dev", "v1alpha1", "WorkflowDefinition"),
        "workflowdefinitions",
    );
    let definitions: Api<DynamicObject> = Api::all_with(client.clone(), &wfd);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_mib(pid, "VmRSS:");

    // Register each kind and wait until it is served.
    let mut to_served = Vec::new();
    for k in 0..kinds {
        let kind = format!("App{k:03}");
        let name = format!("app{k:03}");
        let started = Instant::now();
        run(&lyra, &["register", &reference, "--kind", &kind, "--name", &name], None);
        loop {
            if let Ok(d) = definitions.get(&name).await
                && ready(&d.data)
            {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(120), "{name} never served");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        to_served.push(started.elapsed());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let registered = rss_mib(pid, "VmRSS:");

    // Objects of every kind.
    let mut manifests = String::new();
    for k in 0..kinds {
        for i in 0..per_kind {
            manifests.push_str(&format!(
                "---\napiVersion: workflows.lyra.dev/v1alpha1\nkind: App{k:03}\nmetadata:\n  name: o{i:03}\n  namespace: default\nspec:\n  owner: team{i}\n"
            ));
        }
    }
    let started = Instant::now();
    run(kubectl, &["apply", "-f", "-"], Some(&manifests));
    // kubectl validates each object against its kind's OpenAPI document, client work that
    // grows with the number of kinds in the group: reported apart from the controller's.
    let applied = started.elapsed();
    let total = kinds * per_kind;
    loop {
        let mut done = 0;
        for k in 0..kinds {
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("workflows.lyra.dev", "v1alpha1", &format!("App{k:03}")),
                &format!("app{k:03}s"),
            );
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
            if let Ok(list) = api.list(&ListParams::default()).await {
                done += list.items.iter().filter(|o| ready(&o.data)).count();
            }
        }
        if done == total {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "only {done} of {total} objects Ready after 30 minutes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_ready = started.elapsed();
    let loaded = rss_mib(pid, "VmRSS:");
    let peak = rss_mib(pid, "VmHWM:");
    let _ = controller.kill();
    let _ = controller.wait();

    to_served.sort();
    println!(
        "registration: {kinds} kinds x {per_kind} objects (2 Null::Resource steps each), state {}",
        if schema.is_some() { "Postgres" } else { "SQLite" }
    );
    println!(
        "  lyra register to served: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(&to_served, 0.5).as_secs_f64() * 1000.0,
        percentile(&to_served, 0.99).as_secs_f64() * 1000.0,
        to_served.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
    );
    println!(
        "  controller RSS: idle {idle:.1} MiB, {kinds} kinds {registered:.1} MiB ({:.2} MiB per kind), with objects {loaded:.1} MiB, peak {peak:.1} MiB",
        (registered - idle) / kinds as f64
    );
    println!(
        "  {total} objects Ready after {:.2} s ({:.1}/s); `kubectl apply` of them took {:.2} s of that",
        all_ready.as_secs_f64(),
        total as f64 / all_ready.as_secs_f64(),
        applied.as_secs_f64()
    );
    emulator.shutdown().await;
}
