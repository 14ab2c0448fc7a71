//! Device memory, backed by host memory so that copies and kernels really move data.
//!
//! The process reserves one large private address range (`MAP_NORESERVE`, so untouched pages cost
//! nothing) and hands device addresses out of it: a device pointer *is* the host address backing it,
//! which gives unified addressing for free. Capacity is device-wide across processes: every byte a
//! process holds is charged to `simgpu_core::Shared` before it is handed out, and released after.
//!
//! Beside it: stream-ordered pools (`pool.rs`), the VMM API (`vmm.rs`: memfd-backed physical
//! allocations mapped with `MAP_FIXED`), CUDA arrays (`array.rs`, storage only), pinned host memory
//! (`host.rs`) and pointer attributes (`pointer.rs`).

use crate::context::Context;
use gpuslice_api::types::*;
use gpuslice_api::{CUerror, CUresult};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// cuMemAlloc's alignment (the real driver's minimum).
const ALIGN: usize = 256;
/// VMM granularity (minimum and recommended), and the rounding unit of CUDA arrays.
pub const GRANULARITY: usize = 2 << 20;
/// cuMemAllocPitch rounds rows up to this (the driver's texture pitch alignment on Hopper).
const PITCH_ALIGN: usize = 512;

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn shared() -> Result<&'static simgpu_core::Shared, CUerror> {
    simgpu_core::shared().map_err(|_| CUerror::NOT_INITIALIZED)
}

fn charge(device: u32, bytes: usize) -> CUresult {
    if shared()?.try_reserve(device, bytes as u64) {
        Ok(())
    } else {
        Err(CUerror::OUT_OF_MEMORY)
    }
}

fn uncharge(device: u32, bytes: usize) {
    if let Ok(s) = shared() {
        s.release(device, bytes as u64);
    }
}

// ---- Allocation records ----

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Device,
    Managed,
    /// From a stream-ordered pool (its handle).
    Pool(usize),
    /// A CUDA array (its 3D descriptor); the handle is the base address.
    Array(CUDA_ARRAY3D_DESCRIPTOR),
    Mipmap(CUDA_ARRAY3D_DESCRIPTOR, u32),
    /// Another process's allocation mapped by `cuIpcOpenMemHandle` (its export's key): it costs
    /// this process nothing while the exporter holds it (`simgpu_core::ipc`).
    Ipc(u64),
}

#[derive(Clone, Copy, Debug)]
struct Alloc {
    /// Requested bytes: the valid range for copies.
    size: usize,
    /// Address-space bytes taken, and charged to the device.
    span: usize,
    device: u32,
    /// The owning context's handle (freed with it).
    ctx: usize,
    kind: Kind,
    /// Set by cuMemFreeAsync: the pointer is on its way out (catches double frees).
    freeing: bool,
    id: u64,
}

/// A VMM physical allocation (cuMemCreate).
struct Physical {
    fd: OwnedFd,
    size: usize,
    device: u32,
    /// Handle references (cuMemCreate / cuMemRetainAllocationHandle, minus cuMemRelease).
    refs: u32,
    /// Live mappings; the memory is returned when both counts reach zero, as in the driver.
    maps: u32,
}

struct Mapping {
    size: usize,
    handle: u64,
    access: u32,
}

#[derive(Default)]
struct Mem {
    space: Option<Space>,
    allocs: BTreeMap<usize, Alloc>,
    pools: HashMap<usize, Pool>,
    default_pools: HashMap<u32, usize>,
    current_pools: HashMap<u32, usize>,
    reservations: BTreeMap<usize, usize>,
    mappings: BTreeMap<usize, Mapping>,
    physical: HashMap<u64, Physical>,
}

