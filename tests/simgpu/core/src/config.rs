//! `SIMGPU_*` environment variables, parsed once.

use std::path::PathBuf;
use std::sync::OnceLock;

/// simgpu's configuration. Device count, capacity, `concurrent_kernels` and `timeslice_ns` are only what this process
/// *asks for*: the process that creates the state file decides them for everyone (see [`crate::shared`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// `SIMGPU_DEVICES`, default 1.
    pub devices: u32,
    /// `SIMGPU_MEMORY`: bytes per device ("16GiB", "512MiB", "1.5GiB", "4G", plain bytes); default 16 GiB.
    pub memory: u64,
    /// `SIMGPU_DRIVER_VERSION`, default 12080.
    pub driver_version: i32,
    /// `SIMGPU_STATE`: the shared-state file; a bare name means `/dev/shm/<name>`.
    pub state_path: PathBuf,
    /// `SIMGPU_CONTEXT_MEMORY`: device memory each context costs; default 300 MiB.
    pub context_memory: u64,
    /// `SIMGPU_CONTEXT_CREATE_US`: how long creating a context (or a primary context's first
    /// activation) takes before its memory is reserved, as a real driver takes a noticeable time to
    /// set a context up; default 0, at most 600 s.
    pub context_create_us: u64,
    /// `SIMGPU_CONCURRENT_KERNELS`: kernels of one context a device runs at once (from different
    /// streams); default 4. Kernels of different contexts never run at once.
    pub concurrent_kernels: u32,
    /// `SIMGPU_TIMESLICE_US`: the context time slice, in microseconds; default 2000; 0 turns
    /// time-slicing off (a running kernel keeps the device until it ends).
    pub timeslice_ns: u64,
    /// `SIMGPU_TRACE`: file every driver call is appended to.
    pub trace: Option<PathBuf>,
    /// `SIMGPU_KERNEL_NS`: cost of a non-`spin` kernel; default 5000.
    pub kernel_ns: u64,
    /// `SIMGPU_GROUP`: label for per-group figures; default "".
    pub group: String,
    /// `SIMGPU_MODULE_SCALE`: device memory a loaded module's code takes, as a multiple of what
    /// its image puts on the device (`gpuslice_api::image::device_bytes`, rounded up to 2 MiB);
    /// default 1, 0 makes modules free.
    pub module_scale: u64,
    /// `SIMGPU_POOL_ATTRIBUTES_ZERO=1`: memory pools answer 0 for their reserved and used sizes (a
    /// driver whose answers cannot be trusted).
    pub pool_attributes_zero: bool,
    /// `SIMGPU_GRAPHICS_CLIENTS=1`: every process with memory on a device also holds a graphics
    /// context there (as a CUDA-OpenGL/Vulkan interop program does), so NVML lists it among the
    /// graphics processes too. Read by the process asking NVML.
    pub graphics_clients: bool,
    /// `SIMGPU_ACCOUNTING_MODE=1`: per-process accounting mode is on (`nvidia-smi -am 1`), so NVML
    /// answers `nvmlDeviceGetAccountingPids`/`Stats`/`BufferSize`; off (the driver's default), they
    /// answer `NVML_ERROR_NOT_SUPPORTED`. Read by the process asking NVML.
    pub accounting_mode: bool,
    /// `SIMGPU_CONF_COMPUTE=1`: the devices run in confidential-computing mode, so NVML answers
    /// `nvmlDeviceGetConfComputeProtectedMemoryUsage` (all device memory is protected memory); off,
    /// `NVML_ERROR_NOT_SUPPORTED`. Read by the process asking NVML.
    pub conf_compute: bool,
    /// `SIMGPU_MIG` (*file*): GPUs in MIG mode, each with the memory of its MIG instances, in
    /// instance order: `0:10GiB,20GiB` (GPU 0 with two instances), `;` between GPUs. See
    /// [`crate::mig`].
    pub mig: Vec<(u32, Vec<u64>)>,
    /// `SIMGPU_NVIDIA_ROOT`: a directory standing for the machine's root as the NVIDIA kernel
    /// driver populates it (`proc/driver/nvidia`, MIG instances' capabilities and their device
    /// nodes in `dev/nvidia-caps`), made by the state's creator; a CUDA process with it set uses
    /// only the MIG instances whose capabilities it can open. Unset: not modelled. See
    /// [`crate::caps`].
    pub nvidia_root: Option<PathBuf>,
}

