//! NVML's process lists, accounting and protected-memory views show a tenant only its own processes:
//! every list NVML has, asked through NVIDIA's nvidia-ml-py, in preload, drop-in and mixed
//! deployments.

use gpuslice_testkit as common;

use common::memory::*;
use common::*;

/// Every NVML process list through the raw ABI (ctypes) and through nvidia-ml-py's own wrappers:
/// compute, graphics and MPS processes (v1, v2, v3) and the detail list of each mode. For each raw
/// call: `NAME.query=RC:COUNT` (NULL buffer, count 0), `NAME.short=RC:COUNT` (room for one fewer
/// than the count, when there is any), `NAME=pid:used,...` (room to spare); and the detail list's
/// answer to a version and a mode it does not know.
const NVML_LISTS: &str = r#"import ctypes, pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
print(f'used={nv.nvmlDeviceGetMemoryInfo(h).used}')
class V1(ctypes.Structure):
    _fields_ = [('pid', ctypes.c_uint), ('usedGpuMemory', ctypes.c_ulonglong)]
def shown(entries, n):
    return ','.join(f'{entries[i].pid}:{entries[i].usedGpuMemory}' for i in range(n))
def raw(name, struct):
    fn = nv._nvmlGetFunctionPointer(name)
    n = ctypes.c_uint(0)
    rc = fn(h, ctypes.byref(n), None)
    print(f'{name}.query={rc}:{n.value}')
    if n.value > 0:
        short = ctypes.c_uint(n.value - 1)
        rc = fn(h, ctypes.byref(short), (struct * n.value)())
        print(f'{name}.short={rc}:{short.value}')
    room = ctypes.c_uint(n.value + 4)
    entries = (struct * room.value)()
    rc = fn(h, ctypes.byref(room), entries)
    print(f'{name}=' + (shown(entries, room.value) if rc == 0 else f'error {rc}'))
for kind in ('Compute', 'Graphics', 'MPSCompute'):
    base = 'nvmlDeviceGet' + kind + 'RunningProcesses'
    raw(base, V1)
    raw(base + '_v2', nv.c_nvmlProcessInfo_v2_t)
    raw(base + '_v3', nv.c_nvmlProcessInfo_v3_t)
