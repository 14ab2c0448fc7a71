//! The catalogue of the tests' C clients (`tests/clients/*.c`): each build a test runs, its source,
//! the CUDA headers it is compiled against, how it reaches the driver and what it exercises. Tests
//! name a client by its entry here ([`COMPUTE`], [`QUOTA_OVERHEAD`], ...) and get the binary from
//! [`compile`] (built once per test process) or [`compile_into`] (a copy in a directory of the
//! test's own); no test spells a client's path or compiler flags. A new client gets an entry here
//! and in [`CATALOGUE`] (the kit's unit tests check that every source in `tests/clients` has one).
//!
//! The Python clients (`tests/clients/*.py`) need no build: tests run them by name
//! ([`client_source`], `Sim::run_python`).

use crate::{nvidia_include, require, root, simgpu_lib_dir, tmp_dir};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// A file under `tests/clients/`.
pub fn client_source(name: &str) -> PathBuf {
    require(root().join("tests/clients").join(name), "client source")
}

/// One build of a C client.
#[derive(Debug, Clone)]
pub struct CBuild {
    /// Output name (unique per build configuration).
    pub name: &'static str,
    /// Source file in tests/clients/.
    pub source: &'static str,
    /// Header directory under target/nvidia/include (`cu12`, `cu13`, `nvml`).
    pub include: &'static str,
    /// Link against simgpu's libcuda (`-lcuda`); otherwise the client finds the driver itself
    /// (`dlopen`), or never calls it.
    pub link_cuda: bool,
    /// Compiler flags beyond the common ones (`-O1 -g -Wall -Wextra -Werror`), which they follow.
    pub flags: &'static [&'static str],
    /// What the client exercises, and the tests that run it.
    pub about: &'static str,
}

/// Every C client build the tests use.
pub const CATALOGUE: &[CBuild] = &[
    LINKED_CU12,
    LINKED_CU13,
    DLOPEN,
    PROCADDRESS,
    EVENT_TIMELINE,
    MULTIGPU,
    COMPUTE,
    ROBUST,
    QUOTA_OVERHEAD,
    QUOTA_FRAMEWORKS,
    MEMORY_LAZY,
    GREEN_CONTEXT,
    GRAPH_MEMORY,
    GRAPH_CHILD,
    GRAPH_POOL,
    PATHS_LINKED,
    PATHS_LINKED_CU13,
    PATHS_DLSYM,
    PATHS_PROCADDR,
    QUOTA_ORACLE,
    QUOTA_HYGIENE,
    QUOTA_MALLOCWRAP,
    ESCAPE_MAIN,
    ESCAPE_LIB,
    POD_MEMORY,
    IPC_POD,
];

