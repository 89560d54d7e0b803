//! Data values flowing through workflows.
//!
//! Lyra's values are plain JSON-like data, so the engine uses `serde_json::Value` directly: it is
//! what providers produce, what the state store persists and what `-o json` prints.

pub use serde_json::{Map as JsonMap, Value};

/// An attribute map: a resource's desired or actual state.
pub type Map = JsonMap<String, Value>;

/// Most entries a map has for [`attr`] to find a key by comparing it with each.
const SCANNED: usize = 8;

/// `map[key]`: what `Map::get` finds, found in a small map by comparing keys rather than
/// hashing. A resource's desired and actual states hold a few attributes each, and hashing
/// every name looked up in them (the map's hasher is SipHash) was a tenth of the engine's
/// instructions in a plan of 10,000 unchanged steps.
pub fn attr<'m>(map: &'m Map, key: &str) -> Option<&'m Value> {
    if map.len() <= SCANNED {
        map.iter().find_map(|(k, v)| (k == key).then_some(v))
    } else {
        map.get(key)
    }
}

/// How deeply any value, YAML document or type/guard expression may nest (lists and maps
/// within each other). One limit from parsing to storage: it is enforced when workflows, data
/// files and `--var`s are parsed, when the engine builds a value or receives one from a
/// provider, and when a store writes a record. It is well below the 128 levels `serde_json`
/// reads back, so whatever is stored (inside a record, an export, a Kubernetes status) can
/// always be read again, and no recursive walk over a value can exhaust the stack.
pub const MAX_DEPTH: usize = 64;

/// How deeply `value` nests: 0 for a scalar, 1 for `[1]` or `{a: 1}`, 2 for `[[1]]`...
/// Iterative, so it is safe on values of any depth.
pub fn depth(value: &Value) -> usize {
    let mut max = 0;
    // (a value, how many containers enclose it)
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((v, outer)) = stack.pop() {
        match v {
            Value::Array(items) => {
                max = max.max(outer + 1);
                stack.extend(items.iter().map(|x| (x, outer + 1)));
            }
            Value::Object(m) => {
                max = max.max(outer + 1);
                stack.extend(m.values().map(|x| (x, outer + 1)));
            }
            _ => {}
        }
    }
    max
}

/// Whether `value` nests deeper than [`MAX_DEPTH`]. Stops early on deep values.
pub fn too_deep(value: &Value) -> bool {
    too_deep_at(value, 0)
}

/// Whether `value`, itself inside `outer` containers, reaches deeper than [`MAX_DEPTH`].
pub fn too_deep_at(value: &Value, outer: usize) -> bool {
    // Most values checked are scalars: no stack for them.
    if !matches!(value, Value::Array(_) | Value::Object(_)) {
        return false;
    }
    let mut stack: Vec<(&Value, usize)> = vec![(value, outer)];
    while let Some((v, outer)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(m) => Box::new(m.values()),
            _ => continue,
        };
        if outer + 1 > MAX_DEPTH {
            return true;
        }
        stack.extend(children.map(|x| (x, outer + 1)));
    }
    false
}

/// Whether setting `value` at the dotted key `a.b.c` of a data map (`--var`, the original's
/// flat Kubernetes data keys) would nest the data deeper than [`MAX_DEPTH`]: the map itself
/// and each segment but the last are a level. Checked before building anything.
pub fn dotted_too_deep(dotted: &str, value: &Value) -> bool {
    let levels = dotted.split('.').count();
    levels > MAX_DEPTH || too_deep_at(value, levels)
}

/// The message for a value nested deeper than [`MAX_DEPTH`]; `what` names it.
pub fn too_deep_message(what: &str) -> String {
    format!("{what} nests more than {MAX_DEPTH} levels of lists and maps (the limit)")
}

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

/// `v` as canonical JSON: object keys sorted at every level, no spaces, so equal values give
/// equal bytes whatever order they were built in.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Small maps are scanned, larger ones hashed: either way what `get` finds.
    #[test]
    fn attr_finds_what_get_finds() {
        for n in [0, 1, 2, SCANNED, SCANNED + 1, 40] {
            let map: Map = (0..n).map(|i| (format!("k{i}"), json!(i))).collect();
            for key in (0..=n)
                .map(|i| format!("k{i}"))
                .chain(["".to_owned(), "k".to_owned(), "K0".to_owned()])
            {
                assert_eq!(attr(&map, &key), map.get(&key), "{n} entries, key {key:?}");
            }
        }
    }

    #[test]
    fn dig_follows_maps_and_arrays() {
        let v = json!({"a": {"b": [10, {"c": true}]}});
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(dig(&v, &path(&["a", "b", "0"])), Some(&json!(10)));
        assert_eq!(dig(&v, &path(&["a", "b", "1", "c"])), Some(&json!(true)));
        assert_eq!(dig(&v, &path(&["a", "x"])), None);
    }

    /// `[[...[x]...]]`, `n` lists deep.
    fn nested(n: usize) -> Value {
        let mut v = json!("x");
        for _ in 0..n {
            v = Value::Array(vec![v]);
        }
        v
    }

    #[test]
    fn depth_counts_containers() {
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!([])), 1);
        assert_eq!(depth(&json!({"a": [1, {"b": {}}]})), 4);
        assert_eq!(depth(&nested(MAX_DEPTH)), MAX_DEPTH);
        assert!(!too_deep(&nested(MAX_DEPTH)));
        assert!(too_deep(&nested(MAX_DEPTH + 1)));
        assert!(too_deep_at(&nested(MAX_DEPTH), 1));
        assert!(!too_deep(&json!({"wide": (0..10_000).collect::<Vec<_>>()})));
    }

    #[test]
    fn dotted_keys_count_towards_the_depth() {
        let key = |n: usize| vec!["k"; n].join(".");
        assert!(!dotted_too_deep(&key(MAX_DEPTH), &json!(1)));
        assert!(dotted_too_deep(&key(MAX_DEPTH + 1), &json!(1)));
        assert!(dotted_too_deep(&key(100_000), &json!(1)));
        assert!(!dotted_too_deep("a", &nested(MAX_DEPTH - 1)));
        assert!(dotted_too_deep("a.b", &nested(MAX_DEPTH - 1)));
        let mut m = Map::new();
        set_dotted(&mut m, &key(MAX_DEPTH - 1), nested(1));
        assert_eq!(depth(&Value::Object(m)), MAX_DEPTH);
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
