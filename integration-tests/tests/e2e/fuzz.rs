//! Fuzz-style robustness: deterministic mutations of real workflows (lines deleted,
//! duplicated, swapped, re-indented, truncated, stray YAML punctuation) through `validate` and
//! `plan`. Whatever the input, lyra ends by itself with 0, 1 or 2 and never panics.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use integration_tests::{Lyra, Rng, Run, compat_dir, run_command};

const MUTATIONS: usize = 300;
const SEED: u64 = 0x6c79_7261; // "lyra"

/// Workflows of our own, covering what the compat corpus does not: guards, Null and Time
/// resources, collections over ranges and hashes, typed parameters, nested workflows.
const OWN: &[(&str, &str)] = &[
    (
        "guarded",
        "parameters:\n  flag:\n    type: Boolean\n    value: true\n  names:\n    type: Array[String]\n    value: [a, b]\nreturns: [outs]\nsteps:\n  items:\n    when: flag\n    each: $names\n    as: n\n    into: outs\n    step:\n      returns: output\n      resource: Null::Resource\n      value:\n        input: {name: $n, tags: [x, y]}\n        triggers_replace: $n\n",
    ),
    (
        "timed",
        "steps:\n  wait:\n    returns: {d: create_duration}\n    resource: Time::Sleep\n    value:\n      create_duration: 1ms\n      triggers: {k: v}\n  after:\n    range: [1, 3]\n    as: i\n    step:\n      resource: Null::Resource\n      value:\n        input: [$d, $i]\n",
    ),
    (
        "nested",
        "parameters:\n  p: {value: {a: {b: deep}}}\nreturns:\n  out:\n    value: {x: $inner_out, y: $p.a.b}\nsteps:\n  inner:\n    parameters: [p]\n    returns: [inner_out]\n    steps:\n      n:\n        returns: {inner_out: output}\n        resource: Null::Resource\n        value:\n          input: $p.a\n",
    ),
    (
        "pairs",
        "parameters:\n  on: {value: true}\n  off: {value: false}\nsteps:\n  by_key:\n    eachPair: {one: 1, two: 2}\n    as: [k, v]\n    step:\n      resource: Null::Resource\n      value:\n        input: {key: $k, value: $v}\n  guarded:\n    when: \"!off and (on or off)\"\n    resource: Null::Resource\n    value:\n      input: 1\n",
    ),
];

/// Characters that mean something to YAML or to lyra.
const STRAY: &[&str] = &[
    ":", "[", "]", "{", "}", "$", "-", "- ", "'", "\"", "#", "&", "*", "!", "|", ">", "%", "@", ",", "?", " ", "\t",
    "\\", "$$", "::", "\u{feff}", "é",
];

fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if lines.is_empty() {
        lines.push(String::new());
    }
    // One to three edits on top of each other.
    for _ in 0..=rng.below(3) {
        let n = lines.len().max(1);
        let i = rng.below(n);
        match rng.below(8) {
            0 if lines.len() > 1 => {
                lines.remove(i);
            }
            1 => {
                let dup = lines[i].clone();
                lines.insert(i, dup);
            }
            2 => {
                let j = rng.below(n);
                lines.swap(i, j);
            }
            3 => {
                // Truncate the whole file at a random byte (on a char boundary).
                let all = lines.join("\n");
                let mut cut = rng.below(all.len() + 1);
                while !all.is_char_boundary(cut) {
                    cut -= 1;
                }
                lines = all[..cut].lines().map(str::to_owned).collect();
                if lines.is_empty() {
                    lines.push(String::new());
                }
            }
            4 => {
                // Change the indentation of a line.
                let line = lines[i].trim_start().to_owned();
                let indent = rng.below(9);
                lines[i] = format!("{}{line}", " ".repeat(indent));
            }
            5 => {
                // Cut a line short.
                let line = &lines[i];
                let mut cut = rng.below(line.len() + 1);
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                lines[i] = line[..cut].to_owned();
            }
            _ => {
                // Insert stray characters.
                let line = &lines[i];
                let mut at = rng.below(line.len() + 1);
                while !line.is_char_boundary(at) {
                    at -= 1;
                }
                let stray = rng.pick(STRAY);
                lines[i] = format!("{}{stray}{}", &line[..at], &line[at..]);
            }
        }
    }
    let mut out = lines.join("\n");
    if rng.below(2) == 0 {
        out.push('\n');
    }
    out
}

