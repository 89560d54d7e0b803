//! Compiles Terraform's plugin protocol (the subset in `proto/`) without a system `protoc`:
//! the client for the bridge, the server for the protocol-6 test provider.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/tfplugin.proto", "proto/tfplugin5.proto", "proto/tfplugin6.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
