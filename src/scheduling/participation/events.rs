//! Device time measured with events, a batch of launches at a time (docs/COMPUTE.md, "Measuring
//! device time"): the shim records an event on a stream after every `batch::batch_len`-th launch
//! there (about 2 ms of work, at most 32 launches, `Q` above 16), and one before the batch's first launch unless
//! the batch starts where the stream's previous one ends (`flow::chains`); the interval, less what
//! an empty pair measures, is the batch's device time. Launches between the events cost no driver
//! call of ours. Completions are looked at lazily: only the oldest batch a flow-control wait needs,
//! and the scheduler thread's looks when it charges or hands over. A batch left open when the
//! program stops launching is closed by the scheduler thread (`Sched::close_open`).
//! What an ownership is charged is that time, never more than the wall time the device was held (so
//! kernels of several streams that overlap are charged once).

use super::Sched;
use crate::scheduling::batch::{self, Joined, OpenBatch};
use crate::scheduling::cu;
use crate::scheduling::device::now_ns;
use crate::scheduling::flow::{self, StreamKey};
use crate::scheduling::priority;
use gpuslice_api::types::{CUcontext, CUevent, CUstream};
use gpuslice_api::{CUerror, CUresult};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::*;

/// How often an empty event pair is recorded to re-measure the per-launch event overhead.
const CALIBRATION_NS: u64 = 250_000_000;

/// One of our events, and the context it belongs to.
pub(in crate::scheduling) struct Pending {
    pub(in crate::scheduling) event: usize,
    pub(in crate::scheduling) ctx: usize,
}

/// Recorded events: around one launch, or back to back to calibrate what an empty pair measures. A
/// high-priority tenant records only ends, one a batch of 16 (`start` is `None`, `priority`): it is
/// charged by wall time, and more events would lengthen exactly the latency it asks to keep short.
///
/// A launch submitted while the previous launch on its stream has not completed starts where that
/// one ends: its `start` is the previous launch's `end` (one event recorded per launch instead of
/// two, the common case under contention, where the queue is rarely empty). The event then belongs
/// to the later launch (`end_shared` on the earlier one): it is recycled once, when the later one is.
pub(in crate::scheduling) struct Tracked {
    pub(in crate::scheduling) start: Option<Pending>,
    pub(in crate::scheduling) end: Pending,
    /// The stream the events were recorded on (a chained start is found by it; flow control counts
    /// launches per stream by it): the per-thread default stream is the launching thread's.
    pub(in crate::scheduling) key: StreamKey,
    pub(in crate::scheduling) calibration: bool,
    /// `end` is also the next launch's `start`: not recycled with this one.
    pub(in crate::scheduling) end_shared: bool,
    /// Host time from recording a start event of our own to the launch (0 when chained). On an idle
    /// stream the device stamps that event at once and the kernel only when it is launched: a
    /// thread preempted in between would be charged its wait as device time.
    pub(in crate::scheduling) start_gap_ns: u64,
    /// Launches the interval spans (0: a calibration pair).
    pub(in crate::scheduling) launches: u32,
    /// When `end` was recorded (host, monotonic): a batch that begins soon after may start there.
    pub(in crate::scheduling) closed_ns: u64,
}

/// A batch of launches on one stream whose end event is not recorded yet.
pub(in crate::scheduling) struct Open {
    key: StreamKey,
    pub(in crate::scheduling) ctx: usize,
    /// The stream handle as the launches named it, and whether through a `_ptsz` entry point.
    stream: usize,
    per_thread: bool,
    launches: u32,
    /// Where the batch's interval starts: an event of its own, or the previous batch's end.
    start: Option<Pending>,
    start_gap_ns: u64,
}

/// What `launch_tracked` did about a stream's batch before the launch.
enum Step {
    /// Counted in the stream's open batch (`batch::join`); `Some`: the launch fills it.
    Counted(Option<Open>),
    /// The launch begins a batch.
    Begins(Begun),
}

/// A batch a launch begins: its start, unless chained or high-priority.
struct Begun {
    start: Option<Pending>,
    start_gap_ns: u64,
    /// Not measured: the stream is being captured (nothing runs), or no event could be recorded.
    skip: bool,
}

impl OpenBatch for Open {
    fn stream(&self) -> (StreamKey, usize) {
        (self.key, self.ctx)
    }
    fn launches(&mut self) -> &mut u32 {
        &mut self.launches
    }
}

impl Tracked {
    /// Flow control's key: the stream, and the context (the default streams are one per context).
    pub(in crate::scheduling) fn flow_key(&self) -> (StreamKey, usize) {
        (self.key, self.end.ctx)
    }

