//! Server-side apply field ownership: `metadata.managedFields`, kept as the apiserver keeps
//! it. Each entry is a manager's set of fields (`FieldsV1`: `{"f:spec": {"f:x": {}}}`) for
//! one operation: `Apply` (the fields of the configuration it last applied) or `Update`
//! (the fields its other writes set or changed).
//!
//! An apply makes the applied configuration's fields the manager's `Apply` set, and removes
//! from the object what its previous set had and the new one lacks, unless another manager
//! owns it. It conflicts with another manager owning a field it changes (409, unless
//! `force`, which takes the field over). Any other write takes the fields it sets or changes
//! from their owners for its manager, and nobody owns a field a write removes.
//!
//! What is owned: every field but `apiVersion`, `kind` and `metadata`, where only labels and
//! annotations are, per key (finalizers, owner references, names are never removed by an
//! apply); `status` only through `/status` when it is a subresource. Maps nest at any depth;
//! lists are atomic leaves, but those of built-in kinds with a strategic merge key
//! (`containers` by `name`...) own items one by one (`k:{"name":"app"}`). Custom resources'
//! lists are atomic, as the apiserver's default (`x-kubernetes-list-type` is not read).
//! Below 32 levels a value is owned whole (see `OWNED_DEPTH`).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::subresource::Subresource;

/// A set of field paths: children by path element (`f:<field>`, or `k:<key as JSON>` for an
/// item of a keyed list), and whether the node itself is owned (a leaf, or `"."`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Fields {
    owned: bool,
    children: BTreeMap<String, Fields>,
}

impl Fields {
    fn leaf() -> Fields {
        Fields {
            owned: true,
            children: BTreeMap::new(),
        }
    }

    fn is_empty(&self) -> bool {
        !self.owned && self.children.is_empty()
    }

    fn from_v1(v: &Value) -> Fields {
        let Some(m) = v.as_object() else {
            return Fields::default();
        };
        let mut f = Fields {
            owned: m.is_empty(),
            children: BTreeMap::new(),
        };
        for (k, c) in m {
            if k == "." {
                f.owned = true;
            } else {
                f.children.insert(k.clone(), Fields::from_v1(c));
            }
        }
        f
    }

    fn to_v1(&self) -> Value {
        let mut m = Map::new();
        if self.owned && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &self.children {
            m.insert(k.clone(), c.to_v1());
        }
        Value::Object(m)
    }

    fn union(&mut self, other: &Fields) {
        self.owned |= other.owned;
        for (k, c) in &other.children {
            self.children.entry(k.clone()).or_default().union(c);
        }
    }

    /// Without the paths of `other`: a leaf of `other` takes everything under it.
    fn subtract(&mut self, other: &Fields) {
        if other.owned && other.children.is_empty() {
            *self = Fields::default();
            return;
        }
        self.owned &= !other.owned;
        for (k, c) in &other.children {
            if let Some(mine) = self.children.get_mut(k) {
                mine.subtract(c);
                if mine.is_empty() {
                    self.children.remove(k);
                }
            }
        }
    }

    /// The owned paths both sets have.
    fn common_leaves(&self, other: &Fields, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.owned && other.owned {
            out.push(at.clone());
        }
        for (k, c) in &self.children {
            if let Some(o) = other.children.get(k) {
                at.push(k.clone());
                c.common_leaves(o, at, out);
                at.pop();
            }
        }
    }

    fn from_path(path: &[String]) -> Fields {
        match path.split_first() {
            None => Fields::leaf(),
            Some((first, rest)) => Fields {
                owned: false,
                children: BTreeMap::from([(first.clone(), Fields::from_path(rest))]),
            },
        }
    }
}

/// What a write's fields are, besides the object: which part of it the endpoint writes, and
/// whether lists merge by key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub sub: Subresource,
    /// `status` goes through `/status` only.
    pub status_separate: bool,
    /// Lists with a strategic merge key own items one by one (built-in kinds).
    pub keyed_lists: bool,
}

