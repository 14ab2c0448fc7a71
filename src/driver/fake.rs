//! A fake driver for accounting's unit tests: in-process and deterministic. Its figures (contexts
//! and their devices, pools' reserved and used sizes, memory samples) are set by the test, and it
//! records every call that does something (synchronisations, trims, events), so a test asserts
//! both what accounting decided and what it asked the driver to do.

use super::measure::ProcessFigure;
use super::seam::{Driver, Event, MemorySample};
use gpuslice_api::types::CUdevice;
use gpuslice_api::CUerror;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};

/// A call the fake recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    StreamSynchronize {
        stream: usize,
        per_thread: bool,
    },
    PoolTrim {
        pool: usize,
        keep: u64,
    },
    DeviceOfContext(usize),
    EventCreate(usize),
    EventDestroy(usize),
    MemorySample,
    /// The device's used memory alone (its figure is the next sample's).
    DeviceUsed,
}

/// A pool's figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pool {
    pub owner: Option<CUdevice>,
    pub reserved: Option<u64>,
    pub used: Option<u64>,
    /// What a trim cannot release yet: blocks freed on a stream that has not reached the free.
    /// A synchronisation of such a stream lowers it (`State::on_sync`).
    pub floor: u64,
}

#[derive(Default)]
pub struct State {
    pub current: Option<usize>,
    /// Context -> device ordinal.
    pub contexts: BTreeMap<usize, CUdevice>,
    pub uuids: Vec<String>,
    /// Modules load lazily.
    pub lazy: bool,
    /// Device attributes (every device alike).
    pub attributes: BTreeMap<i32, i32>,
    /// The current context's limits.
    pub limits: BTreeMap<i32, usize>,
    /// Stream -> context.
    pub streams: BTreeMap<usize, usize>,
    pub capturing: Vec<usize>,
    /// Streams whose synchronisation fails (destroyed).
    pub broken_streams: Vec<usize>,
    pub pools: BTreeMap<usize, Pool>,
    /// Device ordinal -> its current pool.
    pub current_pools: BTreeMap<CUdevice, usize>,
    /// Addresses the driver no longer holds.
    pub unknown_pointers: Vec<u64>,
    pub primary_active: BTreeMap<CUdevice, bool>,
    /// Samples handed out in turn (the last one repeats).
    pub samples: VecDeque<MemorySample>,
    pub totals: BTreeMap<String, u64>,
    pub pid_unknown: bool,
    pub identified_pid: Option<u32>,
    /// NVML device handle -> its UUID and (GPU, compute) instance ids (`None`: a GPU's handle).
    pub nvml_devices: BTreeMap<usize, (String, Option<(u32, u32)>)>,
    pub next_event: usize,
    pub live_events: Vec<usize>,
    /// Events whose work has run.
    pub done_events: Vec<usize>,
    /// What a synchronisation of a stream does: (pool, its `floor` afterwards).
    pub on_sync: BTreeMap<usize, (usize, u64)>,
    pub calls: Vec<Call>,
}

/// The fake driver. Tests leak one (`FakeDriver::leaked`) to give accounting a `&'static dyn Driver`.
#[derive(Default)]
pub struct FakeDriver {
    pub state: Mutex<State>,
}

impl FakeDriver {
    /// A fake seeing `uuids` as its devices, with context `0x100 + i` current-able on device `i`
    /// and context `0x100` current.
    pub fn leaked(uuids: &[&str]) -> &'static FakeDriver {
        let fake = Box::leak(Box::<FakeDriver>::default());
        {
            let mut s = fake.state.lock();
            s.uuids = uuids.iter().map(|u| (*u).to_owned()).collect();
            for i in 0..uuids.len() {
                s.contexts.insert(0x100 + i, i as CUdevice);
            }
            s.current = (!uuids.is_empty()).then_some(0x100);
            s.next_event = 0xe000;
        }
        fake
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock())
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    pub fn set_pool(&self, pool: usize, p: Pool) {
        self.state.lock().pools.insert(pool, p);
    }

    pub fn pool(&self, pool: usize) -> Pool {
        self.state
            .lock()
            .pools
            .get(&pool)
            .copied()
            .unwrap_or_default()
    }

    /// Queues samples the next measurements read, in turn.
    pub fn push_samples(&self, samples: impl IntoIterator<Item = MemorySample>) {
        self.state.lock().samples.extend(samples);
    }
}

