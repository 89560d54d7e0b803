//! The pure Lyra engine. See `ARCHITECTURE.md` at the repository root.
//!
//! This crate does no I/O of its own: workflow sources arrive as strings, providers and the
//! state store arrive as trait objects, and time and cancellation arrive from the caller.

pub mod diag;
pub mod engine;
pub mod expr;
pub mod fmt;
pub mod graph;
pub mod guard;
pub mod model;
pub mod names;
pub mod net;
pub mod program;
pub mod provider;
pub mod report;
pub mod schema;
pub mod secret;
pub mod state;
pub mod types;
pub mod validate;
pub mod value;
pub mod yaml;

/// The maps built for every step of a workflow (names, keys, variables): foldhash rather
/// than SipHash, several times cheaper on short keys. It is seeded at random per process, so
/// keys from a workflow cannot be chosen to collide.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
