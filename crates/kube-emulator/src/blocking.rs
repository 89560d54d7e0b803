//! [`BlockingKubeEmulator`]: the emulator for tests without a runtime.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::audit::AuditRecord;
use crate::server::{Config, KubeEmulator, Shared};

/// A [`KubeEmulator`] on a runtime thread of its own, for synchronous tests. Dropping it
/// shuts the server down and joins the thread.
#[derive(Debug)]
pub struct BlockingKubeEmulator {
    /// `None` once dropping: the objects are dropped on the emulator's threads, whose stacks
    /// are deep enough for deep objects.
    shared: Option<Arc<Shared>>,
    url: String,
    kubeconfig: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BlockingKubeEmulator {
    pub fn start() -> io::Result<BlockingKubeEmulator> {
        BlockingKubeEmulator::start_with(Config::default())
    }

    pub fn start_with(config: Config) -> io::Result<BlockingKubeEmulator> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kube-emulator".into())
            .stack_size(crate::THREAD_STACK)
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_stack_size(crate::THREAD_STACK)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async move {
                    match KubeEmulator::start_with(config).await {
                        Ok(emu) => {
                            let info = (
                                emu.shared.clone(),
                                emu.url().to_string(),
                                emu.kubeconfig_path().to_path_buf(),
                            );
                            let _ = ready_tx.send(Ok(info));
                            let _ = stop_rx.await;
                            emu.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })?;
        let (shared, url, kubeconfig) = ready_rx
            .recv()
            .map_err(|_| io::Error::other("the emulator thread died"))??;
        Ok(BlockingKubeEmulator {
            shared: Some(shared),
            url,
            kubeconfig,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// How many watch streams are open now.
    pub fn active_watches(&self) -> usize {
        self.shared
            .as_ref()
            .map_or(0, |s| s.active_watches.load(Ordering::SeqCst))
    }

    /// Every request served so far, oldest first (see [`AuditRecord`]).
    pub fn requests(&self) -> Vec<AuditRecord> {
        self.shared.as_ref().map_or_else(Vec::new, |s| s.audit.all())
    }

    /// The requests of one user: a bearer token, or [`crate::ANONYMOUS_ADMIN`].
    pub fn requests_by(&self, user: &str) -> Vec<AuditRecord> {
        self.shared.as_ref().map_or_else(Vec::new, |s| s.requests_by(user))
    }

    /// Forgets the requests recorded so far.
    pub fn clear_requests(&self) {
        if let Some(s) = &self.shared {
            s.audit.clear();
        }
    }

    /// Blocks until at least `n` watches are open (a kubectl `get -w` or `wait` is listening),
    /// panicking after `timeout`.
    pub fn wait_for_watches(&self, n: usize, timeout: Duration) {
        let start = std::time::Instant::now();
        while self.active_watches() < n {
            assert!(
                start.elapsed() < timeout,
                "{n} watches were not opened within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Note: with `Config::kubeconfig == None` the file lives in a temporary directory owned
    /// by the emulator thread, removed at drop.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }
}

impl Drop for BlockingKubeEmulator {
    fn drop(&mut self) {
        drop(self.shared.take());
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
