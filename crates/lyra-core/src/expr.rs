//! Value templates: literal data with `$name` and `$name.a.b` references anywhere inside.

use std::collections::BTreeSet;

use crate::diag::Span;
use crate::value::{Map, Value, dig};

/// A reference to a variable, optionally digging into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ref {
    pub name: String,
    pub path: Vec<String>,
    pub span: Span,
}

impl Ref {
    /// Parses `$name` or `$name.a.b`; anything else is not a reference (a literal string).
    pub fn parse(s: &str, span: Span) -> Option<Ref> {
        let body = s.strip_prefix('$')?;
        let mut parts = body.split('.');
        let name = parts.next()?;
        let ident = |p: &str| {
            !p.is_empty()
                && p.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        if !ident(name) {
            return None;
        }
        let path: Vec<String> = parts.map(str::to_owned).collect();
        if path
            .iter()
            .any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        {
            return None;
        }
        Some(Ref {
            name: name.to_owned(),
            path,
            span,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Lit(Value),
    Ref(Ref),
    Array(Vec<Expr>),
    Object(Vec<(String, Expr)>),
}

/// A variable as the engine sees it while running or planning.
#[derive(Debug, Clone, PartialEq)]
pub enum Var {
    Known(Value),
    /// Only while planning: produced by a step that has not run yet ("known after apply").
    Unknown,
}

/// Why a template could not be turned into a value.
#[derive(Debug, Clone, PartialEq)]
pub enum ResolveError {
    /// A referenced variable is not known yet (planning only).
    Unknown,
    /// `$x.a.b` where `x` has no `a.b`.
    NoSuchPath { reference: String, span: Span },
    /// The variable is not in scope (validation should have caught it).
    Unbound { name: String, span: Span },
}

impl Expr {
    pub fn is_literal(&self) -> bool {
        match self {
            Expr::Lit(_) => true,
            Expr::Ref(_) => false,
            Expr::Array(items) => items.iter().all(Expr::is_literal),
            Expr::Object(fields) => fields.iter().all(|(_, e)| e.is_literal()),
        }
    }

    /// Every reference inside, in source order.
    pub fn refs(&self) -> Vec<&Ref> {
        let mut out = Vec::new();
        self.collect_refs(&mut out);
        out
    }

    fn collect_refs<'a>(&'a self, out: &mut Vec<&'a Ref>) {
        match self {
            Expr::Lit(_) => {}
            Expr::Ref(r) => out.push(r),
            Expr::Array(items) => items.iter().for_each(|e| e.collect_refs(out)),
            Expr::Object(fields) => fields.iter().for_each(|(_, e)| e.collect_refs(out)),
        }
    }

    /// The names this template reads.
    pub fn names(&self) -> BTreeSet<String> {
        self.refs().into_iter().map(|r| r.name.clone()).collect()
    }

    /// Builds the value, looking variables up with `lookup`.
    pub fn resolve<'v>(&self, lookup: &impl Fn(&str) -> Option<&'v Var>) -> Result<Value, ResolveError> {
        match self {
            Expr::Lit(v) => Ok(v.clone()),
            Expr::Ref(r) => match lookup(&r.name) {
                None => Err(ResolveError::Unbound {
                    name: r.name.clone(),
                    span: r.span,
                }),
                Some(Var::Unknown) => Err(ResolveError::Unknown),
                Some(Var::Known(v)) => {
                    if r.path.is_empty() {
                        return Ok(v.clone());
                    }
                    // An undefined value digs to undefined, as in Puppet.
                    if v.is_null() {
                        return Ok(Value::Null);
                    }
                    dig(v, &r.path).cloned().ok_or_else(|| ResolveError::NoSuchPath {
                        reference: format!("${}.{}", r.name, r.path.join(".")),
                        span: r.span,
                    })
                }
            },
            Expr::Array(items) => Ok(Value::Array(
                items.iter().map(|e| e.resolve(lookup)).collect::<Result<_, _>>()?,
            )),
            Expr::Object(fields) => {
                let mut m = Map::new();
                for (k, e) in fields {
                    m.insert(k.clone(), e.resolve(lookup)?);
                }
                Ok(Value::Object(m))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_refs() {
        let s = Span::default();
        assert_eq!(Ref::parse("$a", s).unwrap().name, "a");
        let r = Ref::parse("$policies.lb_policy", s).unwrap();
        assert_eq!(
            (r.name.as_str(), r.path.clone()),
            ("policies", vec!["lb_policy".to_owned()])
        );
        assert!(Ref::parse("$5 off", s).is_none());
        assert!(Ref::parse("cost $x", s).is_none());
        assert!(Ref::parse("$a.", s).is_none());
    }

    #[test]
    fn resolves_nested_refs() {
        let s = Span::default();
        let e = Expr::Object(vec![
            (
                "ids".into(),
                Expr::Array(vec![Expr::Ref(Ref::parse("$a", s).unwrap()), Expr::Lit(json!(2))]),
            ),
            ("p".into(), Expr::Ref(Ref::parse("$m.k", s).unwrap())),
        ]);
        let a = Var::Known(json!(1));
        let m = Var::Known(json!({"k": "v"}));
        let v = e
            .resolve(&|n: &str| match n {
                "a" => Some(&a),
                "m" => Some(&m),
                _ => None,
            })
            .unwrap();
        assert_eq!(v, json!({"ids": [1, 2], "p": "v"}));
        let u = Var::Unknown;
        assert_eq!(e.resolve(&|_: &str| Some(&u)), Err(ResolveError::Unknown));
    }
}
