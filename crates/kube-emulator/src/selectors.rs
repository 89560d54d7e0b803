//! `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and `fieldSelector`
//! (`=`, `==`, `!=` on any dotted path; a real apiserver allows only a per-kind list of fields,
//! `metadata.name` and `metadata.namespace` for custom resources).

use serde_json::Value;

use crate::errors::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas outside parentheses (`a in (x,y),b`).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

fn set_values(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| ApiError::bad_request(format!("unable to parse requirement: {whole:?}")))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    pub fn parse(src: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(src) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(rest, part)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(rest, part)?)
            } else if let Some(k) = part.strip_prefix('!') {
                LabelReq::NotExists(k.trim().into())
            } else if part.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                LabelReq::Exists(part.into())
            } else {
                return Err(ApiError::bad_request(format!("unable to parse requirement: {part:?}")));
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// A `metav1.LabelSelector` (`matchLabels`, `matchExpressions`), as webhooks' namespace
    /// and object selectors give it; a missing one matches everything.
    pub fn from_json(v: &Value) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for (k, v) in v["matchLabels"].as_object().into_iter().flatten() {
            reqs.push(LabelReq::Eq(k.clone(), v.as_str().unwrap_or_default().into()));
        }
        for e in v["matchExpressions"].as_array().into_iter().flatten() {
            let key = e["key"].as_str().unwrap_or_default().to_string();
            let values: Vec<String> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            reqs.push(match e["operator"].as_str() {
                Some("In") => LabelReq::In(key, values),
                Some("NotIn") => LabelReq::NotIn(key, values),
                Some("Exists") => LabelReq::Exists(key),
                Some("DoesNotExist") => LabelReq::NotExists(key),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            });
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v),
            LabelReq::NotEq(k, v) => get(k) != Some(v),
            LabelReq::In(k, vs) => get(k).is_some_and(|g| vs.iter().any(|v| v == g)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|g| vs.iter().all(|v| v != g)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: every `path=value` / `path!=value` must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(Vec<String>, bool, String)>);

impl FieldSelector {
    pub fn parse(src: &str) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(src) {
            let (k, negate, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: {src:?}; can't understand {part:?}"
                )));
            };
            reqs.push((
                k.trim().split('.').map(str::to_string).collect(),
                negate,
                v.trim().to_string(),
            ));
        }
        Ok(FieldSelector(reqs))
    }

    /// The `metadata.name` this selector pins, which lets a list skip the scan.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(p, neg, _)| !neg && p.len() == 2 && p[0] == "metadata" && p[1] == "name")
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, negate, want)| {
            let got = path.iter().try_fold(obj, |cur, key| cur.get(key));
            // Fields compare as their string form; a missing field equals "".
            let got = match got {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (got == *want) != *negate
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"labels": {"app": "lyra", "tier": "web"}}});
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&obj);
        assert!(m("app=lyra"));
        assert!(m("app==lyra,tier"));
        assert!(!m("app!=lyra"));
        assert!(m("tier in (db, web)"));
        assert!(!m("tier notin (db,web)"));
        assert!(m("!missing"));
        assert!(!m("missing"));
        assert!(m(""));
    }

    #[test]
    fn field_selectors() {
        let obj = json!({"metadata": {"name": "demo", "namespace": "default"}, "involvedObject": {"kind": "Workflow"}});
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&obj);
        assert!(m("metadata.name=demo"));
        assert!(m("metadata.name=demo,metadata.namespace=default"));
        assert!(!m("metadata.name!=demo"));
        assert!(m("involvedObject.kind=Workflow,involvedObject.uid="));
        assert_eq!(
            FieldSelector::parse("metadata.name=demo").unwrap().pinned_name(),
            Some("demo")
        );
    }
}
