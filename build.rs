//! Generates the service's gRPC server for `proto/` (compiled with protox: pure Rust, no
//! system `protoc`) with the strict decoding codec (`src/service/codec.rs`). The messages, the
//! client and the reflection descriptor come from the `mushroom-proto` crate: the server names
//! its types there (`extern_path`), so there is one set of message types.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/mushroom/backup/v1/backup.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .codec_path("crate::service::codec::StrictCodec")
        .extern_path(".mushroom.backup.v1", "::mushroom_proto")
        .build_client(false)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