fn mem() -> MutexGuard<'static, Mem> {
    static M: OnceLock<Mutex<Mem>> = OnceLock::new();
    lock(M.get_or_init(Default::default))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Mem {
    fn space(&mut self) -> Result<&mut Space, CUerror> {
        if self.space.is_none() {
            self.space = Some(Space::new()?);
        }
        Ok(self.space.as_mut().expect("just set"))
    }

    /// Charges and maps `span` bytes of `device` memory.
    fn take(&mut self, device: u32, span: usize, align: usize) -> Result<usize, CUerror> {
        charge(device, span)?;
        match self.space().map(|s| s.alloc(span, align)) {
            Ok(Some(at)) => Ok(at),
            Ok(None) => {
                uncharge(device, span);
                Err(CUerror::OUT_OF_MEMORY)
            }
            Err(e) => {
                uncharge(device, span);
                Err(e)
            }
        }
    }

    fn give_back(&mut self, device: u32, at: usize, span: usize) {
        if let Some(s) = self.space.as_mut() {
            s.release(at, span);
        }
        uncharge(device, span);
    }

    fn alloc(
        &mut self,
        ctx: &Context,
        size: usize,
        span: usize,
        align: usize,
        kind: Kind,
    ) -> Result<usize, CUerror> {
        let at = self.take(ctx.device, span, align)?;
        simgpu_core::trace(format_args!(
            "  alloc {size} bytes ({span} reserved) on device {} at {at:#x}",
            ctx.device
        ));
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let a = Alloc {
            size,
            span,
            device: ctx.device,
            ctx: ctx_handle(ctx),
            kind,
            freeing: false,
            id,
        };
        self.allocs.insert(at, a);
        Ok(at)
    }

    /// The allocation containing `ptr`.
    fn find(&self, ptr: usize) -> Option<(usize, &Alloc)> {
        let (&base, a) = self.allocs.range(..=ptr).next_back()?;
        (ptr < base + a.size.max(1)).then_some((base, a))
    }

    /// Frees the allocation at `base` (a pool block goes back to its pool, still reserved).
    fn free(&mut self, base: usize) {
        let Some(a) = self.allocs.remove(&base) else {
            return;
        };
        simgpu_core::trace(format_args!("  free {base:#x} ({} bytes)", a.size));
        match a.kind {
            Kind::Pool(h) => match self.pools.get_mut(&h) {
                Some(p) => {
                    p.used -= a.span as u64;
                    p.idle.push((base, a.span));
                }
                None => self.give_back(a.device, base, a.span),
            },
            Kind::Ipc(key) => {
                if let Some(s) = self.space.as_mut() {
                    s.release(base, a.span);
                }
                ipc::unmapped(key);
            }
            // An exported allocation an importer still maps lives on there (`simgpu_core::ipc`):
            // only the address range goes.
            Kind::Device if ipc::exported_freed(base) => {
                if let Some(s) = self.space.as_mut() {
                    s.release(base, a.span);
                }
            }
            _ => self.give_back(a.device, base, a.span),
        }
    }

    /// Releases idle pool blocks until the pool reserves at most `keep` bytes.
    fn trim(&mut self, pool: usize, keep: u64) {
        let Some(p) = self.pools.get_mut(&pool) else {
            return;
        };
        let device = p.device;
        // Largest blocks first: fewest releases to get under the limit.
        p.idle.sort_by_key(|b| b.1);
        let mut released = Vec::new();
        while p.reserved > keep {
            let Some((at, span)) = p.idle.pop() else {
                break;
            };
            p.reserved -= span as u64;
            released.push((at, span));
        }
        for (at, span) in released {
            self.give_back(device, at, span);
        }
    }

    fn pool_alloc(
        &mut self,
        ctx: &Context,
        pool: usize,
        size: usize,
        stream: u64,
    ) -> Result<usize, CUerror> {
        let span = round_up(size, ALIGN).ok_or(CUerror::OUT_OF_MEMORY)?;
        let p = self.pools.get_mut(&pool).ok_or(CUerror::INVALID_VALUE)?;
        // Reuse the smallest block that fits: an idle one, or one this stream freed earlier.
        let idle = p
            .idle
            .iter()
            .enumerate()
            .filter(|(_, b)| b.1 >= span)
            .min_by_key(|(_, b)| b.1)
            .map(|(i, b)| (b.1, i));
        let pending = p
            .pending
            .iter()
            .enumerate()
            .filter(|(_, b)| b.1 >= span && b.2 == stream)
            .min_by_key(|(_, b)| b.1)
            .map(|(i, b)| (b.1, i));
        let reuse = match (idle, pending) {
            (Some(i), Some(q)) if q.0 < i.0 => Some(p.pending.swap_remove(q.1)),
            (Some(i), _) => Some(p.idle.swap_remove(i.1)).map(|b| (b.0, b.1, u64::MAX)),
            (None, Some(q)) => Some(p.pending.swap_remove(q.1)),
            (None, None) => None,
        };
        // A pool sub-allocates the memory it reserves (CUDA Programming Guide, "Stream Ordered
        // Memory Allocator": freed memory is reused for later allocations): a larger freed block
        // serves the request from its start, and the rest stays in the pool for the next ones.
        let reuse = reuse.map(|(at, block, freed_on)| {
            if block > span {
                let rest = (at + span, block - span);
                match freed_on {
                    u64::MAX => p.idle.push(rest),
                    stream => p.pending.push((rest.0, rest.1, stream)),
                }
            }
            (at, span)
        });
        let (at, span) = match reuse {
            Some(block) => block,
            None => {
                if p.max_size != 0 && p.reserved as usize + span > p.max_size {
                    return Err(CUerror::OUT_OF_MEMORY);
                }
                let device = p.device;
                let at = match self.take(device, span, ALIGN) {
                    Ok(at) => at,
                    Err(_) => {
                        // Full: give back what the pool holds idle, then retry once.
                        self.trim(pool, 0);
                        self.take(device, span, ALIGN)?
                    }
                };
                let p = self.pools.get_mut(&pool).expect("checked above");
                p.reserved += span as u64;
                p.reserved_high = p.reserved_high.max(p.reserved);
                (at, span)
            }
        };
        let p = self.pools.get_mut(&pool).expect("checked above");
        p.used += span as u64;
        p.used_high = p.used_high.max(p.used);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let a = Alloc {
            size,
            span,
            device: p.device,
            ctx: ctx_handle(ctx),
            kind: Kind::Pool(pool),
            freeing: false,
            id,
        };
        self.allocs.insert(at, a);
        Ok(at)
    }

    fn default_pool(&mut self, device: u32) -> usize {
        if let Some(&h) = self.default_pools.get(&device) {
            return h;
        }
        let h = new_pool_handle();
        self.pools.insert(h, Pool::new(device, 0));
        self.default_pools.insert(device, h);
        h
    }

    fn current_pool(&mut self, device: u32) -> usize {
        match self.current_pools.get(&device) {
            Some(&h) if self.pools.contains_key(&h) => h,
            _ => self.default_pool(device),
        }
    }

    /// Drops a physical allocation once released and unmapped everywhere.
    fn maybe_drop_physical(&mut self, handle: u64) {
        if self
            .physical
            .get(&handle)
            .is_some_and(|p| p.refs == 0 && p.maps == 0)
        {
            if let Some(p) = self.physical.remove(&handle) {
                uncharge(p.device, p.size);
            }
        }
    }
}

