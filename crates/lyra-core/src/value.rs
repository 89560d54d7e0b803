//! Data values flowing through workflows.
//!
//! Lyra's values are plain JSON-like data, so the engine uses `serde_json::Value` directly: it is
//! what providers produce, what the state store persists and what `-o json` prints.

pub use serde_json::{Map as JsonMap, Value};

/// An attribute map: a resource's desired or actual state.
pub type Map = JsonMap<String, Value>;

/// Follows `path` (attribute names, or indices into arrays) inside `value`.
pub fn dig<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = value;
    for seg in path {
        cur = match cur {
            Value::Object(m) => m.get(seg)?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Short human rendering of a value for plans and messages (JSON, truncated).
pub fn short(value: &Value) -> String {
    let s = value.to_string();
    if s.chars().count() > 80 {
        let cut: String = s.chars().take(77).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// Sets `value` at a dotted path inside `root`, creating maps on the way.
///
/// Used for `--var a.b.c=x` and for the original's flat dotted data keys.
pub fn set_dotted(root: &mut Map, dotted: &str, value: Value) {
    let (parent, key) = dotted_parent(root, dotted);
    parent.insert(key.to_owned(), value);
}

/// The map that holds the last segment of `dotted` (`a.b.c` → the map at `a.b`, and `c`),
/// creating maps on the way and replacing values that are not maps.
pub fn dotted_parent<'m, 'd>(root: &'m mut Map, dotted: &'d str) -> (&'m mut Map, &'d str) {
    let Some((path, key)) = dotted.rsplit_once('.') else {
        return (root, dotted);
    };
    let mut cur = root;
    for part in path.split('.') {
        let entry = cur.entry(part.to_owned()).or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        cur = entry.as_object_mut().expect("just made an object");
    }
    (cur, key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dig_follows_maps_and_arrays() {
        let v = json!({"a": {"b": [10, {"c": true}]}});
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(dig(&v, &path(&["a", "b", "0"])), Some(&json!(10)));
        assert_eq!(dig(&v, &path(&["a", "b", "1", "c"])), Some(&json!(true)));
        assert_eq!(dig(&v, &path(&["a", "x"])), None);
    }

    #[test]
    fn set_dotted_builds_nested_maps() {
        let mut m = Map::new();
        set_dotted(&mut m, "aws.tags.Name", json!("x"));
        set_dotted(&mut m, "aws.region", json!("eu"));
        assert_eq!(
            Value::Object(m),
            json!({"aws": {"tags": {"Name": "x"}, "region": "eu"}})
        );
    }
}
