//! MIG instances' identity. In MIG mode `cuDeviceGetUuid_v2` "returns its MIG UUID which uniquely
//! identifies the subscribed MIG compute instance" (cuda.h), the same 16 bytes that NVML,
//! `nvidia-smi -L`, `CUDA_VISIBLE_DEVICES` and device plugins spell `MIG-<uuid>` (MIG user guide,
//! "CUDA Device Enumeration": "each MIG device is assigned a GPU UUID starting with MIG-<UUID>",
//! <https://docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html>). CUDA does not
//! say whether a device is a MIG instance; NVML does: `nvmlDeviceGetHandleByUUID` finds a GPU by
//! its `GPU-` UUID and a MIG instance by its `MIG-` UUID. A device is keyed (limits, ledgers, views,
//! status) by the form NVML knows it by.
//!
//! NVML is not loaded for this when no MIG instance can be in use ([`mig_ruled_out`]): running CUDA
//! on a MIG instance takes access to its capabilities, which the NVIDIA kernel driver lists under
//! `/proc/driver/nvidia/capabilities` and (its default interface) exposes as
//! `/dev/nvidia-caps/nvidia-cap<N>` (MIG user guide, "Device Nodes and Capabilities":
//! <https://docs.nvidia.com/datacenter/tesla/mig-user-guide/device-nodes-and-capabilities.html>).