/// The key of a list's items, when it has one and every item carries it.
fn list_key(shape: Shape, field: &str, items: &[Value]) -> Option<&'static str> {
    if !shape.keyed_lists || items.is_empty() {
        return None;
    }
    super::strategic::merge_key(field, items.first()).filter(|k| items.iter().all(|i| i.get(*k).is_some()))
}

fn item_segment(key: &str, item: &Value) -> String {
    format!("k:{}", json!({ key: item[key] }))
}

/// How deep field sets go: a map nested deeper is owned whole, as one field. The apiserver
/// tracks every level, but a `fieldsV1` as deep as a 10,000-level object cannot be read by
/// clients that bound their nesting (serde_json, so kube-rs, stops at 128): one such object
/// would make every list of its kind unreadable.
const OWNED_DEPTH: usize = 32;

/// `v` with every value nested `OWNED_DEPTH` levels below `depth` replaced by its text: a
/// leaf that still compares unequal when anything in it changes.
fn cut_deep(v: &mut Value, depth: usize) {
    if depth >= OWNED_DEPTH {
        if v.is_object() || v.is_array() {
            *v = Value::String(v.to_string());
        }
        return;
    }
    match v {
        Value::Object(m) => m.values_mut().for_each(|c| cut_deep(c, depth + 1)),
        Value::Array(items) => items.iter_mut().for_each(|c| cut_deep(c, depth + 1)),
        _ => {}
    }
}

/// The part of `obj` that can be owned, cut at `OWNED_DEPTH`.
fn ownable(obj: &Value, shape: Shape) -> Value {
    let mut owned = ownable_whole(obj, shape);
    cut_deep(&mut owned, 0);
    owned
}

