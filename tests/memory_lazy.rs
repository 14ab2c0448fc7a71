//! Driver memory charged where the driver spends it: a lazily loaded library's code at its kernel's
//! first launch (or `cuKernelGetFunction`), not at `cuLibraryGetKernel`; the local memory a launch
//! grows for a kernel with a large frame. Judged by simgpu's own
//! counters (per-process and per-group used memory) through a C client
//! (tests/clients/memory_lazy.c) that never asks `cuMemGetInfo`, so what is judged is what the
//! operations were charged, not what reconciliation found later.

use gpuslice_testkit as common;

use common::memory::{tenant_command, Deploy, GRANULE, QUOTA};
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// A private directory for one test's ledgers and measurement locks.
fn scratch(tag: &str) -> PathBuf {
    scratch_dir("memory_lazy", tag)
}

fn sim(tag: &str) -> Sim {
    Sim::new(tag)
        .env("SIMGPU_MEMORY", "4GiB")
        .env("CUDA_MODULE_LOADING", "LAZY")
}

/// The client as a preloaded process of `tenant` (quota 1 GiB, its ledger and device directory in
/// `dir`).
fn client(sim: &Sim, dir: &Path, tenant: &str, args: &[&str]) -> Command {
    let mut cmd = tenant_command(
        compile(&MEMORY_LAZY),
        sim,
        Deploy::Preload,
        dir,
        tenant,
        args,
    );
    cmd.env("CUDA_MODULE_LOADING", "LAZY");
    cmd
}

/// What a process of `tenant` is charged in the ledger (allocations and driver overhead).
fn charged(dir: &Path, tenant: &str, pid: &str) -> u64 {
    total(&ledger_process(&dir.join(format!("{tenant}.ledger")), pid).used)
}

fn go(child: &mut Child) {
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
}

/// A lazily loaded library's code is charged where the driver loads it: not at
/// `cuLibraryGetKernel` (nothing is on the device yet, nothing charged), at the kernel's first
/// launch and at `cuKernelGetFunction`. After both, the process's charge is simgpu's figure for it
/// to within one page, and later launches of the same kernel add nothing.
#[test]
fn lazy_code_is_charged_at_first_launch_and_kernel_function() {
    let dir = scratch("first-launch");
    let sim = sim("lazy-first-launch");
    let mut child = sim.spawn(&mut client(&sim, &dir, "lazy", &["firstlaunch", "-", "24"]));
    let kv = wait_for_key(&mut child, "got");
    let pid = kv["pid"].clone();
    let used_before = process_used_on(&sim.stat(), &pid, 0);
    let charged_before = charged(&dir, "lazy", &pid);
    assert!(
        used_before.abs_diff(charged_before) <= GRANULE,
        "before any launch: charged {charged_before}, simgpu holds {used_before}"
    );
    go(&mut child);
    let kv = wait_for_key(&mut child, "done");
    for key in ["launch1_rc", "launch2_rc", "getfn_rc", "launch3_rc"] {
        assert_eq!(kv.get(key).map(String::as_str), Some("0"), "{key}: {kv:?}");
    }
    let used = process_used_on(&sim.stat(), &pid, 0);
    let charge = charged(&dir, "lazy", &pid);
    assert!(
        used >= used_before + 48 * MIB,
        "simgpu loaded both libraries' code at their first use: {used_before} -> {used}"
    );
    assert!(
        used.abs_diff(charge) <= GRANULE,
        "after the first launch and cuKernelGetFunction: charged {charge}, simgpu holds {used}"
    );
    go(&mut child);
    finish(child, "firstlaunch").assert_success();
}