/// Most devices a state file holds.
pub const MAX_DEVICES: u32 = 8;

impl Default for Config {
    fn default() -> Self {
        Config {
            devices: 1,
            memory: 16 << 30,
            driver_version: 12080,
            state_path: PathBuf::from("/dev/shm/simgpu-state"),
            context_memory: 300 << 20,
            context_create_us: 0,
            concurrent_kernels: 4,
            timeslice_ns: 2_000_000,
            trace: None,
            kernel_ns: 5000,
            group: String::new(),
            module_scale: 1,
            pool_attributes_zero: false,
            graphics_clients: false,
            accounting_mode: false,
            conf_compute: false,
            mig: Vec::new(),
            nvidia_root: None,
        }
    }
}

/// The configuration of this process, parsed on first use.
pub fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config::from_lookup(|k| std::env::var(k).ok(), |msg| eprintln!("{msg}")))
}

impl Config {
    /// Builds a configuration from `lookup` (an environment); each bad value is reported through
    /// `warn` in one line and replaced by its default.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        mut warn: impl FnMut(String),
    ) -> Config {
        let mut c = Config::default();
        let mut get = |name: &str, parse: &dyn Fn(&str) -> Option<()>| {
            if let Some(v) = lookup(name) {
                if parse(v.trim()).is_none() {
                    warn(format!(
                        "simgpu: ignoring {name}={v:?} (invalid value); using the default"
                    ));
                }
            }
        };
        let devices = std::cell::Cell::new(c.devices);
        get("SIMGPU_DEVICES", &|v| {
            let n: u32 = v.parse().ok().filter(|n| (1..=MAX_DEVICES).contains(n))?;
            devices.set(n);
            Some(())
        });
        let memory = std::cell::Cell::new(c.memory);
        get("SIMGPU_MEMORY", &|v| {
            parse_size(v).filter(|n| *n > 0).map(|n| memory.set(n))
        });
        let driver = std::cell::Cell::new(c.driver_version);
        get("SIMGPU_DRIVER_VERSION", &|v| {
            v.parse()
                .ok()
                .filter(|n| (1000..100_000).contains(n))
                .map(|n| driver.set(n))
        });
        let state = std::cell::RefCell::new(c.state_path.clone());
        get("SIMGPU_STATE", &|v| {
            if v.is_empty() {
                return None;
            }
            *state.borrow_mut() = if v.contains('/') {
                PathBuf::from(v)
            } else {
                PathBuf::from("/dev/shm").join(v)
            };
            Some(())
        });
        let ctx = std::cell::Cell::new(c.context_memory);
        get("SIMGPU_CONTEXT_MEMORY", &|v| {
            parse_size(v).map(|n| ctx.set(n))
        });
        let create = std::cell::Cell::new(c.context_create_us);
        get("SIMGPU_CONTEXT_CREATE_US", &|v| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n <= 600_000_000)
                .map(|n| create.set(n))
        });
        let conc = std::cell::Cell::new(c.concurrent_kernels);
        get("SIMGPU_CONCURRENT_KERNELS", &|v| {
            v.parse()
                .ok()
                .filter(|n| (1..=1024).contains(n))
                .map(|n| conc.set(n))
        });
        let slice = std::cell::Cell::new(c.timeslice_ns);
        get("SIMGPU_TIMESLICE_US", &|v| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n <= 60_000_000)
                .map(|n| slice.set(n * 1000))
        });
        let trace = std::cell::RefCell::new(None);
        get("SIMGPU_TRACE", &|v| {
            if !v.is_empty() {
                *trace.borrow_mut() = Some(PathBuf::from(v));
            }
            Some(())
        });
        let kns = std::cell::Cell::new(c.kernel_ns);
        get("SIMGPU_KERNEL_NS", &|v| v.parse().ok().map(|n| kns.set(n)));
        let group = std::cell::RefCell::new(String::new());
        get("SIMGPU_GROUP", &|v| {
            // The state file stores labels in a fixed field.
            if v.len() > crate::layout::GROUP_NAME_MAX {
                return None;
            }
            *group.borrow_mut() = v.to_owned();
            Some(())
        });
        let scale = std::cell::Cell::new(c.module_scale);
        get("SIMGPU_MODULE_SCALE", &|v| {
            v.parse().ok().filter(|n| *n <= 64).map(|n| scale.set(n))
        });
        let zero = std::cell::Cell::new(c.pool_attributes_zero);
        get("SIMGPU_POOL_ATTRIBUTES_ZERO", &|v| {
            let on = match v {
                "1" => true,
                "0" | "" => false,
                _ => return None,
            };
            zero.set(on);
            Some(())
        });
        let graphics = std::cell::Cell::new(c.graphics_clients);
        get("SIMGPU_GRAPHICS_CLIENTS", &|v| {
            let on = match v {
                "1" => true,
                "0" | "" => false,
                _ => return None,
            };
            graphics.set(on);
            Some(())
        });
        let mut switch = |name: &str, default: bool| {
            let value = std::cell::Cell::new(default);
            get(name, &|v| {
                value.set(match v {
                    "1" => true,
                    "0" | "" => false,
                    _ => return None,
                });
                Some(())
            });
            value.get()
        };
        c.accounting_mode = switch("SIMGPU_ACCOUNTING_MODE", c.accounting_mode);
        c.conf_compute = switch("SIMGPU_CONF_COMPUTE", c.conf_compute);
        c.nvidia_root = lookup("SIMGPU_NVIDIA_ROOT")
            .filter(|v| !v.trim().is_empty())
            .map(|v| PathBuf::from(v.trim()));
        let mig = std::cell::RefCell::new(Vec::new());
        get("SIMGPU_MIG", &|v| {
            *mig.borrow_mut() = crate::mig::parse(v, devices.get(), memory.get())?;
            Some(())
        });
        c.mig = mig.into_inner();
        c.devices = devices.get();
        c.memory = memory.get();
        c.driver_version = driver.get();
        c.state_path = state.into_inner();
        c.context_memory = ctx.get();
        c.context_create_us = create.get();
        c.concurrent_kernels = conc.get();
        c.timeslice_ns = slice.get();
        c.trace = trace.into_inner();
        c.kernel_ns = kns.get();
        c.group = group.into_inner();
        c.module_scale = scale.get();
        c.pool_attributes_zero = zero.get();
        c.graphics_clients = graphics.get();
        c
    }
}

