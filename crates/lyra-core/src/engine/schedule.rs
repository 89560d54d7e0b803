//! The traversal: a step's guard and parameters, a workflow's children started as soon as
//! their inputs are produced, collections' iterations and calls. Resource steps go to
//! `resource`, which bounds provider operations with the run's semaphore.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use sha2::{Digest, Sha256};

use super::error::{IterationError, StepError};
use super::{At, CANCELLED, Done, Env, Run, Val, resource_type};
use crate::expr::Var;
use crate::model::{Over, Param, ParamSource, Step, StepKind};
use crate::report::{Action, Status, StepReport};
use crate::types::{Type, kind_of};
use crate::value::{Map, Value, too_deep};

fn child_id(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

/// The id segment of an iteration over a key of a secret hash. Step ids are shown and
/// recorded everywhere (plans, history, status, `state` commands), so they must not hold the
/// key. The position is no good either: a hash keeps its keys in the order written, so adding
/// one would shift the others and replace their resources. A digest of the key (scoped to the
/// collection) is stable, and 64 bits make a collision within one hash negligible. It hides
/// the key, not what can be guessed: a key from a small set can be found by trying them.
pub(super) fn secret_key_segment(collection_id: &str, key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(collection_id.as_bytes())
        .chain_update([0u8])
        .chain_update(key.as_bytes())
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

impl Run<'_, '_> {
    /// Runs a step in its enclosing scope: guard, own parameters, then the body.
    pub(super) fn step<'s>(&'s self, step: &'s Step, env: Env, id: String) -> BoxFuture<'s, Done> {
        Box::pin(async move {
            let started = Instant::now();
            if let Some((guard, _)) = step.when.as_deref() {
                let look = |n: &str| env.get(n).map(|v| &v.var);
                if guard.eval(&look) == Some(false) {
                    // The step is not wanted: its returns are undefined, and what it made
                    // before is garbage.
                    self.report(StepReport {
                        id: id.clone(),
                        type_name: resource_type(step),
                        action: Action::Noop,
                        status: Status::GuardedOff,
                        external_id: None,
                        duration: started.elapsed(),
                        error: None,
                        changes: vec![],
                        refused: false,
                    });
                    return Done::Ok(undefined_returns(step));
                }
            }
            // Every parameter is read in the enclosing scope (a parameter's value cannot see
            // the step's other parameters), then bound inside the step.
            let mut bound = Vec::with_capacity(step.params.len());
            for p in &step.params {
                match self.argument(p, &env, "") {
                    Ok(v) => bound.push((p.name.clone(), v)),
                    Err(e) => return self.fail_step(&At { step, id: &id, started }, e),
                }
            }
            let mut local = env;
            local.extend(bound);
            // A resource is run in this future rather than in one `body` would box: one
            // allocation per step, not two.
            if let StepKind::Resource { .. } = &step.kind {
                self.resource(step, local, id, started).await
            } else {
                self.body(step, local, id).await
            }
        })
    }

    /// Runs the body of a step whose parameters are bound in `env`.
    pub(super) fn body<'s>(&'s self, step: &'s Step, env: Env, id: String) -> BoxFuture<'s, Done> {
        Box::pin(async move {
            match &step.kind {
                StepKind::Resource { .. } => self.resource(step, env, id, Instant::now()).await,
                StepKind::Workflow { steps, deps } => {
                    let started = Instant::now();
                    let (scope, ok) = self.scope(steps, deps, env, &id).await;
                    if !ok {
                        // Children reported their own failures; account for the subtree.
                        self.claim_subtree(&id);
                        if !id.is_empty() {
                            self.group_report(&id, Status::Failed, Some("a step inside failed".to_owned()), started);
                        }
                        return Done::Failed;
                    }
                    let done = match self.returns_from_scope(&step.returns, &scope) {
                        Ok(r) => Done::Ok(r),
                        Err(e) => self.fail_step(&At { step, id: &id, started }, e),
                    };
                    // The top scope's names (one or more per step) go with the process.
                    if id.is_empty() && self.engine.leave_to_exit {
                        std::mem::forget(scope);
                    }
                    done
                }
                StepKind::Collection { .. } => self.collection(step, env, id).await,
                StepKind::Call { target, args, .. } => self.call(step, target, args, env, id).await,
            }
        })
    }

    /// Runs the children of a workflow as their inputs become available. Returns every
    /// name produced in the scope, and whether all children succeeded.
    async fn scope(&self, steps: &[Step], deps: &[Vec<usize>], mut vars: Env, prefix: &str) -> (Env, bool) {
        let mut front = Frontier::new(deps);
        // Each child produces its names into `vars`: room for them, as growing a map of
        // 10,000 moved them all several times. A resource makes only the returns that are
        // read or typed (see `resource_returns`); a wide workflow's are often neither.
        vars.reserve(steps.iter().map(produced_at_most).sum());
        let mut running = FuturesUnordered::new();
        // Children finished at their first poll since the scope last let others run.
        let mut at_once = 0;
        loop {
            let until = self.start_until(running.len());
            while running.len() < until
                && let Some(i) = front.next()
            {
                let step = &steps[i];
                let id = child_id(prefix, &step.name);
                let why = if self.cancelled() {
                    Some(CANCELLED.to_owned())
                } else {
                    let failed: Vec<&str> = deps[i]
                        .iter()
                        .filter(|d| front.bad[**d])
                        .map(|d| steps[*d].name.as_str())
                        .collect();
                    (!failed.is_empty())
                        .then(|| format!("it depends on '{}', which did not complete", failed.join("', '")))
                };
                if let Some(why) = why {
                    self.skip_step(step, &id, &why);
                    front.settle(i, false);
                    continue;
                }
                let env: Env = step
                    .inputs
                    .iter()
                    .filter_map(|name| vars.get(name).map(|v| (name.clone(), v.clone())))
                    .collect();
                let mut child = self.step(step, env, id);
                // A child that is done at its first poll (most of a plan's are) is settled
                // here: a task in `running` for each cost a tenth of planning them. One that
                // waits is polled again there, with a waker that wakes this scope.
                match (&mut child).now_or_never() {
                    Some(done) => {
                        front.settle(i, settle_into(&mut vars, done));
                        at_once += 1;
                    }
                    None => {
                        running.push(async move { (i, child.await) });
                        #[cfg(test)]
                        super::tests::note_in_flight(self.deployment, running.len());
                    }
                }
                // Now and then the others on this thread (a signal's handler) get to run.
                if at_once == YIELD_EVERY {
                    at_once = 0;
                    yield_now().await;
                }
            }
            let Some((i, done)) = running.next().await else { break };
            front.settle(i, settle_into(&mut vars, done));
        }
        (vars, front.all_ok)
    }

    /// Runs a collection's iterations concurrently and collects their returns into its
    /// `into` list, in iteration order.
    async fn collection(&self, step: &Step, env: Env, id: String) -> Done {
        let StepKind::Collection {
            over,
            over_span,
            vars,
            into,
            step: inner,
        } = &step.kind
        else {
            unreachable!("collection step")
        };
        let at = At {
            step,
            id: &id,
            started: Instant::now(),
        };
        let mut origins: BTreeSet<String> = BTreeSet::new();
        let mut sensitive = false;
        let mut values = Vec::new();
        for e in over.exprs() {
            match self.resolve(e, &env) {
                Ok(v) => {
                    origins.extend(v.origins.iter().cloned());
                    sensitive |= v.sensitive;
                    values.push(v.var);
                }
                Err(e) => return self.fail_step(&at, e),
            }
        }
        if values.contains(&Var::Unknown) {
            // Planning: how many iterations there will be is known only after apply.
            self.claim_subtree(&id);
            self.group_report(
                &id,
                Status::Planned,
                Some("iterations known after apply".to_owned()),
                at.started,
            );
            return self.collected(&at, into, Val::unknown());
        }
        let known: Vec<Value> = values
            .into_iter()
            .map(|v| if let Var::Known(x) = v { x } else { Value::Null })
            .collect();
        let bad = |problem: IterationError| StepError::Iteration {
            at: self.at(*over_span),
            problem,
        };
        // (segment of the id, bindings)
        let iterations: Vec<(String, Vec<Value>)> = match &**over {
            Over::Each(_) => match &known[0] {
                Value::Array(items) => items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        let bound = if vars.len() <= 1 {
                            vec![item.clone()]
                        } else {
                            (0..vars.len())
                                .map(|k| match item {
                                    Value::Array(a) => a.get(k).cloned().unwrap_or(Value::Null),
                                    Value::Object(m) => m.get(&vars[k]).cloned().unwrap_or(Value::Null),
                                    _ => Value::Null,
                                })
                                .collect()
                        };
                        (i.to_string(), bound)
                    })
                    .collect(),
                Value::Null => vec![],
                other => return self.fail_step(&at, bad(IterationError::EachNeedsArray(kind_of(other)))),
            },
            Over::EachPair(_) => match &known[0] {
                Value::Object(m) => m
                    .iter()
                    .map(|(k, v)| {
                        let seg = if sensitive {
                            // The key is as secret as the hash: out of the id, and scrubbed
                            // from messages that quote it.
                            self.remember(&Var::Known(Value::String(k.clone())));
                            secret_key_segment(&id, k)
                        } else {
                            k.clone()
                        };
                        (seg, vec![Value::String(k.clone()), v.clone()])
                    })
                    .collect(),
                Value::Null => vec![],
                other => return self.fail_step(&at, bad(IterationError::EachPairNeedsHash(kind_of(other)))),
            },
            Over::Times(_) | Over::Range(..) => {
                let ints: Option<Vec<i64>> = known
                    .iter()
                    .map(|v| Type::INTEGER.coerce(v).ok().and_then(|x| x.as_i64()))
                    .collect();
                let Some(ints) = ints else {
                    return self.fail_step(&at, bad(IterationError::NotIntegers));
                };
                let (from, to) = if ints.len() == 1 {
                    (0, ints[0])
                } else {
                    (ints[0], ints[1])
                };
                if to < from {
                    let problem = match (ints.len(), sensitive) {
                        (1, false) => IterationError::NegativeTimes(to),
                        (1, true) => IterationError::NegativeSecretTimes,
                        (_, false) => IterationError::BackwardRange { from, to },
                        (_, true) => IterationError::BackwardSecretRange,
                    };
                    return self.fail_step(&at, bad(problem));
                }
                (from..to).map(|i| (i.to_string(), vec![Value::from(i)])).collect()
            }
        };
        let origins = Arc::new(origins.into_iter().collect::<Vec<_>>());
        let mut futs = FuturesUnordered::new();
        let mut pending = iterations.into_iter().enumerate();
        let mut results: Vec<(usize, Env)> = Vec::new();
        let mut ok = true;
        loop {
            let until = self.start_until(futs.len());
            while futs.len() < until
                && let Some((idx, (seg, bound))) = pending.next()
            {
                let mut e = env.clone();
                for (name, v) in vars.iter().zip(bound) {
                    e.insert(
                        name.clone(),
                        Val {
                            var: Var::Known(v),
                            origins: origins.clone(),
                            sensitive,
                        },
                    );
                }
                let iid = format!("{id}/{seg}");
                futs.push(async move { (idx, self.step(inner, e, iid).await) });
                #[cfg(test)]
                super::tests::note_in_flight(self.deployment, futs.len());
            }
            let Some((idx, done)) = futs.next().await else { break };
            match done {
                Done::Ok(r) => results.push((idx, r)),
                _ => ok = false,
            }
        }
        if !ok {
            self.claim_subtree(&id);
            self.group_report(&id, Status::Failed, Some("an iteration failed".to_owned()), at.started);
            return Done::Failed;
        }
        results.sort_by_key(|(i, _)| *i);
        let mut all_origins: BTreeSet<String> = BTreeSet::new();
        let mut any_sensitive = false;
        let mut unknown = false;
        let mut items = Vec::with_capacity(results.len());
        for (_, r) in results {
            let mut element = Map::new();
            for ret in &inner.returns {
                let v = r.get(&ret.name).cloned().unwrap_or_else(|| Val::known(Value::Null));
                all_origins.extend(v.origins.iter().cloned());
                any_sensitive |= v.sensitive;
                match v.var {
                    Var::Known(x) => {
                        element.insert(ret.name.clone(), x);
                    }
                    Var::Unknown => unknown = true,
                }
            }
            items.push(if inner.returns.len() == 1 {
                element.into_iter().next().map(|(_, v)| v).unwrap_or(Value::Null)
            } else {
                Value::Object(element)
            });
        }
        let items = Value::Array(items);
        if too_deep(&items) {
            let e = StepError::CollectedTooDeep {
                at: self.at(step.span),
                into: into.clone(),
            };
            return self.fail_step(&at, e);
        }
        let var = if unknown { Var::Unknown } else { Var::Known(items) };
        let val = Val {
            var,
            origins: Arc::new(all_origins.into_iter().collect()),
            sensitive: any_sensitive,
        };
        self.collected(&at, into, val)
    }

    /// What a collection produces: its `into` list, converted to the type its return (which
    /// can only be that list) declares.
    fn collected(&self, at: &At<'_>, into: &str, val: Val) -> Done {
        let val = match at.step.returns.iter().find(|r| r.name == into) {
            Some(r) => match self.typed_return(r, val) {
                Ok(v) => v,
                Err(e) => return self.fail_step(at, e),
            },
            None => val,
        };
        Done::Ok([(into.to_owned(), val)].into_iter().collect())
    }

    async fn call(&self, step: &Step, target: &str, args: &[Param], env: Env, id: String) -> Done {
        let at = At {
            step,
            id: &id,
            started: Instant::now(),
        };
        let Some(wf) = self.program.workflows.get(target) else {
            let e = StepError::NotLoaded {
                at: self.at(step.span),
                target: target.to_owned(),
            };
            return self.fail_step(&at, e);
        };
        let root = &wf.root;
        let mut callee = Env::default();
        let passed_to = format!(" passed to '{target}'");
        for p in &root.params {
            let v = if let Some(a) = args.iter().find(|a| a.name == p.name) {
                self.argument(a, &env, &passed_to)
            } else {
                match &p.source {
                    ParamSource::Lookup(key) => self.lookup_param(key, p),
                    ParamSource::Value(e) => self.resolve(e, &Env::default()),
                    ParamSource::Implicit => Ok(env.get(&p.name).cloned().unwrap_or_else(|| Val::known(Value::Null))),
                }
            };
            let v = match v.and_then(|v| self.typed(v, p, &format!(" of '{target}'"))) {
                Ok(v) => v,
                Err(e) => return self.fail_step(&at, e),
            };
            callee.insert(p.name.clone(), v);
        }
        // The called workflow's steps live under the call step's id; a called top-level
        // resource is the call step itself.
        match self.body(root, callee, id.clone()).await {
            Done::Ok(returned) => {
                let mut out = Env::default();
                for r in &step.returns {
                    let src = r.source_name().unwrap_or(&r.name);
                    let v = returned.get(src).cloned().unwrap_or_else(|| Val::known(Value::Null));
                    match self.typed_return(r, v) {
                        Ok(v) => out.insert(r.name.clone(), v),
                        Err(e) => return self.fail_step(&at, e),
                    };
                }
                Done::Ok(out)
            }
            other => other,
        }
    }
}

