//! Compiles `proto/` with protox (pure Rust, no system `protoc`) and tonic-prost-build, and
//! writes the encoded file descriptor set for gRPC server reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/mushroom/backup/v1/backup.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("mushroom_backup_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .codec_path("crate::service::codec::StrictCodec")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
