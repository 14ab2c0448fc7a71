//! The tenant's memory accounting in this process: which device a call concerns, the charge it
//! reserves in the ledger before the driver is called, and the record that returns it on free.
//!
//! Every charge follows reserve -> call the driver -> commit (record it) or roll back (release it), so
//! any number of threads and processes allocating at once never pass the limit together. Only what was
//! charged is ever released: a free of memory the shim never counted (allocated before it was active, or
//! through a path it cannot size) leaves the ledger alone.

use crate::config::{self, Config, Limit};
use crate::ledger::{Ledger, LedgerOptions, QuotaExceeded, UNLIMITED};
use crate::log;
use gpuslice_api::types::{CUcontext, CUdevice};
use gpuslice_api::{CUerror, CUresult};
use parking_lot::{Mutex, ReentrantMutex, ReentrantMutexGuard};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

/// What the shim does in this process.
pub enum Mode {
    /// Nothing is configured anywhere and there is no ledger to join: every call is the driver's own.
    Transparent,
    /// Quotas apply.
    Enforcing(Box<Tenant>),
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// The process's mode, decided once (configuration, quota file, ledger).
pub fn mode() -> &'static Mode {
    MODE.get_or_init(|| {
        let config = config::load();
        log::set_level(crate::log_level(config.log_level));
        for note in &config.notes {
            log::info(format_args!("{note}"));
        }
        for warning in &config.warnings {
            log::warn(format_args!("{warning}"));
        }
        for error in &config.errors {
            log::error(format_args!(
                "{error}; allocations on the devices it concerns are refused"
            ));
        }
        if !config.is_configured() && !config.ledger_path.exists() {
            return Mode::Transparent;
        }
        // Preloaded over a gpuslice drop-in libcuda: the drop-in enforces; counting here too would
        // charge everything twice. Finding the driver decides it, so find it now.
        if crate::driver::role() == crate::driver::Role::Preload {
            crate::driver::library_handle(crate::driver::Library::Cuda);
            if crate::driver::deferring() {
                return Mode::Transparent;
            }
        }
        Mode::Enforcing(Box::new(Tenant::new(config)))
    })
}

/// The tenant, when quotas apply.
#[inline]
pub fn tenant() -> Option<&'static Tenant> {
    match mode() {
        Mode::Enforcing(t) => Some(t),
        Mode::Transparent => None,
    }
}

/// Where a charge was made: a device of the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    pub device: usize,
    pub bytes: u64,
}

/// A physical VMM allocation: returned to the quota when released *and* unmapped everywhere.
struct Physical {
    charge: Charge,
    released: bool,
    mappings: u32,
}

/// Hashes the integer keys of the records (device pointers, handles) with one multiplication: they are
/// distinct by construction and need no protection against chosen collisions, and SipHash would be a
/// quarter of an allocation's added cost.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_i32(&mut self, n: i32) {
        self.write_u64(n as u64);
    }
}

type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// Device pointer -> charge, for the allocation hot path: open addressing with linear probing and
/// backward-shift deletion over a power-of-two table kept at most half full. Key 0 marks an empty
/// entry (no allocation lives at address 0).
#[derive(Default)]
struct ChargeTable {
    keys: Vec<u64>,
    charges: Vec<Charge>,
    len: usize,
}

impl ChargeTable {
    #[inline]
    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: the high bits of the product index the table.
        let bits = self.keys.len().trailing_zeros();
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    fn insert(&mut self, key: u64, charge: Charge) {
        if key == 0 {
            return;
        }
        if (self.len + 1) * 2 > self.keys.len() {
            self.grow();
        }
        let mask = self.keys.len() - 1;
        let mut i = self.home(key);
        loop {
            match self.keys[i] {
                0 => {
                    self.keys[i] = key;
                    self.charges[i] = charge;
                    self.len += 1;
                    return;
                }
                k if k == key => {
                    self.charges[i] = charge;
                    return;
                }
                _ => i = (i + 1) & mask,
            }
        }
    }

    fn get(&self, key: u64) -> Option<Charge> {
        if self.len == 0 || key == 0 {
            return None;
        }
        let mask = self.keys.len() - 1;
        let mut i = self.home(key);
        loop {
            match self.keys[i] {
                0 => return None,
                k if k == key => return Some(self.charges[i]),
                _ => i = (i + 1) & mask,
            }
        }
    }

