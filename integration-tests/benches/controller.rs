//! Controller benchmark: 1,000 `Workflow` objects of 10 `Null::Resource` steps each, against
//! the emulator with the real `lyra-controller` binary, in two phases.
//! - Arrival: one `kubectl apply` of all objects to a running controller (kubectl's own pace
//!   bounds this one). Prints the total time, reconciles/s and per object, p50/p99
//!   time-to-Ready (from each object's ADDED to its first Ready=True, seen through one watch)
//!   and the controller's peak memory, whole and per object (its growth over the memory it had
//!   before the objects came).
//! - Backlog: as many objects created while no controller runs, then a controller started:
//!   how fast it works through them alone, and how much of that is its start (when its
//!   /readyz answers, and the first object Ready), with its CPU and the emulator's.
//!
//! ```sh
//! cargo build --release -p lyra-controller -p lyra-cli
//! cargo bench -p integration-tests --bench controller
//! ```
//!
//! The state is Postgres at `$LYRA_TEST_POSTGRES_URL` (default 127.0.0.1:5432) when reachable,
//! in a schema of its own, else a SQLite file. `LYRA_BENCH_OBJECTS` changes the count.

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use integration_tests::bench::{count, kube_client, percentile};
use integration_tests::cluster::{free_port, http_get, metric_sum};
use integration_tests::postgres::PgTestDb;
use integration_tests::{controller_bin, lyra_bin};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube_emulator::KubeEmulator;

// The emulator serves from this process: the allocator of its binary and of the controller,
// so that glibc's malloc does not take the CPU the controller is measured on.
#[global_allocator]
static ALLOCATOR: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;

const STEPS: usize = 10;

fn ten_steps() -> String {
    let mut y = String::from("steps:\n");
    for i in 0..STEPS {
        y.push_str(&format!(
            "  s{i}:\n    resource: Null::Resource\n    value:\n      input: step {i}\n"
        ));
    }
    y
}

fn manifests(n: usize, ns: &str) -> String {
    (0..n)
        .map(|i| {
            format!(
                "---\napiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: wf-{i:04}\n  namespace: {ns}\nspec:\n  workflowName: ten\n"
            )
        })
        .collect()
}

fn ready(obj: &DynamicObject) -> bool {
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// A memory figure of `/proc/<pid>/status` (`VmHWM`: the peak, `VmRSS`: now), in MiB.
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

/// The CPU time a process has used so far (user and system, `/proc/<pid>/stat`), in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name, which may hold spaces: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or_else(Vec::new, |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // USER_HZ, 100 on Linux.
    (ticks(14) + ticks(15)) / 100.0
}

/// Watches the `Workflow`s of `ns` until `n` are Ready; answers each one's time from its
/// first sighting (its ADDED, or the watch's start for objects that were already there).
fn watch_ready(client: kube::Client, ns: &str, n: usize) -> tokio::sync::oneshot::Receiver<Vec<Duration>> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("lyra.dev", "v1alpha1", "Workflow"), "workflows");
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &ar);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut added: HashMap<String, Instant> = HashMap::new();
        let mut readied: HashMap<String, Duration> = HashMap::new();
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = events.next().await {
            let (Event::Apply(o) | Event::InitApply(o)) = event else {
                continue;
            };
            let name = o.name_any();
            let seen = *added.entry(name.clone()).or_insert_with(Instant::now);
            if ready(&o) && !readied.contains_key(&name) {
                readied.insert(name, seen.elapsed());
                if readied.len() == n {
                    let mut times: Vec<Duration> = readied.into_values().collect();
                    times.sort();
                    let _ = done_tx.send(times);
                    return;
                }
            }
        }
    });
    done_rx
}

/// What [`watch_ready`] answers, once every object is Ready.
async fn all_ready(done: tokio::sync::oneshot::Receiver<Vec<Duration>>) -> Vec<Duration> {
    tokio::time::timeout(Duration::from_secs(1800), done)
        .await
        .expect("every object Ready within 30 minutes")
        .expect("the watch ended")
}

fn print_times(times: &[Duration]) {
    println!(
        "  time to Ready: first {:.0} ms, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        times.first().copied().unwrap_or_default().as_secs_f64() * 1000.0,
        percentile(times, 0.5).as_secs_f64() * 1000.0,
        percentile(times, 0.99).as_secs_f64() * 1000.0,
        times.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
    );
}