/// How many children of a scope may finish at their first poll, one after another, before
/// the scope lets the rest of its thread run.
const YIELD_EVERY: usize = 256;

/// Which children of a scope may start: those whose inputs are all settled.
struct Frontier {
    dependents: Vec<Vec<usize>>,
    /// How many of each child's inputs are not settled yet.
    waiting: Vec<usize>,
    /// The children ready from the start, the one written last first: most of a wide
    /// workflow's, taken from the end with no heap to keep in order (popping 10,000 from a
    /// heap was 5% of planning them).
    ready_at_start: Vec<usize>,
    /// The children made ready since, the one written first on top.
    ready: BinaryHeap<Reverse<usize>>,
    /// Whether each child ended badly (failed or skipped).
    bad: Vec<bool>,
    all_ok: bool,
}

impl Frontier {
    fn new(deps: &[Vec<usize>]) -> Frontier {
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); deps.len()];
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                dependents[d].push(i);
            }
        }
        let waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
        let ready_at_start = (0..deps.len()).rev().filter(|i| waiting[*i] == 0).collect();
        Frontier {
            dependents,
            waiting,
            ready_at_start,
            ready: BinaryHeap::new(),
            bad: vec![false; deps.len()],
            all_ok: true,
        }
    }

    /// The ready child written first: steps start in the workflow's order, as far as their
    /// inputs allow (progress reads top to bottom, and the records a plan reads are visited
    /// in the order they were loaded).
    fn next(&mut self) -> Option<usize> {
        match (self.ready_at_start.last(), self.ready.peek()) {
            (Some(&first), Some(&Reverse(later))) if later < first => self.ready.pop().map(|Reverse(i)| i),
            (Some(_), _) => self.ready_at_start.pop(),
            (None, _) => self.ready.pop().map(|Reverse(i)| i),
        }
    }

    /// Child `i` ended, well or not: its dependents may be ready.
    fn settle(&mut self, i: usize, ok: bool) {
        if !ok {
            self.bad[i] = true;
            self.all_ok = false;
        }
        for &j in &self.dependents[i] {
            self.waiting[j] -= 1;
            if self.waiting[j] == 0 {
                self.ready.push(Reverse(j));
            }
        }
    }
}

