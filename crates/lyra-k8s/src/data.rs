//! `spec.data` → the lookup data the engine reads.

use lyra_core::value::{Map, Value, dotted_parent};

/// Nested values as given, then the original Lyra's flat dotted top-level keys
/// (`aws.tags.Name: x`) expanded into nested maps. Dotted keys come second, so they override
/// (and deep-merge into) nested values, as `--var` does over a data file.
pub fn expand(data: Option<&Value>) -> Result<Map, String> {
    let map = match data {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(m)) => m,
        Some(other) => return Err(format!("spec.data must be a mapping, not {}", kind(other))),
    };
    let mut out = Map::new();
    for (k, v) in map.iter().filter(|(k, _)| !k.contains('.')) {
        // The data map is a level itself, as in a data file.
        if lyra_core::value::too_deep_at(v, 1) {
            return Err(format!(
                "spec.data key '{k}': {}",
                lyra_core::value::too_deep_message("the value")
            ));
        }
        merge(&mut out, k, v.clone());
    }
    for (k, v) in map.iter().filter(|(k, _)| k.contains('.')) {
        if k.split('.').any(str::is_empty) {
            return Err(format!("spec.data key '{k}' has an empty segment"));
        }
        if lyra_core::value::dotted_too_deep(k, v) {
            let shown: String = k.chars().take(80).collect();
            return Err(format!(
                "spec.data key '{shown}': {}",
                lyra_core::value::too_deep_message("the key and value together")
            ));
        }
        let (parent, last) = dotted_parent(&mut out, k);
        merge(parent, last, v.clone());
    }
    Ok(out)
}

/// Sets `key` to `value`, merging maps key by key instead of replacing them.
fn merge(into: &mut Map, key: &str, value: Value) {
    match (into.get_mut(key), value) {
        (Some(Value::Object(old)), Value::Object(new)) => {
            for (k, v) in new {
                merge(old, &k, v);
            }
        }
        (_, value) => {
            into.insert(key.to_owned(), value);
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn data_nested_too_deep_is_refused() {
        let mut deep = json!(1);
        for _ in 0..lyra_core::value::MAX_DEPTH {
            deep = json!([deep]);
        }
        assert!(expand(Some(&json!({"ok": deep[0].clone()}))).is_ok());
        let err = expand(Some(&json!({"k": deep}))).unwrap_err();
        assert!(
            err.contains("spec.data key 'k'") && err.contains("more than 64 levels"),
            "{err}"
        );
        let long_key = vec!["a"; 100_000].join(".");
        let err = expand(Some(&json!({ long_key: 1 }))).unwrap_err();
        assert!(err.contains("more than 64 levels") && err.len() < 300, "{err}");
    }

    #[test]
    fn nested_values_pass_through() {
        let d = json!({"webapp": {"region": "eu1", "replicas": 2}, "flag": true});
        assert_eq!(Value::Object(expand(Some(&d)).unwrap()), d);
    }

    #[test]
    fn dotted_keys_expand_and_merge_over_nested_ones() {
        let d = json!({
            "aws.tags.Name": "x",
            "aws": {"region": "eu", "tags": {"Owner": "me", "Name": "old"}},
            "aws.count": 3,
        });
        assert_eq!(
            Value::Object(expand(Some(&d)).unwrap()),
            json!({"aws": {"region": "eu", "tags": {"Owner": "me", "Name": "x"}, "count": 3}})
        );
    }

    #[test]
    fn a_dotted_key_replaces_a_scalar_on_its_path() {
        let d = json!({"a": 1, "a.b": 2});
        assert_eq!(Value::Object(expand(Some(&d)).unwrap()), json!({"a": {"b": 2}}));
    }

    #[test]
    fn non_maps_and_empty_segments_are_errors() {
        assert_eq!(expand(None).unwrap(), Map::new());
        assert!(expand(Some(&json!([1]))).unwrap_err().contains("not a list"));
        assert!(expand(Some(&json!({"a..b": 1}))).unwrap_err().contains("empty segment"));
    }
}