    /// Flow control's key and the launches the batch spans.
    pub(in crate::scheduling) fn flow_entry(&self) -> ((StreamKey, usize), u32) {
        (self.flow_key(), self.launches)
    }
}

/// What a query of one of our events says.
pub(in crate::scheduling) enum State {
    Done,
    Running,
    /// The event is gone (its context was destroyed): nothing to measure, never to be used again.
    Gone,
}

pub(in crate::scheduling) fn query(p: &Pending) -> State {
    // SAFETY: an event we created and recorded.
    match unsafe { cu::cuEventQuery(p.event as CUevent) } {
        Ok(()) => State::Done,
        Err(CUerror::NOT_READY) => State::Running,
        Err(_) => State::Gone,
    }
}

impl Sched {
    /// Launches `launch`, counted in its stream's open batch (one per stream, at most 4): a launch
    /// that begins a batch records the batch's start (or starts where the stream's previous batch
    /// ended), one that fills it records its end ([`Sched::close`]); the launches between cost no
    /// driver call. A high-priority tenant records only ends (it is charged by wall time).
    /// `joined`: what the gate found of the first stream's batch ([`Sched::join_batch`]; a launch
    /// that continues a batch was counted in it there: one look at the open batches a launch).
    /// Notes the launch's time as the last submission (one clock read a launch that continues a
    /// batch).
    pub(in crate::scheduling) fn launch_tracked(
        &self,
        streams: &[CUstream],
        ctx: CUcontext,
        per_thread: bool,
        busy: bool,
        joined: Option<Joined<Open>>,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let high = self.high.load(Relaxed);
        let batch = |key: StreamKey| self.batch_len(key);
        let mut joined = joined;
        let mut steps: [Option<Step>; 4] = Default::default();
        for (i, (b, &s)) in steps.iter_mut().zip(streams).enumerate() {
            let key = flow::stream_key(s as usize, per_thread);
            let j = match joined.take() {
                Some(j) if i == 0 => j,
                _ => batch::join(&mut self.open.lock(), (key, ctx as usize), batch(key)),
            };
            if let Joined::Counted(full) = j {
                *b = Some(Step::Counted(full));
                continue;
            }
            let mut start = None;
            let mut skip = false;
            let mut recorded_at = 0;
            if !high {
                start = self.chain(key, ctx, batch(key), busy);
                if start.is_none() {
                    // An event is never recorded into a capturing stream (it would be captured).
                    skip = cu::capturing(s, per_thread);
                    if !skip {
                        start = self.record(s, ctx, per_thread);
                        recorded_at = now_ns();
                        skip = start.is_none();
                    }
                }
            }
            *b = Some(Step::Begins(Begun {
                start,
                start_gap_ns: recorded_at,
                skip,
            }));
        }
        let launched_at = now_ns();
        let r = launch();
        self.last_submit_ns.store(launched_at, Release);
        for (b, &s) in steps.into_iter().zip(streams) {
            let key = flow::stream_key(s as usize, per_thread);
            let mut b = match b {
                None => continue,
                Some(Step::Counted(full)) => {
                    let full = if r.is_err() {
                        // Not launched: counted out again.
                        let back = Joined::Counted(full);
                        batch::unjoin(&mut self.open.lock(), (key, ctx as usize), back)
                    } else {
                        full
                    };
                    if let Some(o) = full {
                        self.close(o, true);
                    }
                    continue;
                }
                Some(Step::Begins(b)) => b,
            };
            if r.is_err() || b.skip {
                if let Some(start) = b.start.take() {
                    self.unchain(start);
                }
                continue;
            }
            if b.start_gap_ns != 0 {
                b.start_gap_ns = launched_at.saturating_sub(b.start_gap_ns);
            }
            let full = {
                let mut open = self.open.lock();
                let i = match open
                    .iter()
                    .position(|o| o.key == key && o.ctx == ctx as usize)
                {
                    // Another thread began this stream's batch meanwhile: our start is not needed
                    // (given back below).
                    Some(i) => i,
                    None => {
                        if open.is_empty()
                            && self.flow_waiting.load(SeqCst) == 0
                            && self.inflight.lock().is_empty()
                        {
                            // Nothing of ours in flight: our work runs from here at most.
                            self.pending_since_ns.store(launched_at, Release);
                        }
                        open.push(Open {
                            key,
                            ctx: ctx as usize,
                            stream: s as usize,
                            per_thread,
                            launches: 0,
                            start: b.start.take(),
                            start_gap_ns: b.start_gap_ns,
                        });
                        open.len() - 1
                    }
                };
                open[i].launches = open[i].launches.saturating_add(1);
                batch::closes(open[i].launches, batch(key)).then(|| open.swap_remove(i))
            };
            if let Some(o) = full {
                self.close(o, true);
            }
            if let Some(start) = b.start.take() {
                self.unchain(start);
            }
        }
        if r.is_ok() && !high {
            self.calibrate(launched_at, streams, ctx, per_thread);
        }
        r
    }