/// The driver loads a lazily loaded library's code per context ("when a function is needed for
/// that context"): a second context launching the same kernel loads it again, and is charged
/// again; launching it in the first context again adds nothing, and destroying the second context
/// gives its copy back. After each step the process's charge is simgpu's figure to within one page.
#[test]
fn a_second_context_launching_a_library_kernel_is_charged_again() {
    let dir = scratch("contexts");
    let sim = sim("lazy-contexts");
    let mut child = sim.spawn(&mut client(&sim, &dir, "ctxs", &["contexts", "24"]));
    let kv = wait_for_key(&mut child, "got");
    let pid = kv["pid"].clone();
    let agree = |step: &str| {
        let used = process_used_on(&sim.stat(), &pid, 0);
        let charge = charged(&dir, "ctxs", &pid);
        assert!(
            used.abs_diff(charge) <= GRANULE,
            "{step}: charged {charge}, simgpu holds {used}"
        );
        used
    };
    let got = agree("after cuLibraryGetKernel");
    go(&mut child);
    let kv = wait_for_key(&mut child, "one");
    assert_eq!(
        kv.get("launch1_rc").map(String::as_str),
        Some("0"),
        "{kv:?}"
    );
    assert_eq!(
        kv.get("launch2_rc").map(String::as_str),
        Some("0"),
        "{kv:?}"
    );
    let one = agree("after the first context's launches");
    assert!(
        one >= got + 24 * MIB,
        "simgpu loaded the code in the first context: {got} -> {one}"
    );
    go(&mut child);
    let kv = wait_for_key(&mut child, "two");
    for key in ["launch3_rc", "launch4_rc", "launch5_rc"] {
        assert_eq!(kv.get(key).map(String::as_str), Some("0"), "{key}: {kv:?}");
    }
    let two = agree("after the second context's launches");
    assert!(
        two >= one + 24 * MIB,
        "simgpu loaded the code again in the second context: {one} -> {two}"
    );
    go(&mut child);
    wait_for_key(&mut child, "destroyed");
    let destroyed = agree("after the second context was destroyed");
    assert!(
        destroyed + 24 * MIB <= two,
        "simgpu freed the second context's copy: {two} -> {destroyed}"
    );
    go(&mut child);
    finish(child, "contexts").assert_success();
}

/// A first launch whose code the quota has no room for fails with `CUDA_ERROR_OUT_OF_MEMORY`, as a
/// driver that cannot load the code answers, with one log line, and the driver never loads it: the
/// tenant's peak by simgpu's counters stays within its quota. So does `cuKernelGetFunction`.
#[test]
fn a_first_launch_without_room_for_the_code_is_refused() {
    let dir = scratch("first-launch-room");
    let sim = sim("lazy-first-launch-room");
    let mut child = sim.spawn(&mut client(
        &sim,
        &dir,
        "room",
        &["firstlaunch", "10", "24"],
    ));
    wait_for_key(&mut child, "got");
    go(&mut child);
    let kv = wait_for_key(&mut child, "done");
    go(&mut child);
    let run = finish(child, "firstlaunch without room");
    run.assert_success();
    for key in ["launch1_rc", "launch2_rc", "getfn_rc"] {
        assert_eq!(
            kv.get(key).map(String::as_str),
            Some("2"),
            "{key}: {kv:?}\n{}",
            run.report()
        );
    }
    let peak = group_peak_on(&sim.stat(), "room", 0);
    assert!(
        peak <= QUOTA,
        "the driver was let load code the quota had no room for: peak {peak}\n{}",
        run.report()
    );
    assert!(
        run.stderr.contains("refused"),
        "a refused first launch is logged:\n{}",
        run.report()
    );
}

/// The simulated device's multiprocessors and resident threads per multiprocessor.
const THREADS: u64 = 132 * 2048;

