//! The `gpuslice` command: run a program under a quota, show and change a tenant's ledger, demo.

fn main() {
    std::process::exit(gpuslice::cli::main(std::env::args().skip(1).collect()));
}