use std::ffi::{CStr, CString};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`: the form NVML and `nvidia-smi -L` give a GPU's UUID.
pub fn format_uuid(b: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(40);
    out.push_str("GPU-");
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 15)]));
    }
    out
}

/// The key of the device whose UUID is `bytes`: `MIG-…` when NVML knows it as a MIG instance, else
/// `GPU-…` (also when NVML is not there to ask: a MIG instance is then keyed `GPU-<its UUID>`).
/// Asked once per device and process while NVML answers (a cold path: device resolution, ledger
/// and device-ledger joins).
pub fn device_key(bytes: &[u8; 16]) -> String {
    // (UUID, is a MIG instance); a few devices per process at most.
    static KNOWN: Mutex<Vec<([u8; 16], bool)>> = Mutex::new(Vec::new());
    let gpu = format_uuid(bytes);
    let known = KNOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(b, _)| b == bytes)
        .map(|&(_, mig)| mig);
    let mig = match known {
        Some(mig) => mig,
        None => match if no_mig_instance_here() {
            Some(false)
        } else {
            super::measure::known_as_mig_instance(&gpu)
        } {
            Some(mig) => {
                let mut cache = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
                if !cache.iter().any(|(b, _)| b == bytes) {
                    cache.push((*bytes, mig));
                }
                mig
            }
            None => false,
        },
    };
    if mig {
        mig_form(&gpu)
    } else {
        gpu
    }
}

/// Whether this process cannot be using a MIG instance, proved by the machine's files without
/// NVML (see [`mig_ruled_out`]); looked at once per process. The root is `/`, or
/// `GPUSLICE_NVIDIA_ROOT` (tests: simgpu's model of these files). A wrong "ruled out" keys a MIG
/// instance `GPU-<its UUID>`, which fails closed: a limit keyed `MIG-…` then matches no device
/// (allocations refused), a node tenant's ledger has no limit for that key but 0, and a limit for
/// every device still holds (docs/MEMORY.md, "MIG instances").
fn no_mig_instance_here() -> bool {
    static RULED_OUT: OnceLock<bool> = OnceLock::new();
    *RULED_OUT.get_or_init(|| match std::env::var_os("GPUSLICE_NVIDIA_ROOT") {
        Some(root) if !root.is_empty() => mig_ruled_out(Path::new(&root)),
        // The machine's own files: no path to build (a `stat` or three on fixed names).
        _ => ruled_out_by(
            c"/proc/driver/nvidia",
            c"/dev/nvidia-caps",
            c"/proc/driver/nvidia/capabilities",
        ),
    })
}

/// Whether no MIG instance can be in use on the machine whose root is `root`: the NVIDIA kernel
/// module is there (`proc/driver/nvidia`, which it always creates), and neither of the two ways
/// it grants access to a MIG instance's capabilities exists: `dev/nvidia-caps` (the `/dev` based
/// interface, the default) nor `proc/driver/nvidia/capabilities` (which lists every GPU and
/// compute instance's capability, and is the `/proc` based interface). A container runtime hands
/// a MIG device to a container as these files (the instance's capabilities and their device
/// nodes). Anything else (no driver's files at all, a file that cannot be looked at) rules
/// nothing out: NVML is asked.
pub fn mig_ruled_out(root: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let path = |p: &str| CString::new(root.join(p).as_os_str().as_bytes()).ok();
    match (
        path("proc/driver/nvidia"),
        path("dev/nvidia-caps"),
        path("proc/driver/nvidia/capabilities"),
    ) {
        (Some(driver), Some(dev), Some(caps)) => ruled_out_by(&driver, &dev, &caps),
        _ => false,
    }
}

/// [`mig_ruled_out`] on these three paths: `driver` a directory, `dev` and `caps` absent.
fn ruled_out_by(driver: &CStr, dev: &CStr, caps: &CStr) -> bool {
    look(driver, true) == Seen::Directory
        && look(dev, false) == Seen::Absent
        && look(caps, false) == Seen::Absent
}

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Directory,
    Absent,
    /// There (not a directory), or not known (a permission, a loop).
    Other,
}

/// What is at `path`: one `stat` (`follow`) or `lstat` (a dangling link is there). The `64`
/// names, which std imports already: no symbol more for the loader to bind at start-up.
fn look(path: &CStr, follow: bool) -> Seen {
    // SAFETY: a zeroed `stat64` is a valid out-parameter.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated; `st` is a valid out-parameter.
    let rc = unsafe {
        if follow {
            libc::stat64(path.as_ptr(), &mut st)
        } else {
            libc::lstat64(path.as_ptr(), &mut st)
        }
    };
    if rc == 0 {
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            Seen::Directory
        } else {
            Seen::Other
        }
    } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
        Seen::Absent
    } else {
        Seen::Other
    }
}

/// `MIG-…` for a UUID's `GPU-…` form.
pub fn mig_form(gpu: &str) -> String {
    format!("MIG-{}", gpu.get(4..).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_text() {
        let b = [
            0x53, 0x49, 0x4d, 0x47, 0x50, 0x55, 0x40, 0x00, 0x80, 0, 0, 0, 0, 0, 0, 0x1f,
        ];
        assert_eq!(
            super::format_uuid(&b),
            "GPU-53494d47-5055-4000-8000-00000000001f"
        );
    }

    /// A scratch root for [`super::mig_ruled_out`], with these directories in it.
    fn root(tag: &str, dirs: &[&str]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("gpuslice-mig-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        root
    }

    #[test]
    fn mig_is_ruled_out_only_by_a_driver_without_capabilities() {
        let cases: [(&str, &[&str], bool); 5] = [
            ("none", &["proc/driver/nvidia"], true),
            ("nodriver", &[], false),
            ("dev", &["proc/driver/nvidia", "dev/nvidia-caps"], false),
            (
                "proc",
                &["proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0"],
                false,
            ),
            (
                "both",
                &["proc/driver/nvidia/capabilities", "dev/nvidia-caps"],
                false,
            ),
        ];
        for (tag, dirs, ruled_out) in cases {
            let r = root(tag, dirs);
            assert_eq!(super::mig_ruled_out(&r), ruled_out, "{tag}: {dirs:?}");
            let _ = std::fs::remove_dir_all(&r);
        }
        // The driver's directory as a file, or a dangling `dev/nvidia-caps`: nothing ruled out.
        let r = root("file", &["proc/driver"]);
        std::fs::write(r.join("proc/driver/nvidia"), b"").unwrap();
        assert!(!super::mig_ruled_out(&r));
        let _ = std::fs::remove_dir_all(&r);
        let r = root("dangling", &["proc/driver/nvidia", "dev"]);
        std::os::unix::fs::symlink("/nonexistent/caps", r.join("dev/nvidia-caps")).unwrap();
        assert!(!super::mig_ruled_out(&r));
        let _ = std::fs::remove_dir_all(&r);
    }

    #[test]
    fn mig_form_keeps_the_uuid() {
        assert_eq!(
            super::mig_form("GPU-53494d47-4d49-4000-8000-000000000001"),
            "MIG-53494d47-4d49-4000-8000-000000000001"
        );
    }
}
