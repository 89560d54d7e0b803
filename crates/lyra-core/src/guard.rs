//! `when:` guards: `a and (b or !c)`. A name is true when its value is neither undefined
//! (null) nor `false`. Unlike the original, guards are evaluated.

use std::collections::BTreeSet;

use crate::expr::Var;
use crate::value::{MAX_DEPTH, Value};

/// A parsed guard. Chains of `and`/`or` are flat lists, so the tree is only as deep as the
/// parentheses and negations, which are limited to [`MAX_DEPTH`]: walking it never exhausts
/// the stack.
#[derive(Debug, Clone, PartialEq)]
pub enum Guard {
    Var(String),
    Not(Box<Guard>),
    /// All of them (`a and b and c`).
    And(Vec<Guard>),
    /// Any of them (`a or b or c`).
    Or(Vec<Guard>),
}

impl Guard {
    /// Parses a guard; the error says what is wrong and at which character offset.
    pub fn parse(src: &str) -> Result<Guard, (usize, String)> {
        let toks = tokenize(src)?;
        let mut p = GuardParser {
            toks: &toks,
            pos: 0,
            depth: 0,
        };
        let g = p.or()?;
        if let Some((off, t)) = p.toks.get(p.pos) {
            return Err((*off, format!("unexpected '{t}'")));
        }
        Ok(g)
    }

    pub fn names(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        self.collect(&mut out);
        out
    }

    fn collect(&self, out: &mut BTreeSet<String>) {
        match self {
            Guard::Var(n) => {
                out.insert(n.clone());
            }
            Guard::Not(g) => g.collect(out),
            Guard::And(gs) | Guard::Or(gs) => gs.iter().for_each(|g| g.collect(out)),
        }
    }

    /// `None` when a variable is unknown (planning).
    pub fn eval<'v>(&self, lookup: &impl Fn(&str) -> Option<&'v Var>) -> Option<bool> {
        match self {
            Guard::Var(n) => match lookup(n)? {
                Var::Known(v) => Some(!matches!(v, Value::Null | Value::Bool(false))),
                Var::Unknown => None,
            },
            Guard::Not(g) => g.eval(lookup).map(|b| !b),
            // Known once any term decides it, even if others are unknown (planning).
            Guard::And(gs) => {
                let vals: Vec<Option<bool>> = gs.iter().map(|g| g.eval(lookup)).collect();
                if vals.contains(&Some(false)) {
                    Some(false)
                } else if vals.iter().all(|v| *v == Some(true)) {
                    Some(true)
                } else {
                    None
                }
            }
            Guard::Or(gs) => {
                let vals: Vec<Option<bool>> = gs.iter().map(|g| g.eval(lookup)).collect();
                if vals.contains(&Some(true)) {
                    Some(true)
                } else if vals.iter().all(|v| *v == Some(false)) {
                    Some(false)
                } else {
                    None
                }
            }
        }
    }
}

fn tokenize(src: &str) -> Result<Vec<(usize, String)>, (usize, String)> {
    let mut out = Vec::new();
    let mut chars = src.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '(' || c == ')' || c == '!' {
            out.push((i, c.to_string()));
            chars.next();
        } else if c.is_ascii_alphanumeric() || c == '_' || c == '$' {
            let mut s = String::new();
            while let Some(&(_, c)) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' || c == '$' {
                    s.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push((i, s));
        } else {
            return Err((i, format!("unexpected character '{c}'")));
        }
    }
    Ok(out)
}

struct GuardParser<'a> {
    toks: &'a [(usize, String)],
    pos: usize,
    /// Open parentheses and negations around the current token: the parser recurses on them.
    depth: usize,
}