/// Parses a size: plain bytes, or a number (fractions allowed) with a unit. `K`/`M`/`G`/`T` and
/// `KiB`/`MiB`/`GiB`/`TiB` are binary; `KB`/`MB`/`GB`/`TB` decimal; `B` is bytes. Case-insensitive.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = (&s[..split], s[split..].trim());
    if num.is_empty() {
        return None;
    }
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    let bytes = f * mult as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then(|| bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16GiB"), Some(16 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("4G"), Some(4 << 30));
        assert_eq!(parse_size("4g"), Some(4 << 30));
        assert_eq!(parse_size("12345"), Some(12345));
        assert_eq!(parse_size("2 GB"), Some(2_000_000_000));
        assert_eq!(parse_size("0"), Some(0));
        for bad in ["", "GiB", "1.2.3G", "12XB", "-1", "99999999999T"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn env_parsing() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_owned())
        };
        let mut warnings = Vec::new();
        let c = Config::from_lookup(
            env(&[
                ("SIMGPU_MEMORY", "1.5GiB"),
                ("SIMGPU_STATE", "mine"),
                ("SIMGPU_DEVICES", "x"),
            ]),
            |w| warnings.push(w),
        );
        assert_eq!(c.memory, 3 << 29);
        assert_eq!(c.state_path, PathBuf::from("/dev/shm/mine"));
        assert_eq!(c.devices, 1);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("SIMGPU_DEVICES=\"x\""), "{warnings:?}");
        let c = Config::from_lookup(
            env(&[("SIMGPU_STATE", "/tmp/x/state"), ("SIMGPU_GROUP", "a")]),
            |_| {},
        );
        assert_eq!(c.state_path, PathBuf::from("/tmp/x/state"));
        assert_eq!(c.group, "a");
    }
}
