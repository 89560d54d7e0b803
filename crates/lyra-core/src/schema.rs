//! What providers tell the engine about their resource types.

use std::sync::Arc;

use crate::FastMap;
use crate::types::Type;

/// One attribute of a resource type.
#[derive(Debug, Clone)]
pub struct AttributeSchema {
    pub name: String,
    pub ty: Type,
    /// Filled in by the provider when the workflow leaves it unset (an address the cloud
    /// hands out unless one is pinned). Not diffed unless the workflow sets it.
    pub provided: bool,
    /// Computed by the provider, never by the workflow (ids, echoes): read-only. Setting it
    /// could never converge (every apply would see a difference), so validation rejects it.
    /// Implies `provided`.
    pub computed: bool,
    /// A change to this attribute replaces the resource instead of updating it.
    pub immutable: bool,
    /// Never printed in plans, logs or state output.
    pub sensitive: bool,
    /// The workflow must set it (validation says so when it does not).
    pub required: bool,
    /// What it is, for `lyra providers` and the language reference.
    pub doc: String,
}

impl AttributeSchema {
    pub fn new(name: &str, ty: Type) -> Self {
        AttributeSchema {
            name: name.to_owned(),
            ty,
            provided: false,
            computed: false,
            immutable: false,
            sensitive: false,
            required: false,
            doc: String::new(),
        }
    }
    /// The workflow must set it.
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }
    pub fn doc(mut self, doc: &str) -> Self {
        doc.clone_into(&mut self.doc);
        self
    }
    pub fn provided(mut self) -> Self {
        self.provided = true;
        self
    }
    /// Read-only: computed by the provider, never set by a workflow.
    pub fn computed(mut self) -> Self {
        self.provided = true;
        self.computed = true;
        self
    }
    pub fn immutable(mut self) -> Self {
        self.immutable = true;
        self
    }
    pub fn sensitive(mut self) -> Self {
        self.sensitive = true;
        self
    }
    /// Whether its values are secret: marked so, or typed `Sensitive`.
    pub fn is_secret(&self) -> bool {
        self.sensitive || self.ty.is_sensitive()
    }
}

/// A resource type such as `Foobernetes::Instance`.
#[derive(Debug, Clone)]
pub struct ResourceSchema {
    /// Canonical name, `Namespace::Type` (for a provider's configuration, `Namespace`).
    pub name: String,
    pub attributes: Vec<AttributeSchema>,
    /// What it is, for `lyra providers`.
    pub doc: String,
    /// Its resources exist only as their records (the provider computes them and keeps
    /// nothing elsewhere: an echo, a random value, a key pair). A create cut short by a crash
    /// then leaves nothing behind to find again, so the engine records no intent before it:
    /// the next run simply creates anew. One commit per create instead of two.
    pub local: bool,
    /// Its provider's `read` answers the recorded actual state as it is, whatever else
    /// happens (an echo, a value drawn once): a plan or apply takes the record for the read,
    /// neither asking nor copying it (`lyra drift`, whose point is to read, still asks).
    /// Planning 10,000 unchanged steps spent a sixth of its time copying records to read them
    /// back.
    pub read_is_record: bool,
}

impl ResourceSchema {
    pub fn new(name: &str, attributes: Vec<AttributeSchema>) -> Self {
        ResourceSchema {
            name: name.to_owned(),
            attributes,
            doc: String::new(),
            local: false,
            read_is_record: false,
        }
    }

    /// See [`ResourceSchema::local`].
    pub fn local(mut self) -> Self {
        self.local = true;
        self
    }

    /// See [`ResourceSchema::read_is_record`].
    pub fn read_is_record(mut self) -> Self {
        self.read_is_record = true;
        self
    }

    pub fn doc(mut self, doc: &str) -> Self {
        doc.clone_into(&mut self.doc);
        self
    }

    /// The namespace of a type name: `Postgres` for `Postgres::Role`.
    pub fn namespace(&self) -> &str {
        namespace_of(&self.name)
    }

    pub fn attribute(&self, name: &str) -> Option<&AttributeSchema> {
        self.attributes.iter().find(|a| a.name == name)
    }

    /// Whether the values of attribute `name` are secret (see [`AttributeSchema::is_secret`]).
    pub fn is_secret(&self, name: &str) -> bool {
        self.attribute(name).is_some_and(AttributeSchema::is_secret)
    }

    /// Whether any attribute is secret (most types have none).
    pub fn has_secrets(&self) -> bool {
        self.attributes.iter().any(AttributeSchema::is_secret)
    }
}

