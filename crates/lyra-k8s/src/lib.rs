//! Lyra's Kubernetes facade: the `Workflow` custom resource ([`crd`]), its status
//! ([`status`]), and the reconciler ([`reconcile`] is the core, testable without a cluster;
//! [`controller`] wires it to kube-runtime).
//!
//! A Workflow's deployment in the shared state is `k8s/<namespace>/<name>`, and the
//! controller holds the deployment's lease as `controller/<namespace>/<name>` while it runs,
//! so the CLI sees (and is refused by) the controller's runs, and the other way round.

pub mod admission;
pub mod approval;
pub mod controller;
pub mod crd;
pub mod data;
pub mod definition;
pub mod events;
pub mod free;
pub mod inline;
pub mod kind;
pub mod metrics;
pub mod reason;
pub mod reconcile;
pub mod register;
pub mod registrar;
pub mod retry;
pub mod status;
pub mod webhook;

pub use crd::{FINALIZER, Workflow, WorkflowSpec, WorkflowStatus, crd_yaml};
pub use reconcile::{Job, Next, ObjectKey, ReconcileError, Reporter, Runtime, Settings, WorkflowRef};
