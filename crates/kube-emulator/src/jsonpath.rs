//! The subset of Kubernetes JSONPath that printer columns use: `.a.b`, `['a.b']`, `[0]`,
//! `[*]`, and filters `[?(@.type=="Ready")]` with `==`/`!=` against a string or number.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    Wildcard,
    Filter {
        path: Vec<String>,
        negate: bool,
        value: Value,
    },
}

/// A parsed path; `parse` rejects what this subset does not understand.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPath(Vec<Step>);

impl JsonPath {
    pub fn parse(src: &str) -> Result<JsonPath, String> {
        let mut s = src.trim();
        if let Some(inner) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            s = inner.trim();
        }
        s = s.strip_prefix('$').unwrap_or(s);
        let chars: Vec<char> = s.chars().collect();
        let mut steps = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '.' => {
                    let start = i + 1;
                    let mut j = start;
                    while j < chars.len() && chars[j] != '.' && chars[j] != '[' {
                        j += 1;
                    }
                    let name: String = chars[start..j].iter().collect();
                    match name.as_str() {
                        "" => {}
                        "*" => steps.push(Step::Wildcard),
                        _ => steps.push(Step::Field(name)),
                    }
                    i = j;
                }
                '[' => {
                    let close = find_close(&chars, i).ok_or_else(|| format!("unclosed [ in {src:?}"))?;
                    let inner: String = chars[i + 1..close].iter().collect();
                    steps.push(parse_bracket(inner.trim()).map_err(|e| format!("{e} in {src:?}"))?);
                    i = close + 1;
                }
                c => return Err(format!("unexpected {c:?} in {src:?}")),
            }
        }
        Ok(JsonPath(steps))
    }

    /// Every value the path selects, in document order.
    pub fn select<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![root];
        for step in &self.0 {
            let mut next = Vec::new();
            for v in current {
                match step {
                    Step::Field(name) => next.extend(v.get(name)),
                    Step::Index(n) => {
                        if let Value::Array(a) = v {
                            let idx = if *n < 0 { a.len() as i64 + n } else { *n };
                            next.extend(usize::try_from(idx).ok().and_then(|i| a.get(i)));
                        }
                    }
                    Step::Wildcard => match v {
                        Value::Array(a) => next.extend(a.iter()),
                        Value::Object(m) => next.extend(m.values()),
                        _ => {}
                    },
                    Step::Filter { path, negate, value } => {
                        if let Value::Array(a) = v {
                            next.extend(a.iter().filter(|item| {
                                let got = path.iter().try_fold(*item, |cur, key| cur.get(key));
                                let eq = got.is_some_and(|g| loosely_equal(g, value));
                                eq != *negate
                            }));
                        }
                    }
                }
            }
            current = next;
        }
        current
    }
}

fn loosely_equal(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Bool(a), Value::String(b)) => a.to_string() == *b,
        _ => got == want,
    }
}

fn find_close(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0;
    let mut quote: Option<char> = None;
    for (k, &c) in chars.iter().enumerate().skip(open) {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

fn unquote(s: &str) -> Option<&str> {
    s.strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| s.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
}

fn parse_bracket(inner: &str) -> Result<Step, String> {
    if inner == "*" {
        return Ok(Step::Wildcard);
    }
    if let Some(name) = unquote(inner) {
        return Ok(Step::Field(name.to_string()));
    }
    if let Ok(n) = inner.parse::<i64>() {
        return Ok(Step::Index(n));
    }
    let expr = inner
        .strip_prefix("?(")
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unsupported [{inner}]"))?
        .trim();
    let (lhs, negate, rhs) = if let Some((l, r)) = expr.split_once("==") {
        (l, false, r)
    } else if let Some((l, r)) = expr.split_once("!=") {
        (l, true, r)
    } else {
        return Err(format!("unsupported filter {expr:?}"));
    };
    let path = lhs
        .trim()
        .strip_prefix("@.")
        .ok_or_else(|| format!("filter must start with @.: {expr:?}"))?
        .split('.')
        .map(str::to_string)
        .collect();
    let rhs = rhs.trim();
    let value = match unquote(rhs) {
        Some(s) => Value::String(s.to_string()),
        None => serde_json::from_str(rhs).map_err(|_| format!("bad filter value {rhs:?}"))?,
    };
    Ok(Step::Filter { path, negate, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selects_fields_indexes_and_filters() {
        let obj = json!({"status": {"phase": "Ready", "conditions": [
            {"type": "Progressing", "status": "False"},
            {"type": "Ready", "status": "True"}
        ]}, "metadata": {"labels": {"a.b/c": "x"}}});
        let sel = |p: &str| {
            JsonPath::parse(p)
                .unwrap()
                .select(&obj)
                .into_iter()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(sel(".status.phase"), vec![json!("Ready")]);
        assert_eq!(sel("{.status.conditions[1].type}"), vec![json!("Ready")]);
        assert_eq!(
            sel(r#".status.conditions[?(@.type=="Ready")].status"#),
            vec![json!("True")]
        );
        assert_eq!(
            sel(".status.conditions[*].type"),
            vec![json!("Progressing"), json!("Ready")]
        );
        assert_eq!(sel(".metadata.labels['a.b/c']"), vec![json!("x")]);
        assert!(sel(".spec.missing").is_empty());
        assert!(JsonPath::parse(".a[?(@.x > 1)]").is_err());
    }
}
