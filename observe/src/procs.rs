//! The processes using the node's GPUs as the driver sees them, and whose tenant each one is.
//!
//! NVML lists every process with memory or a context on a GPU by its PID in the initial PID
//! namespace (the driver's), whatever container it runs in. A process running under gpuslice holds
//! an OFD write lock on the byte of its ledger slot (`ledger::slot_of_lock_offset`), which
//! `/proc/<pid>/fdinfo/<fd>` lists with the lock's offset: so the node, seeing host PIDs, finds the
//! ledger file (by device and inode) and the slot of each listed process exactly, in whatever PID
//! namespace the process runs and whatever PID it sees itself under. A listed process holding no
//! slot of any gpuslice ledger uses the GPU under no tenant: *unmanaged*.
//!
//! Reading another user's `/proc/<pid>/fd` takes root with `CAP_SYS_PTRACE` and
//! `CAP_DAC_READ_SEARCH` (docs/OBSERVABILITY.md); a process whose descriptors cannot be read is
//! reported as such, never as unmanaged.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// One process NVML lists on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    /// `GPU-...` as NVML spells it.
    pub uuid: String,
    /// NVML's index of the GPU.
    pub index: u32,
    /// The driver's (host) PID.
    pub pid: u32,
    /// Its used device memory; `None`: NVML cannot say.
    pub used: Option<u64>,
}

/// `nvmlProcessInfo_t` (v2 and v3 share it, nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// NVML's "not available" for a process's used memory (nvml.h `NVML_VALUE_NOT_AVAILABLE`).
const NOT_AVAILABLE: u64 = u64::MAX;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;
/// NVML_DEVICE_UUID_V2_BUFFER_SIZE.
const UUID_BUFFER: usize = 96;

fn library_name() -> String {
    std::env::var("GPUSLICE_REAL_NVML")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "libnvidia-ml.so.1".into())
}

/// Every compute process NVML lists on every GPU of the node, by host PID.
pub fn gpu_processes() -> Result<Vec<GpuProcess>, String> {
    type Ret = c_int;
    type Dev = *mut c_void;
    let name = library_name();
    // SAFETY: loading NVML runs its initialisers, which have no preconditions.
    let lib =
        unsafe { libloading::Library::new(&name) }.map_err(|e| format!("NVML ({name}): {e}"))?;
    let sym_err = |e: libloading::Error| format!("NVML ({name}): {e}");
    // SAFETY: each symbol's type is its declaration in nvml.h.
    unsafe {
        let init = lib
            .get::<unsafe extern "C" fn() -> Ret>(b"nvmlInit_v2\0")
            .map_err(sym_err)?;
        let count = lib
            .get::<unsafe extern "C" fn(*mut c_uint) -> Ret>(b"nvmlDeviceGetCount_v2\0")
            .map_err(sym_err)?;
        let by_index = lib
            .get::<unsafe extern "C" fn(c_uint, *mut Dev) -> Ret>(
                b"nvmlDeviceGetHandleByIndex_v2\0",
            )
            .map_err(sym_err)?;
        let uuid = lib
            .get::<unsafe extern "C" fn(Dev, *mut c_char, c_uint) -> Ret>(b"nvmlDeviceGetUUID\0")
            .map_err(sym_err)?;
        let procs = lib
            .get::<unsafe extern "C" fn(Dev, *mut c_uint, *mut ProcessInfo) -> Ret>(
                b"nvmlDeviceGetComputeRunningProcesses_v3\0",
            )
            .map_err(sym_err)?;
        let shutdown = lib
            .get::<unsafe extern "C" fn() -> Ret>(b"nvmlShutdown\0")
            .map_err(sym_err)?;
        let rc = init();
        if rc != 0 {
            return Err(format!("NVML ({name}): nvmlInit_v2 returned {rc}"));
        }
        let mut n: c_uint = 0;
        let mut out = Vec::new();
        let rc = count(&mut n);
        if rc != 0 {
            shutdown();
            return Err(format!(
                "NVML ({name}): nvmlDeviceGetCount_v2 returned {rc}"
            ));
        }
        for i in 0..n.min(64) {
            let mut dev: Dev = std::ptr::null_mut();
            let mut buf = [0 as c_char; UUID_BUFFER];
            if by_index(i, &mut dev) != 0 || uuid(dev, buf.as_mut_ptr(), UUID_BUFFER as c_uint) != 0
            {
                continue;
            }
            buf[UUID_BUFFER - 1] = 0;
            let text = CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned();
            let uuid = gpuslice_state::config::canonical_uuid(&text).unwrap_or(text);
            let mut capacity: c_uint = 64;
            for _ in 0..4 {
                let mut infos = vec![ProcessInfo::default(); capacity as usize];
                let mut got = capacity;
                match procs(dev, &mut got, infos.as_mut_ptr()) {
                    0 => {
                        out.extend(infos.iter().take(got.min(capacity) as usize).map(|p| {
                            GpuProcess {
                                uuid: uuid.clone(),
                                index: i,
                                pid: p.pid,
                                used: (p.used_gpu_memory != NOT_AVAILABLE)
                                    .then_some(p.used_gpu_memory),
                            }
                        }));
                        break;
                    }
                    NVML_ERROR_INSUFFICIENT_SIZE => capacity = got.max(capacity * 2).min(1 << 16),
                    _ => break,
                }
            }
        }
        shutdown();
        Ok(out)
    }
}

