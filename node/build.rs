//! Compiles the kubelet's device-plugin and PodResources APIs (node/proto, see proto/SOURCE) into
//! Rust with tonic-build; protox parses the .proto files, so no system `protoc` is needed.

fn main() {
    let protos = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"]).expect("node/proto: the kubelet APIs parse");
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)
        .expect("generating the kubelet API code");
}