print('py_compute=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in nv.nvmlDeviceGetComputeRunningProcesses(h)))
print('py_graphics=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in nv.nvmlDeviceGetGraphicsRunningProcesses(h)))
print('py_mps=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in nv.nvmlDeviceGetMPSComputeRunningProcesses(h)))
detail = nv._nvmlGetFunctionPointer('nvmlDeviceGetRunningProcessDetailList')
for mode in (nv.NVML_PROCESS_MODE_COMPUTE, nv.NVML_PROCESS_MODE_GRAPHICS, nv.NVML_PROCESS_MODE_MPS):
    plist = nv.c_nvmlProcessDetailList_t()
    plist.version = nv.nvmlProcessDetailList_v1
    plist.mode = mode
    rc = detail(h, ctypes.byref(plist))
    print(f'detail{mode}.query={rc}:{plist.numProcArrayEntries}')
    if plist.numProcArrayEntries > 0:
        room = plist.numProcArrayEntries
        plist.numProcArrayEntries = room - 1
        plist.procArray = ctypes.cast((nv.c_nvmlProcessDetail_v1_t * room)(), ctypes.POINTER(nv.c_nvmlProcessDetail_v1_t))
        rc = detail(h, ctypes.byref(plist))
        print(f'detail{mode}.short={rc}:{plist.numProcArrayEntries}')
    procs = nv.nvmlDeviceGetRunningProcessDetailList(h, nv.nvmlProcessDetailList_v1, mode)
    print(f'detail{mode}=' + ','.join(f'{p.pid}:{p.usedGpuMemory}' for p in procs))
plist = nv.c_nvmlProcessDetailList_t()
plist.version = nv.nvmlProcessDetailList_v1 + (1 << 24)
print(f'detail_bad_version={detail(h, ctypes.byref(plist))}')
plist.version = nv.nvmlProcessDetailList_v1
plist.mode = 7
print(f'detail_bad_mode={detail(h, ctypes.byref(plist))}')
"#;

/// The raw lists [`NVML_LISTS`] prints that name the simulated processes (compute and graphics; the
/// detail list's modes 0 and 1), and those that are empty on simgpu (MPS; mode 2).
const LISTS_OF_PROCESSES: [&str; 8] = [
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "detail0",
    "detail1",
];

const EMPTY_LISTS: [&str; 4] = [
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "detail2",
];

/// The pids a `pid:used,...` value names.
fn pids_of(list: &str) -> Vec<String> {
    list.split(',')
        .filter(|e| !e.is_empty())
        .map(|e| e.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

/// Two tenants, each with a process holding memory, running kernels and (simgpu's
/// `SIMGPU_GRAPHICS_CLIENTS`) holding a graphics context on one GPU: through every NVML process list
/// (compute, graphics, MPS in v1, v2, v3; the detail list of each mode), raw and through
/// nvidia-ml-py, each tenant sees its own process only, with its charge (its usage, as NVML's memory
/// view shows it), and the count protocol tells it of its own processes only (NULL buffer:
/// `INSUFFICIENT_SIZE` with its count; one entry short: the same). The driver's own answer (no shim)
/// lists both processes in the compute, graphics and detail lists, so those are filtered, not just
/// empty. simgpu runs no MPS server: the MPS lists are empty on the driver, and the tenant sees them
/// empty too, with the same count protocol.
fn nvml_every_process_list_shows_only_the_tenant(deploy: Deploy) {
    let dir = scratch("nvml-lists");
    let sim = sim("overhead-nvml-lists").env("SIMGPU_GRAPHICS_CLIENTS", "1");
    let (holders, pids) = holders_of_a_and_b(&sim, deploy, &dir);
    let args = ["-c", NVML_LISTS];
    let mut driver_view = sim.command(venv_python());
    driver_view.args(args);
    let driver = sim.run_cmd(&mut driver_view);
    driver.assert_success();
    for key in LISTS_OF_PROCESSES {
        let listed = pids_of(&driver.get(key));
        for pid in &pids {
            assert!(
                listed.contains(pid),
                "{deploy:?}: the driver's {key} lists {pid}\n{}",
                driver.report()
            );
        }
    }
    for (i, tenant) in ["a", "b"].iter().enumerate() {
        let run = python_as(&sim, deploy, &dir, tenant, &args);
        let report = run.report();
        let mine = format!("{}:{}", pids[i], run.get_u64("used"));
        for key in LISTS_OF_PROCESSES {
            assert_eq!(
                run.get(&format!("{key}.query")),
                "7:1",
                "{deploy:?}: tenant {tenant}'s count query of {key} (INSUFFICIENT_SIZE, 1)\n{report}"
            );
            assert_eq!(
                run.get(&format!("{key}.short")),
                "7:1",
                "{deploy:?}: tenant {tenant}'s {key} with too little room\n{report}"
            );
            assert_eq!(
                run.get(key),
                mine,
                "{deploy:?}: tenant {tenant}'s {key}\n{report}"
            );
        }
        for key in ["py_compute", "py_graphics"] {
            assert_eq!(run.get(key), mine, "{deploy:?}: {key}\n{report}");
        }
        for key in EMPTY_LISTS {
            assert_eq!(
                run.get(&format!("{key}.query")),
                "0:0",
                "{deploy:?}: tenant {tenant}'s count query of {key} (SUCCESS, none)\n{report}"
            );
            assert_eq!(
                run.get(key),
                "",
                "{deploy:?}: tenant {tenant}'s {key}\n{report}"
            );
        }
        assert_eq!(run.get("py_mps"), "", "{deploy:?}: py_mps\n{report}");
        // NVML_ERROR_INVALID_ARGUMENT, as nvml.h documents and the driver answers: a list gpuslice
        // cannot filter is refused, never passed on.
        for key in ["detail_bad_version", "detail_bad_mode"] {
            assert_eq!(run.get(key), driver.get(key), "{deploy:?}: {key}\n{report}");
            assert_eq!(run.get_u64(key), 2, "{deploy:?}: {key}\n{report}");
        }
    }
    for h in holders {
        finish(h, "holder").assert_success();
    }
}

in_every_deployment!(
    nvml_every_process_list_shows_only_the_tenant:
    nvml_every_process_list_shows_only_the_tenant_preloaded,
    nvml_every_process_list_shows_only_the_tenant_dropin,
    nvml_every_process_list_shows_only_the_tenant_mixed
);

/// Accounting mode and the confidential-computing memory view as a tenant sees them, raw (ctypes)
/// and through nvidia-ml-py: `acct.query=RC:COUNT` (NULL buffer, count 0), `acct.short=RC:COUNT`
/// (room for one fewer), `acct=pid,...` (room to spare), `py_acct=` (nvidia-ml-py sizes its buffer
/// by `nvmlDeviceGetAccountingBufferSize`), `statsPID=RC:maxMemoryUsage:isRunning:startTime:time`
/// for every pid given as an argument, and `cc=`/`mem=` as `total:used:free`.
const NVML_ACCOUNTING: &str = r#"import ctypes, sys, pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
acct = nv._nvmlGetFunctionPointer('nvmlDeviceGetAccountingPids')
n = ctypes.c_uint(0)
rc = acct(h, ctypes.byref(n), None)
print(f'acct.query={rc}:{n.value}')
if n.value > 0:
    short = ctypes.c_uint(n.value - 1)
    rc = acct(h, ctypes.byref(short), (ctypes.c_uint * n.value)())
    print(f'acct.short={rc}:{short.value}')
room = ctypes.c_uint(n.value + 4)
pids = (ctypes.c_uint * room.value)()
rc = acct(h, ctypes.byref(room), pids)
print('acct=' + (','.join(str(pids[i]) for i in range(room.value)) if rc == 0 else f'error {rc}'))
print('py_acct=' + ','.join(map(str, nv.nvmlDeviceGetAccountingPids(h))))
stats = nv._nvmlGetFunctionPointer('nvmlDeviceGetAccountingStats')
for pid in sys.argv[1:]:
    st = nv.c_nvmlAccountingStats_t()
    rc = stats(h, ctypes.c_uint(int(pid)), ctypes.byref(st))
    print(f'stats{pid}={rc}:{st.maxMemoryUsage}:{st.isRunning}:{st.startTime}:{st.time}')
cc = nv.nvmlDeviceGetConfComputeProtectedMemoryUsage(h)
m = nv.nvmlDeviceGetMemoryInfo(h)
print(f'cc={cc.total}:{cc.used}:{cc.free}')
print(f'mem={m.total}:{m.used}:{m.free}')
"#;

/// Two tenants, each with a process holding memory and running kernels, on one GPU with accounting
/// mode on and in confidential-computing mode (simgpu's `SIMGPU_ACCOUNTING_MODE`,
/// `SIMGPU_CONF_COMPUTE`). The driver's own answer (no shim) lists both processes with their
/// statistics; each tenant is told of its own process only (its count included), gets the driver's
/// statistics of it, and `NVML_ERROR_NOT_FOUND` for the other tenant's pid, as for a pid without
/// statistics; the protected-memory view is the quota view of `nvmlDeviceGetMemoryInfo`. Once the
/// processes end, the driver keeps their records (terminated, with their lifetime), and a tenant
/// still never sees the other's.
fn nvml_accounting_and_protected_memory_show_only_the_tenant(deploy: Deploy) {
    let dir = scratch("nvml-accounting");
    let sim = sim("overhead-nvml-accounting")
        .env("SIMGPU_ACCOUNTING_MODE", "1")
        .env("SIMGPU_CONF_COMPUTE", "1");
    let (holders, pids) = holders_of_a_and_b(&sim, deploy, &dir);
    let mut args = vec!["-c", NVML_ACCOUNTING];
    args.extend(pids.iter().map(String::as_str));
    let driver_view = |args: &[&str]| {
        let mut cmd = sim.command(venv_python());
        cmd.args(args);
        let run = sim.run_cmd(&mut cmd);
        run.assert_success();
        run
    };
    let driver = driver_view(&args);
    let report = driver.report();
    for key in ["acct", "py_acct"] {
        let listed = pids_of(&driver.get(key));
        for pid in &pids {
            assert!(
                listed.contains(pid),
                "{deploy:?}: the driver's {key} lists {pid}\n{report}"
            );
        }
    }
    for pid in &pids {
        let stats = driver.get(&format!("stats{pid}"));
        let fields: Vec<&str> = stats.split(':').collect();
        assert_eq!(
            (fields[0], fields[2], fields[4]),
            ("0", "1", "0"),
            "{deploy:?}: the driver's statistics of running {pid}\n{report}"
        );
        assert!(
            fields[1].parse::<u64>().unwrap() >= 64 * MIB,
            "{deploy:?}: {pid}'s peak memory\n{report}"
        );
    }
    let driver_cc = driver.get("cc");
    assert_eq!(
        driver_cc,
        driver.get("mem"),
        "{deploy:?}: the driver's protected memory is the device's\n{report}"
    );
    assert!(driver_cc.starts_with(&format!("{}:", 4 * GIB)), "{report}");

    for (i, tenant) in ["a", "b"].iter().enumerate() {
        let (mine, other) = (&pids[i], &pids[1 - i]);
        let run = python_as(&sim, deploy, &dir, tenant, &args);
        let report = run.report();
        let (my_stats, other_stats) = (format!("stats{mine}"), format!("stats{other}"));
        for (key, want) in [
            ("acct.query", "7:1".to_owned()),
            ("acct.short", "7:1".to_owned()),
            ("acct", mine.clone()),
            ("py_acct", mine.clone()),
            (my_stats.as_str(), driver.get(&my_stats)),
            // NVML_ERROR_NOT_FOUND, the struct left as it was.
            (other_stats.as_str(), "6:0:0:0:0".to_owned()),
        ] {
            assert_eq!(
                run.get(key),
                want,
                "{deploy:?}: tenant {tenant}'s {key}\n{report}"
            );
        }
        let mem = run.get("mem");
        assert!(
            mem.starts_with(&format!("{QUOTA}:")),
            "{deploy:?}: {report}"
        );
        assert_eq!(
            run.get("cc"),
            mem,
            "{deploy:?}: tenant {tenant}'s protected memory is its quota view\n{report}"
        );
    }

    for h in holders {
        finish(h, "holder").assert_success();
    }
    let driver = driver_view(&args);
    let report = driver.report();
    for pid in &pids {
        let stats = driver.get(&format!("stats{pid}"));
        let fields: Vec<&str> = stats.split(':').collect();
        assert_eq!(
            (fields[0], fields[2]),
            ("0", "0"),
            "{deploy:?}: the driver keeps the statistics of terminated {pid}\n{report}"
        );
        assert!(
            fields[4].parse::<u64>().unwrap() > 0,
            "{deploy:?}: terminated {pid}'s time\n{report}"
        );
    }
    let run = sim.run_cmd(&mut tenant_command(
        venv_python(),
        &sim,
        deploy,
        &dir,
        "a",
        &args,
    ));
    run.assert_success();
    let report = run.report();
    assert!(
        !pids_of(&run.get("acct")).contains(&pids[1]),
        "{deploy:?}: tenant a is told of b's terminated process\n{report}"
    );
    assert_eq!(
        run.get(&format!("stats{}", pids[1])),
        "6:0:0:0:0",
        "{deploy:?}: tenant a asking for b's terminated process\n{report}"
    );
}

in_every_deployment!(
    nvml_accounting_and_protected_memory_show_only_the_tenant:
    nvml_accounting_and_protected_memory_show_only_the_tenant_preloaded,
    nvml_accounting_and_protected_memory_show_only_the_tenant_dropin,
    nvml_accounting_and_protected_memory_show_only_the_tenant_mixed
);