/// A kernel whose local frame (2 KiB per thread) is larger than the context's stack (1 KiB) makes
/// the driver grow the context's local memory at its first launch, for every resident thread, and
/// keep it: the charge is simgpu's figure for the process to within one page afterwards, and a
/// second launch adds nothing.
#[test]
fn local_memory_grown_at_launch_is_charged() {
    let dir = scratch("lmem");
    let sim = sim("lazy-lmem");
    let mut child = sim.spawn(&mut client(&sim, &dir, "lmem", &["lmem", "-", "2048"]));
    let kv = wait_for_key(&mut child, "loaded");
    let pid = kv["pid"].clone();
    let used_before = process_used_on(&sim.stat(), &pid, 0);
    go(&mut child);
    let kv = wait_for_key(&mut child, "done");
    for key in ["launch1_rc", "launch2_rc"] {
        assert_eq!(kv.get(key).map(String::as_str), Some("0"), "{key}: {kv:?}");
    }
    assert_eq!(kv.get("stack").map(String::as_str), Some("2048"), "{kv:?}");
    let used = process_used_on(&sim.stat(), &pid, 0);
    let charge = charged(&dir, "lmem", &pid);
    assert!(
        used >= used_before + 1024 * THREADS,
        "simgpu grew the local memory at the launch: {used_before} -> {used}"
    );
    assert!(
        used.abs_diff(charge) <= GRANULE,
        "after the launch: charged {charge}, simgpu holds {used}"
    );
    go(&mut child);
    finish(child, "lmem").assert_success();
}

/// A launch whose local memory growth the quota has no room for fails with
/// `CUDA_ERROR_OUT_OF_MEMORY` before the driver grows it: the tenant's peak by simgpu's counters
/// stays within its quota.
#[test]
fn a_launch_without_room_for_its_local_memory_is_refused() {
    let dir = scratch("lmem-room");
    let sim = sim("lazy-lmem-room");
    let mut child = sim.spawn(&mut client(&sim, &dir, "lroom", &["lmem", "100", "2048"]));
    wait_for_key(&mut child, "loaded");
    go(&mut child);
    let kv = wait_for_key(&mut child, "done");
    go(&mut child);
    let run = finish(child, "lmem without room");
    run.assert_success();
    assert_eq!(
        kv.get("launch1_rc").map(String::as_str),
        Some("2"),
        "{kv:?}\n{}",
        run.report()
    );
    let peak = group_peak_on(&sim.stat(), "lroom", 0);
    assert!(
        peak <= QUOTA,
        "the driver was let grow local memory the quota had no room for: peak {peak}\n{}",
        run.report()
    );
}

/// Each context keeps its own local memory, sized by the largest frame launched in it, and frees
/// it with the context (cuda.h `CU_CTX_LMEM_RESIZE_TO_MAX`): one library kernel with a 1.5 KiB
/// frame launched in a created context, then in the primary context (its function there asked
/// first, with `cuKernelGetFunction`, as a framework does), then a 2.5 KiB one there,
/// then the first again in the created context; the primary context released at last. After each
/// step the process's charge is simgpu's figure for it to within one page, and the release gives
/// the primary context's local memory back. `loading`: the driver's module loading mode (a lazily
/// loaded library's kernel is loaded per context at its first launch; an eagerly loaded one is
/// loaded once, at the library's load, and its frame read at `cuLibraryGetKernel`).
fn local_memory_per_context(loading: &str) {
    const SMALL: u64 = 1536;
    const LARGE: u64 = 2560;
    let tag = format!("lmem-contexts-{}", loading.to_lowercase());
    let dir = scratch(&tag);
    let sim = sim(&tag).env("CUDA_MODULE_LOADING", loading);
    let mut cmd = client(
        &sim,
        &dir,
        "lctx",
        &["lmemctx", &SMALL.to_string(), &LARGE.to_string()],
    );
    cmd.env("CUDA_MODULE_LOADING", loading)
        .env("GPUSLICE_MEMORY_LIMIT", "3GiB");
    let mut child = sim.spawn(&mut cmd);
    let kv = wait_for_key(&mut child, "got");
    let pid = kv["pid"].clone();
    let agree = |step: &str| {
        let used = process_used_on(&sim.stat(), &pid, 0);
        let charge = charged(&dir, "lctx", &pid);
        assert!(
            used.abs_diff(charge) <= GRANULE,
            "{loading}, {step}: charged {charge}, simgpu holds {used}"
        );
        used
    };
    let step = |child: &mut Child, key: &str, launches: &[&str]| {
        go(child);
        let kv = wait_for_key(child, key);
        for l in launches {
            assert_eq!(kv.get(*l).map(String::as_str), Some("0"), "{l}: {kv:?}");
        }
    };
    // What a frame of `bytes` per thread takes beyond the default stack (1 KiB).
    let beyond = |bytes: u64| (bytes - 1024) * THREADS;
    let got = agree("after cuLibraryGetKernel");
    step(&mut child, "one", &["launch1_rc"]);
    let one = agree("after the first context's launch");
    assert!(
        one >= got + beyond(SMALL),
        "simgpu grew the first context's local memory: {got} -> {one}"
    );
    step(&mut child, "two", &["getfn_rc", "launch2_rc", "launch3_rc"]);
    let two = agree("after the primary context's launches of the same kernel");
    assert!(
        two >= one + beyond(SMALL),
        "simgpu grew the primary context's local memory too: {one} -> {two}"
    );
    step(&mut child, "large", &["launch4_rc", "launch5_rc"]);
    let large = agree("after the larger frame's launch in the primary context");
    assert!(
        large >= two + beyond(LARGE) - beyond(SMALL),
        "simgpu grew the primary context's local memory by the difference: {two} -> {large}"
    );
    step(&mut child, "again", &["launch6_rc"]);
    let again = agree("after the first context's launch again");
    assert!(
        again <= large + GRANULE,
        "the first context's local memory held the frame already: {large} -> {again}"
    );
    step(&mut child, "released", &[]);
    let released = agree("after the primary context's release");
    assert!(
        released + beyond(LARGE) <= again,
        "simgpu freed the primary context's local memory: {again} -> {released}"
    );
    go(&mut child);
    finish(child, "lmemctx").assert_success();
}

