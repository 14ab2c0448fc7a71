//! Kernel launches and their execution on the shared device.
//!
//! A launch is validated, turned into a [`Kernel`] whose work is fixed at launch time, and enqueued
//! on its stream; the call returns at once. What a kernel does is told by its name:
//! - `spin*` (or a mangled `_Z<n>spin*`): runs for as many microseconds as its first parameter
//!   (`uint64_t microseconds`) says;
//! - `barrier*` (or `_Z<n>barrier*`): parameters `(uint64_t tag, uint64_t participants)`; an
//!   NCCL-like collective: it spins on its device until `participants` barrier kernels with this tag
//!   (across processes and devices) have started, then completes (the n-th barrier kernel of each
//!   participant meets the n-th of the others);
//! - any other kernel costs `SIMGPU_KERNEL_NS`.
//!
//! Parameters are read as with the real driver: `kernelParams[i]` points to parameter `i`, or the
//! packed `CU_LAUNCH_PARAM_BUFFER_POINTER` buffer holds them at offsets 0 and 8.
//!
//! Executing a kernel runs it on the device of its stream's context through simgpu-core's
//! scheduler (contexts time-sliced, kernels of one context concurrent across streams, barriers;
//! see `simgpu_core`'s execution docs).

use crate::module::{self, Function};
use crate::stream::{self, Stream};
use gpuslice_api::launch_types::*;
use gpuslice_api::types::{CUfunction, CUstream};
use gpuslice_api::{CUerror, CUresult};
use simgpu_core::{Submission, Work};
use std::ffi::{c_uint, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A validated launch, replayable (graphs launch it again and again).
#[derive(Clone)]
pub(crate) struct Kernel {
    pub func: Arc<Function>,
    pub device: u32,
    /// simgpu-core's tag of the context the kernel runs in.
    pub context: u64,
    pub work: Work,
}

impl Kernel {
    /// Runs the kernel on the device: waits for the device, runs its work (see the module docs).
    pub fn execute(&self) {
        match self.work {
            Work::Timed(d) => simgpu_core::trace(format_args!(
                "kernel {} {}us",
                self.func.name(),
                d.as_micros()
            )),
            Work::Barrier { tag, participants } => simgpu_core::trace(format_args!(
                "kernel {} barrier tag {tag} participants {participants}",
                self.func.name()
            )),
        }
        match simgpu_core::shared() {
            Ok(shared) => {
                let followed = stream::more_queued();
                let run = shared.run_kernel(&Submission {
                    device: self.device,
                    context: self.context,
                    work: self.work,
                    followed,
                    ready_ns: stream::device_time(),
                });
                stream::advance_device_time(run.end_ns);
                if run.preempted > 0 {
                    simgpu_core::trace(format_args!(
                        "kernel {} preempted {} times",
                        self.func.name(),
                        run.preempted
                    ));
                }
                // On the device timeline (CLOCK_REALTIME us): when it entered the device's queue,
                // first started, ended; in which context.
                simgpu_core::trace(format_args!(
                    "kernel {} ran: work {} us, context {} queued {} started {} ended {} us, seen {} us",
                    self.func.name(),
                    match self.work {
                        Work::Timed(d) => d.as_micros(),
                        Work::Barrier { .. } => 0,
                    },
                    self.context,
                    run.start_ns.saturating_sub(run.queued_ns) / 1000,
                    run.start_ns / 1000,
                    run.end_ns / 1000,
                    simgpu_core::realtime_ns() / 1000
                ));
            }
            Err(e) => {
                simgpu_core::trace(format_args!(
                    "no shared state ({e}): kernel runs unaccounted"
                ));
                if let Work::Timed(d) = self.work {
                    wait_precisely(d);
                }
            }
        }
    }
}

/// Waits `d` from now: sleeps until shortly before the end, then spins on the monotonic clock, so the
/// device's busy time matches the kernel's duration to a few microseconds.
pub(crate) fn wait_precisely(d: Duration) {
    const SPIN: Duration = Duration::from_micros(60);
    let end = Instant::now() + d;
    loop {
        let now = Instant::now();
        if now >= end {
            return;
        }
        let left = end - now;
        if left > SPIN {
            std::thread::sleep(left - SPIN);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Whether a kernel's name starts with `prefix`, plainly or C++-mangled (`_Z<n>prefix...`).
fn named(name: &str, prefix: &str) -> bool {
    if name.starts_with(prefix) {
        return true;
    }
    name.strip_prefix("_Z")
        .map(|r| r.trim_start_matches(|c: char| c.is_ascii_digit()))
        .is_some_and(|r| r.starts_with(prefix))
}

/// The launch's parameters, as the client passed them.
#[derive(Clone, Copy)]
pub(crate) struct Params {
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// The 8 bytes of kernel parameter `index` (0 or 1; each an 8-byte parameter), read now (the client
/// may reuse the memory).
///
/// # Safety
/// `p` follows cuLaunchKernel's contract: `kernel_params` is NULL or an array with an entry per
/// kernel parameter, each pointing to that parameter; `extra` is NULL or a
/// `CU_LAUNCH_PARAM_END`-terminated list of (key, value) pairs whose `CU_LAUNCH_PARAM_BUFFER_POINTER`
/// points to the packed parameters. The kernel (named `spin*`/`barrier*`) has at least `index + 1`
/// 8-byte parameters.
unsafe fn param_u64(p: Params, index: usize, buffer_size: Option<usize>) -> Option<u64> {
    if !p.kernel_params.is_null() {
        // SAFETY: per the contract, a non-NULL array whose entry `index` points to that parameter, a
        // u64 (read unaligned: the client's storage may not be aligned).
        return unsafe {
            let param = *p.kernel_params.add(index);
            (!param.is_null()).then(|| (param as *const u64).read_unaligned())
        };
    }
    if !p.extra.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: the list is terminated by CU_LAUNCH_PARAM_END, and keys come in pairs.
            let key = unsafe { *p.extra.add(i) } as usize;
            if key == CU_LAUNCH_PARAM_END {
                return None;
            }
            if key == CU_LAUNCH_PARAM_BUFFER_POINTER {
                // SAFETY: the value after the BUFFER_POINTER key points to the packed parameters.
                let buf = unsafe { *p.extra.add(i + 1) };
                let end = (index + 1) * 8;
                if buf.is_null() || buffer_size.is_some_and(|n| n < end) {
                    return None;
                }
                // SAFETY: the buffer holds the 8-byte parameters up to `index`.
                return Some(unsafe {
                    (buf as *const u8)
                        .add(index * 8)
                        .cast::<u64>()
                        .read_unaligned()
                });
            }
            i += 2;
        }
    }
    None
}

/// `CU_LAUNCH_PARAM_BUFFER_SIZE`'s value, if given.
///
/// # Safety
/// As [`param_u64`].
unsafe fn extra_buffer_size(extra: *mut *mut c_void) -> Option<usize> {
    if extra.is_null() {
        return None;
    }
    let mut i = 0;
    loop {
        // SAFETY: CU_LAUNCH_PARAM_END-terminated (key, value) pairs per the contract.
        let key = unsafe { *extra.add(i) } as usize;
        if key == CU_LAUNCH_PARAM_END {
            return None;
        }
        if key == CU_LAUNCH_PARAM_BUFFER_SIZE {
            // SAFETY: the value after the BUFFER_SIZE key points to a size_t.
            return unsafe {
                let v = *extra.add(i + 1);
                (!v.is_null()).then(|| *(v as *const usize))
            };
        }
        i += 2;
    }
}

/// Grid and block shape of a launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
}

/// Validates a launch and computes its kernel (duration read from the parameters now); `context`
/// is the launching context's tag, `ctx_id` its id (a lazily loaded library's kernel loads there).
///
/// # Safety
/// `params` follows cuLaunchKernel's contract (see [`param_u64`]).
pub(crate) unsafe fn prepare(
    f: CUfunction,
    shape: Shape,
    params: Params,
    device: u32,
    context: u64,
    ctx_id: u64,
) -> Result<Kernel, CUerror> {
    if f.is_null() {
        return Err(CUerror::INVALID_HANDLE);
    }
    let func = module::function(f)?;
    let [gx, gy, gz] = shape.grid;
    let [bx, by, bz] = shape.block;
    if gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 || bx > 1024 || by > 1024 || bz > 64 {
        return Err(CUerror::INVALID_VALUE);
    }
    if u64::from(bx) * u64::from(by) * u64::from(bz) > 1024 {
        return Err(CUerror::INVALID_VALUE);
    }
    if shape.shared_mem > func.max_dynamic_shared() {
        return Err(CUerror::INVALID_VALUE);
    }
    if !params.kernel_params.is_null() && !params.extra.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    // A library's kernel loaded lazily is loaded at its first launch in a context (module.rs).
    func.load(ctx_id, device)?;
    let default = Work::Timed(Duration::from_nanos(simgpu_core::config().kernel_ns));
    // SAFETY: forwarded contract.
    let size = unsafe { extra_buffer_size(params.extra) };
    let work = if named(func.name(), "spin") {
        // SAFETY: forwarded contract; a spin kernel's parameter 0 is its duration.
        match unsafe { param_u64(params, 0, size) } {
            Some(us) => Work::Timed(Duration::from_micros(us)),
            None => default,
        }
    } else if named(func.name(), "barrier") {
        // SAFETY: forwarded contract; a barrier kernel's parameters are (tag, participants).
        match unsafe { (param_u64(params, 0, size), param_u64(params, 1, size)) } {
            (Some(tag), Some(n)) => Work::Barrier {
                tag,
                participants: n.clamp(1, u64::from(u16::MAX)) as u32,
            },
            _ => return Err(CUerror::INVALID_VALUE),
        }
    } else {
        default
    };
    Ok(Kernel {
        func,
        device,
        context,
        work,
    })
}

/// Enqueues `k` on `s` (or records it if `s` is capturing).
pub(crate) fn submit(s: &Arc<Stream>, k: Kernel) -> CUresult {
    if let Some(c) = s.capture() {
        return c.add(crate::graph::NodeKind::Kernel(k));
    }
    stream::submit_kernel(s, Box::new(move || k.execute())).map(drop)
}

/// cuLaunchKernel and its variants.
///
/// # Safety
/// `params` follows cuLaunchKernel's contract.
unsafe fn launch(
    f: CUfunction,
    shape: Shape,
    hs: CUstream,
    per_thread: bool,
    params: Params,
) -> CUresult {
    let s = stream::resolve(hs, per_thread)?;
    // The real driver launches into the current context; a stream of another context is refused.
    let ctx = crate::context::current()?;
    if s.device() != ctx.device {
        return Err(CUerror::INVALID_HANDLE);
    }
    let tag = s.context()?.tag;
    // SAFETY: forwarded contract.
    let k = unsafe { prepare(f, shape, params, s.device(), tag, ctx.id) }?;
    if s.capture().is_none() {
        crate::context::grow_local_memory(&ctx, k.func.local_size())?;
    }
    submit(&s, k)
}

/// cuLaunchKernelEx: the config's shape and stream; attributes are accepted (cooperative, priority,
/// ... change nothing on a device that runs one kernel at a time).
///
/// # Safety
/// `config` is NULL or a valid `CUlaunchConfig` whose `attrs` holds `numAttrs` entries.
unsafe fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: Params,
    per_thread: bool,
) -> CUresult {
    if config.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: non-NULL and valid per the contract.
    let c = unsafe { *config };
    if c.numAttrs > 0 && c.attrs.is_null() {
        return Err(CUerror::INVALID_VALUE);
    }
    let shape = Shape {
        grid: [c.gridDimX, c.gridDimY, c.gridDimZ],
        block: [c.blockDimX, c.blockDimY, c.blockDimZ],
        shared_mem: c.sharedMemBytes,
    };
    // SAFETY: forwarded contract.
    unsafe { launch(f, shape, c.hStream, per_thread, params) }
}

// ---- exports ----

macro_rules! shape {
    ($gx:expr, $gy:expr, $gz:expr, $bx:expr, $by:expr, $bz:expr, $sm:expr) => {
        Shape {
            grid: [$gx, $gy, $gz],
            block: [$bx, $by, $bz],
            shared_mem: $sm,
        }
    };
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared_mem: c_uint,
    hs: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    crate::call("cuLaunchKernel", || {
        // SAFETY: the client's arguments follow cuLaunchKernel's contract.
        unsafe {
            launch(
                f,
                shape!(gx, gy, gz, bx, by, bz, shared_mem),
                hs,
                false,
                Params {
                    kernel_params,
                    extra,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared_mem: c_uint,
    hs: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    crate::call("cuLaunchKernel_ptsz", || {
        // SAFETY: the client's arguments follow cuLaunchKernel's contract.
        unsafe {
            launch(
                f,
                shape!(gx, gy, gz, bx, by, bz, shared_mem),
                hs,
                true,
                Params {
                    kernel_params,
                    extra,
                },
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared_mem: c_uint,
    hs: CUstream,
    kernel_params: *mut *mut c_void,
) -> CUresult {
    crate::call("cuLaunchCooperativeKernel", || {
        let params = Params {
            kernel_params,
            extra: std::ptr::null_mut(),
        };
        // SAFETY: the client's arguments follow cuLaunchCooperativeKernel's contract.
        unsafe {
            launch(
                f,
                shape!(gx, gy, gz, bx, by, bz, shared_mem),
                hs,
                false,
                params,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared_mem: c_uint,
    hs: CUstream,
    kernel_params: *mut *mut c_void,
) -> CUresult {
    crate::call("cuLaunchCooperativeKernel_ptsz", || {
        let params = Params {
            kernel_params,
            extra: std::ptr::null_mut(),
        };
        // SAFETY: the client's arguments follow cuLaunchCooperativeKernel's contract.
        unsafe {
            launch(
                f,
                shape!(gx, gy, gz, bx, by, bz, shared_mem),
                hs,
                true,
                params,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    crate::call("cuLaunchKernelEx", || {
        // SAFETY: the client's arguments follow cuLaunchKernelEx's contract.
        unsafe {
            launch_ex(
                config,
                f,
                Params {
                    kernel_params,
                    extra,
                },
                false,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    crate::call("cuLaunchKernelEx_ptsz", || {
        // SAFETY: the client's arguments follow cuLaunchKernelEx's contract.
        unsafe {
            launch_ex(
                config,
                f,
                Params {
                    kernel_params,
                    extra,
                },
                true,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_and_barrier_kernels_are_recognised_by_name() {
        assert!(named("spin", "spin"));
        assert!(named("spin_kernel", "spin"));
        assert!(named("_Z11spin_kernely", "spin"));
        assert!(!named("vecAdd", "spin"));
        assert!(!named("_Z6vecAddPfS_S_i", "spin"));
        assert!(named("barrier", "barrier"));
        assert!(named("_Z7barrieryy", "barrier"));
        assert!(!named("spin", "barrier"));
    }

    #[test]
    fn first_parameter_from_kernel_params_or_extra() {
        let mut us: u64 = 1234;
        let mut n: u64 = 2;
        let mut args = [
            &mut us as *mut u64 as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
        ];
        let p = Params {
            kernel_params: args.as_mut_ptr(),
            extra: std::ptr::null_mut(),
        };
        // SAFETY: a valid one-entry parameter array.
        assert_eq!(unsafe { param_u64(p, 0, None) }, Some(1234));
        // SAFETY: as above, two entries.
        assert_eq!(unsafe { param_u64(p, 1, None) }, Some(2));

        let mut buf: [u8; 16] = [0; 16];
        buf[..8].copy_from_slice(&777u64.to_ne_bytes());
        buf[8..].copy_from_slice(&3u64.to_ne_bytes());
        let mut size: usize = buf.len();
        let mut extra = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buf.as_mut_ptr().cast(),
            CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            CU_LAUNCH_PARAM_END as *mut c_void,
        ];
        let p = Params {
            kernel_params: std::ptr::null_mut(),
            extra: extra.as_mut_ptr(),
        };
        // SAFETY: a valid, terminated `extra` list.
        let size = unsafe { extra_buffer_size(p.extra) };
        assert_eq!(size, Some(16));
        // SAFETY: as above.
        assert_eq!(unsafe { param_u64(p, 0, size) }, Some(777));
        // SAFETY: as above.
        assert_eq!(unsafe { param_u64(p, 1, size) }, Some(3));
    }

    #[test]
    fn waits_are_precise() {
        for us in [50u64, 300, 2000] {
            let t = Instant::now();
            wait_precisely(Duration::from_micros(us));
            let took = t.elapsed();
            assert!(took >= Duration::from_micros(us), "{us} us took {took:?}");
        }
    }
}
