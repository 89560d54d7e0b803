//! Pruning: fields the schema does not declare are dropped (and reported, for
//! `fieldValidation`), as the apiserver does before defaulting.

use serde_json::Value;

use super::{Additional, Schema, join};

/// The ObjectMeta fields a client may send; anything else under `metadata` is pruned.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
    "selfLink",
];

impl Schema {
    /// Removes fields the schema does not declare (and non-nullable nulls, which the apiserver
    /// drops before defaulting); returns the paths of the unknown fields removed, which a
    /// `fieldValidation=Strict` request turns into an error. `root` keeps apiVersion/kind/metadata.
    pub fn prune(&self, v: &mut Value, root: bool) -> Vec<String> {
        let mut unknown = Vec::new();
        self.prune_at(v, "", root, &mut unknown);
        unknown.sort();
        unknown
    }

    fn prune_at(&self, v: &mut Value, path: &str, is_resource: bool, unknown: &mut Vec<String>) {
        if self.int_or_string {
            return;
        }
        match v {
            Value::Object(m) => {
                if is_resource && let Some(Value::Object(meta)) = m.get_mut("metadata") {
                    let meta_path = join(path, "metadata");
                    meta.retain(|k, _| {
                        let keep = OBJECT_META_FIELDS.contains(&k.as_str());
                        if !keep {
                            unknown.push(join(&meta_path, k));
                        }
                        keep
                    });
                }
                let keep_unknown = self.preserve_unknown || matches!(self.additional, Additional::Any);
                let keys: Vec<String> = m.keys().cloned().collect();
                for k in keys {
                    if is_resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    let child_path = join(path, &k);
                    let child_schema = self.properties.get(&k).or(match &self.additional {
                        Additional::Schema(s) => Some(s),
                        _ => None,
                    });
                    match child_schema {
                        Some(s) => {
                            if m[&k].is_null() && !s.nullable {
                                m.remove(&k);
                                continue;
                            }
                            if let Some(child) = m.get_mut(&k) {
                                s.prune_at(child, &child_path, s.embedded, unknown);
                            }
                        }
                        None if keep_unknown => {}
                        None => {
                            m.remove(&k);
                            unknown.push(child_path);
                        }
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    for (i, item) in a.iter_mut().enumerate() {
                        items.prune_at(item, &format!("{path}[{i}]"), items.embedded, unknown);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::workflow_schema;

    #[test]
    fn prunes_unknown_fields_but_keeps_preserved_ones() {
        let s = workflow_schema();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a", "bogus": 1},
            "spec": {"image": "a", "typo": 1, "extra": {"anything": [1]}, "steps": [{"name": "s", "junk": true}]}});
        let unknown = s.prune(&mut obj, true);
        assert_eq!(unknown, vec!["metadata.bogus", "spec.steps[0].junk", "spec.typo"]);
        assert_eq!(
            obj["spec"],
            json!({"image": "a", "extra": {"anything": [1]}, "steps": [{"name": "s"}]})
        );
        assert_eq!(obj["apiVersion"], "x/v1");
    }
}
