//! The records of what this process charged, and the allocation paths that use them: device
//! pointers (`cuMemAlloc*`, pitch, managed, stream-ordered without a pool) and arrays.

use super::lazy_code::LazyCode;
use super::pools::{FreedOn, PoolCharge};
use super::vmm::Physical;
use super::{Charge, Device, Tenant};
use gpuslice_api::types::CUdevice;
use gpuslice_api::{CUerror, CUresult};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes the integer keys of the records (device pointers, handles) with one multiplication: they are
/// distinct by construction and need no protection against chosen collisions, and SipHash would be a
/// quarter of an allocation's added cost.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

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

pub(super) type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// Device pointer -> charge, for the allocation hot path: open addressing with linear probing and
/// backward-shift deletion over a power-of-two table kept at most half full. Key 0 marks an empty
/// entry (no allocation lives at address 0).
#[derive(Default)]
pub(super) struct ChargeTable {
    keys: Vec<u64>,
    charges: Vec<Charge>,
    len: usize,
}

impl ChargeTable {
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: the high bits of the product index the table.
        let bits = self.keys.len().trailing_zeros();
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    /// Records `charge` under `key`; the charge it replaces, if `key` had one.
    #[inline(always)]
    pub(super) fn insert(&mut self, key: u64, charge: Charge) -> Option<Charge> {
        if key == 0 {
            return None;
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
                    return None;
                }
                k if k == key => {
                    return Some(std::mem::replace(&mut self.charges[i], charge));
                }
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The index of `key`'s entry (linear probing from its home), if present.
    #[inline(always)]
    fn position(&self, key: u64) -> Option<usize> {
        if self.len == 0 || key == 0 {
            return None;
        }
        let mask = self.keys.len() - 1;
        let mut i = self.home(key);
        loop {
            match self.keys[i] {
                0 => return None,
                k if k == key => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    pub(super) fn get(&self, key: u64) -> Option<Charge> {
        self.position(key).map(|i| self.charges[i])
    }

    /// Every recorded key.
    fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys.iter().copied().filter(|&k| k != 0)
    }

    #[inline(always)]
    pub(super) fn remove(&mut self, key: u64) -> Option<Charge> {
        let i = self.position(key)?;
        let mask = self.keys.len() - 1;
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

/// Everything else this process charged, by what returns it (device pointers are in
/// `Tenant::allocations`, behind a lock of their own: the allocation hot path).
#[derive(Default)]
pub(super) struct Records {
    /// Array / mipmapped array handle -> its charge and its context (destroyed with it).
    pub arrays: KeyMap<usize, (Charge, usize)>,
    /// VMM generic allocation handle -> physical allocation.
    pub physical: KeyMap<u64, Physical>,
    /// Mapped VA start -> (size, handle).
    pub mappings: BTreeMap<u64, (u64, u64)>,
    /// Memory pool -> what it is charged and what is outstanding from it.
    pub pools: KeyMap<usize, PoolCharge>,
    /// Memory pool -> where it allocates: a device ordinal, or `None` for a pool of host memory.
    /// Recorded when the pool is created, or found among the devices' default and current pools.
    pub pool_places: KeyMap<usize, Option<CUdevice>>,
    /// Block of a pool -> (pool, bytes): what is outstanding from each pool.
    pub pool_blocks: KeyMap<u64, (usize, u64)>,
    /// Created context -> its measured (or reserved) cost.
    pub contexts: KeyMap<usize, Charge>,
    /// Device ordinal -> its primary context: references, and what it is charged while it exists.
    pub primary: KeyMap<CUdevice, PrimaryContext>,
    /// Module, library and context limits -> the driver memory they took.
    pub overhead: KeyMap<(u8, usize), OverheadRecord>,
    /// Module and library loaded lazily -> what of its code is on the device.
    pub lazy_code: KeyMap<(u8, usize), LazyCode>,
    /// Kernel of a library loaded lazily -> its library, name, and the contexts it is loaded in:
    /// its code is loaded and charged at its `cuKernelGetFunction` or first launch in each context
    /// (`first_launch`).
    pub lazy_kernels: KeyMap<usize, LazyKernel>,
    /// Function or kernel whose local frame (bytes per thread) is larger than the default stack,
    /// and the contexts whose local memory holds it: its first launch in any other context may grow
    /// that context's local memory (`first_launch`).
    pub local_frames: KeyMap<usize, LocalFrame>,
    /// Context -> the bytes per thread its local memory holds: the largest frame launched in it,
    /// or the stack size the program set (absent: the default stack). Goes with the context.
    pub local_memory: KeyMap<usize, u64>,
    /// Green context -> the device ordinal whose primary context it retains.
    pub green: KeyMap<usize, CUdevice>,
    /// IPC exports and mappings (`ipc`).
    pub ipc: super::ipc::IpcRecords,
}

/// A device's primary context, as this process retained it.
#[derive(Default)]
pub(super) struct PrimaryContext {
    /// References taken (`cuDevicePrimaryCtxRetain`) and not released.
    pub refs: u32,
    /// Its cost and handle while it exists: a reset destroys it and keeps the references.
    pub live: Option<(Charge, usize)>,
}

impl PrimaryContext {
    pub fn charge(&self) -> Option<&Charge> {
        self.live.as_ref().map(|(charge, _)| charge)
    }
}

impl Tenant {
    /// Charges `bytes` on the current device around `call`, which allocates and returns the new
    /// allocation's key; the charge is kept under that key, or rolled back if the driver failed.
    /// Inlined, as every function between a hook and its driver call (`charge_around`).
    #[inline(always)]
    pub fn charged(
        &self,
        device: &Device,
        bytes: u64,
        what: &str,
        call: impl FnOnce() -> Result<u64, CUerror>,
    ) -> CUresult {
        let (key, charge) = self.charge_around(device, bytes, what, call)?;
        // The driver hands out no live allocation's address: a charge already under it is that of
        // memory freed without a free call (with its context), and goes back.
        if let Some(stale) = self.allocations.lock().insert(key, charge) {
            self.release(stale);
        }
        Ok(())
    }

    /// Context `ctx` was destroyed, and with it every allocation and array made in it: their
    /// charges go back. Arrays know their context. Device pointers and pool blocks do not (finding
    /// it would cost every allocation a driver call): those the driver no longer knows are the
    /// freed ones, asked pointer by pointer with their records locked, so that an allocation the
    /// driver makes meanwhile at a freed address is never taken for the freed one (the allocation
    /// hooks record only after the driver returned).
    pub(super) fn release_freed_allocations(&self, ctx: usize) {
        let freed: Vec<(u64, Charge)> = {
            let mut table = self.allocations.lock();
            let gone: Vec<u64> = table
                .keys()
                .filter(|&key| !self.driver.pointer_known(key))
                .collect();
            gone.into_iter()
                .filter_map(|key| Some((key, table.remove(key)?)))
                .collect()
        };
        // An exported allocation an importer of the tenant still maps goes to that importer (`ipc`).
        let mut freed: Vec<Charge> = freed
            .into_iter()
            .filter(|&(key, charge)| !(super::ipc::any() && self.exported_freed(key, charge)))
            .map(|(_, charge)| charge)
            .collect();
        let blocks: Vec<(u64, (usize, u64))> = {
            let mut r = self.records.lock();
            r.arrays.retain(|_, &mut (charge, owner)| {
                let gone = owner == ctx;
                if gone {
                    freed.push(charge);
                }
                !gone
            });
            let gone: Vec<u64> = r
                .pool_blocks
                .keys()
                .copied()
                .filter(|&key| !self.driver.pointer_known(key))
                .collect();
            gone.into_iter()
                .filter_map(|key| Some((key, r.pool_blocks.remove(&key)?)))
                .collect()
        };
        for charge in freed {
            self.release(charge);
        }
        // Blocks of a pool freed with the context are no longer outstanding: the pool is charged
        // what the driver says it holds from then on.
        if !blocks.is_empty() {
            for (key, (pool, bytes)) in blocks {
                self.pool_block_freed(pool, key, bytes, None);
            }
            self.settle_pools();
        }
    }

    /// Frees through `call`, then returns the allocation's charge (if it was charged). A block of a
    /// memory pool returns to its pool, whose charge stays what the pool holds.
    #[inline(always)]
    pub fn uncharge(&self, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        self.uncharge_on(key, None, call)
    }

    /// [`Tenant::uncharge`] of a free enqueued on a stream (`cuMemFreeAsync`).
    #[inline(always)]
    pub fn uncharge_on(
        &self,
        key: u64,
        on: Option<FreedOn>,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        // The record goes before the driver frees: from then on the driver may hand the same
        // address to another thread's allocation, whose new record must not be the one removed.
        // A pool block stops counting as outstanding before the driver frees it: what is counted
        // outstanding is never more than the pool really has handed out.
        let charge = self.allocations.lock().remove(key);
        let block = match charge {
            Some(_) => None,
            None => self.take_pool_block(key),
        };
        if let Some((pool, bytes)) = block {
            self.pool_block_freed(pool, key, bytes, on);
        }
        if let Err(e) = call() {
            if let Some(charge) = charge {
                self.allocations.lock().insert(key, charge);
            }
            if let Some((pool, bytes)) = block {
                self.record_pool_block(pool, 0, key, bytes);
            }
            return Err(e);
        }
        if let Some(charge) = charge {
            // A graph allocation's memory goes to the graph memory pool's cache, still charged;
            // an exported one an importer of the tenant still maps, to that importer (`ipc`).
            let kept = (super::graph_plan::any() && self.graph_allocation_freed(key, charge))
                || (super::ipc::any() && self.exported_freed(key, charge));
            if !kept {
                self.release(charge);
            }
        }
        Ok(())
    }

    /// The pool block at `key`, no longer outstanding from its pool.
    #[inline(never)]
    pub(super) fn take_pool_block(&self, key: u64) -> Option<(usize, u64)> {
        let mut r = self.records.lock();
        if r.pool_blocks.is_empty() {
            None
        } else {
            r.pool_blocks.remove(&key)
        }
    }

    /// Adjusts the charge of a live allocation whose real size is known only after the call
    /// (pitch): grows it (fails when over quota) or shrinks it.
    pub fn recharge(&self, key: u64, device: &Device, bytes: u64, what: &str) -> CUresult {
        let old = self.allocations.lock().get(key);
        let Some(old) = old else { return Ok(()) };
        if bytes > old.bytes {
            let extra = self.reserve(device, bytes - old.bytes, what)?.commit();
            self.allocations.lock().insert(
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
            self.allocations.lock().insert(
                key,
                Charge {
                    device: old.device,
                    bytes,
                },
            );
        }
        Ok(())
    }

    /// An array created in context `ctx`. A charge already under its handle is that of an array
    /// destroyed without a destroy call (with its context, whose teardown was not seen), and goes
    /// back.
    pub fn record_array(&self, handle: usize, charge: Charge, ctx: usize) {
        let stale = self.records.lock().arrays.insert(handle, (charge, ctx));
        if let Some((stale, _)) = stale {
            self.release(stale);
        }
    }

    pub fn forget_array(&self, handle: usize) {
        if let Some((charge, _)) = self.records.lock().arrays.remove(&handle) {
            self.release(charge);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Charge;
    use super::ChargeTable;

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

/// A kernel of a library loaded lazily: its library, its name, the contexts it is loaded in.
pub struct LazyKernel {
    pub(super) library: usize,
    pub(super) name: Vec<u8>,
    pub(super) loaded_in: u64,
}

/// A function's local frame (bytes per thread) and the contexts whose local memory holds it.
pub struct LocalFrame {
    pub(super) bytes: u64,
    pub(super) held_in: u64,
}

/// What an overhead record is for (with its handle, the key of the record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Overhead {
    Module = 1,
    Library = 2,
    /// A context's limits (`cuCtxSetLimit`), keyed by the context.
    Limits = 3,
}

/// Driver memory charged for one object, and the context that owns it (0: none), whose
/// destruction frees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct OverheadRecord {
    pub charge: Charge,
    pub ctx: usize,
}