fn ctx_handle(ctx: &Context) -> usize {
    crate::context::handle_of(ctx) as usize
}

fn new_pool_handle() -> usize {
    // Opaque, non-NULL, never reused.
    0x5100_0000 + NEXT_ID.fetch_add(1, Ordering::Relaxed) as usize * 0x10
}

// ---- Interface for the other modules ----

/// Host address backing [ptr, ptr+len) when it lies inside one live allocation, a run of VMM
/// mappings, or pinned host memory (which is device-accessible); else INVALID_VALUE.
pub fn device_range(ptr: CUdeviceptr, len: usize) -> Result<*mut u8, CUerror> {
    let p = ptr as usize;
    let end = p.checked_add(len).ok_or(CUerror::INVALID_VALUE)?;
    if p == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let m = mem();
    if let Some((base, a)) = m.find(p) {
        return if end <= base + a.size {
            Ok(p as *mut u8)
        } else {
            Err(CUerror::INVALID_VALUE)
        };
    }
    // VMM: contiguous mappings must cover the whole range.
    let mut at = p;
    while let Some((&base, map)) = m.mappings.range(..=at).next_back() {
        if at >= base + map.size {
            break;
        }
        at = base + map.size;
        if at >= end {
            return Ok(p as *mut u8);
        }
    }
    drop(m);
    if is_pinned_host(p as *const u8, len) {
        return Ok(p as *mut u8);
    }
    Err(CUerror::INVALID_VALUE)
}