/// A sample with this process listed at `process` bytes and the device at `device`.
pub fn listed(process: u64, device: u64) -> MemorySample {
    MemorySample {
        process: ProcessFigure::Listed(process),
        device: Some(device),
        listed: None,
    }
}

/// A sample where only the device's used memory is known.
pub fn device_only(device: u64) -> MemorySample {
    MemorySample {
        process: ProcessFigure::Unavailable,
        device: Some(device),
        listed: None,
    }
}

impl Driver for FakeDriver {
    fn current_context(&self) -> Result<Option<usize>, CUerror> {
        Ok(self.state.lock().current)
    }

    fn device_of_context(&self, ctx: usize) -> Result<CUdevice, CUerror> {
        let mut s = self.state.lock();
        s.calls.push(Call::DeviceOfContext(ctx));
        s.contexts
            .get(&ctx)
            .copied()
            .ok_or(CUerror::INVALID_CONTEXT)
    }

    fn device_attribute(&self, _ordinal: CUdevice, attribute: i32) -> Option<i32> {
        self.state.lock().attributes.get(&attribute).copied()
    }

    fn context_limit(&self, limit: i32) -> Option<usize> {
        self.state.lock().limits.get(&limit).copied()
    }

    fn lazy_module_loading(&self) -> bool {
        self.state.lock().lazy
    }

    fn device_count(&self) -> Option<i32> {
        Some(self.state.lock().uuids.len() as i32)
    }

