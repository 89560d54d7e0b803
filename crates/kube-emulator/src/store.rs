//! Objects, the global `resourceVersion` counter and the event log that watches replay.
//!
//! Every write takes the next resourceVersion (one counter for all kinds, like etcd's
//! revision) and appends one event, so the log is ordered by resourceVersion. The log keeps the
//! last `capacity` events; a watch from an older version gets `410 Expired`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds.
pub type ObjKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One write, as watches see it.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub type_: EventType,
    /// The kind's store key (`ResourceType::id`).
    pub resource: String,
    pub object: Arc<Value>,
    /// The object before the write, so a selector watch can turn a MODIFIED that leaves (or
    /// enters) the selection into DELETED (or ADDED), as the apiserver does.
    pub previous: Option<Arc<Value>>,
}

#[derive(Debug)]
pub struct Store {
    objects: HashMap<String, BTreeMap<ObjKey, Arc<Value>>>,
    rv: u64,
    log: VecDeque<Arc<Event>>,
    capacity: usize,
    /// The newest resourceVersion dropped from the log (0: nothing dropped yet).
    compacted_through: u64,
}

pub fn key_of(obj: &Value) -> ObjKey {
    let meta = &obj["metadata"];
    (
        meta["namespace"].as_str().unwrap_or_default().to_string(),
        meta["name"].as_str().unwrap_or_default().to_string(),
    )
}

impl Store {
    pub fn new(capacity: usize) -> Store {
        Store {
            objects: HashMap::new(),
            rv: 0,
            log: VecDeque::new(),
            capacity: capacity.max(1),
            compacted_through: 0,
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(resource)?
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// Objects of one kind in key order; `namespace: None` means all namespaces.
    pub fn list<'a>(
        &'a self,
        resource: &str,
        namespace: Option<&'a str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Value>> + 'a> {
        let Some(objs) = self.objects.get(resource) else {
            return Box::new(std::iter::empty());
        };
        match namespace {
            None => Box::new(objs.values()),
            Some(ns) => Box::new(
                objs.range((ns.to_string(), String::new())..)
                    .take_while(move |((n, _), _)| n == ns)
                    .map(|(_, v)| v),
            ),
        }
    }

    /// Whether any object of any kind lives in `namespace`.
    pub fn namespace_is_empty(&self, namespace: &str) -> bool {
        self.objects.values().all(|objs| {
            objs.range((namespace.to_string(), String::new())..)
                .next()
                .is_none_or(|((n, _), _)| n != namespace)
        })
    }

    /// Every object (of any kind) whose `ownerReferences` name `uid`.
    pub fn dependents_of(&self, uid: &str) -> Vec<(String, Arc<Value>)> {
        let mut out = Vec::new();
        for (res, objs) in &self.objects {
            for obj in objs.values() {
                let owned = obj
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid));
                if owned {
                    out.push((res.clone(), obj.clone()));
                }
            }
        }
        out
    }

    /// Whether an object with this uid exists.
    pub fn uid_exists(&self, uid: &str) -> bool {
        self.objects
            .values()
            .any(|objs| objs.values().any(|o| o["metadata"]["uid"] == uid))
    }

    /// Stores a created or updated object under the next resourceVersion and logs the event.
    pub fn put(&mut self, resource: &str, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let obj = Arc::new(obj);
        let previous = self
            .objects
            .entry(resource.to_string())
            .or_default()
            .insert(key_of(&obj), obj.clone());
        let type_ = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.log_event(type_, resource, obj.clone(), previous);
        obj
    }

    /// Removes an object; `last` is its final state (the DELETED event's object).
    pub fn remove(&mut self, resource: &str, mut last: Value) -> Arc<Value> {
        self.rv += 1;
        last["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let last = Arc::new(last);
        let previous = self
            .objects
            .get_mut(resource)
            .and_then(|objs| objs.remove(&key_of(&last)));
        self.log_event(EventType::Deleted, resource, last.clone(), previous);
        last
    }

    /// All objects of a kind (for dropping a CRD's objects).
    pub fn all_of(&self, resource: &str) -> Vec<Arc<Value>> {
        self.list(resource, None).cloned().collect()
    }

    fn log_event(&mut self, type_: EventType, resource: &str, object: Arc<Value>, previous: Option<Arc<Value>>) {
        self.log.push_back(Arc::new(Event {
            rv: self.rv,
            type_,
            resource: resource.to_string(),
            object,
            previous,
        }));
        while self.log.len() > self.capacity {
            if let Some(old) = self.log.pop_front() {
                self.compacted_through = old.rv;
            }
        }
    }

    /// The logged events after `rv`, or `Err(oldest)` when some of them were compacted away.
    pub fn events_after(&self, rv: u64) -> Result<Vec<Arc<Event>>, u64> {
        if rv < self.compacted_through {
            return Err(self.compacted_through + 1);
        }
        let start = self.log.partition_point(|e| e.rv <= rv);
        Ok(self.log.range(start..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(ns: &str, name: &str) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}})
    }

    #[test]
    fn every_write_gets_the_next_version_and_an_event() {
        let mut s = Store::new(100);
        let a = s.put("cm", obj("default", "a"));
        let a2 = s.put("cm", obj("default", "a"));
        s.put("cm", obj("other", "b"));
        let gone = s.remove("cm", (*a2).clone());
        assert_eq!(a["metadata"]["resourceVersion"], "1");
        assert_eq!(gone["metadata"]["resourceVersion"], "4");
        let types: Vec<EventType> = s.events_after(0).unwrap().iter().map(|e| e.type_).collect();
        assert_eq!(
            types,
            vec![
                EventType::Added,
                EventType::Modified,
                EventType::Added,
                EventType::Deleted
            ]
        );
        assert_eq!(s.events_after(2).unwrap().len(), 2);
        assert_eq!(s.list("cm", Some("other")).count(), 1);
        assert_eq!(s.list("cm", Some("default")).count(), 0);
        assert!(s.namespace_is_empty("default"));
    }

    #[test]
    fn compaction_expires_old_versions() {
        let mut s = Store::new(2);
        for i in 0..5 {
            s.put("cm", obj("default", &format!("o{i}")));
        }
        assert_eq!(s.events_after(2).err(), Some(4));
        assert_eq!(s.events_after(3).unwrap().len(), 2);
    }
}
