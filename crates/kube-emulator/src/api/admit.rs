//! Writes with validating admission webhooks in between, as the apiserver orders them: the
//! server's own admission first (the write computed as a dry run, under the store's lock),
//! then the webhooks, with the lock released (a webhook may call back into the API), then
//! the write itself, under the lock again. A write no webhook matches is one step.

use std::sync::Arc;

use serde_json::Value;

use super::Target;
use crate::Shared;
use crate::errors::ApiError;
use crate::objects::{DeleteOptions, State, WriteOptions, Written};
use crate::webhooks::{self, Call, Operation, Request};

/// What the webhooks are told about the request besides its objects.
pub struct Review {
    user: String,
    options: Value,
    request: (Arc<crate::registry::ResourceType>, String, crate::objects::Subresource),
}

impl Review {
    pub fn new(t: &Target, user: &str, options: Value) -> Review {
        Review {
            user: user.to_string(),
            options,
            request: (t.rt.clone(), t.version.clone(), t.sub),
        }
    }

    fn request(
        self,
        operation: Operation,
        namespace: &str,
        name: &str,
        object: Option<Arc<Value>>,
        old_object: Option<Arc<Value>>,
        dry_run: bool,
    ) -> Request {
        let (rt, version, sub) = self.request;
        Request {
            rt,
            version,
            sub,
            operation,
            namespace: namespace.to_string(),
            name: name.to_string(),
            object,
            old_object,
            dry_run,
            options: self.options,
            user: self.user,
        }
    }
}

enum Step<T> {
    Done(T),
    Review(Vec<Call>, Box<Request>),
}

/// A create, update or patch: `f` performs it (as a dry run when its options say so; the
/// name is the one a create's dry run generated, once the webhooks have seen it).
pub async fn write<F>(
    shared: &Shared,
    t: &Target,
    review: Review,
    opts: WriteOptions,
    f: F,
) -> Result<Written, ApiError>
where
    F: Fn(&mut State, WriteOptions, Option<&str>) -> Result<Written, ApiError>,
{
    let ns = t.namespace.clone().unwrap_or_default();
    let step = shared.write(|s| {
        if !webhooks::any(s) {
            return f(s, opts, None).map(Step::Done);
        }
        let old = t.name.as_deref().and_then(|n| s.get(&t.rt, &ns, n).ok());
        let dry = f(s, WriteOptions { dry_run: true, ..opts }, None)?;
        let name = dry.object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let (operation, old) = if dry.created {
            (Operation::Create, None)
        } else {
            (Operation::Update, old)
        };
        let req = review.request(operation, &ns, &name, Some(dry.object), old, opts.dry_run);
        let calls = webhooks::calls(s, &req);
        if calls.is_empty() {
            return f(s, opts, None).map(Step::Done);
        }
        Ok(Step::Review(calls, Box::new(req)))
    })?;
    match step {
        Step::Done(w) => Ok(w),
        Step::Review(calls, req) => {
            let warnings = webhooks::run(calls, &req).await?;
            let pinned = (req.operation == Operation::Create).then_some(req.name.as_str());
            let mut w = shared.write(|s| f(s, opts, pinned))?;
            w.warnings.extend(warnings);
            Ok(w)
        }
    }
}

/// A DELETE, reviewed with the object as `oldObject` once its preconditions hold.
#[allow(clippy::too_many_arguments)]
pub async fn delete(
    shared: &Shared,
    t: &Target,
    review: Review,
    ns: &str,
    name: &str,
    del: &DeleteOptions,
    dry_run: bool,
) -> Result<Arc<Value>, ApiError> {
    let step = shared.write(|s| {
        if !webhooks::any(s) {
            return s.delete(&t.rt, ns, name, del, dry_run).map(Step::Done);
        }
        let old = s.get(&t.rt, ns, name)?;
        s.delete(&t.rt, ns, name, del, true)?;
        let req = review.request(Operation::Delete, ns, name, None, Some(old), dry_run);
        let calls = webhooks::calls(s, &req);
        if calls.is_empty() {
            return s.delete(&t.rt, ns, name, del, dry_run).map(Step::Done);
        }
        Ok(Step::Review(calls, Box::new(req)))
    })?;
    match step {
        Step::Done(gone) => Ok(gone),
        Step::Review(calls, req) => {
            // A delete's warnings have no object to travel with; the apiserver sends them
            // as headers, which the emulator's DELETE answer does not carry.
            webhooks::run(calls, &req).await?;
            shared.write(|s| s.delete(&t.rt, ns, name, del, dry_run))
        }
    }
}