impl GuardParser<'_> {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.pos).map(|(_, t)| t.as_str())
    }
    fn offset(&self) -> usize {
        self.toks
            .get(self.pos)
            .map_or_else(|| self.toks.last().map_or(0, |(o, t)| o + t.len()), |(o, _)| *o)
    }

    fn or(&mut self) -> Result<Guard, (usize, String)> {
        let mut terms = vec![self.and()?];
        while self.peek() == Some("or") {
            self.pos += 1;
            terms.push(self.and()?);
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Guard::Or(terms)
        })
    }

    fn and(&mut self) -> Result<Guard, (usize, String)> {
        let mut terms = vec![self.not()?];
        while self.peek() == Some("and") {
            self.pos += 1;
            terms.push(self.not()?);
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Guard::And(terms)
        })
    }

    fn not(&mut self) -> Result<Guard, (usize, String)> {
        if self.depth >= MAX_DEPTH {
            return Err((
                self.offset(),
                format!("the guard nests more than {MAX_DEPTH} levels of parentheses and negations (the limit)"),
            ));
        }
        self.depth += 1;
        let g = self.not_inner();
        self.depth -= 1;
        g
    }

    fn not_inner(&mut self) -> Result<Guard, (usize, String)> {
        match self.peek() {
            Some("!") | Some("not") => {
                self.pos += 1;
                Ok(Guard::Not(Box::new(self.not()?)))
            }
            Some("(") => {
                self.pos += 1;
                let g = self.or()?;
                if self.peek() != Some(")") {
                    return Err((self.offset(), "expected ')'".to_owned()));
                }
                self.pos += 1;
                Ok(g)
            }
            Some(t) if t != ")" && t != "and" && t != "or" => {
                let name = t.trim_start_matches('$').to_owned();
                if name.is_empty() || name.contains('$') {
                    return Err((self.offset(), format!("'{t}' is not a variable name")));
                }
                self.pos += 1;
                Ok(Guard::Var(name))
            }
            Some(t) => Err((self.offset(), format!("expected a variable name, got '{t}'"))),
            None => Err((
                self.offset(),
                "expected a variable name, got the end of the guard".to_owned(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_and_evaluates() {
        let g = Guard::parse("a and (b or !c)").unwrap();
        assert_eq!(g.names().into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        let t = Var::Known(json!(true));
        let f = Var::Known(json!(false));
        let n = Var::Known(json!(null));
        let look = |a: &'static Var, b: &'static Var, c: &'static Var| {
            move |name: &str| match name {
                "a" => Some(a),
                "b" => Some(b),
                _ => Some(c),
            }
        };
        let (t, f, n): (&'static Var, &'static Var, &'static Var) =
            (Box::leak(Box::new(t)), Box::leak(Box::new(f)), Box::leak(Box::new(n)));
        assert_eq!(g.eval(&look(t, f, n)), Some(true));
        assert_eq!(g.eval(&look(t, f, t)), Some(false));
        assert_eq!(g.eval(&look(n, t, t)), Some(false));
    }

    #[test]
    fn long_chains_are_flat_and_deep_nesting_is_an_error() {
        let chain = vec!["a"; 100_000].join(" and ");
        let g = Guard::parse(&chain).unwrap();
        let t = Var::Known(json!(true));
        assert_eq!(g.eval(&|_: &str| Some(&t)), Some(true));
        let ok = format!("{}a{}", "(".repeat(MAX_DEPTH - 1), ")".repeat(MAX_DEPTH - 1));
        assert!(Guard::parse(&ok).is_ok());
        for deep in [
            format!("{}a{}", "(".repeat(100_000), ")".repeat(100_000)),
            format!("{}a", "!".repeat(100_000)),
        ] {
            let (off, msg) = Guard::parse(&deep).unwrap_err();
            assert!(msg.contains("nests more than"), "{msg}");
            assert_eq!(off, MAX_DEPTH);
        }
    }

    #[test]
    fn reports_errors_with_offsets() {
        assert_eq!(Guard::parse("a and").unwrap_err().0, 5);
        assert!(Guard::parse("(a or b").is_err());
        assert!(Guard::parse("a & b").is_err());
        assert!(Guard::parse("").is_err());
    }
}
