//! simgpu's shared state: the simulated devices that every simgpu process on the machine shares
//! (memory, execution turns, per-process and per-group usage), its configuration, and its trace.
//!
//! simgpu's `libcuda.so.1` and `libnvidia-ml.so.1` both read it, so that what one process does is
//! seen by all the others, as with a real GPU; tests read it (through [`snapshot`] or the
//! `simgpu-stat` tool) to judge what the product did.

pub mod caps;
mod config;
pub mod ipc;
mod layout;
pub mod mig;
mod shared;
mod sys;

pub use config::{config, parse_size, Config, MAX_DEVICES};
pub use layout::{MAX_GROUPS, MAX_PROCESSES};
pub use mig::MAX_INSTANCES;
pub use shared::{
    snapshot, AccountingRecord, DeviceSnapshot, DeviceTurn, GroupUsage, KernelRun, ProcessUsage,
    Shared, Snapshot, Submission, Work, UTILIZATION_WINDOW_NS,
};
/// The clock of the device timeline (and of every time in the shared state).
pub use sys::realtime_ns;

use std::io::Write as _;
use std::sync::OnceLock;

/// A simulated device as CUDA sees it: a whole GPU, or a MIG instance of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its index in the state file (simgpu's "physical" device).
    pub ordinal: u32,
    pub name: String,
    pub uuid: [u8; 16],
    /// CUDA's form, "0000:XX:00.0" (`cuDeviceGetPCIBusId`); NVML widens the domain to 8 digits.
    pub pci_bus_id: String,
    pub total_memory: u64,
    pub multiprocessor_count: i32,
    pub compute_capability: (i32, i32),
    /// The MIG instance this device is (`None`: a whole GPU).
    pub mig: Option<MigInstance>,
}

/// Where a MIG instance is: its GPU (NVML's index), its MIG device index under it, and NVML's GPU
/// and compute instance ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigInstance {
    pub gpu: u32,
    pub index: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

impl DeviceInfo {
    /// Its UUID as NVML and `nvidia-smi -L` spell it: `GPU-…`, or `MIG-…` for a MIG instance.
    pub fn uuid_text(&self) -> String {
        let text = format_uuid(&self.uuid);
        match self.mig {
            Some(_) => format!("MIG-{}", &text[4..]),
            None => text,
        }
    }
}

/// A GPU as NVML enumerates it: in MIG mode, its instances are devices of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    /// Its description (name, UUID, PCI location, memory: all of the GPU's).
    pub info: DeviceInfo,
    /// Its devices in the state file: itself, or its MIG instances in index order.
    pub devices: Vec<u32>,
    pub mig_mode: bool,
}

/// The state of this process's `SIMGPU_STATE`, mapped (created if needed) but without registering
/// this process (for readers such as NVML). Failure is remembered.
pub fn attach() -> Result<&'static Shared, String> {
    static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| Shared::open(&config().state_path, config()))
        .as_ref()
        .map_err(Clone::clone)
}

/// The state of this process's `SIMGPU_STATE`, with this process registered.
pub fn shared() -> Result<&'static Shared, String> {
    let s = attach()?;
    s.register()?;
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain `extern "C"` function with no arguments (inherited by forked
    // children, where it releases the child's own memory).
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(release_at_exit);
    });
    Ok(s)
}

/// A driver frees a process's device memory as the process ends (its device files close), before
/// anything else can see the process gone: at a normal exit, simgpu does the same. (A killed
/// process's memory goes at the next sweep: `Shared::try_reserve`.)
extern "C" fn release_at_exit() {
    if let Ok(s) = attach() {
        s.release_process_memory();
    }
}

/// All devices of the state (its creator decided their number and memory; this process's
/// configuration if the state cannot be opened): whole GPUs, and MIG instances of GPUs in MIG mode.
/// `CUDA_VISIBLE_DEVICES` is not applied here.
pub fn physical_devices() -> &'static [DeviceInfo] {
    &topology().0
}

/// The GPUs, as NVML enumerates them.
pub fn gpus() -> &'static [GpuInfo] {
    &topology().1
}