    fn remove(&mut self, key: u64) -> Option<Charge> {
        if self.len == 0 || key == 0 {
            return None;
        }
        let mask = self.keys.len() - 1;
        let mut i = self.home(key);
        loop {
            match self.keys[i] {
                0 => return None,
                k if k == key => break,
                _ => i = (i + 1) & mask,
            }
        }
        let found = self.charges[i];
        // Backward shift: pull later entries of the probe run into the hole.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while self.keys[j] != 0 {
            let home = self.home(self.keys[j]);
            // Move j into the hole if its home is not in (hole, j] (cyclically).
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.keys[hole] = self.keys[j];
                self.charges[hole] = self.charges[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.keys[hole] = 0;
        self.len -= 1;
        Some(found)
    }

    #[cold]
    fn grow(&mut self) {
        let capacity = (self.keys.len() * 2).max(64);
        let keys = std::mem::replace(&mut self.keys, vec![0; capacity]);
        let charges = std::mem::replace(
            &mut self.charges,
            vec![
                Charge {
                    device: 0,
                    bytes: 0
                };
                capacity
            ],
        );
        self.len = 0;
        for (k, c) in keys.into_iter().zip(charges) {
            if k != 0 {
                self.insert(k, c);
            }
        }
    }
}

#[derive(Default)]
struct Records {
    /// Device pointer -> charge (cuMemAlloc*, pitch, managed, stream-ordered).
    allocations: ChargeTable,
    /// Array / mipmapped array handle -> charge.
    arrays: KeyMap<usize, Charge>,
    /// VMM generic allocation handle -> physical allocation.
    physical: KeyMap<u64, Physical>,
    /// Mapped VA start -> (size, handle).
    mappings: BTreeMap<u64, (u64, u64)>,
    /// Memory pool -> bytes of it charged (its reserved size as last read from the driver).
    pools: KeyMap<usize, Charge>,
    /// Created context -> charge.
    contexts: KeyMap<usize, Charge>,
    /// Device ordinal -> (primary context references, charge).
    primary: KeyMap<CUdevice, (u32, Charge)>,
}

/// One device as this process sees it.
#[derive(Clone, Debug)]
pub struct Device {
    pub ordinal: CUdevice,
    pub uuid: String,
    /// Ledger index, or why allocations on this device are refused.
    pub slot: Result<usize, String>,
}

pub struct Tenant {
    pub config: Config,
    /// Opened on first use, when the process's devices are known (a creator records their limits).
    ledger: OnceLock<Result<Ledger, String>>,
    /// Devices by ordinal, resolved once each.
    devices: [OnceLock<Device>; MAX_ORDINALS],
    /// The process sees exactly one device (then every allocation is on it): `Some(true)`.
    single_device: OnceLock<bool>,
    records: Mutex<Records>,
    /// Bytes charged per context.
    pub context_reserve: u64,
    /// When the last refusal was logged, and how many were not logged since (rate limit).
    last_refusal_log: Mutex<Option<(std::time::Instant, u32)>>,
    refusals_unlogged: std::sync::atomic::AtomicU64,
    /// Serialises the pool bookkeeping (reserve, driver call, read of the pool's size, settle): the
    /// charge is derived from the pool's size before and after, which another thread's allocation or
    /// settle must not change in between. Reentrant: a refused reservation settles the pools.
    pools_serial: ReentrantMutex<()>,
}

/// Refusal lines logged per second at most (a program retrying in a loop must not flood its log).
pub const REFUSALS_LOGGED_PER_SECOND: u32 = 20;

/// Device ordinals a process can see (CUDA has no more on one machine).
const MAX_ORDINALS: usize = 64;

thread_local! {
    /// The last (context, device ordinal) this thread resolved: allocations repeat on one context.
    static LAST_CONTEXT: Cell<(usize, CUdevice)> = const { Cell::new((0, -1)) };
}

impl Tenant {
    fn new(config: Config) -> Tenant {
        let context_reserve = config
            .context_reserve
            .unwrap_or(config::DEFAULT_CONTEXT_RESERVE);
        Tenant {
            config,
            ledger: OnceLock::new(),
            devices: [const { OnceLock::new() }; MAX_ORDINALS],
            single_device: OnceLock::new(),
            records: Mutex::new(Records::default()),
            context_reserve,
            pools_serial: ReentrantMutex::new(()),
            last_refusal_log: Mutex::new(None),
            refusals_unlogged: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The tenant's ledger, joined (or created) on first use.
    pub fn ledger(&self) -> Result<&Ledger, &str> {
        self.ledger
            .get_or_init(|| {
                let visible = crate::hooks::calls::visible_devices();
                let options = LedgerOptions::from_config(&self.config, &visible);
                Ledger::open(&self.config.ledger_path, &options).map_err(|e| {
                    log::error(format_args!(
                        "{e}; every allocation is refused until this is fixed"
                    ));
                    e.to_string()
                })
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The ledger if this process has joined it, or if it exists (never created from here).
    fn existing_ledger(&self) -> Option<&Ledger> {
        if self.ledger.get().is_none() && !self.config.ledger_path.exists() {
            return None;
        }
        self.ledger().ok()
    }

    /// (used, limit) of the device with this UUID, when it has a limit.
    pub fn usage_by_uuid(&self, uuid: &str) -> Option<(u64, u64)> {
        let ledger = self.existing_ledger()?;
        let dev = ledger.device_index(uuid)?;
        let limit = self.effective_limit(ledger, dev, u32::MAX, uuid);
        (limit != UNLIMITED).then(|| (ledger.used(dev), limit))
    }

    /// The device of the calling thread's current context. When the process sees one device, that is
    /// the device (a call without a current context then fails in the driver, and is rolled back).
    pub fn current_device(&self) -> Result<&Device, CUerror> {
        if self.sees_one_device() {
            return self.device(0);
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-parameter.
        unsafe { crate::hooks::calls::real::cuCtxGetCurrent(&mut ctx) }?;
        if ctx.is_null() {
            return Err(CUerror::INVALID_CONTEXT);
        }
        let (last_ctx, last_ordinal) = LAST_CONTEXT.with(Cell::get);
        let ordinal = if last_ctx == ctx as usize {
            last_ordinal
        } else {
            let mut ordinal: CUdevice = -1;
            // SAFETY: `ordinal` is a valid out-parameter.
            unsafe { crate::hooks::calls::real::cuCtxGetDevice(&mut ordinal) }?;
            LAST_CONTEXT.with(|c| c.set((ctx as usize, ordinal)));
            ordinal
        };
        self.device(ordinal)
    }

    fn sees_one_device(&self) -> bool {
        if let Some(one) = self.single_device.get() {
            return *one;
        }
        let mut count = 0;
        // SAFETY: `count` is a valid out-parameter.
        match unsafe { crate::hooks::calls::real::cuDeviceGetCount(&mut count) } {
            // The count is fixed once the driver is initialised.
            Ok(()) => *self.single_device.get_or_init(|| count == 1),
            Err(_) => false,
        }
    }

    /// A device by ordinal (in this process's visible order): its UUID and ledger slot.
    pub fn device(&self, ordinal: CUdevice) -> Result<&Device, CUerror> {
        let cell = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUerror::INVALID_DEVICE)?;
        if let Some(d) = cell.get() {
            return Ok(d);
        }
        let uuid = crate::hooks::calls::device_uuid(ordinal)?;
        let slot = self.resolve_slot(ordinal, &uuid);
        if let Err(why) = &slot {
            log::error(format_args!(
                "device {ordinal} ({uuid}): {why}; allocations there are refused"
            ));
        }
        Ok(cell.get_or_init(|| Device {
            ordinal,
            uuid,
            slot,
        }))
    }

    fn resolve_slot(&self, ordinal: CUdevice, uuid: &str) -> Result<usize, String> {
        if let Limit::Invalid(why) = self.config.memory_limit_for(ordinal as u32, uuid) {
            return Err(why);
        }
        let ledger = self.ledger().map_err(str::to_owned)?;
        ledger.device_index(uuid).ok_or_else(|| {
            format!(
                "the ledger {} has no room for this device",
                ledger.path().display()
            )
        })
    }

    /// Reserves `bytes` on `device` before the driver is asked for them.
    pub fn reserve(&self, device: &Device, bytes: u64, what: &str) -> Result<Charge, CUerror> {
        self.reserve_or_make_room(device, bytes, what, || false)
    }

    /// [`Tenant::reserve`], calling `make_room` once before refusing; when it returns true (it gave
    /// memory back), the reservation is tried again.
    pub fn reserve_or_make_room(
        &self,
        device: &Device,
        bytes: u64,
        what: &str,
        make_room: impl FnOnce() -> bool,
    ) -> Result<Charge, CUerror> {
        let slot = match &device.slot {
            Ok(slot) => *slot,
            Err(why) => {
                log::warn(format_args!(
                    "tenant {}: {what} of {} on {} (device {}) refused: {why}",
                    self.config.tenant,
                    config::format_bytes(bytes),
                    device.uuid,
                    device.ordinal
                ));
                return Err(CUerror::OUT_OF_MEMORY);
            }
        };
        let ledger = self.ledger().map_err(|_| CUerror::OUT_OF_MEMORY)?;
        let mut attempt = ledger.try_reserve(slot, bytes);
        if attempt.is_err() && self.has_pools() {
            // Memory pools may hold less than was charged for them since the last look.
            self.settle_pools();
            attempt = ledger.try_reserve(slot, bytes);
        }
        if attempt.is_err() && make_room() {
            attempt = ledger.try_reserve(slot, bytes);
        }
        if attempt.is_ok() {
            // Reserve, then check the node's ceiling: of reservations racing past it, none proceeds.
            if let Err(e) = self.within_policy(device, ledger, slot, bytes) {
                ledger.release(slot, bytes);
                attempt = Err(e);
            }
        }
        match attempt {
            Ok(()) => Ok(Charge {
                device: slot,
                bytes,
            }),
            Err(e) => {
                self.refused(device, bytes, what, e);
                Err(CUerror::OUT_OF_MEMORY)
            }
        }
    }

    /// With a node policy, the ledger's usage (this reservation included) must stay within the
    /// policy's ceiling whatever the ledger's own limit says: the ledger is writable by the tenant.
    fn within_policy(
        &self,
        device: &Device,
        ledger: &Ledger,
        slot: usize,
        bytes: u64,
    ) -> Result<(), QuotaExceeded> {
        let Some(ceiling) = self
            .config
            .memory_ceiling(device.ordinal as u32, &device.uuid)
        else {
            return Ok(());
        };
        let used = ledger.used(slot);
        if used <= ceiling {
            return Ok(());
        }
        Err(QuotaExceeded {
            requested: bytes,
            used: used.saturating_sub(bytes),
            limit: ceiling,
        })
    }

    /// The ledger's limit of a device, lowered to the node policy's ceiling.
    fn effective_limit(&self, ledger: &Ledger, slot: usize, ordinal: u32, uuid: &str) -> u64 {
        let limit = ledger.limit(slot);
        self.config
            .memory_ceiling(ordinal, uuid)
            .map_or(limit, |c| c.min(limit))
    }

    /// The warn line of a refused allocation: tenant, device, requested, used and limit. A program
    /// that keeps retrying gets at most [`REFUSALS_LOGGED_PER_SECOND`] lines a second; the next line
    /// logged says how many were left out.
    pub fn refused(&self, device: &Device, requested: u64, what: &str, e: QuotaExceeded) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = std::time::Instant::now();
        {
            let mut window = self.last_refusal_log.lock();
            match &mut *window {
                Some((start, n))
                    if now.duration_since(*start) < std::time::Duration::from_secs(1) =>
                {
                    if *n >= REFUSALS_LOGGED_PER_SECOND {
                        self.refusals_unlogged.fetch_add(1, Relaxed);
                        return;
                    }
                    *n += 1;
                }
                _ => *window = Some((now, 1)),
            }
        }
        let more = match self.refusals_unlogged.swap(0, Relaxed) {
            0 => String::new(),
            n => format!(" ({n} earlier refusals not logged)"),
        };
        log::warn(format_args!(
            "tenant {}: {what} of {} on {} (device {}) refused: {} of {} in use{more}",
            self.config.tenant,
            config::format_bytes(requested),
            device.uuid,
            device.ordinal,
            config::format_bytes(e.used),
            config::format_bytes(e.limit)
        ));
    }

    /// Returns a charge to the quota.
    pub fn release(&self, charge: Charge) {
        if let Some(Ok(ledger)) = self.ledger.get() {
            ledger.release(charge.device, charge.bytes);
        }
    }

    fn has_pools(&self) -> bool {
        !self.records.lock().pools.is_empty()
    }

    /// Charges `bytes` on the current device around `call`, which allocates and returns the new
    /// allocation's key; the charge is kept under that key, or rolled back if the driver failed.
    pub fn charged(
        &self,
        device: &Device,
        bytes: u64,
        what: &str,
        call: impl FnOnce() -> Result<u64, CUerror>,
    ) -> CUresult {
        let charge = self.reserve(device, bytes, what)?;
        match call() {
            Ok(key) => {
                self.records.lock().allocations.insert(key, charge);
                Ok(())
            }
            Err(e) => {
                self.release(charge);
                Err(e)
            }
        }
    }

    /// Frees through `call`, then returns the allocation's charge (if it was charged).
    pub fn uncharge(&self, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        // The record goes before the driver frees: from then on the driver may hand the same
        // address to another thread's allocation, whose new record must not be the one removed.
        let charge = self.records.lock().allocations.remove(key);
        if let Err(e) = call() {
            if let Some(charge) = charge {
                self.records.lock().allocations.insert(key, charge);
            }
            return Err(e);
        }
        if let Some(charge) = charge {
            self.release(charge);
        }
        Ok(())
    }

    /// Adjusts the charge of a live allocation whose real size is known only after the call
    /// (pitch): grows it (fails when over quota) or shrinks it.
    pub fn recharge(&self, key: u64, device: &Device, bytes: u64, what: &str) -> CUresult {
        let old = self.records.lock().allocations.get(key);
        let Some(old) = old else { return Ok(()) };
        if bytes > old.bytes {
            let extra = self.reserve(device, bytes - old.bytes, what)?;
            self.records.lock().allocations.insert(
                key,
                Charge {
                    device: old.device,
                    bytes: old.bytes + extra.bytes,
                },
            );
        } else if bytes < old.bytes {
            self.release(Charge {
                device: old.device,
                bytes: old.bytes - bytes,
            });
            self.records.lock().allocations.insert(
                key,
                Charge {
                    device: old.device,
                    bytes,
                },
            );
        }
        Ok(())
    }

    pub fn record_array(&self, handle: usize, charge: Charge) {
        self.records.lock().arrays.insert(handle, charge);
    }

    pub fn forget_array(&self, handle: usize) {
        if let Some(charge) = self.records.lock().arrays.remove(&handle) {
            self.release(charge);
        }
    }

    pub fn record_physical(&self, handle: u64, charge: Charge) {
        self.records.lock().physical.insert(
            handle,
            Physical {
                charge,
                released: false,
                mappings: 0,
            },
        );
    }

    pub fn physical_released(&self, handle: u64) {
        let mut r = self.records.lock();
        let done = match r.physical.get_mut(&handle) {
            Some(p) => {
                p.released = true;
                p.mappings == 0
            }
            None => false,
        };
        if done {
            let p = r.physical.remove(&handle).expect("present");
            drop(r);
            self.release(p.charge);
        }
    }

    pub fn mapped(&self, va: u64, size: u64, handle: u64) {
        let mut r = self.records.lock();
        if let Some(p) = r.physical.get_mut(&handle) {
            p.mappings += 1;
            r.mappings.insert(va, (size, handle));
        }
    }

    pub fn unmapped(&self, va: u64, size: u64) {
        let mut r = self.records.lock();
        let end = va.saturating_add(size);
        let starts: Vec<u64> = r
            .mappings
            .range(..end)
            .filter(|(s, (len, _))| s.saturating_add(*len) > va)
            .map(|(s, _)| *s)
            .collect();
        let mut freed = Vec::new();
        for start in starts {
            let Some((_, handle)) = r.mappings.remove(&start) else {
                continue;
            };
            if let Some(p) = r.physical.get_mut(&handle) {
                p.mappings = p.mappings.saturating_sub(1);
                if p.released && p.mappings == 0 {
                    freed.push(r.physical.remove(&handle).expect("present").charge);
                }
            }
        }
        drop(r);
        for charge in freed {
            self.release(charge);
        }
    }

    /// Sets the charge of a memory pool to what the driver says it holds now (`None`: it cannot say,
    /// so the pool keeps the whole reservation), given `reserved` bytes already reserved for its growth.
    /// When the pool grew by more than that and the quota has no room for the rest, the pool stays
    /// charged what was reserved and the refusal is returned: the caller undoes the allocation.
    pub fn pool_now_holds(
        &self,
        pool: usize,
        device: usize,
        holds: Option<u64>,
        reserved: u64,
    ) -> Result<(), QuotaExceeded> {
        let mut r = self.records.lock();
        let entry = r.pools.entry(pool).or_insert(Charge { device, bytes: 0 });
        let before = entry.bytes;
        let holds = holds.unwrap_or(before.saturating_add(reserved));
        let Some(Ok(ledger)) = self.ledger.get() else {
            entry.bytes = holds;
            return Ok(());
        };
        let grown = holds.saturating_sub(before);
        if grown > reserved {
            if let Err(e) = ledger.try_reserve(device, grown - reserved) {
                entry.bytes = before + reserved;
                return Err(e);
            }
        } else if grown < reserved {
            ledger.release(device, reserved - grown);
        }
        if holds < before {
            ledger.release(device, before - holds);
        }
        entry.bytes = holds;
        Ok(())
    }

    /// Held by a stream-ordered allocation from before its reservation until its pool's charge is
    /// settled ([`Tenant::pool_now_holds`]).
    pub fn pool_serial(&self) -> ReentrantMutexGuard<'_, ()> {
        self.pools_serial.lock()
    }

    /// Re-reads every known pool's reserved size and returns what the driver released.
    pub fn settle_pools(&self) {
        let _serial = self.pool_serial();
        let pools: Vec<(usize, Charge)> = self
            .records
            .lock()
            .pools
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        for (pool, charge) in pools {
            if let Some(holds) = crate::hooks::calls::pool_reserved(pool) {
                if holds < charge.bytes {
                    let _ = self.pool_now_holds(pool, charge.device, Some(holds), 0);
                }
            }
        }
    }

    pub fn forget_pool(&self, pool: usize) {
        let _serial = self.pool_serial();
        if let Some(charge) = self.records.lock().pools.remove(&pool) {
            self.release(charge);
        }
    }

    pub fn record_context(&self, ctx: usize, charge: Charge) {
        self.records.lock().contexts.insert(ctx, charge);
    }

    pub fn forget_context(&self, ctx: usize) {
        if let Some(charge) = self.records.lock().contexts.remove(&ctx) {
            self.release(charge);
        }
        LAST_CONTEXT.with(|c| {
            if c.get().0 == ctx {
                c.set((0, -1));
            }
        });
    }

    /// A primary context retain: the first one charges the context reservation.
    pub fn primary_retain(&self, device: &Device, call: impl FnOnce() -> CUresult) -> CUresult {
        let first = !self.records.lock().primary.contains_key(&device.ordinal);
        let charge = if first {
            Some(self.reserve(device, self.context_reserve, "context creation")?)
        } else {
            None
        };
        if let Err(e) = call() {
            if let Some(c) = charge {
                self.release(c);
            }
            return Err(e);
        }
        let mut r = self.records.lock();
        match (r.primary.get_mut(&device.ordinal), charge) {
            (Some(entry), Some(c)) => {
                // Another thread charged it first.
                entry.0 += 1;
                drop(r);
                self.release(c);
            }
            (Some(entry), None) => entry.0 += 1,
            (None, Some(c)) => {
                r.primary.insert(device.ordinal, (1, c));
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// A primary context release (`reset` drops every reference).
    pub fn primary_release(&self, ordinal: CUdevice, reset: bool) {
        let mut r = self.records.lock();
        let done = match r.primary.get_mut(&ordinal) {
            Some(entry) if reset || entry.0 <= 1 => true,
            Some(entry) => {
                entry.0 -= 1;
                false
            }
            None => false,
        };
        if done {
            let (_, charge) = r.primary.remove(&ordinal).expect("present");
            drop(r);
            self.release(charge);
        }
    }

    /// What the program is shown as the device's size and free memory: (free, total), or `None` when
    /// the device has no limit (the driver's own figures stand).
    pub fn shown_memory(
        &self,
        device: &Device,
        driver_free: u64,
        driver_total: u64,
    ) -> Option<(u64, u64)> {
        let slot = *device.slot.as_ref().ok()?;
        let ledger = self.ledger().ok()?;
        let limit = self.effective_limit(ledger, slot, device.ordinal as u32, &device.uuid);
        if limit == UNLIMITED {
            return None;
        }
        let used = ledger.used(slot);
        let total = limit.min(driver_total);
        let free = total.saturating_sub(used).min(driver_free);
        Some((free, total))
    }
}

#[cfg(test)]
mod tests {
    use super::{Charge, ChargeTable};

    #[test]
    fn charge_table_matches_a_map() {
        let mut table = ChargeTable::default();
        let mut model = std::collections::HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for step in 0..20_000u64 {
            // xorshift: keys collide in the table's low bits often enough to exercise probing.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 512 + 1) << 8;
            if x % 3 == 0 {
                assert_eq!(table.remove(key), model.remove(&key), "step {step}");
            } else {
                let charge = Charge {
                    device: (x % 4) as usize,
                    bytes: step,
                };
                table.insert(key, charge);
                model.insert(key, charge);
            }
            assert_eq!(table.len, model.len());
        }
        for (k, v) in &model {
            assert_eq!(table.get(*k), Some(*v));
        }
        assert_eq!(table.get(0), None);
    }
}
