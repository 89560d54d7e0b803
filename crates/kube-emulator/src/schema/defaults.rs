//! Defaulting: missing properties take their schema's `default`, after pruning.

use serde_json::Value;

use super::{Additional, Schema};

impl Schema {
    /// Fills in `default`s of missing properties, outside in.
    pub fn apply_defaults(&self, v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, s) in &self.properties {
                    if !m.contains_key(k)
                        && let Some(d) = &s.default
                    {
                        m.insert(k.clone(), d.clone());
                    }
                    if let Some(child) = m.get_mut(k) {
                        s.apply_defaults(child);
                    }
                }
                if let Additional::Schema(s) = &self.additional {
                    for (k, child) in m.iter_mut() {
                        if !self.properties.contains_key(k) {
                            s.apply_defaults(child);
                        }
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    a.iter_mut().for_each(|item| items.apply_defaults(item));
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
    fn defaults_missing_fields() {
        let s = workflow_schema();
        let mut obj = json!({"spec": {"image": "a"}});
        s.apply_defaults(&mut obj);
        assert_eq!(obj["spec"]["replicas"], 1);
    }
}
