//! Values in scopes: parameters and call arguments read from their sources, returns, and
//! expressions resolved with the resources they came from and whether they are secret.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::error::StepError;
use super::{Env, Run, Val, lookup, no_origins};
use crate::expr::{Expr, ResolveError, Var};
use crate::model::{Param, ParamSource, Return, ReturnSource};
use crate::types::{Type, TypeError};
use crate::value::{Value, too_deep};

pub(super) fn coerce_opt(ty: Option<&Type>, v: &Value) -> Result<Value, TypeError> {
    match ty {
        Some(t) => t.coerce(v),
        None => Ok(v.clone()),
    }
}

impl Run<'_, '_> {
    /// A parameter's (or a call argument's) value, read from its source in `scope` (the
    /// enclosing one) and converted to its type; `of` says whose parameter it is in messages.
    pub(super) fn argument(&self, p: &Param, scope: &Env, of: &str) -> Result<Val, StepError> {
        let v = match &p.source {
            ParamSource::Implicit => scope
                .get(&p.name)
                .cloned()
                .or_else(|| p.default.clone().map(Val::known))
                .unwrap_or_else(|| Val::known(Value::Null)),
            ParamSource::Lookup(key) => self.lookup_param(key, p)?,
            ParamSource::Value(e) => self.resolve(e, scope)?,
        };
        self.typed(v, p, of)
    }

    pub(super) fn lookup_param(&self, key: &str, p: &Param) -> Result<Val, StepError> {
        let v = lookup(self.data, key)
            .or(p.default.as_ref())
            .ok_or_else(|| StepError::MissingKey {
                at: self.at(p.span),
                param: p.name.clone(),
                key: key.to_owned(),
            })?;
        if too_deep(v) {
            return Err(StepError::DataTooDeep {
                at: self.at(p.span),
                param: p.name.clone(),
                key: key.to_owned(),
            });
        }
        Ok(Val::known(v.clone()))
    }

    /// Coerces a parameter's value to its declared type (`of` names a called workflow).
    pub(super) fn typed(&self, v: Val, p: &Param, of: &str) -> Result<Val, StepError> {
        let sensitive = v.sensitive || p.ty.as_ref().is_some_and(Type::is_sensitive);
        let v = match (&v.var, &p.ty) {
            (Var::Known(x), Some(t)) => t
                .coerce(x)
                .map(|x| Val {
                    var: Var::Known(x),
                    origins: v.origins.clone(),
                    sensitive,
                })
                .map_err(|error| StepError::ParamType {
                    at: self.at(p.span),
                    param: p.name.clone(),
                    of: of.to_owned(),
                    error: Box::new(error),
                    secret: v.sensitive,
                })?,
            _ => Val { sensitive, ..v },
        };
        // Declared secret: the whole value is; merely derived from one: see `add_derived`.
        if p.ty.as_ref().is_some_and(Type::is_sensitive) {
            self.remember(&v.var);
        } else if sensitive && let Var::Known(x) = &v.var {
            self.secrets.lock().expect("secrets lock").add_derived(x);
        }
        Ok(v)
    }

    pub(super) fn resolve(&self, e: &Expr, env: &Env) -> Result<Val, StepError> {
        // Most values are written out: nothing to look up, no origin, and no deeper than the
        // YAML they were written in, which the front end bounds.
        if let Expr::Lit(v) = e {
            return Ok(Val::known(v.clone()));
        }
        let look = |n: &str| env.get(n).map(|v| &v.var);
        let mut origins: BTreeSet<String> = BTreeSet::new();
        let mut sensitive = false;
        for r in e.refs() {
            if let Some(v) = env.get(&r.name) {
                origins.extend(v.origins.iter().cloned());
                sensitive |= v.sensitive;
            }
        }
        let origins = if origins.is_empty() {
            no_origins()
        } else {
            Arc::new(origins.into_iter().collect())
        };
        match e.resolve(&look) {
            // Templates nest values in values: a chain of steps could build values of any
            // depth. Only a template with references can go past the YAML limit, so the
            // first reference says where.
            Ok(v) if too_deep(&v) => Err(StepError::BuiltTooDeep {
                at: e.refs().first().map(|r| self.at(r.span)).unwrap_or_default(),
            }),
            Ok(v) => Ok(Val {
                var: Var::Known(v),
                origins,
                sensitive,
            }),
            Err(ResolveError::Unknown) => Ok(Val {
                var: Var::Unknown,
                origins,
                sensitive,
            }),
            Err(ResolveError::NoSuchPath { reference, span }) => Err(StepError::NoSuchPath {
                at: self.at(span),
                reference,
            }),
            Err(ResolveError::Unbound { name, span }) => Err(StepError::Unbound {
                at: self.at(span),
                name,
            }),
        }
    }

    pub(super) fn returns_from_scope(&self, returns: &[Return], scope: &Env) -> Result<Env, StepError> {
        let mut out = Env::default();
        for r in returns {
            let v = match &r.source {
                ReturnSource::Same => scope.get(&r.name).cloned(),
                ReturnSource::Alias(a) => scope.get(a).cloned(),
                ReturnSource::Value(e) => Some(self.resolve(e, scope)?),
            }
            .unwrap_or_else(|| Val::known(Value::Null));
            out.insert(r.name.clone(), self.typed_return(r, v)?);
        }
        Ok(out)
    }

    /// A return's value coerced to its declared `type`, whatever the step (a `Sensitive`
    /// type makes it secret).
    pub(super) fn typed_return(&self, r: &Return, v: Val) -> Result<Val, StepError> {
        let v = match (&v.var, &r.ty) {
            (Var::Known(x), Some(t)) => Val {
                var: Var::Known(t.coerce(x).map_err(|error| StepError::ReturnType {
                    at: self.at(r.span),
                    name: r.name.clone(),
                    error: Box::new(error),
                    secret: v.sensitive,
                })?),
                origins: v.origins,
                sensitive: v.sensitive || t.is_sensitive(),
            },
            (_, Some(t)) => Val {
                sensitive: v.sensitive || t.is_sensitive(),
                ..v
            },
            _ => v,
        };
        // Declared secret: the whole value is; merely derived from one: see `add_derived`.
        if r.ty.as_ref().is_some_and(Type::is_sensitive) {
            self.remember(&v.var);
        } else if v.sensitive
            && let Var::Known(x) = &v.var
        {
            self.secrets.lock().expect("secrets lock").add_derived(x);
        }
        Ok(v)
    }
}