/// The controller's reconciles once at least `expected` have ended, or after 2 s: the last
/// object turns Ready when its status is written, a moment before its reconcile returns
/// and is counted (read at once, 1 to 5 of 2,000 were missing).
async fn reconciles_settled(health: &str, expected: usize) -> (f64, f64) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (count, secs) = reconciles(health);
        if count >= expected as f64 || Instant::now() >= deadline {
            return (count, secs);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The controller's reconciles so far, and the seconds they took.
fn reconciles(health: &str) -> (f64, f64) {
    let metrics = http_get(health, "/metrics").unwrap_or_default();
    (
        metric_sum(&metrics, "lyra_reconciles_total"),
        metric_sum(&metrics, "lyra_reconcile_duration_seconds_sum"),
    )
}

#[tokio::main]
async fn main() {
    let n = count("LYRA_BENCH_OBJECTS", 1000);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("workflows")).expect("workflows dir");
    std::fs::write(dir.path().join("workflows/ten.yaml"), ten_steps()).expect("workflow");
    let schema = PgTestDb::create("controller_bench").await;
    let state = schema.as_ref().map_or_else(
        || dir.path().join("state.db").display().to_string(),
        |s| s.url().to_owned(),
    );

    let emulator = KubeEmulator::start().await.expect("emulator");
    let kubeconfig = emulator.kubeconfig_path().to_path_buf();
    let kubectl = |args: &[&str], stdin: Option<&str>| {
        let mut child = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("KUBECACHEDIR", dir.path().join(".kube-cache"))
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kubectl");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("write");
        }
        assert!(child.wait().expect("kubectl").success(), "kubectl {args:?} failed");
    };
    let crd = Command::new(lyra_bin()).arg("crd").output().expect("lyra crd").stdout;
    kubectl(&["apply", "-f", "-"], Some(&String::from_utf8_lossy(&crd)));
    kubectl(&["create", "namespace", "backlog"], None);

    let health = format!("127.0.0.1:{}", free_port());
    let start_controller = || {
        Command::new(controller_bin())
            .args(["--state", &state, "--workflows", "workflows", "--health-addr", &health])
            .current_dir(dir.path())
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("lyra-controller")
    };
    let wait_ready = || async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get(&health, "/readyz").is_none() {
            assert!(Instant::now() < deadline, "the controller never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let client = kube_client(emulator.kubeconfig_path()).await;
    println!(
        "controller: {n} Workflows x {STEPS} Null::Resource steps, state {}",
        if schema.is_some() { "Postgres" } else { "SQLite" }
    );

    // Arrival: objects come, through kubectl, to a running controller.
    let mut controller = start_controller();
    wait_ready().await;
    // What it holds before the objects come.
    let idle = rss_mib(controller.id(), "VmRSS:");
    let done = watch_ready(client.clone(), "default", n);
    let started = Instant::now();
    kubectl(&["apply", "-f", "-"], Some(&manifests(n, "default")));
    let applied = started.elapsed();
    let times = all_ready(done).await;
    let total = started.elapsed();
    let (count, secs) = reconciles_settled(&health, n).await;
    let peak = rss_mib(controller.id(), "VmHWM:");
    println!("arrival: the objects created by one kubectl apply, the controller running");
    println!("  kubectl apply of all objects: {:.2} s", applied.as_secs_f64());
    println!("  all Ready after:              {:.2} s", total.as_secs_f64());
    println!(
        "  reconciles: {count:.0} ({:.1}/s, {:.2} per object, {:.1} ms each on average)",
        count / total.as_secs_f64(),
        count / n as f64,
        secs * 1000.0 / count.max(1.0)
    );
    print_times(&times);
    println!(
        "  controller peak RSS: {peak:.1} MiB ({idle:.1} MiB before the objects, {:.1} KiB per object)",
        (peak - idle) * 1024.0 / n as f64
    );

    // Backlog: as many new objects wait for a restarted controller, which also finds the
    // first ones (applied already: nothing to run).
    let _ = controller.kill();
    let _ = controller.wait();
    kubectl(&["apply", "-f", "-"], Some(&manifests(n, "backlog")));
    let done = watch_ready(client.clone(), "backlog", n);
    emulator.clear_requests();
    let own_cpu = cpu_secs(std::process::id());
    let started = Instant::now();
    let mut controller = start_controller();
    // When it says it is ready: started, state open and its watches listed.
    let readiness = {
        let health = health.clone();
        tokio::task::spawn_blocking(move || {
            while http_get(&health, "/readyz").is_none() {
                std::thread::sleep(Duration::from_millis(2));
            }
            started.elapsed()
        })
    };
    let times = all_ready(done).await;
    let total = started.elapsed();
    // The new objects and the ones applied before: one reconcile each.
    let (count, secs) = reconciles_settled(&health, 2 * n).await;
    let ready_after = readiness.await.expect("readiness poll");
    let cpu = cpu_secs(controller.id());
    let server_cpu = cpu_secs(std::process::id()) - own_cpu;
    println!("backlog: {n} new objects and {n} applied ones, for a controller (re)started after they were created");
    println!("  controller ready after {:.0} ms", ready_after.as_secs_f64() * 1000.0);
    println!(
        "  all new ones Ready after {:.2} s: {:.1} objects/s",
        total.as_secs_f64(),
        n as f64 / total.as_secs_f64()
    );
    println!(
        "  reconciles: {count:.0} ({:.1}/s, {:.1} ms each on average)",
        count / total.as_secs_f64(),
        secs * 1000.0 / count.max(1.0)
    );
    print_times(&times);
    // Its own CPU, apart from the emulator's and Postgres's on the same cores: what a
    // reconcile costs the controller however busy the machine is.
    println!(
        "  controller CPU: {cpu:.2} s ({:.2} ms per reconcile)",
        cpu * 1000.0 / count.max(1.0)
    );
    // This process's: mostly the emulator serving the controller, and the one watch above.
    println!(
        "  API server (emulator) CPU: {server_cpu:.2} s ({:.2} ms per reconcile)",
        server_cpu * 1000.0 / count.max(1.0)
    );
    // What the API server was asked meanwhile, per object (the few lists and watches are the
    // controller's start and the bench's own watch): each request is work for both sides.
    let mut asked: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for r in &emulator.requests() {
        let sub = if r.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", r.subresource)
        };
        *asked.entry(format!("{} {}{sub}", r.verb, r.resource)).or_default() += 1;
    }
    let line: Vec<String> = asked
        .iter()
        .map(|(what, k)| format!("{what} {:.2}", *k as f64 / (2 * n) as f64))
        .collect();
    println!("  API requests per object (of {}): {}", 2 * n, line.join(", "));
    let _ = controller.kill();
    let _ = controller.wait();
    emulator.shutdown().await;
}
