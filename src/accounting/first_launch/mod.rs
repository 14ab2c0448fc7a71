//! Functions whose first launch makes the driver spend memory: a library's kernels whose code the
//! driver has not loaded yet, and functions whose local frame is larger than the context's stack
//! (their launch grows the context's local memory, see `hooks::first_launch::grow_local`).
//!
//! Kernels whose code is not loaded: a library's kernels under lazy loading
//! (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2). `cuLibraryLoadData`'s documentation:
//! a lazily loaded library "will only be loaded when a function is needed for that context, such as
//! a kernel launch"; so `cuLibraryGetKernel` loads nothing, and the kernel's code goes to the device
//! at `cuKernelGetFunction` or at the first launch of the `CUkernel`, in each context that needs it
//! ("for that context": a second context launching the same kernel loads its code again). Those
//! are where it is charged (`hooks::first_launch`).
//!
//! The table the launch hooks ask is `table.rs`; the decisions at a first launch are here.

mod table;

use super::limits::{limit_default, LimitChange, LIMIT_STACK_SIZE};
use super::records::{LazyKernel, LocalFrame, Overhead};
use super::Tenant;
use gpuslice_api::CUresult;
use table::{assign_context, context_bit, put, refresh, remove};
pub use table::{clear, pending, CONTEXT_BITS};
pub(super) use table::{context_appeared, context_gone, forget_library};

impl Tenant {
    /// `cuLibraryGetKernel` answered `kernel` for `name` in `library`: when the library is loaded
    /// lazily and the kernel's code is not loaded yet, the kernel is pending until its first load
    /// in each context.
    /// `false`: its code is loaded in the current context (an eagerly loaded library's).
    pub fn lazy_kernel_got(&self, library: usize, kernel: usize, name: &[u8]) -> bool {
        if !self.lazy_code_pending(Overhead::Library, library, name) {
            return false;
        }
        let mut records = self.records.lock();
        if !records.lazy_kernels.contains_key(&kernel) && put(kernel, 0) {
            records.lazy_kernels.insert(
                kernel,
                LazyKernel {
                    library,
                    name: name.to_vec(),
                    loaded_in: 0,
                },
            );
        }
        true
    }

    /// The library and name of a kernel whose code is not loaded in the current context yet
    /// (`None`: loaded there, or not a lazily loaded library's).
    pub fn lazy_kernel(&self, kernel: usize) -> Option<(usize, Vec<u8>)> {
        let ctx = self.lazy_context(Overhead::Library);
        let records = self.records.lock();
        let Some(lazy) = records.lazy_kernels.get(&kernel) else {
            refresh(&records, kernel);
            return None;
        };
        if context_bit(ctx).is_some_and(|bit| lazy.loaded_in & bit != 0) {
            return None;
        }
        Some((lazy.library, lazy.name.clone()))
    }

    /// A kernel's code was loaded in the current context: its launches there take the fast path
    /// from now on.
    pub fn lazy_kernel_loaded(&self, kernel: usize) {
        let ctx = self.lazy_context(Overhead::Library);
        let mut records = self.records.lock();
        let bit = assign_context(ctx);
        let Some(lazy) = records.lazy_kernels.get_mut(&kernel) else {
            return;
        };
        match bit {
            Some(bit) => {
                lazy.loaded_in |= bit;
                refresh(&records, kernel);
            }
            // Untracked context: its loads are left to reconciliation.
            None => {
                if !records.local_frames.contains_key(&kernel) {
                    remove(kernel);
                }
            }
        }
    }
}

impl Tenant {
    /// `f` (a function or kernel) has a local frame of `local` bytes per thread: beyond
    /// `default_stack`, its launch in a context whose local memory holds less grows it. A handle
    /// noted again (given to another function since) takes its new frame.
    pub fn local_frame_seen(&self, f: usize, local: u64, default_stack: u64) {
        let mut records = self.records.lock();
        if local <= default_stack {
            if records.local_frames.remove(&f).is_some() {
                refresh(&records, f);
            }
            return;
        }
        let held_in = records
            .local_memory
            .iter()
            .filter(|(_, &held)| held >= local)
            .filter_map(|(&ctx, _)| context_bit(ctx))
            .fold(0, |bits, bit| bits | bit);
        records.local_frames.insert(
            f,
            LocalFrame {
                bytes: local,
                held_in,
            },
        );
        refresh(&records, f);
    }