/// The seed files: the compat corpus (when present) and our own.
fn seeds() -> Vec<(String, String)> {
    let mut seeds: Vec<(String, String)> = OWN.iter().map(|(n, y)| ((*n).to_owned(), (*y).to_owned())).collect();
    if let Some(dir) = compat_dir() {
        for name in [
            "foobernetes",
            "foober_iter",
            "sample_alias",
            "sample_output_hash",
            "varstep",
        ] {
            let path = dir.join("workflows").join(format!("{name}.yaml"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            seeds.push((name.to_owned(), text));
        }
    }
    seeds
}

fn check(run: &Run, mutant: &str) {
    assert!(
        !run.stderr.contains("panicked") && matches!(run.code, Some(0..=2)),
        "lyra failed on a mutated workflow:\n{run}\n--- workflow ---\n{mutant}"
    );
    if run.code == Some(1) && run.args == ["validate", "m"] {
        assert!(
            !run.stderr.trim().is_empty(),
            "an invalid workflow gets an explanation\n{run}\n{mutant}"
        );
    }
}

fn lyra_in(lyra: &Lyra, dir: &Path, args: &[&str]) -> Run {
    let mut cmd = lyra.command(args);
    cmd.current_dir(dir);
    run_command(cmd, args)
}

#[test]
fn mutated_workflows_never_panic() {
    let seeds = seeds();
    let lyra = Lyra::new();
    let data = "foobernetes:\n  policies:\n    lb_policy: rr\nvar_a: 1\nvar_b: 2\nvar_c: 3\nflag: true\n";
    let mut rng = Rng::new(SEED);
    // Generate every mutant up front, so the inputs do not depend on thread scheduling.
    let mutants: Vec<(usize, String)> = (0..MUTATIONS)
        .map(|k| {
            let (_, text) = &seeds[k % seeds.len()];
            (k, mutate(&mut rng, text))
        })
        .collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 4);
    let next = AtomicUsize::new(0);
    let (outcomes, valid) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for w in 0..workers {
            let (lyra, mutants, next, outcomes, valid) = (&lyra, &mutants, &next, &outcomes, &valid);
            s.spawn(move || {
                // Each worker has its own directory: workflows, data, state and cloud file.
                let dir = lyra
                    .write(format!("w{w}/data.yaml"), data)
                    .parent()
                    .expect("dir")
                    .to_path_buf();
                loop {
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    let Some((index, mutant)) = mutants.get(k) else { break };
                    std::fs::create_dir_all(dir.join("workflows")).expect("mkdir");
                    std::fs::write(dir.join("workflows").join("m.yaml"), mutant).expect("write mutant");
                    let v = lyra_in(lyra, &dir, &["validate", "m"]);
                    check(&v, mutant);
                    let j = lyra_in(lyra, &dir, &["validate", "m", "-o", "json"]);
                    check(&j, mutant);
                    if j.code == Some(0) || j.code == Some(1) {
                        let report = j.json();
                        assert_eq!(report["valid"] == true, j.code == Some(0), "mutant {index}\n{j}");
                        assert_eq!(
                            j.code, v.code,
                            "validate and validate -o json disagree on mutant {index}\n{v}\n{j}"
                        );
                    }
                    if v.code == Some(0) {
                        valid.fetch_add(1, Ordering::SeqCst);
                    }
                    let p = lyra_in(lyra, &dir, &["plan", "m", "--state", "state.db", "-o", "json"]);
                    check(&p, mutant);
                    if p.code == Some(0) {
                        p.json();
                    }
                    outcomes.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(outcomes.load(Ordering::SeqCst), MUTATIONS);
    // The mutations must not all be trivially broken (or trivially harmless).
    let valid = valid.load(Ordering::SeqCst);
    assert!(
        valid > MUTATIONS / 20 && valid < MUTATIONS * 19 / 20,
        "{valid} of {MUTATIONS} mutants are valid"
    );
}

#[test]
fn mutations_are_deterministic() {
    let text = OWN[0].1;
    let (mut a, mut b) = (Rng::new(SEED), Rng::new(SEED));
    for _ in 0..50 {
        assert_eq!(mutate(&mut a, text), mutate(&mut b, text));
    }
}