    /// Counts a launch on `key` (of `ctx`) in the stream's open batch, if one is open
    /// (`batch::join`: the launch then needs no flow control, and `launch_tracked` no other look
    /// at the open batches); [`Joined::Begins`] otherwise.
    pub(in crate::scheduling) fn join_batch(&self, key: StreamKey, ctx: usize) -> Joined<Open> {
        let batch = self.batch_len(key);
        batch::join(&mut self.open.lock(), (key, ctx), batch)
    }

    /// A launch counted by [`Sched::join_batch`] goes back to the gate instead of to the driver:
    /// counted out (`batch::unjoin`; a batch it filled while the stream began another is closed
    /// as it is, from the launching thread).
    pub(in crate::scheduling) fn unjoin_batch(
        &self,
        key: StreamKey,
        ctx: usize,
        joined: Joined<Open>,
    ) {
        let back = batch::unjoin(&mut self.open.lock(), (key, ctx), joined);
        if let Some(o) = back {
            self.close(o, true);
        }
    }

    /// Whether the newest batch of stream `key` (of `ctx`) in `inflight` is still running (one
    /// query, none when it was closed recently enough to be chained anyway, `flow::chains`; the
    /// caller has relaxed the thread's capture mode).
    pub(in crate::scheduling) fn newest_runs(
        inflight: &VecDeque<Tracked>,
        key: StreamKey,
        ctx: usize,
        launch_ns: u64,
        batch: u32,
    ) -> bool {
        inflight
            .iter()
            .rev()
            .find(|t| t.key == key && t.end.ctx == ctx && !t.calibration)
            .is_some_and(|t| {
                flow::chains(now_ns().saturating_sub(t.closed_ns), launch_ns, batch)
                    || matches!(query(&t.end), State::Running)
            })
    }

    /// Launches counted in batches still open (no end event recorded yet).
    pub(in crate::scheduling) fn open_launches(&self) -> u64 {
        self.open.lock().iter().map(|o| u64::from(o.launches)).sum()
    }

    /// How many launches on stream `key` one event measures (`priority::batch_len`: about 2 ms of
    /// work; a fixed 16 for a high-priority tenant, which is charged by wall time and whose
    /// latency is what it keeps short).
    pub(in crate::scheduling) fn batch_len(&self, key: StreamKey) -> u32 {
        priority::batch_len(
            self.high.load(Relaxed),
            self.launch_ns.load(Relaxed),
            self.queue_depth(),
            matches!(key, StreamKey::Thread(_)),
        )
    }

    /// The launches kept in flight (`Q`, `priority::queue_depth`): one beside a high-priority
    /// tenant, the most for a high-priority tenant.
    pub(in crate::scheduling) fn queue_depth(&self) -> usize {
        priority::queue_depth(
            self.high.load(Relaxed),
            self.beside_high.load(Relaxed),
            self.launch_ns.load(Relaxed),
        )
    }

    /// Records a batch's end event and tracks it (`launcher`: from the thread that launched the
    /// batch's last launch, whose current context is the batch's; otherwise the batch's context is
    /// made current for the record). Not into a capturing stream (the launches since the check
    /// were captured, not run), nor past [`flow::HARD_DEPTH`] tracked batches: the batch then goes
    /// unmeasured.
    fn close(&self, o: Open, launcher: bool) {
        let full = self.inflight.lock().len() >= flow::HARD_DEPTH;
        let default_stream = matches!(o.stream, 0 | 1);
        let end = if full || cu::capturing(o.stream as CUstream, o.per_thread) {
            None
        } else if launcher || !default_stream {
            self.record(o.stream as CUstream, o.ctx as CUcontext, o.per_thread)
        } else {
            cu::in_context(o.ctx as CUcontext, || {
                self.record(o.stream as CUstream, o.ctx as CUcontext, o.per_thread)
            })
        };
        match end {
            Some(end) => self.inflight.lock().push_back(Tracked {
                start: o.start,
                end,
                key: o.key,
                calibration: false,
                end_shared: false,
                start_gap_ns: o.start_gap_ns,
                launches: o.launches,
                closed_ns: now_ns(),
            }),
            None => {
                if let Some(start) = o.start {
                    self.unchain(start);
                }
            }
        }
    }

