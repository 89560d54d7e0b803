//! A resource step's lifecycle, in phases: the desired state, then (holding a slot of the
//! provider semaphore) either reading a read-only resource, or finding the current one
//! (asking the provider about a pending record), diffing, and in apply mode recording the
//! intent, creating, replacing or updating, and recording the outcome before its returns are
//! published.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::bind::coerce_opt;
use super::diff::changes;
use super::error::StepError;
use super::{At, CANCELLED, Done, Env, Run, Val, resource_type};
use crate::expr::{Expr, Var};
use crate::model::{Attr, Controls, Step, StepKind};
use crate::provider::{Lookup, OpContext, Provider, ProviderError, idempotency_key, legacy_idempotency_key};
use crate::report::{Action, AttrChange, Mode, Status, StepReport};
use crate::schema::ResourceSchema;
use crate::state::{ResourceRecord, StoreError};
use crate::value::{self, Map, Value, attr, too_deep};

/// A resource's desired state, as far as it is known.
struct Desired {
    values: Map,
    /// Attributes whose values are known only after apply (planning).
    unknown: Vec<String>,
    /// Attributes whose values derive from something sensitive.
    tainted: BTreeSet<String>,
}

/// What a resource step does with its resource, by its `external_id`.
enum Ownership {
    /// No `external_id`: the step creates, updates and deletes its resource.
    Managed,
    /// Read-only: the resource of this id is read, never changed.
    Read(String),
    /// Read-only, but the id is known only after apply (planning).
    ReadLater,
}

/// A resource step past its desired state, holding a provider slot: what every phase reads.
struct Target<'s> {
    at: At<'s>,
    /// The type as the workflow names it.
    type_name: &'s str,
    schema: &'s ResourceSchema,
    provider: &'s Arc<dyn Provider>,
    cx: OpContext<'s>,
    /// The provider's settings, recorded with the resource.
    config: Option<&'s super::config::Resolved>,
    /// The step's `retry:` and `timeout:`.
    controls: &'s Controls,
    prior: Option<&'s ResourceRecord>,
    desired: Desired,
    /// The recorded resources its values came from, for deletion order.
    depends_on: Vec<String>,
}

/// The resource as it is now: its id and actual state.
type Current = (String, Map);

/// [`Current`] as found before converging: the actual state borrowed from the record when
/// that is what a read answers ([`ResourceSchema::read_is_record`]).
type Found<'p> = (String, Cow<'p, Map>);

/// A step's slot among the run's `concurrency` provider operations.
type Permit<'a> = async_lock::SemaphoreGuard<'a>;

/// Why a step's provider call or its intent record failed.
enum Failure {
    Provider(ProviderError),
    Store(StoreError),
    /// The provider's answer cannot be recorded (too deep).
    Unstorable(StepError),
}

impl From<ProviderError> for Failure {
    fn from(e: ProviderError) -> Self {
        Failure::Provider(e)
    }
}

/// `e`, saying how many attempts it took when there were several. A failure cut short keeps
/// its kind (see `ProviderError::is_indefinite`): a create that timed out may have made its
/// resource, and its intent must stay.
fn after_attempts(e: ProviderError, attempts: u32) -> ProviderError {
    if attempts <= 1 || e.is_indefinite() {
        e
    } else {
        ProviderError::Other(format!("{e} (after {attempts} attempts)"))
    }
}

/// The key a pending record's create was asked with: its own, or for records written before
/// keys were recorded, the key those versions used.
pub(super) fn pending_key(deployment: &str, rec: &ResourceRecord) -> String {
    rec.create_key
        .clone()
        .unwrap_or_else(|| legacy_idempotency_key(deployment, &rec.step_id))
}