/// A ledger slot lock a process holds: the locked file's identity (device, inode), the slot, and a
/// path that reaches the file through the process (`/proc/<pid>/fd/<n>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotLock {
    pub file: (u64, u64),
    pub slot: usize,
    pub fd_path: PathBuf,
}

/// What the node can tell of a process's descriptors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Descriptors {
    /// The slot locks it holds (none: it runs under no gpuslice ledger).
    Read(Vec<SlotLock>),
    /// `/proc/<pid>/fd` cannot be read (gone, or not permitted).
    Unreadable(String),
}

/// Most descriptors of one process looked at (a process with more is judged on these).
const MAX_FDS: usize = 65_536;

/// The ledger slot locks process `pid` holds, from `<proc>/<pid>/fd` and `fdinfo`: each descriptor
/// whose fdinfo lists an OFD write lock of one byte at a slot's lock offset.
pub fn slot_locks(proc_root: &Path, pid: u32) -> Descriptors {
    let dir = proc_root.join(pid.to_string());
    let entries = match std::fs::read_dir(dir.join("fd")) {
        Ok(e) => e,
        Err(e) => return Descriptors::Unreadable(format!("{}: {e}", dir.join("fd").display())),
    };
    let mut locks = Vec::new();
    for entry in entries.flatten().take(MAX_FDS) {
        let name = entry.file_name();
        let Some(fd) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Some(text) = read_small(&dir.join("fdinfo").join(fd), 64 << 10) else {
            continue;
        };
        let slots: Vec<usize> = text
            .lines()
            .filter_map(parse_lock_line)
            .filter_map(gpuslice_state::ledger::slot_of_lock_offset)
            .collect();
        if slots.is_empty() {
            continue;
        }
        // The file the descriptor names (the link is followed: it is the process's open file).
        let fd_path = dir.join("fd").join(fd);
        let Ok(m) = std::fs::metadata(&fd_path) else {
            continue;
        };
        if !m.is_file() {
            continue;
        }
        for slot in slots {
            locks.push(SlotLock {
                file: (m.dev(), m.ino()),
                slot,
                fd_path: fd_path.clone(),
            });
        }
    }
    Descriptors::Read(locks)
}

/// The start of a one-byte OFD write lock from an fdinfo `lock:` line
/// (`lock:\t1: OFDLCK  ADVISORY  WRITE -1 00:1a:1234 262144 262144`, fs/locks.c
/// `lock_get_status`).
fn parse_lock_line(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("lock:")?;
    let words: Vec<&str> = rest.split_whitespace().collect();
    // id: OFDLCK ADVISORY WRITE pid dev:ino start end
    if words.len() < 8 || words[1] != "OFDLCK" || words[3] != "WRITE" {
        return None;
    }
    let start: u64 = words[6].parse().ok()?;
    let end: u64 = words[7].parse().ok()?;
    (start == end).then_some(start)
}

