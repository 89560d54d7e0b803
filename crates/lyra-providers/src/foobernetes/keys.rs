//! The idempotency index: which resource was made for which [`OpContext::idempotency_key`].
//!
//! The original's `deployment.json` has no room for it (its format is fixed), so it lives beside
//! that file in `<file>.lyra-keys` (`deployment.json.lyra-keys` by default): one JSON object
//! mapping each key (`<store id>/<run id>/<deployment>/<step id>`, or `<deployment>/<step id>`
//! from Lyra versions before store ids) to the external id made for it, keys sorted,
//! pretty-printed. For example:
//!
//! ```json
//! {
//!   "0b6f4c3e-8d0a-4c52-9a7e-3f1d2b5c6a70/3/web/appServers/0": "i-5577006791947779410",
//!   "0b6f4c3e-8d0a-4c52-9a7e-3f1d2b5c6a70/3/web/lb": "lb-8674665223082153551"
//! }
//! ```
//!
//! A key whose id is not in `deployment.json` is *dangling*: it is what a crash between writing
//! the two files leaves behind (see [`super::store`]), or what deleting the resource by hand
//! does. It means "nothing exists for this key", except that a retried `create` reuses its id.
//!
//! [`OpContext::idempotency_key`]: lyra_core::provider::OpContext::idempotency_key

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The suffix that names the index file after the Foobernetes file.
const SUFFIX: &str = ".lyra-keys";

/// The index file of the Foobernetes file `path`.
pub(crate) fn path_for(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(SUFFIX);
    PathBuf::from(name)
}

/// Key → external id, and what changed since it was loaded, so the store knows whether to write
/// it before or after `deployment.json`.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    ids: BTreeMap<String, String>,
    added: bool,
    removed: bool,
}

impl Keys {
    pub(crate) fn from_map(ids: BTreeMap<String, String>) -> Self {
        Keys { ids, ..Keys::default() }
    }

    pub(crate) fn as_map(&self) -> &BTreeMap<String, String> {
        &self.ids
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.ids.get(key).map(String::as_str)
    }

    /// Whether some key names `id`: a new resource must not get such an id, or that key's
    /// lookup would find a resource that was not made for it.
    pub(crate) fn names(&self, id: &str) -> bool {
        self.ids.values().any(|v| v == id)
    }

    pub(crate) fn insert(&mut self, key: String, id: String) {
        if self.ids.get(&key) != Some(&id) {
            self.ids.insert(key, id);
            self.added = true;
        }
    }

    /// Drops every key naming `id` (normally one).
    pub(crate) fn forget_id(&mut self, id: &str) {
        let before = self.ids.len();
        self.ids.retain(|_, v| v != id);
        self.removed |= self.ids.len() != before;
    }

    /// Whether a key was added or re-pointed: then the index is written before the deployment.
    pub(crate) fn added(&self) -> bool {
        self.added
    }

    /// Whether a key was dropped.
    pub(crate) fn removed(&self) -> bool {
        self.removed
    }
}