impl Run<'_, '_> {
    /// `started`: when the step started (its guard and parameters come first).
    pub(super) async fn resource(&self, step: &Step, env: Env, id: String, started: Instant) -> Done {
        let at = At { step, id: &id, started };
        let StepKind::Resource {
            type_name,
            value,
            external_id,
            controls,
            ..
        } = &step.kind
        else {
            unreachable!("resource step")
        };
        let prior = self.claim(&id);
        let providers = self.engine.providers;
        let Some((schema, provider)) = providers.resolve(type_name) else {
            let e = StepError::NoProvider {
                at: self.at(step.span),
                type_name: type_name.clone(),
            };
            return self.fail_step(&at, e);
        };
        let desired = match self.desired(type_name, schema, value, &env) {
            Ok(d) => d,
            Err(e) => return self.fail_step(&at, e),
        };
        let ownership = match self.ownership(external_id.as_deref().map(|(e, _)| e), &env) {
            Ok(o) => o,
            Err(e) => return self.fail_step(&at, e),
        };

        // The provider slot is let go before the outcome's record is written: a commit waits
        // for the disk, not for a provider, and steps that wait for theirs together share one
        // (see `Recorder`). The window slot is held until the record is written. A step that
        // calls no provider and writes nothing takes neither: most of a no-change plan's,
        // where taking and giving back the two slots was 7% of planning them.
        let slots = if self.calls_out(schema, prior, &ownership) {
            Some((self.window.acquire().await, self.sem.acquire().await))
        } else {
            None
        };
        let (_slot, permit) = slots.unzip();
        // Cancelled while waiting for a slot: do not start.
        if self.cancelled() {
            return self.skip_step(step, &id, CANCELLED);
        }
        self.engine.observer.step_started(&id, type_name);
        // The key of this step's create: a pending record's own (its create may have
        // happened), else a new one of this run's, so nothing made for a forgotten record is
        // ever adopted. `None` only in plan mode, which creates nothing.
        let create_key = match prior {
            Some(rec) if rec.pending => Some(pending_key(self.deployment, rec)),
            _ => self
                .run_id
                .map(|run| idempotency_key(self.engine.store.store_id(), run, self.deployment, &id)),
        };
        let mut origins: BTreeSet<&str> = BTreeSet::new();
        for v in env.values() {
            origins.extend(v.origins.iter().map(String::as_str));
        }
        let config = self.configs.for_type(&schema.name);
        let no_config: &Map = super::config::none();
        let t = Target {
            config,
            controls,
            at,
            type_name,
            schema,
            provider,
            cx: OpContext {
                deployment: self.deployment,
                step_id: &id,
                type_name: &schema.name,
                idempotency_key: create_key.as_deref(),
                config: config.map_or(no_config, |c| &c.map),
                cancel: self.engine.cancel,
            },
            prior,
            desired,
            depends_on: origins.into_iter().filter(|o| *o != id).map(str::to_owned).collect(),
        };
        match ownership {
            // Boxed, so that a step's future is small until it has its slots: a wide
            // workflow's steps are all ready, and wait for them at once (850 bytes a step
            // less: 85 MB of a first apply's peak at 100,000 steps).
            Ownership::Managed => Box::pin(self.managed(&t, permit)).await,
            Ownership::Read(ext) => Box::pin(self.read_only(&t, ext, permit)).await,
            Ownership::ReadLater => {
                let unknown = step.returns.iter().map(|r| (r.name.clone(), Val::unknown())).collect();
                self.finish(&t.at, Action::Read, vec![], None, unknown)
            }
        }
    }

    /// The desired state from the step's `value`, converted to the schema's types. Values
    /// derived from secrets are remembered.
    fn desired(
        &self,
        type_name: &str,
        schema: &ResourceSchema,
        value: &[Attr],
        env: &Env,
    ) -> Result<Desired, StepError> {
        let mut d = Desired {
            // Sized at once: growing it from empty took a slower path, twice, for each step.
            values: Map::with_capacity(value.len()),
            unknown: Vec::new(),
            tainted: BTreeSet::new(),
        };
        for a in value {
            // A value written out is converted where it is written, not copied first.
            let (known, sensitive) = match &a.expr {
                Expr::Lit(v) => (Some(Cow::Borrowed(v)), false),
                e => {
                    let resolved = self.resolve(e, env)?;
                    let known = match resolved.var {
                        Var::Known(v) => Some(Cow::Owned(v)),
                        Var::Unknown => None,
                    };
                    (known, resolved.sensitive)
                }
            };
            if sensitive {
                d.tainted.insert(a.name.clone());
            }
            let Some(v) = known else {
                d.unknown.push(a.name.clone());
                continue;
            };
            let ty = schema.attribute(&a.name).map(|x| &x.ty);
            let v = coerce_opt(ty, &v).map_err(|error| StepError::AttributeType {
                at: self.at(a.span),
                attribute: a.name.clone(),
                type_name: type_name.to_owned(),
                error: Box::new(error),
                secret: sensitive,
            })?;
            if sensitive {
                self.secrets.lock().expect("secrets lock").add_derived(&v);
            }
            d.values.insert(a.name.clone(), v);
        }
        Ok(d)
    }