/// Reads at most `max` bytes of a small text file (procfs), without following a last link.
fn read_small(path: &Path, max: u64) -> Option<String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let mut text = String::new();
    f.take(max).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Whether the file a process has open at `fd_path` is a gpuslice ledger (its first 8 bytes are
/// the magic): a process under a ledger the node does not reconcile is still not unmanaged.
pub fn is_ledger(fd_path: &Path) -> bool {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(fd_path)
    else {
        return false;
    };
    let mut magic = [0u8; 8];
    f.take(8).read_exact(&mut magic).is_ok() && &magic == b"GPUSLICE"
}

/// The command name of a process (`/proc/<pid>/comm`), for reports; "" when it cannot be read.
pub fn command_name(proc_root: &Path, pid: u32) -> String {
    read_small(&proc_root.join(pid.to_string()).join("comm"), 64)
        .map(|s| {
            s.trim_end()
                .chars()
                .filter(|c| !c.is_control())
                .collect::<String>()
        })
        .unwrap_or_default()
}

/// A process using a GPU under no tenant, as the node last reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmanaged {
    pub uuid: String,
    pub pid: u32,
    /// `None`: NVML cannot say.
    pub used: Option<u64>,
    pub command: String,
}

/// The node's report of unmanaged processes: `<state>/reconcile/unmanaged`, written by
/// `gpuslice node reconcile` at each pass (a first line `# <unix ms>`, then
/// `<uuid>\t<pid>\t<bytes or ->\t<command>` lines).
pub const UNMANAGED_FILE: &str = "reconcile/unmanaged";

/// The report's text.
pub fn format_unmanaged(now_ms: u64, list: &[Unmanaged]) -> String {
    let mut s = format!("# {now_ms}\n");
    for u in list {
        let used = u.used.map_or_else(|| "-".to_string(), |b| b.to_string());
        let command: String = u
            .command
            .chars()
            .map(|c| if c.is_whitespace() { '_' } else { c })
            .collect();
        s.push_str(&format!("{}\t{}\t{used}\t{command}\n", u.uuid, u.pid));
    }
    s
}

/// Reads the node's report under `state_dir` (a regular file of at most 1 MiB, not a link):
/// when it was written (unix ms) and its processes; `None` when there is none or it cannot be read.
pub fn read_unmanaged(state_dir: &Path) -> Option<(u64, Vec<Unmanaged>)> {
    let path = state_dir.join(UNMANAGED_FILE);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return None;
    }
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    let mut lines = text.lines();
    let when: u64 = lines.next()?.strip_prefix("# ")?.trim().parse().ok()?;
    let list = lines
        .filter_map(|l| {
            let mut it = l.split('\t');
            let uuid = it.next()?.to_string();
            let pid = it.next()?.parse().ok()?;
            let used = match it.next()? {
                "-" => None,
                n => Some(n.parse().ok()?),
            };
            let command = it.next().unwrap_or("").to_string();
            Some(Unmanaged {
                uuid,
                pid,
                used,
                command,
            })
        })
        .take(4096)
        .collect();
    Some((when, list))
}

/// A report older than this is not exported (the node stopped reconciling).
pub const REPORT_FRESH_MS: u64 = 60_000;

