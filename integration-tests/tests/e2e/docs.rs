//! The language reference, `docs/language.md`, stays true: every ```yaml block in it is run
//! through the real `lyra`, and every error message it quotes is the one `lyra` prints.
//!
//! What a block means is said by the words after `yaml` in its info string:
//!
//! - (none): a workflow that `lyra validate` accepts;
//! - `error`: a workflow that `lyra validate` rejects; the next fenced block, a ```text block,
//!   is its stderr, exactly;
//! - `plan` / `apply`: a valid workflow that `lyra plan` / `lyra apply` runs successfully; a
//!   ```text block right after it is its stdout, exactly;
//! - `plan-error`: a valid workflow that `lyra plan` rejects or fails; the ```text block is its
//!   output, stdout then stderr (a plan with failed steps is on stdout, a rejected input on
//!   stderr);
//! - `apply-error`: a valid workflow whose `lyra apply` fails; the ```text block is its stderr,
//!   compared line by line in any order (steps finish concurrently), without the timing of the
//!   summary line;
//! - `data`: not a workflow but the data file (`data.yaml`) of the next workflow block;
//! - `file=PATH`: the workflow's file (default `example.yaml`). Named files are on the load
//!   path of every example, so that examples can `call` them;
//! - `then`: runs in the directory of the previous example, with its state and its
//!   Foobernetes cloud: a plan after an apply, say.
//!
//! Each example runs in a fresh directory of its own, holding its file at the top, so messages
//! read `example.yaml:LINE:COL` as in the reference. A ```text block is always an expected
//! output; output that is not checked goes in other blocks (```console).

use std::collections::BTreeMap;

use integration_tests::{Lyra, Run, workspace_dir};

const REFERENCE: &str = "docs/language.md";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Validate,
    Error,
    Plan,
    PlanError,
    Apply,
    ApplyError,
}

impl Mode {
    fn parse(word: &str) -> Option<Mode> {
        Some(match word {
            "error" => Mode::Error,
            "plan" => Mode::Plan,
            "plan-error" => Mode::PlanError,
            "apply" => Mode::Apply,
            "apply-error" => Mode::ApplyError,
            _ => return None,
        })
    }

    /// Whether the block must be followed by its expected output.
    fn needs_output(self) -> bool {
        matches!(self, Mode::Error | Mode::PlanError | Mode::ApplyError)
    }

    /// Whether a ```text block may follow.
    fn takes_output(self) -> bool {
        self != Mode::Validate
    }
}

/// A fenced block of the reference.
#[derive(Debug)]
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    words: Vec<String>,
    body: String,
}

/// One workflow example and what running it must give.
#[derive(Debug, Clone)]
struct Example {
    line: usize,
    file: String,
    named: bool,
    body: String,
    mode: Mode,
    expected: Option<String>,
    data: Option<String>,
    then: bool,
}

fn fenced_blocks(md: &str, problems: &mut Vec<String>) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in md.lines().enumerate() {
        let n = i + 1;
        if let Some(mut b) = open.take() {
            if line == "```" {
                blocks.push(b);
            } else {
                b.body.push_str(line);
                b.body.push('\n');
                open = Some(b);
            }
            continue;
        }
        if let Some(info) = line.strip_prefix("```") {
            let mut words = info.split_whitespace().map(str::to_owned);
            open = Some(Block {
                line: n,
                lang: words.next().unwrap_or_default(),
                words: words.collect(),
                body: String::new(),
            });
        } else if line.trim_start().starts_with("```") {
            // A fence inside a list item would be skipped silently: keep fences at the margin.
            problems.push(format!(
                "{REFERENCE}:{n}: indented code fence; start fences at column 1"
            ));
        }
    }
    if let Some(b) = open {
        problems.push(format!("{REFERENCE}:{}: code block never closed", b.line));
    }
    blocks
}