    /// Whether the step manages its resource or reads the one its `external_id` names.
    fn ownership(&self, external_id: Option<&Expr>, env: &Env) -> Result<Ownership, StepError> {
        let Some(e) = external_id else {
            return Ok(Ownership::Managed);
        };
        Ok(match self.resolve(e, env)?.var {
            Var::Known(Value::String(s)) => Ownership::Read(s),
            Var::Known(other) => Ownership::Read(other.to_string()),
            Var::Unknown => Ownership::ReadLater,
        })
    }

    fn provider_failed(&self, t: &Target<'_>, source: ProviderError) -> StepError {
        StepError::Provider {
            at: self.at(t.at.step.span),
            type_name: t.type_name.to_owned(),
            source,
        }
    }

    /// A read-only resource: read, recorded when it changed, never created, updated or
    /// deleted.
    async fn read_only(&self, t: &Target<'_>, ext: String, permit: Option<Permit<'_>>) -> Done {
        let actual = match self
            .guarded(t, || t.provider.read(&t.cx, &ext, t.prior.map(|p| &p.actual)))
            .await
        {
            Ok(Some(a)) => match self.check_returned(t, &a) {
                Ok(()) => a,
                Err(e) => return self.fail_step(&t.at, e),
            },
            Ok(None) => {
                let e = StepError::ReadMissing {
                    at: self.at(t.at.step.span),
                    type_name: t.type_name.to_owned(),
                    external_id: ext,
                };
                return self.fail_step(&t.at, e);
            }
            Err(e) => return self.fail_step(&t.at, self.provider_failed(t, e)),
        };
        drop(permit);
        let secret = self.secret_attributes(t, &actual);
        if self.mode == Mode::Apply {
            let rec = ResourceRecord {
                step_id: t.at.id.to_owned(),
                type_name: t.schema.name.clone(),
                external_id: ext.clone(),
                desired: t.desired.values.clone(),
                actual: actual.clone(),
                depends_on: t.depends_on.clone(),
                managed: false,
                pending: false,
                sensitive: secret.iter().cloned().collect(),
                create_key: None,
            };
            let mut rec = rec;
            super::config::record(&mut rec, t.config);
            if t.prior != Some(&rec)
                && let Err(e) = self.engine.store.put_resource(self.deployment, &rec).await
            {
                return self.store_failed(&t.at, e);
            }
        }
        match self.resource_returns(t, Action::Read, &actual, &secret) {
            Ok(returns) => self.finish(&t.at, Action::Read, vec![], Some(ext), returns),
            Err(e) => self.fail_as(&t.at, Action::Read, Some(ext), e),
        }
    }