fn ownable_whole(obj: &Value, shape: Shape) -> Value {
    let Some(m) = obj.as_object() else {
        return json!({});
    };
    let mut out = Map::new();
    if shape.sub == Subresource::Status {
        if let Some(s) = m.get("status") {
            out.insert("status".into(), s.clone());
        }
        return Value::Object(out);
    }
    for (k, v) in m {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "status" if shape.status_separate => {}
            "metadata" => {
                let mut meta = Map::new();
                for per_key in ["labels", "annotations"] {
                    if let Some(Value::Object(kv)) = v.get(per_key)
                        && !kv.is_empty()
                    {
                        meta.insert(per_key.into(), Value::Object(kv.clone()));
                    }
                }
                if !meta.is_empty() {
                    out.insert(k.clone(), Value::Object(meta));
                }
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The fields a value sets: maps nest, keyed lists own their items, the rest are leaves.
fn set_of(v: &Value, shape: Shape) -> Fields {
    let children: BTreeMap<String, Fields> = match v.as_object() {
        Some(m) => m
            .iter()
            .filter(|(_, c)| !c.is_null())
            .map(|(k, c)| (format!("f:{k}"), field_set(k, c, shape)))
            .collect(),
        None => BTreeMap::new(),
    };
    if children.is_empty() {
        return Fields::leaf();
    }
    Fields { owned: false, children }
}

fn field_set(field: &str, v: &Value, shape: Shape) -> Fields {
    if let Value::Array(items) = v
        && let Some(key) = list_key(shape, field, items)
    {
        let children = items
            .iter()
            .map(|i| {
                (
                    item_segment(key, i),
                    Fields {
                        owned: true,
                        ..set_of(i, shape)
                    },
                )
            })
            .collect();
        return Fields { owned: false, children };
    }
    set_of(v, shape)
}

/// What changed from `old` to `new` (fields set or changed) and what was removed.
fn diff(old: &Value, new: &Value, shape: Shape, changed: &mut Fields, removed: &mut Fields) {
    let (Some(o), Some(n)) = (old.as_object(), new.as_object()) else {
        return;
    };
    for (k, nv) in n.iter().filter(|(_, v)| !v.is_null()) {
        let seg = format!("f:{k}");
        match o.get(k).filter(|v| !v.is_null()) {
            None => {
                changed.children.insert(seg, field_set(k, nv, shape));
            }
            Some(ov) if ov == nv => {}
            Some(ov) if ov.is_object() && nv.is_object() && !nv.as_object().is_some_and(Map::is_empty) => {
                let (mut c, mut r) = (Fields::default(), Fields::default());
                diff(ov, nv, shape, &mut c, &mut r);
                insert_non_empty(changed, &seg, c);
                insert_non_empty(removed, &seg, r);
            }
            Some(ov) => {
                let keyed = match (ov, nv) {
                    (Value::Array(oi), Value::Array(ni)) => {
                        list_key(shape, k, ni).filter(|key| list_key(shape, k, oi) == Some(key))
                    }
                    _ => None,
                };
                let Some(key) = keyed else {
                    // Replaced whole: whoever owned what was under it no longer does.
                    removed.children.insert(seg.clone(), Fields::leaf());
                    changed.children.insert(seg, field_set(k, nv, shape));
                    continue;
                };
                let (oi, ni) = (ov.as_array().expect("keyed"), nv.as_array().expect("keyed"));
                let (mut c, mut r) = (Fields::default(), Fields::default());
                for item in ni {
                    let iseg = item_segment(key, item);
                    match oi.iter().find(|x| x[key] == item[key]) {
                        None => {
                            c.children.insert(
                                iseg,
                                Fields {
                                    owned: true,
                                    ..set_of(item, shape)
                                },
                            );
                        }
                        Some(before) if before == item => {}
                        Some(before) => {
                            let (mut ic, mut ir) = (Fields::default(), Fields::default());
                            diff(before, item, shape, &mut ic, &mut ir);
                            insert_non_empty(&mut c, &iseg, ic);
                            insert_non_empty(&mut r, &iseg, ir);
                        }
                    }
                }
                for item in oi.iter().filter(|x| !ni.iter().any(|i| i[key] == x[key])) {
                    r.children.insert(item_segment(key, item), Fields::leaf());
                }
                insert_non_empty(changed, &seg, c);
                insert_non_empty(removed, &seg, r);
            }
        }
    }
    for k in o.keys().filter(|k| n.get(*k).is_none_or(Value::is_null)) {
        removed.children.insert(format!("f:{k}"), Fields::leaf());
    }
}

fn insert_non_empty(into: &mut Fields, seg: &str, f: Fields) {
    if !f.is_empty() {
        into.children.insert(seg.to_owned(), f);
    }
}

/// The keys a `k:` segment names, as a map.
fn segment_key(seg: &str) -> Option<Map<String, Value>> {
    serde_json::from_str(seg.strip_prefix("k:")?).ok()
}

fn item_matches(item: &Value, key: &Map<String, Value>) -> bool {
    key.iter().all(|(k, v)| item.get(k) == Some(v))
}

fn child<'a>(v: &'a Value, seg: &str) -> Option<&'a Value> {
    if let Some(f) = seg.strip_prefix("f:") {
        return v.get(f);
    }
    let key = segment_key(seg)?;
    v.as_array()?.iter().find(|i| item_matches(i, &key))
}

fn child_mut<'a>(v: &'a mut Value, seg: &str) -> Option<&'a mut Value> {
    if let Some(f) = seg.strip_prefix("f:") {
        return v.get_mut(f);
    }
    let key = segment_key(seg)?;
    v.as_array_mut()?.iter_mut().find(|i| item_matches(i, &key))
}

fn remove_child(v: &mut Value, seg: &str) {
    if let Some(f) = seg.strip_prefix("f:") {
        if let Some(m) = v.as_object_mut() {
            m.remove(f);
        }
    } else if let (Some(key), Some(items)) = (segment_key(seg), v.as_array_mut()) {
        items.retain(|i| !item_matches(i, &key));
    }
}

fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, seg| child(v, seg))
}

