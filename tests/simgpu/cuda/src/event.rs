//! Events: a record is an op on a stream that timestamps the event with the op's time on the device
//! timeline (`stream::device_time`): when the stream's previous work ended on the device, or when the
//! record was submitted if later — as a GPU stamps it, whenever simgpu's host worker gets to it.

use crate::graph::Capture;
use crate::handles::Handles;
use crate::stream::{self, lock, Dep, Stream};
use gpuslice_api::launch_types::{
    CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS,
    CU_EVENT_RECORD_EXTERNAL,
};
use gpuslice_api::types::{CUevent, CUstream};
use gpuslice_api::{CUerror, CUresult};
use std::collections::BTreeMap;
use std::ffi::c_uint;
use std::sync::{Arc, Mutex, OnceLock};

/// The latest record of an event: the op's position on its stream, and its time (realtime ns on the
/// device timeline) once reached.
#[derive(Clone)]
struct Record {
    stream: Arc<Stream>,
    seq: u64,
    time: Arc<OnceLock<u64>>,
}

pub struct Event {
    flags: u32,
    /// `cuCtxGetId` of the context the event was created in (ids are never reused).
    context: u64,
    record: Mutex<Option<Record>>,
    /// Set when last recorded on a capturing stream: waiting on it joins that capture.
    captured: Mutex<Option<Arc<Capture>>>,
}

static EVENTS: Mutex<BTreeMap<usize, Arc<Event>>> = Mutex::new(BTreeMap::new());
static HANDLES: Handles = Handles::new(0x7e00_0000_0000);

/// The event a client handle names (`CUDA_ERROR_INVALID_HANDLE` if unknown or destroyed).
pub fn lookup(h: CUevent) -> Result<Arc<Event>, CUerror> {
    lock(&EVENTS)
        .get(&(h as usize))
        .cloned()
        .ok_or(CUerror::INVALID_HANDLE)
}

fn create(flags: u32) -> Result<CUevent, CUerror> {
    let valid = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if flags & !valid != 0
        || (flags & CU_EVENT_INTERPROCESS != 0 && flags & CU_EVENT_DISABLE_TIMING == 0)
    {
        return Err(CUerror::INVALID_VALUE);
    }
    let ctx = crate::context::current()?;
    let e = Arc::new(Event {
        flags,
        context: ctx.id,
        record: Mutex::new(None),
        captured: Mutex::new(None),
    });
    let h = HANDLES.take();
    lock(&EVENTS).insert(h, e);
    Ok(h as CUevent)
}

/// The context with `cuCtxGetId` `context` is destroyed: so are its events, whose handles are
/// invalid afterwards (`CUDA_ERROR_INVALID_HANDLE`; see `stream::invalidate_context`).
pub(crate) fn invalidate_context(context: u64) {
    let mut gone = Vec::new();
    lock(&EVENTS).retain(|&h, e| {
        let keep = e.context != context;
        if !keep {
            gone.push(h);
        }
        keep
    });
    for h in gone {
        HANDLES.give_back(h);
    }
}

fn destroy(h: CUevent) -> CUresult {
    // A pending record still completes (its op holds its own clock); only the handle goes.
    lock(&EVENTS)
        .remove(&(h as usize))
        .ok_or(CUerror::INVALID_HANDLE)?;
    HANDLES.give_back(h as usize);
    Ok(())
}

fn record(h: CUevent, hs: CUstream, per_thread: bool, flags: u32) -> CUresult {
    if flags & !CU_EVENT_RECORD_EXTERNAL != 0 {
        return Err(CUerror::INVALID_VALUE);
    }
    let e = lookup(h)?;
    let s = stream::resolve(hs, per_thread)?;
    if let Some(c) = s.capture() {
        // Inside a capture the record is a marker of the capture sequence, not stream work.
        *lock(&e.captured) = Some(c);
        return Ok(());
    }
    let time = Arc::new(OnceLock::new());
    let t = time.clone();
    let seq = stream::submit(
        &s,
        Vec::new(),
        Box::new(move || {
            let _ = t.set(stream::device_time());
        }),
    )?;
    *lock(&e.record) = Some(Record {
        stream: s,
        seq,
        time,
    });
    *lock(&e.captured) = None;
    Ok(())
}

impl Event {
    /// The capture sequence the event was last recorded in, while that capture is still going on.
    fn capture(&self) -> Option<Arc<Capture>> {
        lock(&self.captured).clone().filter(|c| c.active())
    }
}