    /// A managed resource: planned, or converged and recorded.
    async fn managed(&self, t: &Target<'_>, permit: Option<Permit<'_>>) -> Done {
        let current = match self.current(t).await {
            Ok(c) => c,
            Err(e) => return self.fail_step(&t.at, e),
        };
        let (mut action, mut changes) = changes(
            t.schema,
            &t.desired.values,
            &t.desired.unknown,
            current.as_ref().map(|(_, a)| &**a),
        );
        if action == Action::Update
            && let Some((_, actual)) = &current
        {
            let reasons = t.provider.replace_reasons(&t.schema.name, &t.desired.values, actual);
            for c in &mut changes {
                let forced = reasons.iter().any(|r| {
                    r == &c.attribute
                        || r.strip_prefix(c.attribute.as_str())
                            .is_some_and(|rest| rest.starts_with('.'))
                });
                if forced {
                    c.forces_replace = true;
                    action = Action::Replace;
                }
            }
        }
        let empty = Map::new();
        let secret = self.secret_attributes(t, current.as_ref().map_or(&empty, |(_, a)| &**a));
        for c in &mut changes {
            // The old value is secret if the attribute was: it may hold an old secret.
            c.sensitive |= secret.contains(&c.attribute) || t.prior.is_some_and(|p| p.sensitive.contains(&c.attribute));
        }
        if self.mode == Mode::Plan {
            let actual = current.as_ref().map_or(&empty, |(_, a)| &**a);
            let returns = self.resource_returns(t, action, actual, &secret);
            let ext = current.map(|(e, _)| e);
            return match returns {
                Ok(returns) => self.finish(&t.at, action, changes, ext, returns),
                Err(e) => self.fail_as(&t.at, action, ext, e),
            };
        }
        self.converge(t, action, changes, current, permit).await
    }