/// Removes from `v` what `prev` has and `keep` lacks. A map or list emptied this way goes too,
/// unless kept.
fn prune(v: &mut Value, prev: &Fields, keep: Option<&Fields>) {
    for (seg, c) in &prev.children {
        let kept = keep.and_then(|k| k.children.get(seg));
        if c.owned && kept.is_none() {
            remove_child(v, seg);
            continue;
        }
        if c.children.is_empty() {
            continue;
        }
        let Some(inner) = child_mut(v, seg) else {
            continue;
        };
        let len = |v: &Value| match v {
            Value::Object(m) => Some(m.len()),
            Value::Array(a) => Some(a.len()),
            _ => None,
        };
        let before = len(inner);
        prune(inner, c, kept);
        if kept.is_none() && before.is_some_and(|n| n > 0) && len(inner) == Some(0) {
            remove_child(v, seg);
        }
    }
}

/// The apiserver's spelling of a path in conflict messages: `.spec.containers[name="app"].image`.
fn display_path(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        if let Some(f) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(key) = segment_key(seg) {
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        }
    }
    s
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    fields: Fields,
}

impl Entry {
    fn parse(v: &Value) -> Option<Entry> {
        Some(Entry {
            manager: v["manager"].as_str().unwrap_or_default().to_owned(),
            operation: v["operation"].as_str()?.to_owned(),
            api_version: v["apiVersion"].as_str().unwrap_or_default().to_owned(),
            time: v["time"].as_str().unwrap_or_default().to_owned(),
            subresource: v["subresource"].as_str().map(str::to_owned),
            fields: Fields::from_v1(&v["fieldsV1"]),
        })
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields.to_v1(),
        });
        if let Some(s) = &self.subresource {
            v["subresource"] = json!(s);
        }
        v
    }
}

/// Who writes: the manager, the version it writes, and the shape of what it writes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub shape: Shape,
}

impl Writer<'_> {
    fn subresource(&self) -> Option<String> {
        (self.shape.sub == Subresource::Status).then(|| "status".to_owned())
    }

    fn is(&self, e: &Entry, operation: &str) -> bool {
        e.manager == self.manager && e.operation == operation && e.subresource == self.subresource()
    }

    /// The manager's entry for `operation` with `fields`; its time moves only when they do,
    /// so a write that changes nothing stays a no-op.
    fn own(&self, entries: &mut Vec<Entry>, operation: &str, fields: Fields) {
        let at = entries.iter().position(|e| self.is(e, operation));
        match at {
            Some(i) if entries[i].fields == fields && entries[i].api_version == self.api_version => {}
            Some(i) => {
                let e = &mut entries[i];
                e.fields = fields;
                e.api_version = self.api_version.to_owned();
                e.time = super::now_rfc3339();
            }
            None => entries.push(Entry {
                manager: self.manager.to_owned(),
                operation: operation.to_owned(),
                api_version: self.api_version.to_owned(),
                time: super::now_rfc3339(),
                subresource: self.subresource(),
                fields,
            }),
        }
    }
}

fn entries_of(obj: &Value) -> Vec<Entry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Entry::parse)
        .collect()
}

fn store_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.fields.is_empty());
    let Some(meta) = obj["metadata"].as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert(
            "managedFields".into(),
            Value::Array(entries.iter().map(Entry::to_json).collect()),
        );
    }
}

