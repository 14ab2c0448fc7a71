//! The C clients of the tests (tests/clients) and their builds.

use crate::{nvidia_include, require, root, simgpu_lib_dir, tmp_dir};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// A file under `tests/clients/`.
pub fn client_source(name: &str) -> PathBuf {
    require(root().join("tests/clients").join(name), "client source")
}

/// A C client, built once per test process.
#[derive(Debug, Clone)]
pub struct CBuild {
    /// Output name (unique per build configuration).
    pub name: &'static str,
    /// Source file in tests/clients/.
    pub source: &'static str,
    /// Header directory under target/nvidia/include (`cu12`, `cu13`, `nvml`).
    pub include: &'static str,
    /// Link against simgpu's libcuda (`-lcuda`).
    pub link_cuda: bool,
}

/// Compile a client with `cc` into this test's tmp dir; cached for the life of the test process.
pub fn compile(b: &CBuild) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(b.name) {
        return p.clone();
    }
    // Built under a private name, then renamed into place: several test binaries may build the same
    // client at once, and a running copy keeps its inode.
    let dir = tmp_dir().join("clients");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(b.name);
    let tmp = dir.join(format!(".{}.{}", b.name, std::process::id()));
    let mut cmd = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
    cmd.args(["-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(nvidia_include(b.include))
        .arg("-I")
        .arg(root().join("tests/clients"))
        .arg(client_source(b.source))
        .arg("-o")
        .arg(&tmp);
    if b.link_cuda {
        cmd.arg("-L").arg(simgpu_lib_dir()).arg("-lcuda");
    }
    cmd.arg("-ldl");
    let o = cmd.output().expect("run cc");
    assert!(
        o.status.success(),
        "compiling {} failed:\n{}{}",
        b.source,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, &out).unwrap();
    built.insert(b.name, out.clone());
    out
}

pub const LINKED_CU12: CBuild = CBuild {
    name: "linked-cu12",
    source: "linked.c",
    include: "cu12",
    link_cuda: true,
};
pub const LINKED_CU13: CBuild = CBuild {
    name: "linked-cu13",
    source: "linked.c",
    include: "cu13",
    link_cuda: true,
};
pub const DLOPEN: CBuild = CBuild {
    name: "dlopen-cu12",
    source: "dlopen.c",
    include: "cu12",
    link_cuda: false,
};
pub const PROCADDRESS: CBuild = CBuild {
    name: "procaddress",
    source: "procaddress.c",
    include: "cu13",
    link_cuda: false,
};
