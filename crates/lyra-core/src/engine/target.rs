//! `--target STEP`: runs restricted to some of the workflow's own steps. A plan or apply runs
//! the targets and everything they read from (the steps they depend on, transitively); the
//! rest of the deployment is left as recorded: a targeted run collects no garbage. A delete removes the
//! targets' resources and everything recorded as built from them (their dependents first).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use crate::model::StepKind;
use crate::program::Program;
use crate::state::ResourceRecord;

/// The program cut down to the targets and what they depend on. Unknown names are ignored:
/// the caller checks them against [`step_names`] first.
pub(super) fn prune(program: &Program, targets: &[String]) -> Program {
    let mut main = (*program.main).clone();
    let StepKind::Workflow { steps, deps } = &mut main.root.kind else {
        // A workflow that is one resource: the target is all of it.
        return program.clone();
    };
    let mut keep = vec![false; steps.len()];
    let mut todo: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| targets.contains(&s.name))
        .map(|(i, _)| i)
        .collect();
    while let Some(i) = todo.pop() {
        if !std::mem::replace(&mut keep[i], true) {
            todo.extend(deps[i].iter().copied());
        }
    }
    // Old index -> new index of the kept steps, to renumber their dependencies.
    let mut new_index = vec![usize::MAX; steps.len()];
    let mut n = 0;
    for (i, k) in keep.iter().enumerate() {
        if *k {
            new_index[i] = n;
            n += 1;
        }
    }
    let kept_deps: Vec<Vec<usize>> = deps
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(d, _)| d.iter().map(|j| new_index[*j]).collect())
        .collect();
    let kept_steps = std::mem::take(steps)
        .into_iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(s, _)| s)
        .collect();
    *steps = kept_steps;
    *deps = kept_deps;
    // A partial run produces no returns: those of the left-out steps are not there.
    main.root.returns.clear();
    Program {
        main: Arc::new(main),
        workflows: program.workflows.clone(),
    }
}

/// The names `--target` can take: the workflow's own steps (its one step, for a workflow
/// that is a single resource).
pub fn step_names(program: &Program) -> Vec<String> {
    match &program.main.root.kind {
        StepKind::Workflow { steps, .. } => steps.iter().map(|s| s.name.clone()).collect(),
        _ => vec![program.main.root.name.clone()],
    }
}

/// Whether a recorded step id is (inside) target `t`.
pub fn covers(t: &str, step_id: &str) -> bool {
    step_id == t || step_id.strip_prefix(t).is_some_and(|rest| rest.starts_with('/'))
}

/// The records a targeted delete removes: the targets' and, transitively, every record built
/// from one of them (they would be left reading a resource that is gone).
pub(super) fn for_delete(records: Vec<ResourceRecord>, targets: &[String]) -> Vec<ResourceRecord> {
    let mut chosen: BTreeSet<String> = records
        .iter()
        .filter(|r| targets.iter().any(|t| covers(t, &r.step_id)))
        .map(|r| r.step_id.clone())
        .collect();
    loop {
        let more: HashSet<String> = records
            .iter()
            .filter(|r| !chosen.contains(&r.step_id) && r.depends_on.iter().any(|d| chosen.contains(d)))
            .map(|r| r.step_id.clone())
            .collect();
        if more.is_empty() {
            break;
        }
        chosen.extend(more);
    }
    records.into_iter().filter(|r| chosen.contains(&r.step_id)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, depends_on: &[&str]) -> ResourceRecord {
        let mut r = ResourceRecord::intent(id, "T::T", Default::default(), vec![], String::new());
        r.depends_on = depends_on.iter().map(|s| (*s).to_owned()).collect();
        r
    }

    #[test]
    fn a_delete_takes_the_targets_and_their_dependents() {
        let records = vec![
            rec("db", &[]),
            rec("app/0", &["db"]),
            rec("app/1", &["db"]),
            rec("lb", &["app/0", "app/1"]),
            rec("other", &[]),
            rec("dbx", &[]),
        ];
        let ids = |t: &[&str]| -> Vec<String> {
            let t: Vec<String> = t.iter().map(|s| (*s).to_owned()).collect();
            for_delete(records.clone(), &t).into_iter().map(|r| r.step_id).collect()
        };
        assert_eq!(ids(&["db"]), ["db", "app/0", "app/1", "lb"]);
        assert_eq!(ids(&["app"]), ["app/0", "app/1", "lb"]);
        assert_eq!(ids(&["lb", "other"]), ["lb", "other"]);
        assert!(ids(&["nosuch"]).is_empty());
    }

    #[test]
    fn covers_whole_segments() {
        assert!(covers("app", "app") && covers("app", "app/0/x"));
        assert!(!covers("app", "apps") && !covers("app/0", "app/00"));
    }
}
