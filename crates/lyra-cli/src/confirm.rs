//! Asking before `apply` and `delete` change anything: only when a person can answer (stdin
//! and stderr are terminals), never under `-o json` or `--yes`, and only when the plan shown
//! changes something. Anything but `yes` declines, as an end of input does.

use std::io::{BufRead as _, IsTerminal as _};

use crate::args::Output;
use crate::warn;

/// Whether this run should ask.
pub fn wanted(yes: bool, out: Output) -> bool {
    !yes && out == Output::Text && std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Asks `question` on stderr and reads the answer from stdin: `true` only for `yes`.
pub async fn ask(question: &str) -> bool {
    warn(&format!(
        "\n{question}\n  Only 'yes' is accepted (--yes skips this question): "
    ));
    // Reading a terminal blocks; the runtime's other tasks (the lease renewer) go on.
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await;
    matches!(answer, Ok(Ok(line)) if line.trim() == "yes")
}
