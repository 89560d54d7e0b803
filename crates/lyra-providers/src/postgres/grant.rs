//! `Postgres::Grant`.

use lyra_core::provider::{Created, Lookup, ProviderError};
use lyra_core::value::Map;

use super::{PostgresProvider, Server};

fn missing() -> ProviderError {
    ProviderError::Other("Postgres::Grant is not implemented yet".to_owned())
}

pub(super) async fn create(_p: &PostgresProvider, _server: &Server, _desired: &Map) -> Result<Created, ProviderError> {
    Err(missing())
}

pub(super) async fn read(
    _p: &PostgresProvider,
    _server: &Server,
    _id: &str,
    _prior: &Map,
) -> Result<Option<Map>, ProviderError> {
    Err(missing())
}

pub(super) async fn update(
    _p: &PostgresProvider,
    _server: &Server,
    _id: &str,
    _desired: &Map,
    _prior: &Map,
) -> Result<Map, ProviderError> {
    Err(missing())
}

pub(super) async fn delete(
    _p: &PostgresProvider,
    _server: &Server,
    _id: &str,
    _prior: &Map,
) -> Result<(), ProviderError> {
    Err(missing())
}

pub(super) async fn lookup(_p: &PostgresProvider, _server: &Server, _desired: &Map) -> Result<Lookup, ProviderError> {
    Err(missing())
}