pub const LINKED_CU12: CBuild = CBuild {
    name: "linked-cu12",
    source: "linked.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "a program as nvcc builds them (client.h's modes), calling the driver directly: \
            simgpu_clients, simgpu_sharing, memory_views, memory_nvml_lists",
};
pub const LINKED_CU13: CBuild = CBuild {
    name: "linked-cu13",
    source: "linked.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "linked.c built against CUDA 13's headers (its versioned exports): simgpu_clients",
};
pub const DLOPEN: CBuild = CBuild {
    name: "dlopen-cu12",
    source: "dlopen.c",
    include: "cu12",
    link_cuda: false,
    flags: &[],
    about: "client.h's modes with every function found by dlopen + dlsym, as cudarc and numba \
            do: simgpu_clients, dropin_libraries, memory_frameworks",
};
pub const PROCADDRESS: CBuild = CBuild {
    name: "procaddress",
    source: "procaddress.c",
    include: "cu13",
    link_cuda: false,
    flags: &[],
    about: "cuGetProcAddress (v1 and v2) answers by symbol name, compared with NVIDIA's driver: \
            simgpu_procaddress_oracle, shim_paths, dropin_libraries",
};
pub const EVENT_TIMELINE: CBuild = CBuild {
    name: "event-timeline",
    source: "event_timeline.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "events stamped on the device's timeline; handle reuse: simgpu_sharing",
};
pub const MULTIGPU: CBuild = CBuild {
    name: "multigpu-cu12",
    source: "multigpu_client.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "ranks of a collective on several devices: simgpu_multigpu, compute_shares",
};
pub const COMPUTE: CBuild = CBuild {
    name: "compute-client",
    source: "compute_client.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "kernels launched as fast as allowed (spin, batch, ...) under compute shares: \
            compute_*, config_effects, hostile_device_ledger, node tests",
};
pub const ROBUST: CBuild = CBuild {
    name: "robust-client-cu12",
    source: "robust_client.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "allocation storms, forks, threads and crashes under a quota: shim_robustness, \
            hostile_shm, several_users, config_effects",
};
pub const QUOTA_OVERHEAD: CBuild = CBuild {
    name: "quota-overhead",
    source: "quota_overhead.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "driver overhead under a quota (contexts, module code, limits, pools) and every view \
            of memory after each step: memory_*, node_reconcile, node tests",
};
pub const QUOTA_FRAMEWORKS: CBuild = CBuild {
    name: "quota-frameworks",
    source: "quota_frameworks.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "what frameworks (XLA, vLLM, PyTorch) ask the driver at start-up and when memory runs \
            short: memory_frameworks",
};
pub const MEMORY_LAZY: CBuild = CBuild {
    name: "memory-lazy",
    source: "memory_lazy.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "lazily loaded code charged at a kernel's first launch: memory_lazy",
};
pub const GREEN_CONTEXT: CBuild = CBuild {
    name: "green-context",
    source: "green_context.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "green contexts (CUDA 12.4+) under a quota: memory_green",
};
pub const GRAPH_MEMORY: CBuild = CBuild {
    name: "graph-memory",
    source: "graph_memory.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "graph memory nodes near the quota: graph_memory_quota",
};
pub const GRAPH_CHILD: CBuild = CBuild {
    name: "graph-child",
    source: "graph_child.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "memory nodes in child graphs moved into a parent (CUDA 12.9): graph_memory_quota",
};
pub const GRAPH_POOL: CBuild = CBuild {
    name: "graph-pool",
    source: "graph_pool.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "the graph memory pool's cache and its trim: graph_pool_cache",
};
pub const PATHS_LINKED: CBuild = CBuild {
    name: "quota-paths-linked",
    source: "quota_paths_linked.c",
    include: "cu12",
    link_cuda: true,
    flags: &[],
    about: "the quota through every allocation path, the driver called directly: shim_paths",
};
pub const PATHS_LINKED_CU13: CBuild = CBuild {
    name: "quota-paths-linked-cu13",
    source: "quota_paths_linked.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "quota_paths_linked.c built against CUDA 13's headers: shim_paths",
};
pub const PATHS_DLSYM: CBuild = CBuild {
    name: "quota-paths-dlsym",
    source: "quota_paths_dlsym.c",
    include: "cu12",
    link_cuda: false,
    flags: &[],
    about: "the quota through every allocation path, functions found by dlsym: shim_paths",
};
pub const PATHS_PROCADDR: CBuild = CBuild {
    name: "quota-paths-procaddr",
    source: "quota_paths_procaddr.c",
    include: "cu12",
    link_cuda: false,
    flags: &[],
    about: "the quota through every allocation path, functions found by cuGetProcAddress \
            (v1, v2): shim_paths",
};
pub const QUOTA_ORACLE: CBuild = CBuild {
    name: "quota-oracle",
    source: "quota_oracle.c",
    include: "cu12",
    link_cuda: false,
    flags: &[],
    about: "what the driver answers before any device is there, with and without gpuslice: \
            shim_paths",
};
pub const QUOTA_HYGIENE: CBuild = CBuild {
    // The program's own name is in what it prints (dladdr of its own symbols): shim_paths expects it.
    name: "quota_hygiene",
    source: "quota_hygiene.c",
    include: "cu12",
    link_cuda: false,
    flags: &["-O2", "-rdynamic"],
    about: "dlsym and dlvsym lookups the interposer must leave as glibc answers them: shim_paths",
};
pub const QUOTA_MALLOCWRAP: CBuild = CBuild {
    name: "libquota_mallocwrap.so",
    source: "quota_mallocwrap.c",
    include: "cu12",
    link_cuda: false,
    flags: &["-O2", "-shared", "-fPIC"],
    about: "a malloc interposer preloaded after libgpuslice.so, finding malloc with \
            dlsym(RTLD_NEXT): shim_paths",
};
pub const ESCAPE_MAIN: CBuild = CBuild {
    name: "escape-main",
    source: "escape_main.c",
    include: "cu12",
    link_cuda: false,
    flags: &[],
    about: "a program reaching the driver the ways docs/SECURITY.md lists (RTLD_DEEPBIND, \
            dlopen by path): dropin_escapes",
};
pub const ESCAPE_LIB: CBuild = CBuild {
    name: "libescape.so",
    source: "escape_lib.c",
    include: "cu12",
    link_cuda: true,
    flags: &["-shared", "-fPIC"],
    about: "a library linked against the driver that escape_main opens with RTLD_DEEPBIND \
            (built with each test's linker flags: compile_into): dropin_escapes",
};
pub const POD_MEMORY: CBuild = CBuild {
    name: "pod-memory",
    source: "pod_memory.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "driver memory a pod's process spends without an allocation call: node_reconcile",
};
pub const IPC_POD: CBuild = CBuild {
    name: "ipc-pod",
    source: "ipc_pod.c",
    include: "cu13",
    link_cuda: true,
    flags: &[],
    about: "an IPC exporter and importer of one tenant in one pod: node_reconcile",
};

/// Compile a client with `cc` into the tests' tmp dir; cached for the life of the test process.
pub fn compile(b: &CBuild) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(b.name) {
        return p.clone();
    }
    let dir = tmp_dir().join("clients");
    std::fs::create_dir_all(&dir).unwrap();
    let out = compile_into(b, &dir.join(b.name), &[]);
    built.insert(b.name, out.clone());
    out
}

