use std::path::PathBuf;

/// What can go wrong building, reading, pushing or pulling a package. Messages name the
/// reference or path, never credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("'{reference}' is not a package reference: {why}")]
    BadReference { reference: String, why: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A blob whose bytes do not hash to the digest that names it.
    #[error(
        "blob {digest} from {location} does not match its digest (its content hashes to {actual}): \
         the package was altered or damaged; refusing it"
    )]
    DigestMismatch {
        digest: String,
        actual: String,
        location: String,
    },
    #[error("{location} is not a Lyra package: {why}")]
    NotAPackage { location: String, why: String },
    #[error("cannot package {name}: {why}")]
    Build { name: String, why: String },
    #[error("registry {registry} cannot be reached: {message}; check the address and that the registry is running")]
    Unreachable { registry: String, message: String },
    #[error("{reference}: not found in the registry")]
    NotFound { reference: String },
    #[error(
        "{reference}: access denied by the registry; set credentials in the Docker config or LYRA_REGISTRY_USERNAME and LYRA_REGISTRY_PASSWORD"
    )]
    Denied { reference: String },
    #[error("{reference}: {message}")]
    Registry { reference: String, message: String },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