fn query(h: CUevent) -> CUresult {
    let e = lookup(h)?;
    if e.capture().is_some() {
        return Err(CUerror::CAPTURED_EVENT);
    }
    crate::graph::check_unsafe_call()?;
    let rec = lock(&e.record).clone();
    match rec {
        Some(r) if r.time.get().is_none() => Err(CUerror::NOT_READY),
        // Never recorded, or reached.
        _ => Ok(()),
    }
}

fn synchronize(h: CUevent) -> CUresult {
    let e = lookup(h)?;
    if e.capture().is_some() {
        return Err(CUerror::CAPTURED_EVENT);
    }
    crate::graph::check_unsafe_call()?;
    let rec = lock(&e.record).clone();
    if let Some(r) = rec {
        r.stream.wait_for(r.seq);
        crate::memory::on_synchronize(&*r.stream.context()?);
    }
    Ok(())
}

fn elapsed(ms: Option<&mut f32>, start: CUevent, end: CUevent) -> CUresult {
    let ms = crate::out(ms)?;
    let (a, b) = (lookup(start)?, lookup(end)?);
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(CUerror::INVALID_HANDLE);
    }
    // One lock at a time: start and end may be the same event (0 ms, as the driver answers).
    let ra = lock(&a.record).clone();
    let rb = lock(&b.record).clone();
    let (Some(ra), Some(rb)) = (ra, rb) else {
        return Err(CUerror::INVALID_HANDLE);
    };
    let (Some(ta), Some(tb)) = (ra.time.get(), rb.time.get()) else {
        return Err(CUerror::NOT_READY);
    };
    *ms = ((*tb as i128 - *ta as i128) as f64 / 1e6) as f32;
    Ok(())
}

/// `cuStreamWaitEvent`: work submitted to `s` from now on waits for the event's latest record.
pub(crate) fn stream_wait(s: &Arc<Stream>, e: &Arc<Event>) -> CUresult {
    if let Some(c) = e.capture() {
        // Waiting on a captured event forks `s` into the capture sequence (real driver semantics).
        match s.capture() {
            Some(mine) if Arc::ptr_eq(&mine, &c) => {}
            Some(_) => return Err(CUerror::STREAM_CAPTURE_MERGE),
            None => c.join(s),
        }
        return Ok(());
    }
    if s.capture().is_some() {
        // Uncaptured work can't be a dependency of a graph: nothing to record (the event is either
        // already complete or the graph will be launched later than it anyway).
        return Ok(());
    }
    let rec = lock(&e.record).clone();
    let Some(r) = rec else { return Ok(()) };
    if r.stream.reached(r.seq) || Arc::ptr_eq(&r.stream, s) {
        return Ok(());
    }
    stream::submit(
        s,
        vec![Dep {
            stream: r.stream,
            seq: r.seq,
        }],
        Box::new(|| {}),
    )
    .map(drop)
}

// ---- exports ----

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: Option<&mut CUevent>, flags: c_uint) -> CUresult {
    crate::call("cuEventCreate", || {
        let ph = crate::out(ph)?;
        *ph = create(flags)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy(h: CUevent) -> CUresult {
    crate::call("cuEventDestroy", || destroy(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(h: CUevent) -> CUresult {
    crate::call("cuEventDestroy_v2", || destroy(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(h: CUevent, s: CUstream) -> CUresult {
    crate::call("cuEventRecord", || record(h, s, false, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord_ptsz(h: CUevent, s: CUstream) -> CUresult {
    crate::call("cuEventRecord_ptsz", || record(h, s, true, 0))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    h: CUevent,
    s: CUstream,
    flags: c_uint,
) -> CUresult {
    crate::call("cuEventRecordWithFlags", || record(h, s, false, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags_ptsz(
    h: CUevent,
    s: CUstream,
    flags: c_uint,
) -> CUresult {
    crate::call("cuEventRecordWithFlags_ptsz", || record(h, s, true, flags))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(h: CUevent) -> CUresult {
    crate::call("cuEventQuery", || query(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(h: CUevent) -> CUresult {
    crate::call("cuEventSynchronize", || synchronize(h))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: Option<&mut f32>,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    crate::call("cuEventElapsedTime", || elapsed(ms, start, end))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: Option<&mut f32>,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    crate::call("cuEventElapsedTime_v2", || elapsed(ms, start, end))
}
