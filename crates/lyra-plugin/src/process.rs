//! Starting helper processes that cannot outlive Lyra: [`plugin_command`], [`spawn_plugin`].

use std::future::Future;
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc;

use tokio::process::{Child, Command};

/// A command that runs the executable at `path` as a process Lyra owns: a provider plugin, or
/// any other helper that must not outlive Lyra. Set its arguments, environment and stdio as
/// usual, then start it with [`spawn_plugin`] (or `Command::spawn` from a long-lived thread, see
/// there).
///
/// The child is killed when its `Child` is dropped (`kill_on_drop`), and on Linux also by the
/// kernel when Lyra dies, even by `kill -9` (`PR_SET_PDEATHSIG` with `SIGKILL`, set between
/// fork and exec; a child whose parent died before that exits at once). Elsewhere, a plugin
/// built on [`serve`](crate::serve) still exits when its stdin reaches end of file.
///
/// Only the process started is covered: a wrapper script must `exec` the real program, as the
/// setting does not pass to the children a process forks.
pub fn plugin_command(path: &Path) -> Command {
    let mut command = Command::new(path);
    command.kill_on_drop(true);
    #[cfg(target_os = "linux")]
    die_with_parent(&mut command);
    command
}

/// Starts `command` (made by [`plugin_command`]) on a thread that lives as long as the process.
///
/// Why a thread of its own: Linux sends the parent-death signal when the *thread* that forked
/// the child exits, not the process. Tokio's worker threads live as long as their runtime,
/// but a `spawn_blocking` thread ends after 10 s idle and a `block_in_place` caller gives its
/// worker role away, so a plugin started there would be killed early. This thread never
/// ends. Call it inside a Tokio runtime: the child is registered with the caller's one.
pub fn spawn_plugin(command: Command) -> std::io::Result<Child> {
    type Job = (
        Command,
        tokio::runtime::Handle,
        mpsc::SyncSender<std::io::Result<Child>>,
    );
    static SPAWNER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);

    let handle = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
    let (reply, answer) = mpsc::sync_channel(1);
    {
        let mut spawner = SPAWNER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sender = match spawner.as_ref() {
            Some(s) => s.clone(),
            None => {
                let (tx, rx) = mpsc::channel::<Job>();
                std::thread::Builder::new()
                    .name("lyra-plugin-spawner".to_owned())
                    .spawn(move || {
                        for (mut command, handle, reply) in rx {
                            let _runtime = handle.enter();
                            let _ = reply.send(command.spawn());
                        }
                    })?;
                spawner.insert(tx).clone()
            }
        };
        sender
            .send((command, handle, reply))
            .map_err(|_| std::io::Error::other("the plugin spawner thread is gone"))?;
    }
    // A fork and an exec: as long as `Command::spawn` would block the caller anyway.
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the plugin spawner thread is gone"))?
}

/// `PR_SET_PDEATHSIG` in the child, then the check that the parent did not die before it.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: it makes two system calls (prctl, getppid) and allocates nothing
    // (the errors are plain errno values).
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The parent may have died between fork and prctl: then no signal will come.
            if rustix::process::getppid() != Some(parent) {
                return Err(rustix::io::Errno::SRCH.into());
            }
            Ok(())
        });
    }
}

/// How many of a helper process's last stderr lines are kept for error messages.
const STDERR_TAIL: usize = 20;

/// A helper process's last stderr lines, as [`forward_output`] keeps them.
pub type StderrTail = std::sync::Arc<Mutex<std::collections::VecDeque<String>>>;

/// The lines in `tail`, oldest first.
pub fn stderr_lines(tail: &StderrTail) -> Vec<String> {
    tail.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default()
}

/// Forwards a helper process's stderr (its log) line by line to `tracing` at `level` (target
/// `lyra_plugin::stderr`, the executable in field `plugin`), keeping its last lines in the
/// returned tail. The task ends at end of file.
pub fn forward_stderr(
    path: &Path,
    pipe: tokio::process::ChildStderr,
    level: tracing::Level,
) -> (StderrTail, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncBufReadExt as _;
    let plugin = path.display().to_string();
    let tail = StderrTail::default();
    let keep = std::sync::Arc::clone(&tail);
    let done = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if level == tracing::Level::DEBUG {
                tracing::debug!(target: "lyra_plugin::stderr", plugin = %plugin, "{line}");
            } else {
                tracing::info!(target: "lyra_plugin::stderr", plugin = %plugin, "{line}");
            }
            if let Ok(mut t) = keep.lock() {
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }
    });
    (tail, done)
}

/// Reads what a helper process writes to stdout after its handshake, so it never blocks on a
/// full pipe, logging it at `level` (target `lyra_plugin::stdout`).
pub fn drain_stdout(path: &Path, stdout: tokio::io::BufReader<tokio::process::ChildStdout>, level: tracing::Level) {
    use tokio::io::AsyncBufReadExt as _;
    let plugin = path.display().to_string();
    tokio::spawn(async move {
        let mut lines = stdout.lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if level == tracing::Level::DEBUG {
                tracing::debug!(target: "lyra_plugin::stdout", plugin = %plugin, "{line}");
            } else {
                tracing::info!(target: "lyra_plugin::stdout", plugin = %plugin, "{line}");
            }
        }
    });
}

/// Runs `call` to completion on a thread of its own, with a runtime of its own, from
/// synchronous code inside any runtime (a `Provider` method that is not async, such as
/// `replace_reasons`). `call` must make its own connection: one made on the caller's runtime
/// may need that runtime's threads, which the caller is blocking.
pub fn block_on_own_thread<T: Send>(call: impl Future<Output = Result<T, String>> + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(call)
        })
        .join()
        .unwrap_or_else(|_| Err("the call panicked".to_owned()))
    })
}
