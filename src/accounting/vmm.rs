//! Virtual memory management: a physical allocation (`cuMemCreate`) is charged until it is released
//! *and* unmapped everywhere, as the driver keeps it that long.

use super::{Charge, Device, Tenant};
use gpuslice_api::{CUerror, CUresult};

/// A physical VMM allocation and the mappings that keep it alive.
pub(super) struct Physical {
    pub charge: Charge,
    pub released: bool,
    pub mappings: u32,
}

impl Tenant {
    /// `cuMemCreate` of `bytes` on `device` (`granularity`: the minimum the driver says sizes must
    /// be a multiple of): reserved before `call` creates it (returning its handle); `release`
    /// releases a handle the quota has no room for.
    pub fn create_physical(
        &self,
        device: &Device,
        bytes: u64,
        granularity: Option<u64>,
        call: impl FnOnce() -> Result<Option<u64>, CUerror>,
        release: impl FnOnce(u64),
    ) -> CUresult {
        if bytes == 0 || granularity.is_some_and(|g| bytes % g != 0) {
            // A size the documentation says the driver refuses (0, or not a multiple of the
            // minimum granularity): the driver answers with its own error (INVALID_VALUE), not a
            // quota refusal. Should a driver accept it anyway, it is charged afterwards, or
            // released.
            return self.create_physical_unaligned(device, bytes, call, release);
        }
        let reservation = self.reserve(device, bytes, "cuMemCreate")?;
        if let Some(h) = call()? {
            self.record_physical(h, reservation.commit());
        }
        Ok(())
    }

    #[cold]
    fn create_physical_unaligned(
        &self,
        device: &Device,
        bytes: u64,
        call: impl FnOnce() -> Result<Option<u64>, CUerror>,
        release: impl FnOnce(u64),
    ) -> CUresult {
        let Some(h) = call()? else { return Ok(()) };
        match self.reserve(device, bytes, "cuMemCreate") {
            Ok(reservation) => {
                self.record_physical(h, reservation.commit());
                Ok(())
            }
            Err(e) => {
                release(h);
                Err(e)
            }
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
        let done = match r.physical.get(&handle) {
            Some(p) => p.mappings == 0,
            None => return,
        };
        let freed = if done {
            r.physical.remove(&handle).map(|p| p.charge)
        } else {
            if let Some(p) = r.physical.get_mut(&handle) {
                p.released = true;
            }
            None
        };
        drop(r);
        if let Some(charge) = freed {
            self.release(charge);
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
            let last = match r.physical.get_mut(&handle) {
                Some(p) => {
                    p.mappings = p.mappings.saturating_sub(1);
                    p.released && p.mappings == 0
                }
                None => false,
            };
            if last {
                freed.extend(r.physical.remove(&handle).map(|p| p.charge));
            }
        }
        drop(r);
        for charge in freed {
            self.release(charge);
        }
    }
}