fn topology() -> &'static (Vec<DeviceInfo>, Vec<GpuInfo>) {
    static TOPOLOGY: OnceLock<(Vec<DeviceInfo>, Vec<GpuInfo>)> = OnceLock::new();
    TOPOLOGY.get_or_init(|| {
        let (placements, gpu_memory) = match attach() {
            Ok(s) => s.topology(),
            Err(_) => {
                let c = config();
                let gpus = c.devices.clamp(1, MAX_DEVICES);
                (
                    mig::placements(gpus, c.memory, &c.mig),
                    vec![c.memory; gpus as usize],
                )
            }
        };
        let mut gpus: Vec<GpuInfo> = gpu_memory
            .iter()
            .enumerate()
            .map(|(g, &memory)| GpuInfo {
                index: g as u32,
                info: device_info(g as u32, memory),
                devices: Vec::new(),
                mig_mode: false,
            })
            .collect();
        let devices = placements
            .iter()
            .enumerate()
            .map(|(d, p)| {
                let gpu = &mut gpus[p.gpu as usize];
                gpu.devices.push(d as u32);
                let mut info = gpu.info.clone();
                info.ordinal = d as u32;
                info.total_memory = p.memory;
                if let Some(i) = p.instance {
                    gpu.mig_mode = true;
                    info.uuid = mig::instance_uuid(p.gpu, i);
                    info.name = format!(
                        "NVIDIA H100 80GB HBM3 MIG {}GiB (simgpu)",
                        p.memory.div_ceil(1 << 30)
                    );
                    // GPU instance ids as NVML gives them (from 1); one compute instance each (0).
                    info.mig = Some(MigInstance {
                        gpu: p.gpu,
                        index: i,
                        gpu_instance_id: i + 1,
                        compute_instance_id: 0,
                    });
                }
                info
            })
            .collect();
        (devices, gpus)
    })
}

fn device_info(ordinal: u32, total_memory: u64) -> DeviceInfo {
    // A fixed, recognisable UUID per ordinal (version-4 shaped): "GPU-53494d47-5055-4000-8000-0000000000NN".
    let mut uuid = [
        0x53, 0x49, 0x4d, 0x47, 0x50, 0x55, 0x40, 0x00, 0x80, 0, 0, 0, 0, 0, 0, 0,
    ];
    uuid[12..].copy_from_slice(&ordinal.to_be_bytes());
    DeviceInfo {
        ordinal,
        // What a current data-centre GPU reports (H100 SXM5), marked as simulated.
        name: "NVIDIA H100 80GB HBM3 (simgpu)".to_owned(),
        uuid,
        pci_bus_id: format!("0000:{:02X}:00.0", 0x17 + ordinal * 0x10),
        total_memory,
        multiprocessor_count: 132,
        compute_capability: (9, 0),
        mig: None,
    }
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| {
        uuid[r]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// If `SIMGPU_TRACE` is set, appends "<pid> <args>\n" to it (one `write`, so lines from concurrent
/// processes do not interleave). Otherwise a single `OnceLock` check.
pub fn trace(args: std::fmt::Arguments<'_>) {
    static TRACE: OnceLock<Option<std::fs::File>> = OnceLock::new();
    let file = TRACE.get_or_init(|| {
        let path = config().trace.as_ref()?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    });
    if let Some(mut f) = file.as_ref() {
        let line = format!("{} {}\n", std::process::id(), args);
        let _ = f.write_all(line.as_bytes());
    }
}

/// JSON for a snapshot (the `simgpu-stat` output): hand-written, no serde.
pub fn snapshot_json(s: &Snapshot) -> String {
    fn list(v: &[u64]) -> String {
        format!(
            "[{}]",
            v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
        )
    }
    fn string(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }
    let devices: Vec<String> = s
        .devices
        .iter()
        .map(|d| {
            format!(
                "{{\"capacity\":{},\"used\":{},\"busy_ns\":{},\"kernels\":{},\"switches\":{},\"serving\":{},\"running\":{},\"queued\":[{}]}}",
                d.capacity,
                d.used,
                d.busy_ns,
                d.kernels,
                d.switches,
                d.serving,
                d.running,
                d.queued
                    .iter()
                    .map(|(pid, n)| format!("{{\"pid\":{pid},\"kernels\":{n}}}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect();
    let processes: Vec<String> = s
        .processes
        .iter()
        .map(|p| {
            format!(
                "{{\"pid\":{},\"group\":{},\"used\":{},\"peak\":{},\"busy_ns\":{},\"kernels\":{}}}",
                p.pid,
                string(&p.group),
                list(&p.used),
                list(&p.peak),
                list(&p.busy_ns),
                list(&p.kernels)
            )
        })
        .collect();
    let groups: Vec<String> = s
        .groups
        .iter()
        .map(|g| {
            format!(
                "{{\"name\":{},\"used\":{},\"peak\":{},\"busy_ns\":{}}}",
                string(&g.name),
                list(&g.used),
                list(&g.peak),
                list(&g.busy_ns)
            )
        })
        .collect();
    format!(
        "{{\"devices\":[{}],\"processes\":[{}],\"groups\":[{}]}}",
        devices.join(","),
        processes.join(","),
        groups.join(",")
    )
}

#[cfg(test)]
mod tests;