/// The namespace of a type name: `Postgres` for `Postgres::Role`, the whole name when it has
/// no `::`.
pub fn namespace_of(type_name: &str) -> &str {
    // Bytes rather than a `"::"` pattern: its searcher is set up anew on each call, which
    // cost more than the rest of looking a step's provider settings up.
    let at = type_name.as_bytes().windows(2).position(|w| w == b"::");
    at.map_or(type_name, |i| &type_name[..i])
}

/// Normalised key for a resource type name: type names are case-insensitive
/// (`Foobernetes::Loadbalancer` is `Foobernetes::LoadBalancer`), as in the original.
pub fn type_key(name: &str) -> String {
    name.to_ascii_lowercase()
}

/// Calls `f` with [`type_key`] of `name`, lowercased on the stack when it is short (as every
/// real type name is): looking a type up for each step of a run allocates nothing.
pub fn with_type_key<R>(name: &str, f: impl FnOnce(&str) -> R) -> R {
    let mut buf = [0u8; 128];
    match buf.get_mut(..name.len()) {
        Some(key) => {
            key.copy_from_slice(name.as_bytes());
            key.make_ascii_lowercase();
            // ASCII lowercasing leaves every other byte as it was: still UTF-8.
            f(std::str::from_utf8(key).expect("lowercased UTF-8 is UTF-8"))
        }
        None => f(&type_key(name)),
    }
}

/// Values by resource type, looked up case-insensitively. A name spelt as it was registered,
/// as workflows and records nearly always spell it, is found first and without a lowercased
/// copy: the copies were 8% of planning 10,000 unchanged steps, which look their type up twice
/// each.
#[derive(Debug, Clone)]
pub(crate) struct TypeIndex<V> {
    by_key: FastMap<String, V>,
    by_name: FastMap<String, V>,
}

impl<V> Default for TypeIndex<V> {
    fn default() -> Self {
        TypeIndex {
            by_key: FastMap::default(),
            by_name: FastMap::default(),
        }
    }
}

impl<V: Clone> TypeIndex<V> {
    pub(crate) fn insert(&mut self, name: &str, value: V) {
        if self.by_key.insert(type_key(name), value.clone()).is_some() {
            // Registered before, perhaps spelt otherwise: replaced under every spelling.
            self.by_name.retain(|n, _| !n.eq_ignore_ascii_case(name));
        }
        self.by_name.insert(name.to_owned(), value);
    }

    pub(crate) fn get(&self, name: &str) -> Option<&V> {
        self.by_name
            .get(name)
            .or_else(|| with_type_key(name, |key| self.by_key.get(key)))
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.by_key.values()
    }
}

/// All resource types known to an engine, looked up case-insensitively.
#[derive(Debug, Clone, Default)]
pub struct SchemaRegistry {
    types: TypeIndex<Arc<ResourceSchema>>,
    /// Provider configuration schemas, by namespace key.
    configs: FastMap<String, ResourceSchema>,
}

impl SchemaRegistry {
    pub fn insert(&mut self, schema: ResourceSchema) {
        let name = schema.name.clone();
        self.types.insert(&name, Arc::new(schema));
    }

    pub fn get(&self, name: &str) -> Option<&ResourceSchema> {
        self.types.get(name).map(|s| &**s)
    }

    /// Registers the configuration schema of a namespace (named by it).
    pub fn insert_config(&mut self, schema: ResourceSchema) {
        self.configs.insert(type_key(&schema.name), schema);
    }

    /// The configuration schema of namespace `ns` (case-insensitive), if its provider takes one.
    pub fn config(&self, ns: &str) -> Option<&ResourceSchema> {
        with_type_key(ns, |key| self.configs.get(key))
    }

    /// The namespaces whose providers take configuration, sorted.
    pub fn config_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.configs.values().map(|s| s.name.as_str()).collect();
        v.sort_unstable();
        v
    }

    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.types.values().map(|s| s.name.as_str()).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_what_comes_before_the_first_double_colon() {
        for (name, ns) in [
            ("Postgres::Role", "Postgres"),
            ("Null", "Null"),
            ("A::B::C", "A"),
            ("::Role", ""),
            ("Ns::", "Ns"),
            ("", ""),
            (":", ":"),
            ("a:b::c", "a:b"),
            ("Ünï::Cödé", "Ünï"),
        ] {
            assert_eq!(namespace_of(name), ns, "{name:?}");
            assert_eq!(namespace_of(name), name.split_once("::").map_or(name, |(n, _)| n));
        }
    }

    #[test]
    fn type_keys_on_the_stack_are_the_allocated_ones() {
        let long = format!("Ns::{}", "Ä".repeat(100));
        for name in [
            "Foobernetes::LoadBalancer",
            "null::resource",
            "",
            "Ünï::Cödé",
            long.as_str(),
        ] {
            assert_eq!(with_type_key(name, str::to_owned), type_key(name), "{name}");
        }
    }
}
