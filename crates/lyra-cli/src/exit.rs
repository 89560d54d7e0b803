//! Exit statuses scripts can trust: 0 success, 1 failure, 2 usage error, 3 locked by another
//! run, 130 interrupted.

use lyra_core::diag::{Diagnostics, Sources};

/// An early end of a command, with its exit status and what to tell the user.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: Option<String>,
}

impl Exit {
    pub const SUCCESS: u8 = 0;
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    /// Another run holds the deployment's lease.
    pub const LOCKED: u8 = 3;
    pub const INTERRUPTED: u8 = 130;

    pub fn usage(message: impl Into<String>) -> Exit {
        Exit {
            code: Self::USAGE,
            message: Some(format!("error: {}", message.into())),
        }
    }

    pub fn failure(message: impl Into<String>) -> Exit {
        Exit {
            code: Self::FAILURE,
            message: Some(format!("error: {}", message.into())),
        }
    }

    pub fn invalid(d: &Diagnostics, sources: &Sources) -> Exit {
        Exit {
            code: Self::FAILURE,
            message: Some(crate::load::render(d, sources)),
        }
    }

    pub fn code(code: u8) -> Exit {
        Exit { code, message: None }
    }
}

impl From<anyhow::Error> for Exit {
    fn from(e: anyhow::Error) -> Exit {
        Exit::failure(format!("{e:#}"))
    }
}