#[test]
fn local_memory_is_charged_per_context_and_given_back_with_it() {
    local_memory_per_context("LAZY");
}

#[test]
fn local_memory_of_an_eagerly_loaded_library_kernel_is_charged_per_context() {
    local_memory_per_context("EAGER");
}

/// Module code charged up front (docs/MEMORY.md): with room, a module's load and lookup are
/// charged the image's pages without a reading, and every 32nd such operation reads the process's
/// figure and charges what the driver spent beyond them. Here simgpu spends twice each image
/// (`SIMGPU_MODULE_SCALE=2`) over 100 modules of 2 MiB kept loaded (400 MiB, 200 MiB beyond their
/// images):
/// the charge trails simgpu's figure by at most the lookups since the last reading (16, 2 MiB
/// each), never exceeds it, and simgpu's figure stays within the quota; once all are unloaded the
/// charge comes back to the context's to within the unloads since the last reading.
#[test]
fn module_code_charged_up_front_is_verified_every_few_operations() {
    const SINCE_READING: u64 = 16 * GRANULE;
    /// simgpu's default context cost.
    const SIM_CONTEXT: u64 = 300 * MIB;
    let dir = scratch("up-front");
    let sim = sim("lazy-up-front").env("SIMGPU_MODULE_SCALE", "2");
    let mut child = sim.spawn(&mut client(&sim, &dir, "mods", &["many", "100", "2"]));
    let kv = wait_for_key(&mut child, "loaded");
    assert_eq!(kv["loaded"], "100", "{kv:?}");
    let pid = kv["pid"].clone();
    let used = process_used_on(&sim.stat(), &pid, 0);
    let charge = charged(&dir, "mods", &pid);
    assert!(
        used >= SIM_CONTEXT + 400 * MIB,
        "simgpu spent twice each module's page: {used}"
    );
    assert!(
        charge <= used + GRANULE && used <= charge + SINCE_READING + GRANULE,
        "after 100 loads: charged {charge}, simgpu holds {used}"
    );
    assert!(group_peak_on(&sim.stat(), "mods", 0) <= QUOTA);
    go(&mut child);
    wait_for_key(&mut child, "unloaded");
    let used = process_used_on(&sim.stat(), &pid, 0);
    let charge = charged(&dir, "mods", &pid);
    assert!(
        used.abs_diff(SIM_CONTEXT) <= GRANULE
            && charge + GRANULE >= used
            && charge <= used + 2 * SINCE_READING + GRANULE,
        "after the unloads: charged {charge}, simgpu holds {used}"
    );
    go(&mut child);
    finish(child, "many").assert_success();
}
