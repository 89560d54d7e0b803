//! Compiles `proto/lyra/plugin/v1/provider.proto` without a system `protoc`: protox makes the
//! descriptor set, tonic-prost-build the messages, client and server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/lyra/plugin/v1/provider.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