fn examples(blocks: &[Block], problems: &mut Vec<String>) -> Vec<Example> {
    let mut out = Vec::new();
    let mut data: Option<(usize, String)> = None;
    let mut i = 0;
    while i < blocks.len() {
        let b = &blocks[i];
        i += 1;
        match b.lang.as_str() {
            "yaml" => {}
            "text" => {
                problems.push(format!(
                    "{REFERENCE}:{}: a ```text block is the expected output of the yaml block before it, \
                     which expects none; use ```console for output that is not checked",
                    b.line
                ));
                continue;
            }
            _ => continue,
        }
        let (mut mode, mut file, mut then, mut is_data) = (Mode::Validate, None, false, false);
        for w in &b.words {
            if let Some(m) = Mode::parse(w) {
                mode = m;
            } else if let Some(f) = w.strip_prefix("file=") {
                file = Some(f.to_owned());
            } else if w == "then" {
                then = true;
            } else if w == "data" {
                is_data = true;
            } else {
                problems.push(format!("{REFERENCE}:{}: unknown word '{w}' after ```yaml", b.line));
            }
        }
        if is_data {
            if let Some((line, _)) = data.replace((b.line, b.body.clone())) {
                problems.push(format!(
                    "{REFERENCE}:{line}: a data block with no workflow block after it"
                ));
            }
            continue;
        }
        let expected = match blocks.get(i) {
            Some(next) if next.lang == "text" => {
                i += 1;
                if !mode.takes_output() {
                    problems.push(format!(
                        "{REFERENCE}:{}: ```text after a yaml block that only validates; say what it \
                         is the output of (error, plan, apply...)",
                        next.line
                    ));
                }
                Some(next.body.clone())
            }
            _ => None,
        };
        if mode.needs_output() && expected.is_none() {
            problems.push(format!(
                "{REFERENCE}:{}: a '{}' example needs the expected output in a ```text block right after it",
                b.line,
                b.words.join(" ")
            ));
        }
        if then && out.is_empty() {
            problems.push(format!("{REFERENCE}:{}: 'then' on the first example", b.line));
        }
        out.push(Example {
            line: b.line,
            named: file.is_some(),
            file: file.unwrap_or_else(|| "example.yaml".to_owned()),
            body: b.body.clone(),
            mode,
            expected,
            data: data.take().map(|(_, d)| d),
            then,
        });
    }
    if let Some((line, _)) = data {
        problems.push(format!(
            "{REFERENCE}:{line}: a data block with no workflow block after it"
        ));
    }
    out
}

/// Lines without trailing blanks, without blank lines at the end.
fn normalize(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim_end).collect();
    lines.join("\n").trim_end_matches('\n').to_owned()
}

/// An apply's stderr as a sorted list of lines, with the summary's timing blanked out.
fn apply_lines(s: &str) -> Vec<String> {
    let timing = regex::Regex::new(r"\(\d+(\.\d+)?s\)$").expect("a valid regex");
    let mut lines: Vec<String> = normalize(s)
        .lines()
        .map(|l| timing.replace(l, "(…s)").into_owned())
        .collect();
    lines.sort();
    lines
}

fn mismatch(ex: &Example, what: &str, expected: &str, run: &Run) -> String {
    format!(
        "{REFERENCE}:{}: {what} differs from the reference\n--- the reference says ---\n{}\n--- lyra says ---\n{run}",
        ex.line,
        normalize(expected)
    )
}