    /// Closes every open batch (the scheduler thread: the program stopped launching, or our
    /// ownership ends): their launches are then measured when they complete. A per-thread default
    /// stream's batch (one launch, closed at once) is never left open.
    pub(in crate::scheduling) fn close_open(&self) {
        let open = std::mem::take(&mut *self.open.lock());
        for o in open {
            if matches!(o.key, StreamKey::Thread(_)) {
                if let Some(start) = o.start {
                    self.unchain(start);
                }
                continue;
            }
            self.close(o, false);
        }
    }

    /// The start of a batch on `stream` that begins while the stream's previous batch still runs
    /// (`busy`: flow control just saw it run) or soon after it was closed (`flow::chains`): that
    /// batch's end event, which the new batch then owns. `None` otherwise (the device may have
    /// been idle between the two: a start event of its own measures the batch alone). No driver
    /// call.
    fn chain(&self, key: StreamKey, ctx: CUcontext, batch: u32, busy: bool) -> Option<Pending> {
        let mut f = self.inflight.lock();
        let prev = f
            .iter_mut()
            .rev()
            .find(|t| t.key == key && t.end.ctx == ctx as usize && !t.calibration)?;
        let gap = now_ns().saturating_sub(prev.closed_ns);
        if prev.end_shared || !(busy || flow::chains(gap, self.launch_ns.load(Relaxed), batch)) {
            return None;
        }
        prev.end_shared = true;
        Some(Pending {
            event: prev.end.event,
            ctx: prev.end.ctx,
        })
    }

    /// A start event whose launch failed: recycled, or given back to the launch it was chained to.
    fn unchain(&self, start: Pending) {
        {
            let mut f = self.inflight.lock();
            if let Some(prev) = f
                .iter_mut()
                .find(|t| t.end_shared && t.end.event == start.event)
            {
                prev.end_shared = false;
                return;
            }
        }
        self.free_events.lock().push(start);
    }

    /// Records one of our events on `stream` (of context `ctx`).
    fn record(&self, stream: CUstream, ctx: CUcontext, per_thread: bool) -> Option<Pending> {
        let key = ctx as usize;
        let reuse = {
            let mut free = self.free_events.lock();
            free.iter()
                .position(|p| p.ctx == key)
                .map(|i| free.swap_remove(i))
        };
        let p = match reuse {
            Some(p) => p,
            None => {
                let mut ev: CUevent = std::ptr::null_mut();
                // SAFETY: valid out-parameter; the event is created in the stream's context.
                cu::in_context(ctx, || unsafe { cu::cuEventCreate(&mut ev, 0) }).ok()?;
                Pending {
                    event: ev as usize,
                    ctx: key,
                }
            }
        };
        // SAFETY: our event and the caller's stream.
        let r = unsafe {
            if per_thread {
                cu::cuEventRecord_ptsz(p.event as CUevent, stream)
            } else {
                cu::cuEventRecord(p.event as CUevent, stream)
            }
        };
        match r {
            Ok(()) => Some(p),
            // The context is gone (destroyed, or its address reused by a new one): forget its events
            // without calling the driver on them again.
            // Or the stream's handle names a stream of another context now (it was destroyed and
            // its handle given again): the cached stream → context answers are asked again.
            Err(_) => {
                self.free_events.lock().retain(|q| q.ctx != key);
                cu::stream_context_stale();
                None
            }
        }
    }

    /// Now and then, two events back to back after a launch: what they measure is the driver's step
    /// between stream operations, which a launch's event pair measures twice besides its device time.
    /// `now`: the launch's time, read before it.
    fn calibrate(&self, now: u64, streams: &[CUstream], ctx: CUcontext, per_thread: bool) {
        let last = self.last_calibration_ns.load(Relaxed);
        let Some(&stream) = streams.first() else {
            return;
        };
        if now.saturating_sub(last) < CALIBRATION_NS
            || self
                .last_calibration_ns
                .compare_exchange(last, now, AcqRel, Relaxed)
                .is_err()
        {
            return;
        }
        // Never into a capturing stream (the pair would be captured, not run).
        if cu::capturing(stream, per_thread) {
            return;
        }
        let Some(start) = self.record(stream, ctx, per_thread) else {
            return;
        };
        match self.record(stream, ctx, per_thread) {
            Some(end) => self.inflight.lock().push_back(Tracked {
                start: Some(start),
                end,
                key: flow::stream_key(stream as usize, per_thread),
                calibration: true,
                end_shared: false,
                start_gap_ns: 0,
                launches: 0,
                closed_ns: now_ns(),
            }),
            None => self.free_events.lock().push(start),
        }
    }
}
