//! Provider configuration: the main workflow's `providers:` block, resolved per run.

use std::sync::OnceLock;

use crate::value::Map;

/// The configuration of a provider that has none.
pub(super) static NONE: OnceLock<Map> = OnceLock::new();