/// Runs one example in `lyra`'s directory; returns what is wrong with it, if anything.
fn check(lyra: &Lyra, shared: &BTreeMap<String, String>, ex: &Example) -> Option<String> {
    for (path, body) in shared {
        lyra.write(path, body);
    }
    lyra.write(&ex.file, &ex.body);
    match &ex.data {
        Some(d) => {
            lyra.write("data.yaml", d);
        }
        None => {
            let _ = std::fs::remove_file(lyra.path("data.yaml"));
        }
    }
    let file = ex.file.as_str();
    let validate = lyra.run(&["validate", file]);
    if ex.mode == Mode::Error {
        let expected = ex.expected.as_deref().unwrap_or_default();
        if validate.code != Some(1) || normalize(&validate.stderr) != normalize(expected) {
            return Some(mismatch(ex, "the error of `lyra validate`", expected, &validate));
        }
        return None;
    }
    if validate.code != Some(0) {
        return Some(format!(
            "{REFERENCE}:{}: the example does not validate\n{validate}",
            ex.line
        ));
    }
    let (command, ok) = match ex.mode {
        Mode::Validate | Mode::Error => return None,
        Mode::Plan => ("plan", true),
        Mode::PlanError => ("plan", false),
        Mode::Apply => ("apply", true),
        Mode::ApplyError => ("apply", false),
    };
    let run = lyra.run(&[command, file]);
    let expected = ex.expected.as_deref();
    let (code_ok, output_ok) = match (ok, expected) {
        (true, None) => (run.code == Some(0), true),
        (true, Some(e)) => (run.code == Some(0), normalize(&run.stdout) == normalize(e)),
        (false, e) => {
            let e = e.unwrap_or_default();
            let same = if ex.mode == Mode::ApplyError {
                apply_lines(&run.stderr) == apply_lines(e)
            } else {
                normalize(&format!("{}{}", run.stdout, run.stderr)) == normalize(e)
            };
            (run.code == Some(1), same)
        }
    };
    if code_ok && output_ok {
        return None;
    }
    let what = match (ok, code_ok) {
        (_, false) => format!("the exit code of `lyra {command}`"),
        (true, true) => format!("the output of `lyra {command}`"),
        (false, true) => format!("the error of `lyra {command}`"),
    };
    Some(mismatch(ex, &what, expected.unwrap_or("(any output)"), &run))
}

#[test]
fn every_example_in_the_language_reference_is_what_lyra_does() {
    let md = std::fs::read_to_string(workspace_dir().join(REFERENCE)).expect("read the language reference");
    let mut problems = Vec::new();
    let blocks = fenced_blocks(&md, &mut problems);
    let examples = examples(&blocks, &mut problems);

    // Named workflows are there for every example to call (not the `then` variants of them).
    let mut shared: BTreeMap<String, String> = BTreeMap::new();
    for ex in examples.iter().filter(|e| e.named && !e.then && e.mode != Mode::Error) {
        if shared.insert(ex.file.clone(), ex.body.clone()).is_some() {
            problems.push(format!(
                "{REFERENCE}:{}: a second workflow named {}; give it another name or 'then'",
                ex.line, ex.file
            ));
        }
    }

    // Chains of examples that share a directory (an example and the `then`s after it) are
    // independent of each other: run them on a few threads.
    let mut chains: Vec<Vec<&Example>> = Vec::new();
    for ex in &examples {
        match chains.last_mut() {
            Some(chain) if ex.then => chain.push(ex),
            _ => chains.push(vec![ex]),
        }
    }
    let threads = 4;
    let found: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (chains, shared) = (&chains, &shared);
                s.spawn(move || {
                    let mut found = Vec::new();
                    for chain in chains.iter().skip(t).step_by(threads) {
                        let lyra = Lyra::new();
                        for ex in chain {
                            found.extend(check(&lyra, shared, ex));
                        }
                    }
                    found
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("an example thread panicked"))
            .collect()
    });
    problems.extend(found);

    // Guard against a parser that finds nothing and so passes vacuously.
    let count = |m: Mode| examples.iter().filter(|e| e.mode == m).count();
    for (mode, at_least) in [
        (Mode::Validate, 1),
        (Mode::Error, 15),
        (Mode::Plan, 1),
        (Mode::PlanError, 1),
        (Mode::Apply, 1),
        (Mode::ApplyError, 1),
    ] {
        if count(mode) < at_least {
            problems.push(format!(
                "{REFERENCE}: only {} {mode:?} examples found, expected at least {at_least}",
                count(mode)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s) with {REFERENCE}:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

#[test]
fn the_readme_links_the_language_reference() {
    let readme = std::fs::read_to_string(workspace_dir().join("README.md")).expect("read README.md");
    assert!(
        readme.contains("(docs/language.md)"),
        "README.md does not link docs/language.md"
    );
}