/// A non-apply write (create, update, patch) from `old` (none for a create) to `new`: its
/// manager owns what it set or changed, taken from other managers; removed fields have no
/// owner. `new` carries `old`'s managedFields, and leaves with the new ones.
pub(super) fn record_update(old: Option<&Value>, new: &mut Value, who: &Writer<'_>) {
    let mut entries = old.map(entries_of).unwrap_or_default();
    let target = ownable(new, who.shape);
    let (mut changed, mut removed) = (Fields::default(), Fields::default());
    match old {
        Some(o) => diff(&ownable(o, who.shape), &target, who.shape, &mut changed, &mut removed),
        None => changed = set_of(&target, who.shape),
    }
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    if changed.owned {
        // An empty object sets nothing.
        changed = Fields::default();
    }
    let mut taken = changed.clone();
    taken.union(&removed);
    let mine = entries.iter().position(|e| who.is(e, "Update"));
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) == mine {
            e.fields.subtract(&removed);
        } else {
            e.fields.subtract(&taken);
        }
    }
    if !who.manager.is_empty() && !changed.is_empty() {
        let mut fields = mine.map(|i| entries[i].fields.clone()).unwrap_or_default();
        fields.union(&changed);
        who.own(&mut entries, "Update", fields);
    }
    store_entries(new, entries);
}

/// A field another manager owns and an apply would change.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub api_version: String,
    pub path: String,
}