/// Stream/context synchronize: pools of the context's device release idle memory above their
/// release threshold, as the real driver does at synchronization points.
pub fn on_synchronize(ctx: &Context) {
    let mut m = mem();
    let pools: Vec<(usize, u64)> = m
        .pools
        .iter()
        .filter(|(_, p)| p.device == ctx.device)
        .map(|(&h, p)| (h, p.release_threshold))
        .collect();
    for (h, threshold) in pools {
        m.trim(h, threshold);
    }
}

/// A context is going away: everything allocated in it is freed.
pub fn on_context_destroyed(ctx: &Context) {
    let h = ctx_handle(ctx);
    let mut m = mem();
    let mine: Vec<usize> = m
        .allocs
        .iter()
        .filter(|(_, a)| a.ctx == h)
        .map(|(&b, _)| b)
        .collect();
    for b in mine {
        m.free(b);
    }
    drop(m);
    on_synchronize(ctx);
}

pub fn default_pool(device: u32) -> CUmemoryPool {
    mem().default_pool(device) as CUmemoryPool
}

pub fn current_pool(device: u32) -> CUmemoryPool {
    mem().current_pool(device) as CUmemoryPool
}

pub fn set_current_pool(device: u32, pool: CUmemoryPool) -> CUresult {
    let mut m = mem();
    match m.pools.get(&(pool as usize)) {
        Some(p) if p.device == device => {
            m.current_pools.insert(device, pool as usize);
            Ok(())
        }
        _ => Err(CUerror::INVALID_VALUE),
    }
}

/// Whether [ptr, ptr+len) is page-locked host memory (cuMemAllocHost / cuMemHostAlloc /
/// cuMemHostRegister): copies from/to it may be truly asynchronous.
pub fn is_pinned_host(ptr: *const u8, len: usize) -> bool {
    let p = ptr as usize;
    let pinned = lock(pinned());
    pinned
        .range(..=p)
        .next_back()
        .is_some_and(|(&b, h)| p.saturating_add(len) <= b + h.size)
}

/// The base address of a CUDA array (its storage), for copies.
pub fn array_storage(array: CUarray) -> Result<(usize, CUDA_ARRAY3D_DESCRIPTOR), CUerror> {
    let m = mem();
    match m.allocs.get(&(array as usize)) {
        Some(Alloc {
            kind: Kind::Array(d),
            ..
        }) => Ok((array as usize, *d)),
        _ => Err(CUerror::INVALID_HANDLE),
    }
}

/// Bytes per element of a CUDA array format.
pub fn format_bytes(format: u32) -> Option<usize> {
    Some(match format {
        0x01 | 0x08 | 0xc0 | 0xc6 => 1,
        0x02 | 0x09 | 0x10 | 0xc1 | 0xc3 | 0xc7 | 0xc9 => 2,
        0x03 | 0x0a | 0x20 | 0xc2 | 0xc4 | 0xc8 | 0xca | 0x50 => 4,
        0xc5 | 0xcb => 8,
        _ => return None,
    })
}

mod alloc;
mod array;
mod host;
mod ipc;
mod pointer;
mod pool;
mod space;
mod vmm;

pub use self::{alloc::*, array::*, host::*, ipc::*, pointer::*, pool::*, vmm::*};
use host::pinned;
use pool::Pool;
use space::Space;
