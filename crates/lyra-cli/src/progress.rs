//! Live progress on stderr: a line per step as it starts and ends, with timing, under a
//! spinner that counts what is done. Quiet when stderr is not a terminal (unless --verbose),
//! so that stdout stays clean data for pipes.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lyra_core::engine::Observer;
use lyra_core::report::{Action, Status, StepReport};

pub struct Progress {
    bar: ProgressBar,
    lines: bool,
    done: AtomicUsize,
    running: AtomicUsize,
    /// The spinner turns from the first step on, not before: a plan shown and a question
    /// asked before the run (see `confirm`) must not be drawn over.
    ticking: AtomicBool,
    /// Steps that started and have not finished: not every finished step started (skips).
    /// In order, so the first few are at hand: hundreds may be waiting for their records.
    started: Mutex<BTreeSet<String>>,
}

impl Progress {
    pub fn new(verbose: bool) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = if tty {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("valid template"));
            b
        } else {
            ProgressBar::hidden()
        };
        Progress {
            bar,
            lines: tty || verbose,
            done: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            ticking: AtomicBool::new(false),
            started: Mutex::new(BTreeSet::new()),
        }
    }

    fn line(&self, s: String) {
        if !self.lines {
            return;
        }
        if self.bar.is_hidden() {
            crate::warn(&format!("{s}\n"));
        } else {
            self.bar.println(s);
        }
    }

    fn update(&self) {
        if self.bar.is_hidden() {
            return;
        }
        let (d, r) = (self.done.load(Ordering::Relaxed), self.running.load(Ordering::Relaxed));
        // Which steps a long run is waiting on: a few of them, by name.
        let mut names = {
            let started = self.started.lock().expect("progress lock");
            started
                .iter()
                .take(3)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if r > 3 {
            names.push_str(", …");
        }
        let names = if names.is_empty() {
            String::new()
        } else {
            format!(": {names}")
        };
        self.bar.set_message(format!("{d} done, {r} running{names}"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Nothing is shown at all (stderr is not a terminal, no --verbose): the per-step work
    /// of keeping count and formatting lines is skipped, which on a large run is not free.
    fn silent(&self) -> bool {
        !self.lines && self.bar.is_hidden()
    }
}

impl Observer for Progress {
    fn step_started(&self, id: &str, type_name: &str) {
        if self.silent() {
            return;
        }
        if !self.bar.is_hidden() && !self.ticking.swap(true, Ordering::Relaxed) {
            self.bar.enable_steady_tick(Duration::from_millis(100));
        }
        self.started.lock().expect("progress lock").insert(id.to_owned());
        self.running.fetch_add(1, Ordering::Relaxed);
        self.update();
        self.line(format!("  … {id} ({type_name})"));
    }

    fn step_finished(&self, r: &StepReport) {
        if self.silent() {
            return;
        }
        if self.started.lock().expect("progress lock").remove(&r.id) {
            self.running.fetch_sub(1, Ordering::Relaxed);
        }
        self.done.fetch_add(1, Ordering::Relaxed);
        self.update();
        let ms = r.duration.as_millis();
        let what = r.type_name.as_deref().map(|t| format!(" ({t})")).unwrap_or_default();
        let line = match r.status {
            Status::Done if r.action == Action::Noop => format!("  = {}{what} unchanged {ms}ms", r.id),
            Status::Done => format!("  ✓ {}{what} {} {ms}ms", r.id, past(r.action)),
            Status::Failed => format!(
                "  ✗ {}{what} failed after {ms}ms: {}",
                r.id,
                r.error.as_deref().unwrap_or("")
            ),
            Status::Skipped => format!("  ○ {}{what} skipped: {}", r.id, r.error.as_deref().unwrap_or("")),
            Status::GuardedOff => format!("  ○ {}{what} not applicable (its 'when' guard is false)", r.id),
            Status::Planned => return,
        };
        self.line(line);
    }
}

fn past(a: Action) -> &'static str {
    match a {
        Action::Create => "created",
        Action::Update => "updated",
        Action::Replace => "replaced",
        Action::Delete => "deleted",
        Action::Read => "read",
        Action::Forget => "forgotten",
        Action::Noop | Action::Group => "done",
    }
}