/// The unmanaged processes of a fresh report as exposition text: `gpuslice_unmanaged_memory_bytes`
/// per process (labels `gpu`, `UUID`, `pid`, `command`; only where NVML says how much) and
/// `gpuslice_unmanaged_processes` per GPU that has any.
pub fn encode_unmanaged(
    report: Option<&(u64, Vec<Unmanaged>)>,
    now_ms: u64,
    gpus: &mut crate::gpus::GpuIndex,
) -> String {
    use prometheus::{Encoder, IntGaugeVec, Opts, Registry, TextEncoder};
    let Some((_, list)) = report.filter(|(w, _)| now_ms.saturating_sub(*w) <= REPORT_FRESH_MS)
    else {
        return String::new();
    };
    if list.is_empty() {
        return String::new();
    }
    let bytes = IntGaugeVec::new(
        Opts::new(
            "gpuslice_unmanaged_memory_bytes",
            "Device memory a process uses on the GPU under no tenant (no gpuslice ledger: a static binary, a container without the library), as NVML reports it.",
        ),
        &["gpu", "UUID", "pid", "command"],
    )
    .expect("valid metric definition");
    let count = IntGaugeVec::new(
        Opts::new(
            "gpuslice_unmanaged_processes",
            "Processes using the GPU under no tenant, as the node last found them.",
        ),
        &["gpu", "UUID"],
    )
    .expect("valid metric definition");
    for u in list {
        let gpu = gpus.label(&u.uuid);
        count.with_label_values(&[&gpu, &u.uuid]).inc();
        if let Some(b) = u.used {
            bytes
                .with_label_values(&[&gpu, &u.uuid, &u.pid.to_string(), &u.command])
                .set(i64::try_from(b).unwrap_or(i64::MAX));
        }
    }
    let registry = Registry::new();
    let _ = registry.register(Box::new(bytes));
    let _ = registry.register(Box::new(count));
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_lock_lines_give_the_locked_byte() {
        assert_eq!(
            parse_lock_line("lock:\t1: OFDLCK  ADVISORY  WRITE -1 00:1a:1234 262144 262144"),
            Some(262144)
        );
        // Read locks, ranges, POSIX and flock locks are not slot locks.
        assert_eq!(
            parse_lock_line("lock:\t1: OFDLCK  ADVISORY  READ -1 00:1a:1234 5 5"),
            None
        );
        assert_eq!(
            parse_lock_line("lock:\t1: OFDLCK  ADVISORY  WRITE -1 00:1a:1234 0 EOF"),
            None
        );
        assert_eq!(
            parse_lock_line("lock:\t1: POSIX  ADVISORY  WRITE 12 00:1a:1234 5 5"),
            None
        );
        assert_eq!(parse_lock_line("flags:\t0100002"), None);
    }

    #[test]
    fn the_report_reads_back_what_was_written() {
        let dir = std::env::temp_dir().join(format!("observe-unmanaged-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("reconcile")).unwrap();
        let list = vec![
            Unmanaged {
                uuid: "GPU-a".into(),
                pid: 42,
                used: Some(300 << 20),
                command: "static bin".into(),
            },
            Unmanaged {
                uuid: "GPU-b".into(),
                pid: 7,
                used: None,
                command: String::new(),
            },
        ];
        std::fs::write(dir.join(UNMANAGED_FILE), format_unmanaged(99, &list)).unwrap();
        let (when, back) = read_unmanaged(&dir).unwrap();
        assert_eq!(when, 99);
        assert_eq!(back[0].command, "static_bin");
        assert_eq!((back[0].pid, back[0].used), (42, Some(300 << 20)));
        assert_eq!((back[1].pid, back[1].used), (7, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// This process's own OFD lock on a ledger slot is found through its /proc entry.
    #[test]
    fn a_slot_lock_is_found_in_fdinfo() {
        use gpuslice_state::config::Limit;
        use gpuslice_state::ledger::{Ledger, LedgerOptions};
        let dir = std::env::temp_dir().join(format!("observe-slotlock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.ledger");
        let uuid = "GPU-00000000-0000-4000-8000-000000000001";
        let opts = LedgerOptions {
            tenant: "t".into(),
            default_limit: Limit::Bytes(1 << 30),
            devices: vec![(uuid.into(), Limit::Bytes(1 << 30))],
            group: None,
        };
        let l = Ledger::open(&path, &opts).unwrap();
        let d = l.device_index(uuid).unwrap();
        l.try_reserve(d, 1).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        let Descriptors::Read(locks) = slot_locks(Path::new("/proc"), std::process::id()) else {
            panic!("our own descriptors are readable")
        };
        let mine: Vec<&SlotLock> = locks
            .iter()
            .filter(|s| s.file == (m.dev(), m.ino()))
            .collect();
        assert_eq!(mine.len(), 1, "{locks:?}");
        assert_eq!(mine[0].slot, l.slot().unwrap());
        assert!(is_ledger(&mine[0].fd_path));
        drop(l);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
