//! [`EmptyState`]: what a command that only reads sees where no state exists yet.

use async_trait::async_trait;
use lyra_core::state::{
    DeploymentState, Recorder, ResourceRecord, RunEnd, RunId, RunStart, StoreError, StoreErrorKind,
};

/// A state with nothing recorded, which refuses every write. `lyra plan` on a store that does
/// not exist yet plans against it: everything would be created, and nothing is created to
/// find that out.
#[derive(Debug, Clone)]
pub struct EmptyState {
    /// Where the state would be, for the refusal's message.
    pub location: String,
}

impl EmptyState {
    fn refuse(&self) -> StoreError {
        StoreError::new(
            StoreErrorKind::Unavailable,
            format!("no state at {}: this command does not create one", self.location),
        )
    }
}

#[async_trait]
impl Recorder for EmptyState {
    /// No store exists, so none has an id yet; nothing is created against it, so no
    /// idempotency key is ever made from this.
    fn store_id(&self) -> &str {
        ""
    }
    async fn load(&self, _: &str) -> Result<Option<DeploymentState>, StoreError> {
        Ok(None)
    }
    async fn begin_run(&self, _: &RunStart) -> Result<RunId, StoreError> {
        Err(self.refuse())
    }
    async fn put_resource(&self, _: &str, _: &ResourceRecord) -> Result<(), StoreError> {
        Err(self.refuse())
    }
    async fn remove_resource(&self, _: &str, _: &str) -> Result<(), StoreError> {
        Err(self.refuse())
    }
    async fn finish_run(&self, _: RunId, _: &RunEnd) -> Result<(), StoreError> {
        Err(self.refuse())
    }
}
