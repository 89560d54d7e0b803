//! Lyra's provider plugin protocol.
//!
//! A provider plugin is an executable named `lyra-provider-<name>` that serves the gRPC
//! service of `proto/lyra/plugin/v1/provider.proto` over a Unix socket. Lyra (the host)
//! starts it with stdin, stdout and stderr piped; the plugin creates its socket in a fresh
//! private directory and writes one handshake line to stdout:
//!
//! ```text
//! lyra-plugin|1|unix|/tmp/lyra-plugin-XXXX/provider.sock
//! ```
//!
//! (`lyra-plugin`, the protocol version [`PROTOCOL_VERSION`], the transport `unix`, the
//! socket's path). The host then speaks gRPC on the socket. The plugin exits when its stdin
//! reaches end of file, which happens when the host closes it or dies, or on SIGTERM; on Linux
//! the kernel also kills it when the host dies ([`plugin_command`]). Its stderr is its log:
//! the host forwards it line by line to `tracing`.
//!
//! Values travel as JSON text. Failures a provider means travel in each response's `error`
//! field and come back as the same [`ProviderError`](lyra_core::provider::ProviderError)
//! variants; transport failures (a crashed plugin) become `ProviderError::Other` naming the
//! plugin, so they fail only the steps that use it; a plugin found dead is restarted for the
//! next operation.
//!
//! - Plugins (server side): [`serve`].
//! - The host (client side): [`PluginProvider`], [`discover`]; [`plugin_command`] and
//!   [`spawn_plugin`] start any process that must not outlive Lyra.

mod convert;
mod host;
mod process;
mod server;

pub use host::{PluginError, PluginProvider, discover};
pub use process::{
    StderrTail, block_on_own_thread, drain_stdout, forward_stderr, plugin_command, spawn_plugin, stderr_lines,
};
pub use server::{ServeError, serve};

/// The generated messages, client and server of `lyra.plugin.v1`.
#[allow(clippy::all, clippy::pedantic, unused_qualifications, rust_2018_idioms, missing_docs)]
pub mod proto {
    tonic::include_proto!("lyra.plugin.v1");
}

/// Resolves once `cx` is cancelled (polled every 50 ms: the flag is a plain atomic the host
/// sets from a signal handler or a lost lease). Race an operation against it to give it up.
pub async fn until_cancelled(cx: &lyra_core::provider::OpContext<'_>) {
    while !cx.cancelled() {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The first field of the handshake line.
pub const HANDSHAKE_MAGIC: &str = "lyra-plugin";
/// The protocol version this crate speaks: the handshake line's second field.
pub const PROTOCOL_VERSION: &str = "1";
/// The prefix of executables that are provider plugins.
pub const EXECUTABLE_PREFIX: &str = "lyra-provider-";