/// How many names `step` produces in its scope at most.
fn produced_at_most(step: &Step) -> usize {
    match &step.kind {
        StepKind::Resource { .. } => step.returns.iter().filter(|r| r.wanted()).count(),
        StepKind::Collection { .. } => 1,
        _ => step.returns.len(),
    }
}

/// Adds what a child produced to its scope's names; whether it ended well.
fn settle_into(vars: &mut Env, done: Done) -> bool {
    match done {
        Done::Ok(produced) => {
            vars.extend(produced);
            true
        }
        Done::Failed | Done::Skipped => false,
    }
}

/// Lets the other tasks of the thread run once.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Every return of a step, undefined (its guard was false).
fn undefined_returns(step: &Step) -> Env {
    match &step.kind {
        StepKind::Collection { into, .. } => [(into.clone(), Val::known(Value::Null))].into_iter().collect(),
        _ => step
            .returns
            .iter()
            .map(|r| (r.name.clone(), Val::known(Value::Null)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::Frontier;

    /// Takes every child as `front` lets them, settling each at once: the order they start.
    fn order(deps: &[Vec<usize>]) -> Vec<usize> {
        let mut front = Frontier::new(deps);
        let mut started = Vec::new();
        while let Some(i) = front.next() {
            started.push(i);
            front.settle(i, true);
        }
        started
    }

    #[test]
    fn children_start_in_written_order_as_their_inputs_allow() {
        assert_eq!(order(&[vec![], vec![], vec![]]), [0, 1, 2]);
        // 1 is made ready by 0 and comes before 2, ready from the start.
        assert_eq!(order(&[vec![], vec![0], vec![]]), [0, 1, 2]);
        // 4 is made ready by 0 but 2 and 3 were written first; 1 waits for 3.
        assert_eq!(order(&[vec![], vec![3], vec![], vec![], vec![0]]), [0, 2, 3, 1, 4]);
        // A chain written backwards.
        assert_eq!(order(&[vec![1], vec![2], vec![]]), [2, 1, 0]);
    }
}
