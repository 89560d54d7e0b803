//! Advice that ends some of the engine's messages. The core knows no command line, data file
//! or Kubernetes field: the program running the engine words how its users act on a message.

/// The caller's words for what its users can do about a message.
pub trait Hints: Send + Sync {
    /// Where a data key can be added, e.g. "the data file or `--var KEY=VALUE`", completing
    /// "add 'KEY' to the data (…)".
    fn add_data_key(&self, key: &str) -> String;

    /// How a data key is given a value, e.g. "`--var KEY=VALUE`", completing "give it a value
    /// in the data (…), or a lookup or a value".
    fn set_data_key(&self, key: &str) -> String;

    /// What forgets these records without deleting their resources, e.g. "`lyra state rm
    /// DEPLOYMENT STEP…`", completing "then run …" and "forget the records with …".
    fn forget_records(&self, deployment: &str, step_ids: &[&str]) -> String;
}
