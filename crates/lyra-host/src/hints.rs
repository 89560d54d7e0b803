//! The advice the engine's messages end with, worded for Lyra's users. The CLI and the
//! controller give the same: a workflow runs under both, and a record is forgotten with the CLI
//! whichever ran it.

use lyra_core::engine::Hints;

/// [`Hints`] naming the data file, `--var`, `spec.data` and `lyra state rm`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Advice;

impl Hints for Advice {
    fn add_data_key(&self, key: &str) -> String {
        format!("the data file or `--var {key}=VALUE`; `spec.data` on Kubernetes")
    }

    fn set_data_key(&self, key: &str) -> String {
        format!("`--var {key}=VALUE`; `spec.data` on Kubernetes")
    }

    fn forget_records(&self, deployment: &str, step_ids: &[&str]) -> String {
        format!("`lyra state rm {deployment} {}`", step_ids.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_every_record_to_forget() {
        assert_eq!(Advice.forget_records("web", &["a", "b/0"]), "`lyra state rm web a b/0`");
    }
}
