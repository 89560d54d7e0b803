//! Strategic merge patch for built-in kinds, as kubectl apply and helm 3 send it: maps merge
//! as in a merge patch, lists of objects with a merge key (`containers` by `name`, a
//! Service's `ports` by `port`...) merge element by element, `$setElementOrder`, `$patch:
//! delete|replace` and `$deleteFromPrimitiveList` directives are honoured. A real apiserver
//! reads merge keys from each kind's Go types; the emulator knows the fields by name, which
//! is enough for the kinds it serves. Other lists are replaced.

use serde_json::{Map, Value};

/// The key a list of objects merges by, from its field name (and a first element, for
/// `ports`: a container's by `containerPort`, a Service's by `port`).
pub(super) fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "webhooks"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "hostAliases" => "ip",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "topologySpreadConstraints" => "topologyKey",
        "ports" if sample.is_some_and(|s| s.get("containerPort").is_some()) => "containerPort",
        "ports" => "port",
        _ => return None,
    })
}

/// Lists of scalars that merge as sets.
fn merges_as_set(field: &str) -> bool {
    field == "finalizers"
}

/// Applies `patch` to `target`.
pub fn apply(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = Value::Object(strip(p));
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("just made an object");
    for (k, v) in p {
        if k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/")
                && let Some(Value::Array(items)) = t.get_mut(field)
            {
                items.retain(|i| !v.as_array().is_some_and(|d| d.contains(i)));
            }
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(_) => apply(t.entry(k.clone()).or_insert(Value::Null), v),
            Value::Array(items) => {
                let order = p.get(&format!("$setElementOrder/{k}")).and_then(Value::as_array);
                let merged = merge_list(k, t.get(k), items, order);
                t.insert(k.clone(), merged);
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// A map without its `$` directives.
fn strip(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn merge_list(field: &str, current: Option<&Value>, patch: &[Value], order: Option<&Vec<Value>>) -> Value {
    let current: Vec<Value> = current.and_then(Value::as_array).cloned().unwrap_or_default();
    if merges_as_set(field) {
        let mut out = current;
        for v in patch {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
        return Value::Array(out);
    }
    let sample = patch.first().or(current.first());
    let Some(key) = merge_key(field, sample).filter(|_| patch.iter().all(Value::is_object)) else {
        return Value::Array(patch.to_vec());
    };
    let mut out = current;
    for item in patch {
        let id = &item[key];
        let at = out.iter().position(|c| &c[key] == id);
        match (item.get("$patch").and_then(Value::as_str), at) {
            (Some("delete"), Some(i)) => {
                out.remove(i);
            }
            (Some("delete"), None) => {}
            (_, Some(i)) => apply(&mut out[i], item),
            (_, None) => {
                let mut fresh = Value::Null;
                apply(&mut fresh, item);
                out.push(fresh);
            }
        }
    }
    if let Some(order) = order {
        // The patch's order first (elements it names), then the rest as they were.
        let rank = |v: &Value| order.iter().position(|o| o[key] == v[key]).unwrap_or(usize::MAX);
        out.sort_by_key(rank);
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn containers_merge_by_name_and_directives_apply() {
        let mut d = json!({"spec": {"containers": [
            {"name": "app", "image": "a:1", "args": ["--x"], "env": [{"name": "A", "value": "1"}]},
            {"name": "side", "image": "s:1"}],
            "ports": [{"port": 443, "targetPort": 8443}], "finalizers": ["a"]}});
        apply(
            &mut d,
            &json!({"spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
                "containers": [{"name": "app", "args": ["--y"], "env": [{"name": "B", "value": "2"}]}],
                "ports": [{"port": 443, "targetPort": 9443}], "finalizers": ["b"]}}),
        );
        let c = &d["spec"]["containers"];
        assert_eq!(c[0]["name"], "side");
        assert_eq!(c[1]["image"], "a:1", "untouched fields stay");
        assert_eq!(c[1]["args"], json!(["--y"]), "scalar lists are replaced");
        assert_eq!(
            c[1]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(d["spec"]["ports"], json!([{"port": 443, "targetPort": 9443}]));
        assert_eq!(d["spec"]["finalizers"], json!(["a", "b"]));
        apply(
            &mut d,
            &json!({"spec": {"containers": [{"name": "side", "$patch": "delete"}], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(d["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(d["spec"]["finalizers"], json!(["b"]));
    }
}