/// A server-side apply of `config` by `who`: `merged` is `old` (none for a create) with
/// `config` merged in. Checks conflicts (taking the fields over when `force`), removes what
/// the manager applied before and no longer does (unless someone else owns it), and leaves
/// the new managedFields on `merged`.
pub(super) fn apply(
    old: Option<&Value>,
    merged: &mut Value,
    config: &Value,
    who: &Writer<'_>,
    force: bool,
) -> Result<(), Vec<Conflict>> {
    let mut entries = old.map(entries_of).unwrap_or_default();
    let mut applied = set_of(&ownable(config, who.shape), who.shape);
    if applied.owned {
        applied = Fields::default();
    }
    let mut conflicts = Vec::new();
    if let Some(old) = old {
        for e in entries.iter_mut().filter(|e| !who.is(e, "Apply")) {
            let mut common = Vec::new();
            applied.common_leaves(&e.fields, &mut Vec::new(), &mut common);
            for path in common {
                if value_at(old, &path) == value_at(config, &path) {
                    // The same value: both own it.
                    continue;
                }
                if force {
                    e.fields.subtract(&Fields::from_path(&path));
                } else {
                    conflicts.push(Conflict {
                        manager: e.manager.clone(),
                        api_version: e.api_version.clone(),
                        path: display_path(&path),
                    });
                }
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut keep = applied.clone();
    let mut previous = None;
    for e in &entries {
        if who.is(e, "Apply") {
            previous = Some(e.fields.clone());
        } else {
            keep.union(&e.fields);
        }
    }
    if let Some(previous) = previous {
        prune(merged, &previous, Some(&keep));
    }
    who.own(&mut entries, "Apply", applied);
    store_entries(merged, entries);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use crate::objects::{FieldManager, PatchKind, State, Subresource, WriteOptions};
    use crate::registry::ResourceType;

    /// A cluster with a kind whose spec and status take anything, status a subresource.
    fn cluster() -> (State, Arc<ResourceType>) {
        let mut s = State::new(1000);
        let crd_type = s
            .registry
            .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .unwrap();
        let open = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        let crd = json!({
            "metadata": {"name": "things.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "things", "kind": "Thing"},
                "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "properties": {"spec": open, "status": open}}}}]}
        });
        s.create(&crd_type, "v1", "", crd, WriteOptions::default()).unwrap();
        let t = s.registry.find("example.com", "v1", "things").unwrap();
        (s, t)
    }

    fn by(manager: &str, force: bool) -> WriteOptions {
        WriteOptions {
            manager: FieldManager::new(manager).unwrap(),
            force,
            ..WriteOptions::default()
        }
    }

    fn thing(spec: Value) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "a"}, "spec": spec})
    }

    fn patch(
        s: &mut State,
        rt: &Arc<ResourceType>,
        kind: PatchKind,
        body: Value,
        sub: Subresource,
        opts: WriteOptions,
    ) -> Result<Arc<Value>, crate::errors::ApiError> {
        s.patch(rt, "v1", "default", "a", kind, &body, sub, opts)
            .map(|w| w.object)
    }

    fn apply(s: &mut State, rt: &Arc<ResourceType>, body: Value, manager: &str) -> Arc<Value> {
        patch(s, rt, PatchKind::Apply, body, Subresource::Main, by(manager, true)).unwrap()
    }

    fn depth(v: &Value) -> usize {
        match v {
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn a_deep_value_is_owned_whole_below_the_owned_depth() {
        let (mut s, t) = cluster();
        let mut deep = json!("bottom");
        for _ in 0..200 {
            deep = json!({ "d": deep });
        }
        let obj = apply(&mut s, &t, thing(json!({"deep": deep, "x": 1})), "m");
        let fields = &entry(&obj, "m", "Apply")["fieldsV1"];
        assert!(
            depth(fields) <= super::OWNED_DEPTH + 2,
            "fieldsV1 {} deep",
            depth(fields)
        );
        assert_eq!(obj["spec"]["deep"], deep, "the object itself is whole");
        // Changed below the cut: still this manager's change; left out: removed whole.
        let mut other = json!("changed");
        for _ in 0..200 {
            other = json!({ "d": other });
        }
        let obj = apply(&mut s, &t, thing(json!({"deep": other, "x": 1})), "m");
        assert_eq!(obj["spec"]["deep"], other);
        let obj = apply(&mut s, &t, thing(json!({"x": 1})), "m");
        assert!(obj["spec"].get("deep").is_none(), "{}", obj["spec"]);
    }

    fn entry<'a>(obj: &'a Value, manager: &str, operation: &str) -> &'a Value {
        obj["metadata"]["managedFields"]
            .as_array()
            .and_then(|e| {
                e.iter()
                    .find(|e| e["manager"] == manager && e["operation"] == operation)
            })
            .unwrap_or_else(|| panic!("no {operation} entry of {manager}: {obj:#}"))
    }

    #[test]
    fn an_omitted_field_is_removed_at_any_depth_and_can_come_back() {
        let (mut s, t) = cluster();
        let spec = json!({"image": "x", "refreshInterval": "1m", "retry": {"limit": 3, "backoff": "5s"}});
        apply(&mut s, &t, thing(spec), "helm");
        let o = apply(&mut s, &t, thing(json!({"image": "x", "retry": {"limit": 3}})), "helm");
        assert_eq!(o["spec"], json!({"image": "x", "retry": {"limit": 3}}));
        let o = apply(&mut s, &t, thing(json!({"image": "x"})), "helm");
        assert_eq!(o["spec"], json!({"image": "x"}), "an emptied map goes too");
        let o = apply(
            &mut s,
            &t,
            thing(json!({"image": "x", "refreshInterval": "2m"})),
            "helm",
        );
        assert_eq!(o["spec"]["refreshInterval"], "2m");
        assert_eq!(
            entry(&o, "helm", "Apply")["fieldsV1"],
            json!({"f:spec": {"f:image": {}, "f:refreshInterval": {}}})
        );
    }

    #[test]
    fn managed_fields_have_the_apiservers_shape_and_labels_are_owned_per_key() {
        let (mut s, t) = cluster();
        let mut body = thing(json!({"image": "x"}));
        body["metadata"]["labels"] = json!({"app": "a", "tier": "web"});
        body["metadata"]["managedFields"] = json!([{"manager": "liar", "operation": "Apply"}]);
        let o = patch(
            &mut s,
            &t,
            PatchKind::Apply,
            body,
            Subresource::Main,
            by("kubectl", false),
        )
        .unwrap();
        let fields = o["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(fields.len(), 1, "what the client sent is ignored: {fields:?}");
        let e = &fields[0];
        assert_eq!(e["manager"], "kubectl");
        assert_eq!(e["operation"], "Apply");
        assert_eq!(e["apiVersion"], "example.com/v1");
        assert_eq!(e["fieldsType"], "FieldsV1");
        assert!(e["time"].as_str().unwrap().ends_with('Z'));
        assert!(e.get("subresource").is_none());
        assert_eq!(
            e["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:app": {}, "f:tier": {}}}, "f:spec": {"f:image": {}}})
        );
        // Another manager's label stays when the applier drops its own.
        patch(
            &mut s,
            &t,
            PatchKind::Merge,
            json!({"metadata": {"labels": {"team": "t"}}}),
            Subresource::Main,
            by("kubectl-label", false),
        )
        .unwrap();
        let mut body = thing(json!({"image": "x"}));
        body["metadata"]["labels"] = json!({"app": "a"});
        let o = apply(&mut s, &t, body, "kubectl");
        assert_eq!(o["metadata"]["labels"], json!({"app": "a", "team": "t"}));
        assert_eq!(o["metadata"]["name"], "a", "names are never owned nor removed");
        assert_eq!(
            entry(&o, "kubectl-label", "Update")["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:team": {}}}})
        );
    }

    #[test]
    fn a_field_another_manager_owns_stays() {
        let (mut s, t) = cluster();
        apply(&mut s, &t, thing(json!({"image": "x", "replicas": 2})), "helm");
        // Someone else sets the same value with an apply of their own, and another field by
        // an update.
        apply(&mut s, &t, thing(json!({"replicas": 2})), "ops");
        patch(
            &mut s,
            &t,
            PatchKind::Merge,
            json!({"spec": {"paused": true}}),
            Subresource::Main,
            by("kubectl-patch", false),
        )
        .unwrap();
        let o = apply(&mut s, &t, thing(json!({"image": "x"})), "helm");
        assert_eq!(o["spec"], json!({"image": "x", "replicas": 2, "paused": true}));
        let o = apply(&mut s, &t, thing(json!({})), "ops");
        assert_eq!(o["spec"], json!({"image": "x", "paused": true}));
    }

    #[test]
    fn a_changed_field_of_another_manager_conflicts_unless_forced() {
        let (mut s, t) = cluster();
        apply(&mut s, &t, thing(json!({"replicas": 2})), "helm");
        let err = patch(
            &mut s,
            &t,
            PatchKind::Apply,
            thing(json!({"replicas": 3})),
            Subresource::Main,
            by("kubectl", false),
        )
        .unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"helm\" using example.com/v1: .spec.replicas"
        );
        assert_eq!(err.details.unwrap()["causes"][0]["reason"], "FieldManagerConflict");
        let o = apply(&mut s, &t, thing(json!({"replicas": 3})), "kubectl");
        assert_eq!(o["spec"]["replicas"], 3);
        assert!(
            o["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| e["manager"] != "helm"),
            "forced: helm owned nothing else and lost its entry"
        );
        // helm no longer owns replicas: dropping it from its apply leaves it.
        let o = apply(&mut s, &t, thing(json!({})), "helm");
        assert_eq!(o["spec"]["replicas"], 3);
    }

    #[test]
    fn status_is_owned_through_its_subresource_and_left_by_the_main_apply() {
        let (mut s, t) = cluster();
        apply(&mut s, &t, thing(json!({"image": "x"})), "helm");
        let o = patch(
            &mut s,
            &t,
            PatchKind::Merge,
            json!({"status": {"phase": "Ready"}}),
            Subresource::Status,
            by("controller", false),
        )
        .unwrap();
        let e = entry(&o, "controller", "Update");
        assert_eq!(e["subresource"], "status");
        assert_eq!(e["fieldsV1"], json!({"f:status": {"f:phase": {}}}));
        let o = apply(&mut s, &t, thing(json!({"image": "y"})), "helm");
        assert_eq!(o["status"]["phase"], "Ready");
        // An apply through /status removes what its manager applied there before, only.
        let status = |st: Value| json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "a"}, "status": st});
        let status_apply = |s: &mut State, st: Value| {
            patch(
                s,
                &t,
                PatchKind::Apply,
                status(st),
                Subresource::Status,
                by("controller", true),
            )
            .unwrap()
        };
        status_apply(&mut s, json!({"ready": true, "message": "m"}));
        let o = status_apply(&mut s, json!({"ready": true}));
        assert_eq!(o["status"], json!({"phase": "Ready", "ready": true}));
        assert_eq!(o["spec"], json!({"image": "y"}));
        assert_eq!(entry(&o, "controller", "Apply")["subresource"], "status");
    }

    #[test]
    fn lists_are_atomic_and_keyed_lists_of_built_in_kinds_merge_by_key() {
        let (mut s, t) = cluster();
        apply(
            &mut s,
            &t,
            thing(json!({"args": ["a", "b"], "steps": [{"name": "x"}]})),
            "helm",
        );
        patch(
            &mut s,
            &t,
            PatchKind::Merge,
            json!({"spec": {"args": ["a", "b", "c"]}}),
            Subresource::Main,
            by("kubectl-edit", false),
        )
        .unwrap();
        let o = apply(&mut s, &t, thing(json!({"steps": [{"name": "x"}]})), "helm");
        assert_eq!(
            o["spec"]["args"],
            json!(["a", "b", "c"]),
            "the editor owns the list now"
        );
        assert_eq!(
            entry(&o, "kubectl-edit", "Update")["fieldsV1"],
            json!({"f:spec": {"f:args": {}}})
        );
        let o = apply(&mut s, &t, thing(json!({"steps": [{"name": "y"}]})), "helm");
        assert_eq!(o["spec"]["steps"], json!([{"name": "y"}]), "replaced whole");

        let deploy = s.registry.find("apps", "v1", "deployments").unwrap();
        let d = |containers: Value| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "a"},
                "spec": {"template": {"spec": {"containers": containers}}}})
        };
        let containers = json!([{"name": "app", "image": "a:1", "args": ["--x"]}, {"name": "side", "image": "s:1"}]);
        apply(&mut s, &deploy, d(containers), "helm");
        patch(
            &mut s,
            &deploy,
            PatchKind::Strategic,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "debug", "image": "d:1"}]}}}}),
            Subresource::Main,
            by("kubectl-debug", false),
        )
        .unwrap();
        let o = apply(&mut s, &deploy, d(json!([{"name": "app", "image": "a:2"}])), "helm");
        assert_eq!(
            o["spec"]["template"]["spec"]["containers"],
            json!([{"name": "app", "image": "a:2"}, {"name": "debug", "image": "d:1"}])
        );
        let helm = &entry(&o, "helm", "Apply")["fieldsV1"]["f:spec"]["f:template"]["f:spec"];
        assert_eq!(
            helm["f:containers"],
            json!({"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}})
        );
    }

    #[test]
    fn writes_that_change_nothing_stay_no_ops() {
        let (mut s, t) = cluster();
        let first = apply(&mut s, &t, thing(json!({"image": "x"})), "helm");
        let again = apply(&mut s, &t, thing(json!({"image": "x"})), "helm");
        assert_eq!(first, again);
        let same = patch(
            &mut s,
            &t,
            PatchKind::Merge,
            json!({"spec": {"image": "x"}}),
            Subresource::Main,
            by("other", false),
        )
        .unwrap();
        assert_eq!(
            same["metadata"]["resourceVersion"],
            first["metadata"]["resourceVersion"]
        );
        // The server's own writes (no manager) record no entry.
        let cm = s.registry.find("", "v1", "configmaps").unwrap();
        let w = s
            .create(
                &cm,
                "v1",
                "default",
                json!({"metadata": {"name": "c"}}),
                WriteOptions::default(),
            )
            .unwrap();
        assert!(w.object["metadata"].get("managedFields").is_none());
        let w = s
            .create(
                &cm,
                "v1",
                "default",
                json!({"metadata": {"name": "d"}, "data": {"k": "v"}}),
                by("kubectl-create", false),
            )
            .unwrap();
        assert_eq!(
            entry(&w.object, "kubectl-create", "Update")["fieldsV1"],
            json!({"f:data": {"f:k": {}}})
        );
    }
}
