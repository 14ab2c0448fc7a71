//! Context limits (`cuCtxSetLimit`, and the local memory a launch grows): charged what NVIDIA
//! documents a limit's value to take beyond its default, at least, and what the driver was
//! measured to spend, at most what the quota has room for.

use super::measurement::{Expected, Measurement};
use super::overhead::{driver_pages as pages, Overhead};
use super::{Device, Tenant};
use gpuslice_api::types::CUdevice;
use gpuslice_api::CUresult;
use std::ffi::c_int;

/// `CU_LIMIT_STACK_SIZE`, `CU_LIMIT_PRINTF_FIFO_SIZE`, `CU_LIMIT_MALLOC_HEAP_SIZE`.
pub const LIMIT_STACK_SIZE: c_int = 0;
pub const LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
pub const LIMIT_MALLOC_HEAP_SIZE: c_int = 2;

/// A limit of the current context going from `old` to `value`.
#[derive(Clone, Copy, Debug)]
pub struct LimitChange<'a> {
    /// What changes it, for the log.
    pub what: &'a str,
    pub limit: c_int,
    pub old: usize,
    pub value: usize,
}

impl Tenant {
    /// Limit `limit` of the current context goes from `old` to `value` in `call`: charged what NVIDIA
    /// documents the change to take beyond the default, at least, reserved before `call`.
    pub fn change_limit(
        &self,
        device: &Device,
        change: LimitChange<'_>,
        call: impl FnOnce() -> CUresult,
        undo: Option<impl FnOnce(())>,
    ) -> CUresult {
        let t = self;
        let LimitChange {
            what,
            limit,
            old,
            value,
        } = change;
        let ctx = t.current_context();
        let current = t.overhead_of(Overhead::Limits, ctx);
        // What NVIDIA documents the change to take: charged at least (a driver may reserve it lazily).
        // The default's memory is the context's (charged with it): only what a value takes beyond the
        // default is the limit's, so a limit lowered below its default and raised again is not charged
        // twice for the default's part.
        let beyond = |v: usize| {
            pages(
                t.limit_bytes(device.ordinal, limit, v)
                    .saturating_sub(t.limit_bytes(device.ordinal, limit, limit_default(limit))),
            )
        };
        let estimate = i128::from(beyond(value)) - i128::from(beyond(old));
        let m = Measurement {
            floor: Some(estimate),
            current,
            ..Measurement::new(
                what,
                u64::try_from(estimate.max(0)).unwrap_or(u64::MAX),
                Expected::Known(0),
            )
        };
        let ((), charge, after) = t.charge_measured_sampled(device, &m, call, undo)?;
        t.record_overhead(Overhead::Limits, ctx, ctx, charge);
        t.reconcile_with(device, after);
        Ok(())
    }

    /// The device memory a limit's value takes, as NVIDIA documents the limits: the stack size for every
    /// thread the device can hold resident, the heap and the FIFO themselves.
    pub fn limit_bytes(&self, ordinal: CUdevice, limit: c_int, value: usize) -> u64 {
        let value = value as u64;
        match limit {
            LIMIT_STACK_SIZE => {
                let attribute = |a: c_int| {
                    self.driver
                        .device_attribute(ordinal, a)
                        .map_or(0, |v| u64::try_from(v).unwrap_or(0))
                };
                // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, _MAX_THREADS_PER_MULTIPROCESSOR.
                value
                    .saturating_mul(attribute(16))
                    .saturating_mul(attribute(39))
            }
            LIMIT_PRINTF_FIFO_SIZE | LIMIT_MALLOC_HEAP_SIZE => value,
            _ => 0,
        }
    }
}

/// A limit's value in a new context, as NVIDIA documents them (a 1 KiB stack per thread, a 1 MiB
/// printf FIFO, an 8 MiB malloc heap).
pub fn limit_default(limit: c_int) -> usize {
    match limit {
        LIMIT_STACK_SIZE => 1024,
        LIMIT_PRINTF_FIFO_SIZE => 1 << 20,
        LIMIT_MALLOC_HEAP_SIZE => 8 << 20,
        _ => 0,
    }
}