/// Compile a client with `cc` to `out` (a directory of the test's own: copies other uids can reach,
/// variants), `extra` flags after its source (linker options); not cached.
pub fn compile_into(b: &CBuild, out: &Path, extra: &[&str]) -> PathBuf {
    // Built under a private name, then renamed into place: several test binaries may build the same
    // client at once, and a running copy keeps its inode.
    let dir = out.parent().expect("a file path");
    let name = out.file_name().expect("a file path").to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let mut cmd = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
    cmd.args(["-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .args(b.flags)
        .arg("-I")
        .arg(nvidia_include(b.include))
        .arg("-I")
        .arg(root().join("tests/clients"))
        .arg(client_source(b.source))
        .args(extra)
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
    std::fs::rename(&tmp, out).unwrap();
    out.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every C source in tests/clients is built by an entry of the catalogue, or included by the
    /// source of one; every entry's source is there; names are unique.
    #[test]
    fn the_catalogue_covers_every_c_client() {
        let dir = root().join("tests/clients");
        let mut names: Vec<&str> = CATALOGUE.iter().map(|b| b.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            CATALOGUE.len(),
            "a name twice in the catalogue"
        );
        let included: String = CATALOGUE
            .iter()
            .map(|b| {
                assert!(
                    dir.join(b.source).is_file(),
                    "{}: no tests/clients/{}",
                    b.name,
                    b.source
                );
                assert!(
                    matches!(b.include, "cu12" | "cu13"),
                    "{}: {}",
                    b.name,
                    b.include
                );
                assert!(!b.about.is_empty(), "{}: say what it exercises", b.name);
                std::fs::read_to_string(dir.join(b.source)).unwrap()
            })
            .collect();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let file = entry.unwrap().file_name().to_string_lossy().into_owned();
            if !file.ends_with(".c") {
                continue;
            }
            let built = CATALOGUE.iter().any(|b| b.source == file);
            let is_included = included.contains(&format!("#include \"{file}\""));
            assert!(
                built || is_included,
                "tests/clients/{file} is in no entry of the catalogue (tests/kit/src/clients.rs)"
            );
        }
    }
}