    /// What launching `f` in context `ctx` may grow: `f`'s frame and what the context's local
    /// memory holds per thread as far as this process saw (the largest frame launched in it, or
    /// the stack size set; 0: nothing seen). `None`: `f` has no large frame, or the context
    /// holds it already (then its launches there take the fast path).
    pub fn local_growth(&self, f: usize, ctx: usize) -> Option<(u64, u64)> {
        let mut records = self.records.lock();
        let frame = records.local_frames.get(&f)?.bytes;
        let held = records.local_memory.get(&ctx).copied().unwrap_or(0);
        if frame > held {
            return Some((frame, held));
        }
        if let (Some(bit), Some(local)) = (assign_context(ctx), records.local_frames.get_mut(&f)) {
            local.held_in |= bit;
        }
        refresh(&records, f);
        None
    }

    /// Context `ctx`'s local memory holds `bytes` per thread: grown to it by a launch (`set`
    /// false: it never shrinks), or set to it by `cuCtxSetLimit` of the stack (`set`). The frames
    /// it holds launch there on the fast path; the others grow it.
    pub fn local_memory_holds(&self, ctx: usize, bytes: u64, set: bool) {
        if ctx == 0 {
            return;
        }
        let mut records = self.records.lock();
        let held = match records.local_memory.get(&ctx) {
            Some(&old) if !set => old.max(bytes),
            _ => bytes,
        };
        records.local_memory.insert(ctx, held);
        let Some(bit) = assign_context(ctx) else {
            return;
        };
        let frames: Vec<usize> = records.local_frames.keys().copied().collect();
        for f in frames {
            if let Some(local) = records.local_frames.get_mut(&f) {
                if local.bytes <= held {
                    local.held_in |= bit;
                } else {
                    local.held_in &= !bit;
                }
            }
            refresh(&records, f);
        }
    }

    /// Launches function `f` (by `launch`) in the current context, charging the local memory the
    /// launch grows. The driver keeps one local memory per context, sized by the largest frame
    /// launched in it and kept after the launch (cuda.h: `CU_CTX_LMEM_RESIZE_TO_MAX`, "Keep local
    /// memory allocation after launch", the default from CUDA 12.9; `cuCtxSetLimit`:
    /// `CU_LIMIT_STACK_SIZE` "The driver automatically increases the per-thread stack size for
    /// each kernel launch as needed. This size isn't reset back to the original value after each
    /// launch"), freed with the context. A launch whose frame is larger than what the context
    /// holds (the larger of its stack limit, as the driver answers it, and the largest frame
    /// launched in it) is charged the growth, as raising the stack limit from that to the frame
    /// is ([`Tenant::change_limit`]: what NVIDIA documents, reserved before the launch, then
    /// measured; recorded with the context's limits, returned with the context): a launch the
    /// quota has no room for fails with `CUDA_ERROR_OUT_OF_MEMORY` and runs nothing (the next
    /// one tries again). A launch that grows nothing is not charged.
    pub fn launch_growing_local(&self, f: usize, launch: impl FnOnce() -> CUresult) -> CUresult {
        let ctx = self.current_context();
        let Some((frame, held)) = self.local_growth(f, ctx) else {
            return launch();
        };
        let Some(device) = self.overhead_device(true) else {
            return launch();
        };
        let default = limit_default(LIMIT_STACK_SIZE) as u64;
        let stack = self
            .driver()
            .context_limit(LIMIT_STACK_SIZE)
            .map_or(default, |v| v as u64);
        let old = stack.max(held);
        if frame <= old {
            self.local_memory_holds(ctx, old, false);
            return launch();
        }
        let change = LimitChange {
            what: "local memory growth",
            limit: LIMIT_STACK_SIZE,
            old: usize::try_from(old).unwrap_or(usize::MAX),
            value: usize::try_from(frame).unwrap_or(usize::MAX),
        };
        self.change_limit(device, change, launch, None::<fn(())>)?;
        self.local_memory_holds(ctx, frame, false);
        Ok(())
    }
}