    fn device_uuid(&self, ordinal: CUdevice) -> Result<String, CUerror> {
        let s = self.state.lock();
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| s.uuids.get(i).cloned())
            .ok_or(CUerror::INVALID_DEVICE)
    }

    fn stream_device(&self, stream: usize) -> Option<(usize, u32)> {
        let s = self.state.lock();
        let ctx = s.streams.get(&stream).copied().or(s.current)?;
        let ordinal = *s.contexts.get(&ctx)?;
        Some((ctx, ordinal as u32))
    }

    fn capturing(&self, stream: usize, _per_thread: bool) -> bool {
        self.state.lock().capturing.contains(&stream)
    }

    fn stream_synchronize(&self, stream: usize, per_thread: bool) -> Result<(), CUerror> {
        let mut s = self.state.lock();
        s.calls.push(Call::StreamSynchronize { stream, per_thread });
        if s.broken_streams.contains(&stream) {
            return Err(CUerror::INVALID_HANDLE);
        }
        // The frees enqueued on the stream have run: the pool's blocks are back in it, and a trim
        // can now release them.
        if let Some((pool, floor)) = s.on_sync.remove(&stream) {
            s.pools.entry(pool).or_default().floor = floor;
        }
        Ok(())
    }

    fn current_pool(&self, ordinal: CUdevice) -> Option<usize> {
        self.state.lock().current_pools.get(&ordinal).copied()
    }

    fn pool_owner(&self, pool: usize) -> Option<CUdevice> {
        self.state.lock().pools.get(&pool).and_then(|p| p.owner)
    }

    fn pool_reserved(&self, pool: usize) -> Option<u64> {
        self.state.lock().pools.get(&pool).and_then(|p| p.reserved)
    }

    fn pool_used(&self, pool: usize) -> Option<u64> {
        self.state.lock().pools.get(&pool).and_then(|p| p.used)
    }

    fn pool_trim(&self, pool: usize, keep: u64) {
        let mut s = self.state.lock();
        s.calls.push(Call::PoolTrim { pool, keep });
        if let Some(p) = s.pools.get_mut(&pool) {
            // The driver never releases memory a block (or a free not yet run) holds.
            let least = keep.max(p.floor).max(p.used.unwrap_or(0));
            if let Some(r) = p.reserved.as_mut() {
                *r = (*r).min(least);
            }
        }
    }

    fn pointer_known(&self, ptr: u64) -> bool {
        !self.state.lock().unknown_pointers.contains(&ptr)
    }

    fn primary_context_active(&self, ordinal: CUdevice) -> Option<bool> {
        self.state.lock().primary_active.get(&ordinal).copied()
    }

    fn relaxed_capture(&self) -> Option<super::calls::RelaxedCapture> {
        None
    }

    fn event_on(&self, _stream: usize, _per_thread: bool) -> Option<Event<'_>> {
        let mut s = self.state.lock();
        let handle = s.next_event;
        s.next_event += 1;
        s.live_events.push(handle);
        s.calls.push(Call::EventCreate(handle));
        drop(s);
        Some(Event::own(self, handle))
    }

    fn event_done(&self, event: usize) -> Result<bool, CUerror> {
        let s = self.state.lock();
        if !s.live_events.contains(&event) {
            return Err(CUerror::INVALID_HANDLE);
        }
        Ok(s.done_events.contains(&event))
    }

    fn event_destroy(&self, event: usize) {
        let mut s = self.state.lock();
        s.live_events.retain(|e| *e != event);
        s.calls.push(Call::EventDestroy(event));
    }

    fn memory_sample(&self, _uuid: &str) -> MemorySample {
        let mut s = self.state.lock();
        s.calls.push(Call::MemorySample);
        let sample = if s.samples.len() > 1 {
            s.samples.pop_front()
        } else {
            s.samples.front().cloned()
        };
        sample.unwrap_or(MemorySample {
            process: ProcessFigure::Unavailable,
            device: None,
            listed: None,
        })
    }

    fn device_used(&self, _uuid: &str) -> Option<u64> {
        let mut s = self.state.lock();
        s.calls.push(Call::DeviceUsed);
        let sample = if s.samples.len() > 1 {
            s.samples.pop_front()
        } else {
            s.samples.front().cloned()
        };
        sample.and_then(|s| s.device)
    }

    fn device_total(&self, uuid: &str) -> Option<u64> {
        self.state.lock().totals.get(uuid).copied()
    }

    fn driver_pid_unknown(&self) -> bool {
        let s = self.state.lock();
        s.pid_unknown && s.identified_pid.is_none()
    }

    fn identify_driver_pid(&self, pid: u32) {
        self.state.lock().identified_pid = Some(pid);
    }

    fn nvml_device_uuid(&self, handle: usize) -> Option<String> {
        let s = self.state.lock();
        s.nvml_devices.get(&handle).map(|(uuid, _)| uuid.clone())
    }

    fn nvml_instance_ids(&self, handle: usize) -> (u32, u32) {
        let s = self.state.lock();
        let ids = s.nvml_devices.get(&handle).and_then(|(_, ids)| *ids);
        ids.unwrap_or((u32::MAX, u32::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_destroys_itself_when_dropped() {
        let fake = FakeDriver::leaked(&["GPU-a"]);
        let event = fake.event_on(7, false).unwrap();
        let handle = event.handle();
        assert_eq!(event.done(), Ok(false));
        fake.with(|s| s.done_events.push(handle));
        assert_eq!(event.done(), Ok(true));
        drop(event);
        assert!(fake.with(|s| s.live_events.is_empty()));
        assert_eq!(
            fake.calls(),
            vec![Call::EventCreate(handle), Call::EventDestroy(handle)]
        );
    }

    #[test]
    fn the_context_device_is_cached_until_a_context_is_destroyed() {
        let fake = FakeDriver::leaked(&["GPU-a", "GPU-b"]);
        fake.with(|s| s.current = Some(0x101));
        assert_eq!(fake.current_device(), Ok(1));
        assert_eq!(fake.current_device(), Ok(1));
        let asked = |f: &FakeDriver| {
            f.calls()
                .iter()
                .filter(|c| matches!(c, Call::DeviceOfContext(_)))
                .count()
        };
        assert_eq!(asked(fake), 1, "the second answer is the cached one");
        // The handle is given to a context on another device once the first is destroyed.
        fake.with(|s| s.contexts.insert(0x101, 0));
        super::super::seam::context_destroyed();
        assert_eq!(fake.current_device(), Ok(0));
        assert_eq!(asked(fake), 2);
    }
}
