//! Prints a snapshot of a simgpu state file as JSON: `simgpu-stat [--state PATH]` (default:
//! `SIMGPU_STATE`, as simgpu itself resolves it). Read-only: never creates or registers.

fn main() {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--state" => path = args.next(),
            "-h" | "--help" => {
                println!("usage: simgpu-stat [--state PATH]");
                return;
            }
            other => {
                eprintln!("simgpu-stat: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let path = match path {
        Some(p) if p.contains('/') => std::path::PathBuf::from(p),
        Some(p) => std::path::Path::new("/dev/shm").join(p),
        None => simgpu_core::config().state_path.clone(),
    };
    match simgpu_core::snapshot(&path) {
        Ok(s) => println!("{}", simgpu_core::snapshot_json(&s)),
        Err(e) => {
            eprintln!("simgpu-stat: {e}");
            std::process::exit(1);
        }
    }
}
