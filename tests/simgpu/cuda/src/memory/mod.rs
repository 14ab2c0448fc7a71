//! Device memory, backed by host memory so that copies and kernels really move data.
//!
//! The process reserves one large private address range (`MAP_NORESERVE`, so untouched pages cost
//! nothing) and hands device addresses out of it: a device pointer *is* the host address backing it,
//! which gives unified addressing for free. Capacity is device-wide across processes: every byte a
//! process holds is charged to `simgpu_core::Shared` before it is handed out, and released after.
//!
//! Also here: stream-ordered pools, the VMM API (memfd-backed physical allocations mapped with
//! `MAP_FIXED`), CUDA arrays (storage only) and pinned host memory.

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

// ---- Address space ----

/// First-fit allocator over the process's reserved address range.
struct Space {
    free: BTreeMap<usize, usize>,
}

impl Space {
    fn new() -> Result<Space, CUerror> {
        // Twice every device's capacity (fragmentation headroom), plus the same again for VMM.
        let devices = simgpu_core::physical_devices();
        let cap: usize = devices.iter().map(|d| d.total_memory as usize).sum();
        let max = devices
            .iter()
            .map(|d| d.total_memory as usize)
            .max()
            .unwrap_or(0);
        let size = round_up(
            cap.saturating_mul(2).saturating_add(max.saturating_mul(2)),
            GRANULARITY,
        )
        .ok_or(CUerror::OUT_OF_MEMORY)?
        .max(GRANULARITY)
            + GRANULARITY;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(CUerror::OUT_OF_MEMORY);
        }
        // Start on a 2 MiB boundary so VMM reservations can be aligned; keep address 0 out.
        let start = round_up(base as usize, GRANULARITY).ok_or(CUerror::OUT_OF_MEMORY)?;
        let end = base as usize + size;
        let mut free = BTreeMap::new();
        free.insert(start, end - start);
        Ok(Space { free })
    }

    fn alloc(&mut self, size: usize, align: usize) -> Option<usize> {
        let (start, len, at) = self.free.iter().find_map(|(&start, &len)| {
            let at = round_up(start, align)?;
            (at.checked_add(size)? <= start + len).then_some((start, len, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + size < start + len {
            self.free.insert(at + size, start + len - at - size);
        }
        Some(at)
    }

    /// Takes exactly [at, at+size) if it is free (a VMM address hint).
    fn alloc_at(&mut self, at: usize, size: usize) -> bool {
        let Some((&start, &len)) = self.free.range(..=at).next_back() else {
            return false;
        };
        if at.checked_add(size).is_none_or(|e| e > start + len) {
            return false;
        }
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + size < start + len {
            self.free.insert(at + size, start + len - at - size);
        }
        true
    }

    /// Returns a range: its pages are dropped (zero on reuse, no resident memory) and it coalesces.
    fn release(&mut self, mut at: usize, mut size: usize) {
        // SAFETY: the range lies inside our own reservation and nothing refers to it any more.
        unsafe { libc::madvise(at as *mut c_void, size, libc::MADV_DONTNEED) };
        if let Some((&s, &l)) = self.free.range(..at).next_back() {
            if s + l == at {
                self.free.remove(&s);
                at = s;
                size += l;
            }
        }
        if let Some(&l) = self.free.get(&(at + size)) {
            self.free.remove(&(at + size));
            size += l;
        }
        self.free.insert(at, size);
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

struct Pool {
    device: u32,
    release_threshold: u64,
    max_size: usize,
    reserved: u64,
    reserved_high: u64,
    used: u64,
    used_high: u64,
    /// Freed blocks still reserved by the pool: (address, span).
    idle: Vec<(usize, usize)>,
    /// Blocks freed on a stream whose free has not run yet: (address, span, stream id). As with the
    /// real driver, a later allocation on the same stream may reuse them at once (stream order makes
    /// it safe); other streams wait until the free has run.
    pending: Vec<(usize, usize, u64)>,
    follow_event_deps: i32,
    allow_opportunistic: i32,
    allow_internal_deps: i32,
}

impl Pool {
    fn new(device: u32, max_size: usize) -> Pool {
        Pool {
            device,
            release_threshold: 0,
            max_size,
            reserved: 0,
            reserved_high: 0,
            used: 0,
            used_high: 0,
            idle: Vec::new(),
            pending: Vec::new(),
            follow_event_deps: 1,
            allow_opportunistic: 1,
            allow_internal_deps: 1,
        }
    }
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

// ---- cuMemAlloc family ----

fn mem_alloc(dptr: Option<&mut CUdeviceptr>, size: usize, kind: Kind) -> CUresult {
    let ctx = crate::context::current()?;
    let dptr = crate::out(dptr)?;
    if size == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let span = round_up(size, ALIGN).ok_or(CUerror::OUT_OF_MEMORY)?;
    *dptr = mem().alloc(&ctx, size, span, ALIGN, kind)? as CUdeviceptr;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: Option<&mut CUdeviceptr>, size: usize) -> CUresult {
    crate::call("cuMemAlloc_v2", || {
        // Not stream-ordered: prohibited while a capture is going on (see graph.rs).
        crate::graph::check_unsafe_call()?;
        mem_alloc(dptr, size, Kind::Device)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: Option<&mut u32>, size: c_uint) -> CUresult {
    crate::call("cuMemAlloc", || {
        let dptr = crate::out(dptr)?;
        let mut p: CUdeviceptr = 0;
        mem_alloc(Some(&mut p), size as usize, Kind::Device)?;
        // The 32-bit API cannot name a 64-bit address: undo and fail as an old driver would.
        match u32::try_from(p) {
            Ok(v) => {
                *dptr = v;
                Ok(())
            }
            Err(_) => {
                mem().free(p as usize);
                Err(CUerror::OUT_OF_MEMORY)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemAllocManaged", || {
        if flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST {
            return Err(CUerror::INVALID_VALUE);
        }
        // Counted as device memory: simgpu has no host/device migration.
        mem_alloc(dptr, size, Kind::Managed)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: Option<&mut CUdeviceptr>,
    pitch: Option<&mut usize>,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    crate::call("cuMemAllocPitch_v2", || {
        let ctx = crate::context::current()?;
        let (dptr, pitch) = (crate::out(dptr)?, crate::out(pitch)?);
        if !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        let row = round_up(width, PITCH_ALIGN).ok_or(CUerror::INVALID_VALUE)?;
        let size = row.checked_mul(height).ok_or(CUerror::OUT_OF_MEMORY)?;
        let span = round_up(size, ALIGN).ok_or(CUerror::OUT_OF_MEMORY)?;
        *dptr = mem().alloc(&ctx, size, span, ALIGN, Kind::Device)? as CUdeviceptr;
        *pitch = row;
        Ok(())
    })
}

fn mem_free(ptr: CUdeviceptr) -> CUresult {
    crate::context::current()?;
    if ptr == 0 {
        return Ok(());
    }
    // Freeing waits for the device, as the real cuMemFree does.
    if let Ok(s) = crate::stream::resolve(std::ptr::null_mut(), false) {
        let _ = crate::stream::synchronize(&s);
    }
    let mut m = mem();
    match m.allocs.get(&(ptr as usize)) {
        Some(a) if !a.freeing && matches!(a.kind, Kind::Device | Kind::Managed | Kind::Pool(_)) => {
            m.free(ptr as usize);
            Ok(())
        }
        _ => Err(CUerror::INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    crate::call("cuMemFree_v2", || {
        crate::graph::check_unsafe_call()?;
        if let Some(a) = crate::graph_memory::lookup(ptr) {
            crate::graph_memory::release(&a);
            return Ok(());
        }
        mem_free(ptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree(ptr: u32) -> CUresult {
    crate::call("cuMemFree", || mem_free(ptr as CUdeviceptr))
}

/// The current context's device: (free, total).
fn mem_info() -> Result<(u64, u64), CUerror> {
    let ctx = crate::context::current()?;
    let s = shared()?;
    let cap = s.device_capacity(ctx.device);
    Ok((cap.saturating_sub(s.device_used(ctx.device)), cap))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(
    free: Option<&mut usize>,
    total: Option<&mut usize>,
) -> CUresult {
    crate::call("cuMemGetInfo_v2", || {
        let (free, total) = (crate::out(free)?, crate::out(total)?);
        let (f, t) = mem_info()?;
        (*free, *total) = (f as usize, t as usize);
        Ok(())
    })
}

/// The legacy 32-bit entry point (what a binary built against CUDA < 3.2 calls, and what
/// `cuGetProcAddress("cuMemGetInfo", ..., version < 3020)` returns): saturates rather than wrapping,
/// as `cuDeviceTotalMem` does.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: Option<&mut u32>, total: Option<&mut u32>) -> CUresult {
    crate::call("cuMemGetInfo", || {
        let (free, total) = (crate::out(free)?, crate::out(total)?);
        let (f, t) = mem_info()?;
        let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        (*free, *total) = (narrow(f), narrow(t));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: Option<&mut CUdeviceptr>,
    size: Option<&mut usize>,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuMemGetAddressRange_v2", || {
        crate::context::current()?;
        let m = mem();
        let (b, s) = match m.find(ptr as usize) {
            Some((b, a)) => (b, a.size),
            None => {
                let (&b, map) = m
                    .mappings
                    .range(..=ptr as usize)
                    .next_back()
                    .ok_or(CUerror::NOT_FOUND)?;
                if ptr as usize >= b + map.size {
                    return Err(CUerror::NOT_FOUND);
                }
                (b, map.size)
            }
        };
        if let Some(base) = base {
            *base = b as CUdeviceptr;
        }
        if let Some(size) = size {
            *size = s;
        }
        Ok(())
    })
}

// ---- Pinned host memory ----

struct Pinned {
    size: usize,
    /// Allocated by us (cuMemAllocHost/cuMemHostAlloc) rather than registered.
    owned: bool,
    flags: u32,
}

fn pinned() -> &'static Mutex<BTreeMap<usize, Pinned>> {
    static P: OnceLock<Mutex<BTreeMap<usize, Pinned>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

fn host_alloc(pp: Option<&mut *mut c_void>, size: usize, flags: u32) -> CUresult {
    crate::context::current()?;
    let pp = crate::out(pp)?;
    if size == 0
        || flags
            & !(CU_MEMHOSTALLOC_PORTABLE
                | CU_MEMHOSTALLOC_DEVICEMAP
                | CU_MEMHOSTALLOC_WRITECOMBINED)
            != 0
    {
        return Err(CUerror::INVALID_VALUE);
    }
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUerror::OUT_OF_MEMORY);
    }
    lock(pinned()).insert(
        p as usize,
        Pinned {
            size,
            owned: true,
            flags,
        },
    );
    *pp = p;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: Option<&mut *mut c_void>, size: usize) -> CUresult {
    crate::call("cuMemAllocHost_v2", || host_alloc(pp, size, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost(pp: Option<&mut *mut c_void>, size: c_uint) -> CUresult {
    crate::call("cuMemAllocHost", || host_alloc(pp, size as usize, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: Option<&mut *mut c_void>,
    size: usize,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemHostAlloc", || host_alloc(pp, size, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    crate::call("cuMemFreeHost", || {
        crate::context::current()?;
        let mut pinned = lock(pinned());
        match pinned.get(&(p as usize)) {
            Some(h) if h.owned => {
                let size = h.size;
                pinned.remove(&(p as usize));
                // SAFETY: the mapping was created by host_alloc with this size and is no longer tracked.
                unsafe { libc::munmap(p, size) };
                Ok(())
            }
            _ => Err(CUerror::INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemHostRegister_v2", || {
        crate::context::current()?;
        let all = CU_MEMHOSTREGISTER_PORTABLE
            | CU_MEMHOSTREGISTER_DEVICEMAP
            | CU_MEMHOSTREGISTER_IOMEMORY
            | CU_MEMHOSTREGISTER_READ_ONLY;
        if p.is_null() || size == 0 || flags & !all != 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        let start = p as usize;
        let end = start.checked_add(size).ok_or(CUerror::INVALID_VALUE)?;
        let mut pinned = lock(pinned());
        let overlaps = pinned
            .range(..end)
            .next_back()
            .is_some_and(|(&b, h)| b + h.size > start);
        if overlaps {
            return Err(CUerror::HOST_MEMORY_ALREADY_REGISTERED);
        }
        pinned.insert(
            start,
            Pinned {
                size,
                owned: false,
                flags,
            },
        );
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    crate::call("cuMemHostUnregister", || {
        crate::context::current()?;
        let mut pinned = lock(pinned());
        match pinned.get(&(p as usize)) {
            Some(h) if !h.owned => {
                pinned.remove(&(p as usize));
                Ok(())
            }
            _ => Err(CUerror::HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: Option<&mut CUdeviceptr>,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    crate::call("cuMemHostGetDevicePointer_v2", || {
        crate::context::current()?;
        let dptr = crate::out(dptr)?;
        if flags != 0 || !is_pinned_host(p as *const u8, 1) {
            return Err(CUerror::INVALID_VALUE);
        }
        // Unified addressing: the device sees pinned memory at its host address.
        *dptr = p as CUdeviceptr;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: Option<&mut c_uint>, p: *mut c_void) -> CUresult {
    crate::call("cuMemHostGetFlags", || {
        crate::context::current()?;
        let flags = crate::out(flags)?;
        let pinned = lock(pinned());
        let (_, h) = pinned
            .range(..=p as usize)
            .next_back()
            .filter(|(&b, h)| (p as usize) < b + h.size)
            .ok_or(CUerror::INVALID_VALUE)?;
        *flags = h.flags;
        Ok(())
    })
}

// ---- Pointer attributes ----

/// # Safety
/// `data` must be valid for a write of `T`.
unsafe fn put<T>(data: *mut c_void, v: T) {
    // SAFETY: per the caller.
    unsafe { data.cast::<T>().write_unaligned(v) }
}

/// What simgpu knows of the allocation holding an address.
struct PointerInfo {
    memory_type: u32,
    ctx: usize,
    device: u32,
    base: usize,
    size: usize,
    managed: bool,
    id: u64,
    pool: usize,
}

fn pointer_info(p: usize) -> Option<PointerInfo> {
    let m = mem();
    if let Some((b, a)) = m.find(p) {
        let pool = if let Kind::Pool(h) = a.kind { h } else { 0 };
        return Some(PointerInfo {
            memory_type: CU_MEMORYTYPE_DEVICE,
            ctx: a.ctx,
            device: a.device,
            base: b,
            size: a.size,
            managed: a.kind == Kind::Managed,
            id: a.id,
            pool,
        });
    }
    if let Some((&b, map)) = m
        .mappings
        .range(..=p)
        .next_back()
        .filter(|(&b, mp)| p < b + mp.size)
    {
        return Some(PointerInfo {
            memory_type: CU_MEMORYTYPE_DEVICE,
            ctx: 0,
            device: m.physical.get(&map.handle).map_or(0, |ph| ph.device),
            base: b,
            size: map.size,
            managed: false,
            id: map.handle,
            pool: 0,
        });
    }
    drop(m);
    let pinned = lock(pinned());
    let (base, size) = pinned
        .range(..=p)
        .next_back()
        .filter(|(&b, h)| p < b + h.size)
        .map(|(&b, h)| (b, h.size))?;
    let current = crate::context::current().ok();
    Some(PointerInfo {
        memory_type: CU_MEMORYTYPE_HOST,
        ctx: current.as_ref().map_or(0, |c| ctx_handle(c)),
        device: current.map_or(0, |c| c.device),
        base,
        size,
        managed: false,
        id: base as u64,
        pool: 0,
    })
}

const CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
const CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: u32 = 14;
const CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: u32 = 15;
const CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: u32 = 16;
/// `CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE`.
const ACCESS_READWRITE: u32 = 3;

/// Writes one attribute of `ptr` (`info`: its allocation, `None` when it is none of simgpu's) to
/// `data`. `Err(INVALID_VALUE)` for an unknown attribute or one that does not apply to the pointer;
/// with `defaults` (`cuPointerGetAttributes`), an attribute that does not apply is written as its
/// type's zero instead.
///
/// # Safety
/// `data` is valid for a write of the attribute's documented type.
unsafe fn put_pointer_attribute(
    data: *mut c_void,
    attr: u32,
    ptr: CUdeviceptr,
    info: Option<&PointerInfo>,
    defaults: bool,
) -> CUresult {
    // (the attribute's value, or None when it does not apply) per attribute, by type.
    macro_rules! answer {
        ($ty:ty, $v:expr) => {{
            let v: Option<$ty> = $v;
            match (v, defaults) {
                // SAFETY: per the caller.
                (Some(v), _) => unsafe { put(data, v) },
                // SAFETY: per the caller.
                (None, true) => unsafe { put(data, <$ty>::default()) },
                (None, false) => return Err(CUerror::INVALID_VALUE),
            }
        }};
    }
    match attr {
        CU_POINTER_ATTRIBUTE_CONTEXT => answer!(usize, info.map(|i| i.ctx)),
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE => answer!(u32, info.map(|i| i.memory_type)),
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER => answer!(u64, info.map(|_| ptr)),
        CU_POINTER_ATTRIBUTE_HOST_POINTER => answer!(
            usize,
            info.filter(|i| i.memory_type == CU_MEMORYTYPE_HOST || i.managed)
                .map(|_| ptr as usize)
        ),
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => answer!(u32, info.map(|_| 0)),
        CU_POINTER_ATTRIBUTE_BUFFER_ID => answer!(u64, info.map(|i| i.id)),
        CU_POINTER_ATTRIBUTE_IS_MANAGED => answer!(u32, info.map(|i| u32::from(i.managed))),
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
            answer!(i32, info.map(|i| crate::device::visible_ordinal(i.device)))
        }
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => answer!(
            u32,
            info.map(|i| u32::from(
                i.memory_type == CU_MEMORYTYPE_DEVICE && i.pool == 0 && !i.managed
            ))
        ),
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => answer!(u64, info.map(|i| i.base as u64)),
        CU_POINTER_ATTRIBUTE_RANGE_SIZE => answer!(usize, info.map(|i| i.size)),
        CU_POINTER_ATTRIBUTE_MAPPED => answer!(u32, info.map(|_| 1)),
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES => answer!(u64, info.map(|_| 0)),
        CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE => answer!(u32, info.map(|_| 0)),
        CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => answer!(u32, info.map(|_| ACCESS_READWRITE)),
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => answer!(usize, info.map(|i| i.pool)),
        _ => return Err(CUerror::INVALID_VALUE),
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuPointerGetAttribute", || {
        crate::entry::initialized()?;
        if data.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let info = pointer_info(ptr as usize).ok_or(CUerror::INVALID_VALUE)?;
        // SAFETY: the client passes storage of the attribute's documented type.
        unsafe { put_pointer_attribute(data, attr, ptr, Some(&info), false) }
    })
}

/// Several attributes at once. Unlike `cuPointerGetAttribute`, an address simgpu does not know (or
/// an attribute that does not apply to it) is no error: its attributes are written as NULL/0, as
/// NVIDIA documents.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attrs: *const c_uint,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuPointerGetAttributes", || {
        crate::entry::initialized()?;
        if count == 0 || attrs.is_null() || data.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let info = pointer_info(ptr as usize);
        for i in 0..count as usize {
            // SAFETY: the client passes `count` attributes and as many data pointers.
            let (attr, out) = unsafe { (*attrs.add(i), *data.add(i)) };
            if out.is_null() {
                return Err(CUerror::INVALID_VALUE);
            }
            // SAFETY: each data pointer is storage of its attribute's documented type.
            unsafe { put_pointer_attribute(out, attr, ptr, info.as_ref(), true) }?;
        }
        Ok(())
    })
}

// ---- Pools ----

fn pool_handle(pool: CUmemoryPool) -> Result<usize, CUerror> {
    let h = pool as usize;
    if mem().pools.contains_key(&h) {
        Ok(h)
    } else {
        Err(CUerror::INVALID_VALUE)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: Option<&mut CUmemoryPool>,
    props: Option<&CUmemPoolProps>,
) -> CUresult {
    crate::call("cuMemPoolCreate", || {
        crate::entry::initialized()?;
        let (pool, props) = (crate::out(pool)?, props.ok_or(CUerror::INVALID_VALUE)?);
        if props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED
            || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUerror::INVALID_VALUE);
        }
        let device =
            crate::device::physical(props.location.id).map_err(|_| CUerror::INVALID_VALUE)?;
        let h = new_pool_handle();
        mem().pools.insert(h, Pool::new(device, props.maxSize));
        *pool = h as CUmemoryPool;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    crate::call("cuMemPoolDestroy", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        let mut m = mem();
        if m.default_pools.values().any(|&d| d == h) {
            return Err(CUerror::INVALID_VALUE);
        }
        m.current_pools.retain(|_, c| *c != h);
        // Frees still in flight: their blocks go back with the pool (the driver releases them
        // once nothing is outstanding).
        if let Some(p) = m.pools.get_mut(&h) {
            let pending = std::mem::take(&mut p.pending);
            p.idle
                .extend(pending.into_iter().map(|(at, span, _)| (at, span)));
        }
        m.trim(h, 0);
        // Blocks still allocated from it are returned when freed (the pool is gone).
        m.pools.remove(&h);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    crate::call("cuMemPoolTrimTo", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        mem().trim(h, keep as u64);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    crate::call("cuMemPoolSetAttribute", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        if value.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let mut m = mem();
        let p = m.pools.get_mut(&h).ok_or(CUerror::INVALID_VALUE)?;
        // SAFETY: (all reads) the client passes a value of the attribute's documented type.
        unsafe {
            match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => {
                    p.follow_event_deps = *value.cast::<i32>()
                }
                CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => {
                    p.allow_opportunistic = *value.cast::<i32>()
                }
                CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    p.allow_internal_deps = *value.cast::<i32>()
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = *value.cast::<u64>(),
                // The high-water marks can only be reset (to 0 -> the current value).
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if *value.cast::<u64>() == 0 => {
                    p.reserved_high = p.reserved
                }
                CU_MEMPOOL_ATTR_USED_MEM_HIGH if *value.cast::<u64>() == 0 => p.used_high = p.used,
                _ => return Err(CUerror::INVALID_VALUE),
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    crate::call("cuMemPoolGetAttribute", || {
        crate::entry::initialized()?;
        let h = pool_handle(pool)?;
        if value.is_null() {
            return Err(CUerror::INVALID_VALUE);
        }
        let m = mem();
        let p = m.pools.get(&h).ok_or(CUerror::INVALID_VALUE)?;
        // SAFETY: (all writes) the client passes storage of the attribute's documented type.
        unsafe {
            match attr {
                CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => put(value, p.follow_event_deps),
                CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => put(value, p.allow_opportunistic),
                CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                    put(value, p.allow_internal_deps)
                }
                CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => put(value, p.release_threshold),
                // SIMGPU_POOL_ATTRIBUTES_ZERO: a driver whose pool figures cannot be trusted.
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
                | CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH
                | CU_MEMPOOL_ATTR_USED_MEM_CURRENT
                | CU_MEMPOOL_ATTR_USED_MEM_HIGH
                    if simgpu_core::config().pool_attributes_zero =>
                {
                    put(value, 0u64)
                }
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => put(value, p.reserved),
                CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => put(value, p.reserved_high),
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT => put(value, p.used),
                CU_MEMPOOL_ATTR_USED_MEM_HIGH => put(value, p.used_high),
                CU_MEMPOOL_ATTR_ALLOCATION_TYPE => put(value, CU_MEM_ALLOCATION_TYPE_PINNED),
                CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES => put(value, CU_MEM_HANDLE_TYPE_NONE),
                CU_MEMPOOL_ATTR_LOCATION_ID => put(value, crate::device::visible_ordinal(p.device)),
                CU_MEMPOOL_ATTR_LOCATION_TYPE => put(value, CU_MEM_LOCATION_TYPE_DEVICE),
                CU_MEMPOOL_ATTR_MAX_POOL_SIZE => put(value, p.max_size as u64),
                _ => return Err(CUerror::INVALID_VALUE),
            }
        }
        Ok(())
    })
}

/// Allocates from `pool` (NULL: the device's current pool) at call time; the stream is validated
/// and the pointer is usable in stream order (it already is, so nothing is enqueued).
fn alloc_async(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
    per_thread: bool,
) -> CUresult {
    crate::context::current()?;
    let dptr = crate::out(dptr)?;
    let s = crate::stream::resolve(stream, per_thread)?;
    if size == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    // NVIDIA's cuMemAllocAsync: the memory comes from "the current mempool of the provided stream's
    // device", which need not be the current context's.
    let ctx = s.context()?;
    if let Some(c) = s.capture() {
        // Captured: an allocation node, with no memory until the graph is launched.
        *dptr = crate::graph_memory::captured_alloc(&c, s.device(), size)? as CUdeviceptr;
        return Ok(());
    }
    let mut m = mem();
    let h = match pool {
        Some(p) => {
            let h = p as usize;
            if !m.pools.contains_key(&h) {
                return Err(CUerror::INVALID_VALUE);
            }
            h
        }
        None => m.current_pool(s.device()),
    };
    *dptr = m.pool_alloc(&ctx, h, size, s.id())? as CUdeviceptr;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocAsync", || {
        alloc_async(dptr, size, None, stream, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocAsync_ptsz", || {
        alloc_async(dptr, size, None, stream, true)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocFromPoolAsync", || {
        alloc_async(dptr, size, Some(pool), stream, false)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: Option<&mut CUdeviceptr>,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    crate::call("cuMemAllocFromPoolAsync_ptsz", || {
        alloc_async(dptr, size, Some(pool), stream, true)
    })
}

fn free_async(ptr: CUdeviceptr, stream: CUstream, per_thread: bool) -> CUresult {
    crate::context::current()?;
    let s = crate::stream::resolve(stream, per_thread)?;
    if let Some(a) = crate::graph_memory::lookup(ptr) {
        return crate::graph_memory::free_async(a, &s);
    }
    let base = ptr as usize;
    {
        let mut m = mem();
        let pool = match m.allocs.get_mut(&base) {
            Some(a)
                if !a.freeing && matches!(a.kind, Kind::Device | Kind::Managed | Kind::Pool(_)) =>
            {
                a.freeing = true;
                match a.kind {
                    Kind::Pool(h) => Some((h, a.span)),
                    _ => None,
                }
            }
            _ => return Err(CUerror::INVALID_VALUE),
        };
        if let Some((h, span)) = pool {
            // The block is the pool's again for this stream at once, for every stream once the
            // free has run (see `Pool::pending`).
            if m.pools.contains_key(&h) {
                m.allocs.remove(&base);
                let p = m.pools.get_mut(&h).expect("present");
                p.used -= span as u64;
                p.pending.push((base, span, s.id()));
                drop(m);
                return crate::stream::enqueue(
                    &s,
                    Box::new(move || {
                        let mut m = mem();
                        if let Some(p) = m.pools.get_mut(&h) {
                            // What is left of the block (the stream may have reused part of it
                            // meanwhile: see `pool_alloc`) is every stream's now.
                            let freed = base..base + span;
                            let mut done = Vec::new();
                            p.pending.retain(|b| {
                                let ran = freed.contains(&b.0);
                                if ran {
                                    done.push((b.0, b.1));
                                }
                                !ran
                            });
                            p.idle.extend(done);
                        }
                    }),
                );
            }
        }
    }
    crate::stream::enqueue(&s, Box::new(move || mem().free(base)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    crate::call("cuMemFreeAsync", || free_async(ptr, stream, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, stream: CUstream) -> CUresult {
    crate::call("cuMemFreeAsync_ptsz", || free_async(ptr, stream, true))
}

// ---- Virtual memory management ----

fn check_prop(prop: Option<&CUmemAllocationProp>) -> Result<u32, CUerror> {
    let prop = prop.ok_or(CUerror::INVALID_VALUE)?;
    if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUerror::INVALID_VALUE);
    }
    crate::device::physical(prop.location.id).map_err(|_| CUerror::INVALID_DEVICE)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: Option<&mut usize>,
    prop: Option<&CUmemAllocationProp>,
    _option: c_uint,
) -> CUresult {
    crate::call("cuMemGetAllocationGranularity", || {
        crate::entry::initialized()?;
        let granularity = crate::out(granularity)?;
        check_prop(prop)?;
        *granularity = GRANULARITY;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: Option<&mut CUmemGenericAllocationHandle>,
    size: usize,
    prop: Option<&CUmemAllocationProp>,
    flags: u64,
) -> CUresult {
    crate::call("cuMemCreate", || {
        crate::context::current()?;
        let handle = crate::out(handle)?;
        let device = check_prop(prop)?;
        if flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUerror::INVALID_VALUE);
        }
        charge(device, size)?;
        // A memfd so that every mapping of the allocation aliases the same pages.
        // SAFETY: plain syscalls on a name we own; the fd is wrapped at once.
        let fd = unsafe { libc::memfd_create(c"simgpu-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            uncharge(device, size);
            return Err(CUerror::OUT_OF_MEMORY);
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: resizing our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            uncharge(device, size);
            return Err(CUerror::OUT_OF_MEMORY);
        }
        let h = 0xc0de_0000_0000 + NEXT_ID.fetch_add(1, Ordering::Relaxed);
        mem().physical.insert(
            h,
            Physical {
                fd,
                size,
                device,
                refs: 1,
                maps: 0,
            },
        );
        *handle = h;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    crate::call("cuMemRelease", || {
        crate::entry::initialized()?;
        let mut m = mem();
        match m.physical.get_mut(&handle) {
            Some(p) if p.refs > 0 => p.refs -= 1,
            _ => return Err(CUerror::INVALID_VALUE),
        }
        m.maybe_drop_physical(handle);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: Option<&mut CUmemGenericAllocationHandle>,
    addr: *mut c_void,
) -> CUresult {
    crate::call("cuMemRetainAllocationHandle", || {
        crate::entry::initialized()?;
        let handle = crate::out(handle)?;
        let p = addr as usize;
        let mut m = mem();
        let h = m
            .mappings
            .range(..=p)
            .next_back()
            .filter(|(&b, map)| p < b + map.size)
            .map(|(_, map)| map.handle)
            .ok_or(CUerror::INVALID_VALUE)?;
        m.physical.get_mut(&h).ok_or(CUerror::INVALID_VALUE)?.refs += 1;
        *handle = h;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: Option<&mut CUdeviceptr>,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: u64,
) -> CUresult {
    crate::call("cuMemAddressReserve", || {
        crate::entry::initialized()?;
        let ptr = crate::out(ptr)?;
        if size == 0
            || !size.is_multiple_of(GRANULARITY)
            || flags != 0
            || (alignment != 0 && !alignment.is_power_of_two())
        {
            return Err(CUerror::INVALID_VALUE);
        }
        let align = alignment.max(GRANULARITY);
        let mut m = mem();
        let space = m.space()?;
        // The requested address is a hint, as in the driver.
        let at = if addr != 0
            && (addr as usize).is_multiple_of(align)
            && space.alloc_at(addr as usize, size)
        {
            addr as usize
        } else {
            space.alloc(size, align).ok_or(CUerror::OUT_OF_MEMORY)?
        };
        m.reservations.insert(at, size);
        *ptr = at as CUdeviceptr;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    crate::call("cuMemAddressFree", || {
        crate::entry::initialized()?;
        let at = ptr as usize;
        let mut m = mem();
        if m.reservations.get(&at) != Some(&size) {
            return Err(CUerror::INVALID_VALUE);
        }
        if m.mappings.range(at..at + size).next().is_some() {
            // Still mapped: the driver requires cuMemUnmap first.
            return Err(CUerror::INVALID_VALUE);
        }
        m.reservations.remove(&at);
        if let Some(s) = m.space.as_mut() {
            s.release(at, size);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    crate::call("cuMemMap", || {
        crate::entry::initialized()?;
        let at = ptr as usize;
        if flags != 0
            || size == 0
            || !size.is_multiple_of(GRANULARITY)
            || !at.is_multiple_of(GRANULARITY)
            || !offset.is_multiple_of(GRANULARITY)
        {
            return Err(CUerror::INVALID_VALUE);
        }
        let end = at.checked_add(size).ok_or(CUerror::INVALID_VALUE)?;
        let mut m = mem();
        let reserved = m
            .reservations
            .range(..=at)
            .next_back()
            .is_some_and(|(&b, &s)| end <= b + s);
        let overlaps = m
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&b, mp)| b + mp.size > at);
        let phys = m
            .physical
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or(CUerror::INVALID_HANDLE)?;
        if !reserved || overlaps || offset.checked_add(size).is_none_or(|e| e > phys.size) {
            return Err(CUerror::INVALID_VALUE);
        }
        // SAFETY: [at, end) is inside a reservation of our own address range and not mapped; the
        // shared file mapping replaces the anonymous pages there.
        let r = unsafe {
            libc::mmap(
                at as *mut c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                phys.fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(CUerror::OUT_OF_MEMORY);
        }
        phys.maps += 1;
        m.mappings.insert(
            at,
            Mapping {
                size,
                handle,
                access: CU_MEM_ACCESS_FLAGS_PROT_NONE,
            },
        );
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    crate::call("cuMemUnmap", || {
        crate::entry::initialized()?;
        let at = ptr as usize;
        let end = at.checked_add(size).ok_or(CUerror::INVALID_VALUE)?;
        let mut m = mem();
        let inside: Vec<usize> = m.mappings.range(at..end).map(|(&b, _)| b).collect();
        let partial = m
            .mappings
            .range(..at)
            .next_back()
            .is_some_and(|(&b, mp)| b + mp.size > at)
            || inside.iter().any(|b| b + m.mappings[b].size > end);
        if inside.is_empty() || partial {
            return Err(CUerror::INVALID_VALUE);
        }
        for b in inside {
            let map = m.mappings.remove(&b).expect("listed above");
            // SAFETY: [b, b+size) is our own mapping; put back private anonymous pages so the
            // reservation stays backed (and keeps the address range ours).
            unsafe {
                libc::mmap(
                    b as *mut c_void,
                    map.size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if let Some(p) = m.physical.get_mut(&map.handle) {
                p.maps -= 1;
            }
            m.maybe_drop_physical(map.handle);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    crate::call("cuMemSetAccess", || {
        crate::entry::initialized()?;
        if desc.is_null() || count == 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        // SAFETY: the client passes `count` descriptors.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        for d in descs {
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUerror::INVALID_VALUE);
            }
            crate::device::physical(d.location.id).map_err(|_| CUerror::INVALID_DEVICE)?;
        }
        let flags = descs.last().map_or(0, |d| d.flags);
        let (at, end) = (
            ptr as usize,
            (ptr as usize)
                .checked_add(size)
                .ok_or(CUerror::INVALID_VALUE)?,
        );
        let mut m = mem();
        let mut covered = 0;
        for (_, map) in m.mappings.range_mut(at..end) {
            map.access = flags;
            covered += map.size;
        }
        if covered != size {
            return Err(CUerror::INVALID_VALUE);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: Option<&mut u64>,
    location: Option<&CUmemLocation>,
    ptr: CUdeviceptr,
) -> CUresult {
    crate::call("cuMemGetAccess", || {
        crate::entry::initialized()?;
        let (flags, location) = (crate::out(flags)?, location.ok_or(CUerror::INVALID_VALUE)?);
        if location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUerror::INVALID_VALUE);
        }
        let p = ptr as usize;
        let m = mem();
        let (_, map) = m
            .mappings
            .range(..=p)
            .next_back()
            .filter(|(&b, mp)| p < b + mp.size)
            .ok_or(CUerror::INVALID_VALUE)?;
        *flags = map.access as u64;
        Ok(())
    })
}

// ---- CUDA arrays ----

/// Bytes a CUDA array takes: width x max(height,1) x max(depth,1) x channels x format bytes,
/// rounded up to 2 MiB (arrays are laid out in whole large pages); for a mipmapped array the levels
/// (each dimension halved, at least 1) are summed before rounding.
fn array_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> Result<usize, CUerror> {
    let elem = format_bytes(d.Format).ok_or(CUerror::INVALID_VALUE)?;
    if !matches!(d.NumChannels, 1 | 2 | 4) || d.Width == 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let mut total: usize = 0;
    for l in 0..levels.max(1) {
        let dim = |n: usize| if n == 0 { 1 } else { (n >> l).max(1) };
        let bytes = dim(d.Width)
            .checked_mul(dim(d.Height))
            .and_then(|v| v.checked_mul(dim(d.Depth)))
            .and_then(|v| v.checked_mul(elem * d.NumChannels as usize))
            .ok_or(CUerror::OUT_OF_MEMORY)?;
        total = total.checked_add(bytes).ok_or(CUerror::OUT_OF_MEMORY)?;
    }
    round_up(total, GRANULARITY).ok_or(CUerror::OUT_OF_MEMORY)
}

fn array_create(d: CUDA_ARRAY3D_DESCRIPTOR, levels: Option<u32>) -> Result<usize, CUerror> {
    let ctx = crate::context::current()?;
    let bytes = array_bytes(&d, levels.unwrap_or(1))?;
    let kind = match levels {
        Some(l) => Kind::Mipmap(d, l),
        None => Kind::Array(d),
    };
    mem().alloc(&ctx, bytes, bytes, GRANULARITY, kind)
}

fn array_destroy(handle: usize, mipmap: bool) -> CUresult {
    crate::context::current()?;
    let mut m = mem();
    match m.allocs.get(&handle).map(|a| a.kind) {
        Some(Kind::Array(_)) if !mipmap => m.free(handle),
        Some(Kind::Mipmap(..)) if mipmap => m.free(handle),
        _ => return Err(CUerror::INVALID_HANDLE),
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    handle: Option<&mut CUarray>,
    desc: Option<&CUDA_ARRAY_DESCRIPTOR>,
) -> CUresult {
    crate::call("cuArrayCreate_v2", || {
        crate::context::current()?;
        let (handle, desc) = (crate::out(handle)?, desc.ok_or(CUerror::INVALID_VALUE)?);
        let d3 = CUDA_ARRAY3D_DESCRIPTOR {
            Width: desc.Width,
            Height: desc.Height,
            Depth: 0,
            Format: desc.Format,
            NumChannels: desc.NumChannels,
            Flags: 0,
        };
        *handle = array_create(d3, None)? as CUarray;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    handle: Option<&mut CUarray>,
    desc: Option<&CUDA_ARRAY3D_DESCRIPTOR>,
) -> CUresult {
    crate::call("cuArray3DCreate_v2", || {
        crate::context::current()?;
        let (handle, desc) = (crate::out(handle)?, desc.ok_or(CUerror::INVALID_VALUE)?);
        *handle = array_create(*desc, None)? as CUarray;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(handle: CUarray) -> CUresult {
    crate::call("cuArrayDestroy", || array_destroy(handle as usize, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(
    desc: Option<&mut CUDA_ARRAY_DESCRIPTOR>,
    handle: CUarray,
) -> CUresult {
    crate::call("cuArrayGetDescriptor_v2", || {
        crate::context::current()?;
        let desc = crate::out(desc)?;
        let (_, d) = array_storage(handle)?;
        *desc = CUDA_ARRAY_DESCRIPTOR {
            Width: d.Width,
            Height: d.Height,
            Format: d.Format,
            NumChannels: d.NumChannels,
        };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    desc: Option<&mut CUDA_ARRAY3D_DESCRIPTOR>,
    handle: CUarray,
) -> CUresult {
    crate::call("cuArray3DGetDescriptor_v2", || {
        crate::context::current()?;
        let desc = crate::out(desc)?;
        *desc = array_storage(handle)?.1;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    handle: Option<&mut CUmipmappedArray>,
    desc: Option<&CUDA_ARRAY3D_DESCRIPTOR>,
    levels: c_uint,
) -> CUresult {
    crate::call("cuMipmappedArrayCreate", || {
        crate::context::current()?;
        let (handle, desc) = (crate::out(handle)?, desc.ok_or(CUerror::INVALID_VALUE)?);
        if levels == 0 {
            return Err(CUerror::INVALID_VALUE);
        }
        *handle = array_create(*desc, Some(levels))? as CUmipmappedArray;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult {
    crate::call("cuMipmappedArrayDestroy", || {
        array_destroy(handle as usize, true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_first_fit_and_coalesce() {
        let mut s = Space {
            free: BTreeMap::from([(4096, 1 << 20)]),
        };
        let a = s.alloc(1000, 256).unwrap();
        let b = s.alloc(1000, 256).unwrap();
        assert_eq!(a, 4096);
        assert_eq!(b % 256, 0);
        assert!(b >= a + 1000);
        // Not a real mapping: skip release()'s madvise by rebuilding the free map by hand.
        assert!(s.alloc(2 << 20, 256).is_none());
    }

    #[test]
    fn array_sizes() {
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            Width: 1024,
            Height: 1024,
            Depth: 0,
            Format: 0x20,
            NumChannels: 4,
            Flags: 0,
        };
        assert_eq!(array_bytes(&d, 1).unwrap(), 16 << 20);
        let small = CUDA_ARRAY3D_DESCRIPTOR { Width: 16, ..d };
        assert_eq!(array_bytes(&small, 1).unwrap(), 2 << 20);
        assert!(array_bytes(&CUDA_ARRAY3D_DESCRIPTOR { Format: 0x77, ..d }, 1).is_err());
    }
}