    /// What is there now? A resource deleted behind our back is created again. A pending
    /// record means an earlier run died between `create` and recording its result: only the
    /// provider can tell whether the resource was made.
    async fn current<'p>(&self, t: &Target<'p>) -> Result<Option<Found<'p>>, StepError> {
        let found = match t.prior {
            Some(rec) if rec.pending => match self
                .guarded(t, || {
                    let asked = super::config::attributes(&rec.desired).into_owned();
                    async move { t.provider.lookup(&t.cx, &asked).await }
                })
                .await
            {
                Ok(Lookup::Found(c)) => Some((c.external_id, Cow::Owned(c.actual))),
                Ok(Lookup::Absent) => None,
                Ok(Lookup::Unsupported) => {
                    return Err(StepError::Unrecorded {
                        at: self.at(t.at.step.span),
                        step_id: t.at.id.to_owned(),
                        type_name: t.schema.name.clone(),
                        forget: self.engine.hints.forget_records(self.deployment, &[t.at.id]),
                    });
                }
                Err(e) => return Err(self.provider_failed(t, e)),
            },
            Some(rec) if t.schema.read_is_record => Some((rec.external_id.clone(), Cow::Borrowed(&rec.actual))),
            Some(rec) => match self
                .guarded(t, || t.provider.read(&t.cx, &rec.external_id, Some(&rec.actual)))
                .await
            {
                Ok(Some(a)) => Some((rec.external_id.clone(), Cow::Owned(a))),
                Ok(None) => None,
                Err(e) => return Err(self.provider_failed(t, e)),
            },
            None => None,
        };
        // A record's own values too: no store writes one too deep, but a state edited by hand
        // can hold one, and apply (which records what it found) would refuse it.
        if let Some((_, actual)) = &found {
            self.check_returned(t, actual)?;
        }
        Ok(found)
    }

    /// Applies `action` to the resource and records the outcome.
    async fn converge(
        &self,
        t: &Target<'_>,
        action: Action,
        changes: Vec<AttrChange>,
        current: Option<Found<'_>>,
        permit: Option<Permit<'_>>,
    ) -> Done {
        // The intent is recorded before `create` so that a crash before the result is recorded
        // leaves a trace (see `Lookup`). For a replace it follows the delete: until then the
        // record keeps the old resource's id. A local type leaves no trace to find (see
        // `ResourceSchema::local`): no intent.
        let intent_recorded = AtomicBool::new(false);
        // Made only when recorded: most runs converge steps that need no intent (no-ops,
        // updates), and a copy of the desired state for each cost a no-change apply.
        let record_intent = || async {
            if t.schema.local {
                return Ok(());
            }
            let mut intent = ResourceRecord::intent(
                t.at.id,
                &t.schema.name,
                t.desired.values.clone(),
                t.depends_on.clone(),
                t.cx.idempotency_key.unwrap_or_default().to_owned(),
            );
            super::config::record(&mut intent, t.config);
            self.engine
                .store
                .put_resource(self.deployment, &intent)
                .await
                .map_err(Failure::Store)?;
            intent_recorded.store(true, Ordering::SeqCst);
            Ok::<(), Failure>(())
        };
        let desired = &t.desired.values;
        let result: Result<Current, Failure> = async {
            match (action, &current) {
                (Action::Create, _) => {
                    record_intent().await?;
                    Ok(self.create(t, desired).await?)
                }
                (Action::Replace, Some((ext, actual))) => {
                    self.guarded(t, || t.provider.delete(&t.cx, ext, actual)).await?;
                    record_intent().await?;
                    Ok(self.create(t, desired).await?)
                }
                (Action::Update, Some((ext, actual))) => Ok(self
                    .guarded(t, || t.provider.update(&t.cx, ext, desired, actual))
                    .await
                    .map(|a| (ext.clone(), a))?),
                (_, Some((ext, actual))) => Ok((ext.clone(), Map::clone(actual))),
                (_, None) => unreachable!("no-op needs a current resource"),
            }
        }
        .await;
        // A value too deep to store is not stored: a created resource keeps its intent record
        // (the next run asks the provider for it, as after a crash), an updated one its old
        // record.
        let result = result.and_then(|(ext, actual)| match self.check_returned(t, &actual) {
            Ok(()) => Ok((ext, actual)),
            Err(e) => Err(Failure::Unstorable(e)),
        });
        // The provider is done with: what is left is recording the outcome.
        drop(permit);
        let (ext, actual) = match result {
            Ok(r) => r,
            Err(Failure::Unstorable(e)) => {
                let ext = current.map(|(e, _)| e);
                return self.fail_as(&t.at, action, ext, e);
            }
            // After a failed replace the old resource may be gone: the next run reads it,
            // finds nothing and creates it.
            Err(Failure::Provider(e)) => {
                // A create that failed made nothing (providers that cannot be sure track keys
                // and are asked again): drop its intent so the next run simply tries again.
                // One cut short (a timeout, a cancellation) may have made it: the intent stays,
                // and the next run asks the provider, as after a crash.
                if intent_recorded.load(Ordering::SeqCst)
                    && !e.is_indefinite()
                    && let Err(se) = self.engine.store.remove_resource(self.deployment, t.at.id).await
                {
                    return self.store_failed(&t.at, se);
                }
                let ext = current.map(|(e, _)| e);
                return self.fail_as(&t.at, action, ext, self.provider_failed(t, e));
            }
            Err(Failure::Store(e)) => return self.store_failed(&t.at, e),
        };
        let mut rec = ResourceRecord {
            step_id: t.at.id.to_owned(),
            type_name: t.schema.name.clone(),
            external_id: ext.clone(),
            desired: desired.clone(),
            actual: actual.clone(),
            depends_on: t.depends_on.clone(),
            managed: true,
            pending: false,
            sensitive: self.secret_attributes(t, &actual).into_iter().collect(),
            create_key: None,
        };
        super::config::record(&mut rec, t.config);
        // No-ops write only when the recorded state is stale (drift, new dependencies).
        if (action != Action::Noop || t.prior != Some(&rec))
            && let Err(e) = self.engine.store.put_resource(self.deployment, &rec).await
        {
            return self.store_failed(&t.at, e);
        }
        let secret: BTreeSet<String> = rec
            .sensitive
            .iter()
            .filter(|s| *s != super::config::RECORD_KEY)
            .cloned()
            .collect();
        match self.resource_returns(t, action, &actual, &secret) {
            Ok(returns) => self.finish(&t.at, action, changes, Some(ext), returns),
            // Recorded, but what it returns is not what the workflow says it is.
            Err(e) => self.fail_as(&t.at, action, Some(ext), e),
        }
    }

    /// One provider call under the step's controls: given up at its `timeout:`, and tried
    /// again after a retryable failure up to its `retry:` attempts, waiting `backoff`, doubled
    /// each time up to `max_backoff`. A cancelled run retries nothing.
    async fn guarded<T, F, Fut>(&self, t: &Target<'_>, op: F) -> Result<T, ProviderError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        let c = t.controls;
        let mut wait = c.backoff;
        let mut attempt = 1;
        loop {
            match self.attempt(c, op()).await {
                Err(e) if e.is_retryable() && attempt < c.attempts && !self.cancelled() => {
                    self.engine.timer.sleep(wait).await;
                    wait = (wait * 2).min(c.max_backoff);
                    attempt += 1;
                }
                Err(e) => return Err(after_attempts(e, attempt)),
                r => return r,
            }
        }
    }

    /// `op`, given up at `c.timeout`.
    async fn attempt<T>(
        &self,
        c: &Controls,
        op: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        let Some(limit) = c.timeout else {
            return op.await;
        };
        let op = std::pin::pin!(op);
        match futures::future::select(op, self.engine.timer.sleep(limit)).await {
            futures::future::Either::Left((r, _)) => r,
            futures::future::Either::Right(((), _)) => Err(ProviderError::TimedOut(limit)),
        }
    }

    /// A create under the step's controls. A create that timed out may have made the resource:
    /// before trying again the provider is asked for it by the create's key, and when it
    /// cannot tell, the create is not repeated (its intent stays for the next run to resolve).
    async fn create(&self, t: &Target<'_>, desired: &Map) -> Result<Current, ProviderError> {
        let c = t.controls;
        let mut wait = c.backoff;
        let mut attempt = 1;
        loop {
            let r = self.attempt(c, t.provider.create(&t.cx, desired)).await;
            let e = match r {
                Ok(created) => return Ok((created.external_id, created.actual)),
                Err(e) => e,
            };
            if !e.is_retryable() || attempt >= c.attempts || self.cancelled() {
                return Err(after_attempts(e, attempt));
            }
            self.engine.timer.sleep(wait).await;
            wait = (wait * 2).min(c.max_backoff);
            attempt += 1;
            if e.is_indefinite() {
                match self.attempt(c, t.provider.lookup(&t.cx, desired)).await {
                    Ok(Lookup::Found(created)) => return Ok((created.external_id, created.actual)),
                    Ok(Lookup::Absent) => {}
                    Ok(Lookup::Unsupported) | Err(_) => return Err(e),
                }
            }
        }
    }

    /// The attributes of a resource whose values are secret: those set from something
    /// sensitive (`tainted`), those the provider marks secret, those holding a known secret
    /// (a provider echoing a secret input, now or from an earlier run, which it cannot know
    /// to mark), and those the prior record marked whose value has not changed since. The
    /// values the provider marks are remembered as secrets; derived ones only when scalars
    /// (see `Secrets::add_derived`).
    fn secret_attributes(&self, t: &Target<'_>, actual: &Map) -> BTreeSet<String> {
        // Usually nothing is: no value set from a secret, no attribute the provider marks, none
        // the record marked, and no secret met yet to find echoed. Then there is none to find
        // below, and looking was 8% of planning an unchanged step.
        if t.desired.tainted.is_empty()
            && t.prior.is_none_or(|p| p.sensitive.is_empty())
            && !t.schema.has_secrets()
            && self.secrets.lock().expect("secrets lock").is_empty()
        {
            return BTreeSet::new();
        }
        let desired = &t.desired.values;
        let mut out = t.desired.tainted.clone();
        out.extend(
            desired
                .keys()
                .chain(actual.keys())
                .filter(|k| t.schema.is_secret(k))
                .cloned(),
        );
        let mut secrets = self.secrets.lock().expect("secrets lock");
        for k in &out {
            let marked = t.schema.is_secret(k);
            for m in [desired, actual] {
                if let Some(v) = attr(m, k) {
                    if marked {
                        secrets.add(v);
                    } else {
                        secrets.add_derived(v);
                    }
                }
            }
        }
        let unchanged = |k: &String| {
            t.prior
                .is_some_and(|p| p.sensitive.contains(k) && attr(&p.actual, k) == attr(actual, k))
        };
        let echoes: Vec<String> = desired
            .iter()
            .chain(actual.iter())
            .filter(|(k, v)| !out.contains(*k) && (secrets.reveals(v) || unchanged(k)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in echoes {
            for m in [desired, actual] {
                if let Some(v) = attr(m, &k) {
                    secrets.add_derived(v);
                }
            }
            out.insert(k);
        }
        out
    }

    /// Whether the step may call its provider or write a record. In a plan, a managed step
    /// calls it only to read what its record holds (see [`ResourceSchema::read_is_record`]) or
    /// to look for a create in doubt (see [`Run::current`]); one whose id is known only after
    /// apply, never.
    fn calls_out(&self, schema: &ResourceSchema, prior: Option<&ResourceRecord>, ownership: &Ownership) -> bool {
        if self.mode != Mode::Plan {
            return true;
        }
        match ownership {
            Ownership::Managed => prior.is_some_and(|r| r.pending || !schema.read_is_record),
            Ownership::Read(_) => true,
            Ownership::ReadLater => false,
        }
    }

    /// Whether what a provider returned can be recorded and shown: values nested deeper than
    /// the limit could be written but never read back.
    fn check_returned(&self, t: &Target<'_>, actual: &Map) -> Result<(), StepError> {
        match actual.iter().find(|(_, v)| too_deep(v)) {
            None => Ok(()),
            Some((k, _)) => Err(StepError::Unrecordable {
                at: self.at(t.at.step.span),
                type_name: t.schema.name.clone(),
                attribute: k.clone(),
            }),
        }
    }

    /// A failed state write: the step fails, and so does the run, whatever else happens.
    fn store_failed(&self, at: &At<'_>, source: StoreError) -> Done {
        let e = StepError::Record {
            step_id: at.id.to_owned(),
            source,
        };
        *self.fatal.lock().expect("fatal lock") = Some(e.to_string());
        self.fail_step(at, e)
    }

    /// What the step returns, from the desired and actual states. In plan mode what only
    /// apply can tell (an attribute the provider will set on a new resource) is unknown.
    fn resource_returns(
        &self,
        t: &Target<'_>,
        action: Action,
        actual: &Map,
        secret: &BTreeSet<String>,
    ) -> Result<Env, StepError> {
        let desired = &t.desired.values;
        let mut origins = None;
        let mut out = Env::default();
        // A return nothing reads, with no type to check, is not made: it would go unused (a
        // wide workflow's returns are often only there to be looked at). Its secrets are
        // known from `secret` already.
        for r in t.at.step.returns.iter().filter(|r| r.wanted()) {
            let attr = r.source_name().unwrap_or(&r.name);
            let sensitive = secret.contains(attr) || t.schema.is_secret(attr);
            let var = if self.mode == Mode::Plan {
                let provided = t.schema.attribute(attr).is_some_and(|a| a.provided);
                if t.desired.unknown.iter().any(|u| u == attr)
                    || (matches!(action, Action::Create | Action::Replace)
                        && provided
                        && value::attr(desired, attr).is_none_or(Value::is_null))
                {
                    Var::Unknown
                } else {
                    Var::Known(
                        value::attr(desired, attr)
                            .or_else(|| value::attr(actual, attr))
                            .cloned()
                            .unwrap_or(Value::Null),
                    )
                }
            } else {
                Var::Known(
                    value::attr(actual, attr)
                        .or_else(|| value::attr(desired, attr))
                        .cloned()
                        .unwrap_or(Value::Null),
                )
            };
            let v = Val {
                var,
                origins: Arc::clone(origins.get_or_insert_with(|| Arc::new(vec![t.at.id.to_owned()]))),
                sensitive,
            };
            out.insert(r.name.clone(), self.typed_return(r, v)?);
        }
        Ok(out)
    }

    /// Reports a resource step done (or planned) and publishes its returns.
    fn finish(
        &self,
        at: &At<'_>,
        action: Action,
        changes: Vec<AttrChange>,
        external_id: Option<String>,
        returns: Env,
    ) -> Done {
        self.report(StepReport {
            id: at.id.to_owned(),
            type_name: resource_type(at.step),
            action,
            status: if self.mode == Mode::Plan {
                Status::Planned
            } else {
                Status::Done
            },
            external_id,
            duration: at.started.elapsed(),
            error: None,
            changes,
            refused: false,
        });
        Done::Ok(returns)
    }
}
