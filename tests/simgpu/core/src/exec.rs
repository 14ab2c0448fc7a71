//! Execution: how kernels of every process share a device.
//!
//! What is modelled, following how NVIDIA GPUs without MPS behave:
//! - **Devices are independent.** Each device has its own queue and its own schedule.
//! - **Contexts are time-sliced, never concurrent.** A kernel from one CUDA context cannot execute
//!   concurrently with a kernel from another context (NVIDIA Nsight VSE, "CUDA Concurrent Kernel
//!   Trace": "A kernel from one CUDA context cannot execute concurrently with a kernel from another
//!   CUDA context"); the device serves one context at a time. When kernels of another context are
//!   waiting and the serving context has used a time slice of device time (`SIMGPU_TIMESLICE_US`,
//!   default 2 ms; the time its kernels ran, not wall time), its running kernels are preempted (they
//!   keep the work they have done and resume later) and the device goes to the context whose kernel
//!   has waited longest. Preempted kernels queue again behind those waiting, so contexts take turns.
//!   A context with nothing running and nothing queued gives the device up at once, unless a kernel
//!   of it just ended with more work queued on its stream: on a GPU that work is in the device's
//!   queue already, so the context keeps the device for it (up to 5 ms, within its slice) and the
//!   next kernel counts as started when the previous one ended. `SIMGPU_TIMESLICE_US=0` turns
//!   preemption off.
//! - **Concurrent kernels within a context.** Up to `SIMGPU_CONCURRENT_KERNELS` (default 4) kernels
//!   of the serving context run at once (kernels of different streams overlap; the CUDA programming
//!   guide, "Concurrent Kernel Execution": kernels of different streams of one context may execute
//!   concurrently on devices with `concurrentKernels`; Hopper allows up to 128 resident grids).
//!   Kernels of one stream never overlap: a stream runs one kernel at a time.
//! - **Busy time is the union** of the intervals during which at least one kernel runs: a device is
//!   never busier than wall time, and a process whose two streams overlap is charged the union
//!   (charged to the serving context's process and group, which are the only ones running then).
//! - **Barrier kernels** ([`Work::Barrier`]) behave like an NCCL collective: a kernel that, once
//!   started, spins on its device (holding it, counted busy) until all `participants` kernels with
//!   its tag, across processes and devices, have started; then it completes. Started means "got on
//!   the device at least once": a preempted barrier kernel still counts as arrived. Rounds: the n-th
//!   barrier kernel of each participant meets the n-th of the others.
//! - **The device does not wait for host threads.** A kernel comes with the time it entered the
//!   device's queue on a GPU (`ready_ns`: its stream's previous work ended, or it was launched);
//!   a kernel that finds the device idle, or held for it, starts then, not when the host thread that
//!   hands it over gets to run. Its end (`KernelRun::end_ns`) is where its stream's next op stands on
//!   the device timeline.
//! - **A kernel runs whatever its process does.** Any process that steps a device's schedule
//!   finishes every kernel that is over by then, at its exact end time, starts queued kernels on
//!   behalf of their (possibly stopped) processes, and preempts at slice end. Kernels of processes
//!   that died are removed within ~100 ms (a real driver tears the context down).
//!
//! Not modelled: SM partitioning (a kernel does not take less time when it runs beside others),
//! stream priorities, MPS, the cost of a context switch, compute preemption granularity (a kernel
//! yields at any instant), graphics work, and copy engines (copies do not take device time).
//!
//! Protocol: each device's schedule lives in its [`Exec`] and is changed only under the device's
//! lock, a word in shared memory with short critical sections (no system calls but the rare liveness
//! check). A lock held for 200 ms by a process that is dead or stopped is taken over. Kernels sleep
//! on the device's epoch futex (bumped at every change) until their end, the next slice end, or a
//! change.

use super::*;

/// What a kernel does on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Runs for this long on the device (time spent preempted does not count).
    Timed(Duration),
    /// Spins until `participants` kernels with `tag` have started, then completes.
    Barrier { tag: u64, participants: u32 },
}

/// A kernel handed to a device (see [`Shared::run_kernel`]).
#[derive(Clone, Copy, Debug)]
pub struct Submission {
    pub device: u32,
    /// simgpu's tag of the context it runs in.
    pub context: u64,
    pub work: Work,
    /// More work is already queued behind it on its stream.
    pub followed: bool,
    /// When it entered the device's queue on the device timeline (0: now).
    pub ready_ns: u64,
}

impl Submission {
    /// A kernel of `context` on `device`, ready now, nothing queued behind it.
    pub fn now(device: u32, context: u64, work: Work) -> Submission {
        Submission {
            device,
            context,
            work,
            followed: false,
            ready_ns: 0,
        }
    }

    /// With more work queued behind it on its stream.
    pub fn followed(self) -> Submission {
        Submission {
            followed: true,
            ..self
        }
    }

    /// Ready since `ready_ns` on the device timeline.
    pub fn ready_at(self, ready_ns: u64) -> Submission {
        Submission { ready_ns, ..self }
    }
}

/// What happened to a kernel (for traces and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelRun {
    /// Times it was preempted by the time slice.
    pub preempted: u32,
    /// Realtime ns from queueing to first start.
    pub queued_ns: u64,
    /// Realtime ns at which it first started on the device.
    pub start_ns: u64,
    /// Realtime ns at which it ended on the device (its stream's next work can start then).
    pub end_ns: u64,
}

/// A DONE entry its launching thread did not free (its process died) is reused after this.
const RECLAIM_NS: u64 = 1_000_000_000;
/// A device lock held this long by a dead or stopped process is taken over.
const LOCK_STEAL_NS: u64 = 200_000_000;
/// Kernels of dead processes are looked for at most this often.
const REAP_SPACING_NS: u64 = 100_000_000;
/// Longest sleep without looking at the schedule.
const POLL_NS: u64 = 20_000_000;
/// How long a context whose kernel ended with more work queued on its stream keeps the device for
/// that work (the time its stream's host worker takes to hand the next kernel over, longer on a
/// loaded machine). That kernel is then taken to have started when the previous one ended (or when
/// it was ready, if later), so the hand-over costs no device time, as on a GPU where the kernel was
/// in the device's queue already.
const HOLD_NS: u64 = 5_000_000;

/// The right to run on a device, as one kernel of this process's own context that runs until the
/// turn is dropped (or is given a duration). Used by tools and tests without a CUDA driver. Like any
/// kernel it can be preempted by the time slice; dropping it ends it.
pub struct DeviceTurn<'a> {
    shared: &'a Shared,
    device: usize,
    index: usize,
    id: u64,
}

struct ExecLock<'a> {
    exec: &'a Exec,
    token: u64,
}

impl Drop for ExecLock<'_> {
    fn drop(&mut self) {
        // Fails only if the lock was taken over (this process was stopped holding it).
        let _ = self
            .exec
            .lock
            .compare_exchange(self.token, 0, Release, Relaxed);
    }
}

fn lock_exec(exec: &Exec) -> ExecLock<'_> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let low = SEQ.fetch_add(1, Relaxed).max(1);
    let token = ((std::process::id() as u64) << 32) | low as u64;
    let mut tries: u32 = 0;
    loop {
        if exec
            .lock
            .compare_exchange_weak(0, token, Acquire, Relaxed)
            .is_ok()
        {
            exec.lock_ns.store(sys::realtime_ns(), Relaxed);
            return ExecLock { exec, token };
        }
        tries = tries.wrapping_add(1);
        if tries < 64 {
            std::hint::spin_loop();
        } else if tries < 128 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
            if tries.is_multiple_of(512) {
                let held = exec.lock.load(Acquire);
                let since = sys::realtime_ns().saturating_sub(exec.lock_ns.load(Relaxed));
                if held != 0
                    && since > LOCK_STEAL_NS
                    && !sys::process_running((held >> 32) as u32)
                    && exec
                        .lock
                        .compare_exchange(held, token, Acquire, Relaxed)
                        .is_ok()
                {
                    exec.lock_ns.store(sys::realtime_ns(), Relaxed);
                    return ExecLock { exec, token };
                }
            }
        }
    }
}

fn wake(exec: &Exec) {
    exec.epoch.fetch_add(1, AcqRel);
    sys::futex_wake_all(&exec.epoch);
}

impl Shared {
    /// A new context tag, unique in the state file (a CUDA context of some process).
    pub fn new_context_tag(&self) -> u64 {
        self.st().header.next_context.fetch_add(1, AcqRel) + 1
    }

    /// The time slice (0: no preemption), decided by the file's creator.
    pub fn timeslice_ns(&self) -> u64 {
        self.timeslice_ns
    }

    fn owner_word(&self) -> u64 {
        match self.slot() {
            Some(s) => ((s as u64) << 32) | self.st().slots[s].generation.load(Acquire) as u64,
            None => (u32::MAX as u64) << 32,
        }
    }

    /// Runs one kernel of `context` on `device` to its end: queues it, waits for the device, holds
    /// it for the kernel's work (see the module docs). Returns at once for a nonexistent device.
    ///
    /// `ready_ns`: realtime ns at which the kernel entered the device's queue on a GPU — when its
    /// stream's previous work ended on the device, or when it was launched if later (0: now). The
    /// host thread that calls this may get there later (a loaded machine); the device does not wait
    /// for it: a kernel that finds the device idle, or held for it, starts when it was ready.
    ///
    /// `followed`: more work is already queued behind this kernel on its stream. On a GPU that work
    /// is in the device's queue already, so the context is not idle between the two kernels; here
    /// the next kernel is handed over only once this one returns, so the context keeps the device
    /// for up to 5 ms (`HOLD_NS`) after this kernel ends (unless its time slice is over and
    /// another context waits).
    pub fn run_kernel(&self, k: &Submission) -> KernelRun {
        let Some((index, id)) = self.enqueue(k) else {
            return KernelRun::default();
        };
        let mut run = KernelRun::default();
        self.wait_entry(k.device as usize, index, id, Some(&mut run), |_| false);
        run
    }

    /// A turn on `device` for this process's own context (see [`DeviceTurn`]); returns once running.
    pub fn acquire_device(&self, device: u32) -> DeviceTurn<'_> {
        let context = {
            let mut c = self
                .process_context
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if c.0 != std::process::id() {
                *c = (std::process::id(), self.new_context_tag());
            }
            c.1
        };
        let Some((index, id)) = self.enqueue(&Submission::now(
            device,
            context,
            Work::Timed(Duration::from_nanos(UNTIL_ENDED)),
        )) else {
            return DeviceTurn {
                shared: self,
                device: usize::MAX,
                index: 0,
                id: 0,
            };
        };
        let d = device as usize;
        self.wait_entry(d, index, id, None, |e| {
            e.state.load(Acquire) == ENTRY_RUNNING
        });
        DeviceTurn {
            shared: self,
            device: d,
            index,
            id,
        }
    }

    /// Queues a kernel entry; `None` for a nonexistent device.
    fn enqueue(&self, k: &Submission) -> Option<(usize, u64)> {
        let &Submission {
            device,
            context,
            work,
            followed,
            ready_ns,
        } = k;
        let dev = self.device(device)?;
        let ex = &dev.exec;
        let owner = self.owner_word();
        let (remaining, barrier) = match work {
            Work::Timed(d) => (u64::try_from(d.as_nanos()).unwrap_or(UNTIL_ENDED), 0),
            Work::Barrier { tag, participants } => match self.barrier_slot(tag) {
                Some(b) => (
                    UNTIL_ENDED,
                    (b as u32 + 1) | (participants.min(0xffff) << 16),
                ),
                None => {
                    eprintln!(
                        "simgpu: all {MAX_BARRIERS} barrier tags are in use; barrier {tag} completes at once"
                    );
                    (0, 0)
                }
            },
        };
        loop {
            let g = lock_exec(ex);
            let now = sys::realtime_ns();
            if let Some(i) = alloc_entry(ex, now) {
                let e = &ex.entries[i];
                let id = ex.next_id.fetch_add(1, Relaxed) + 1;
                e.id.store(id, Relaxed);
                e.flags
                    .store(if followed { ENTRY_FOLLOWED } else { 0 }, Relaxed);
                e.context.store(context, Relaxed);
                e.owner.store(owner, Relaxed);
                e.seq.store(ex.next_seq.fetch_add(1, Relaxed), Relaxed);
                e.remaining_ns.store(remaining, Relaxed);
                e.segment_ns.store(0, Relaxed);
                e.barrier.store(barrier, Relaxed);
                e.barrier_round.store(0, Relaxed);
                e.done_ns.store(0, Relaxed);
                let ready = if ready_ns == 0 {
                    now
                } else {
                    ready_ns.min(now)
                };
                e.queued_ns.store(ready, Relaxed);
                e.first_ns.store(0, Relaxed);
                e.preempted.store(0, Relaxed);
                e.state.store(ENTRY_WAITING, Release);
                self.step(device as usize, now);
                drop(g);
                wake(ex);
                return Some((i, id));
            }
            drop(g);
            // Every entry is taken: wait for kernels to end.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until entry `index` (use `id`) is over, or until `until` says so; steps the schedule
    /// whenever something may have changed. Frees the entry when it is over.
    fn wait_entry(
        &self,
        d: usize,
        index: usize,
        id: u64,
        mut run: Option<&mut KernelRun>,
        until: impl Fn(&Entry) -> bool,
    ) {
        let ex = &self.st().devices[d].exec;
        let e = &ex.entries[index];
        loop {
            let epoch = ex.epoch.load(Acquire);
            let state = e.state.load(Acquire);
            if e.id.load(Acquire) != id || state == ENTRY_DONE {
                if let Some(r) = run.as_deref_mut() {
                    r.preempted = e.preempted.load(Relaxed);
                    let first = e.first_ns.load(Relaxed);
                    r.queued_ns = first.saturating_sub(e.queued_ns.load(Relaxed));
                    r.start_ns = first;
                    r.end_ns = e.done_ns.load(Relaxed);
                }
                if e.id.load(Acquire) == id {
                    let _ = e
                        .state
                        .compare_exchange(ENTRY_DONE, ENTRY_FREE, AcqRel, Acquire);
                }
                return;
            }
            if until(e) {
                return;
            }
            let now = sys::realtime_ns();
            let remaining = e.remaining_ns.load(Acquire);
            let own_end = (state == ENTRY_RUNNING && remaining != UNTIL_ENDED)
                .then(|| e.segment_ns.load(Acquire).saturating_add(remaining));
            let deadline = own_end
                .unwrap_or(u64::MAX)
                .min(self.next_event(ex, now))
                .min(now + POLL_NS);
            if deadline > now {
                // A late wake-up costs nothing on the device timeline: a kernel ends at its exact
                // end time whoever steps the schedule, and what its stream runs next is taken to
                // have been ready then. So nobody spins to be on time.
                sys::futex_wait(&ex.epoch, epoch, Duration::from_nanos(deadline - now));
            }
            let g = lock_exec(ex);
            let changed = self.step(d, sys::realtime_ns());
            drop(g);
            if changed {
                wake(ex);
            }
        }
    }

    /// The earliest time at which the schedule of `ex` changes by itself: a running kernel's end or
    /// the end of the serving context's slice (if another context waits). Read without the lock.
    fn next_event(&self, ex: &Exec, now: u64) -> u64 {
        let mut next = u64::MAX;
        let high = (ex.high.load(Acquire) as usize).min(TURNS);
        let active = ex.active_context.load(Acquire);
        let mut others_wait = false;
        for e in &ex.entries[..high] {
            match e.state.load(Acquire) {
                ENTRY_RUNNING => {
                    let r = e.remaining_ns.load(Acquire);
                    if r != UNTIL_ENDED {
                        next = next.min(e.segment_ns.load(Acquire).saturating_add(r));
                    }
                }
                ENTRY_WAITING => others_wait |= e.context.load(Acquire) != active,
                _ => {}
            }
        }
        if others_wait {
            let hold = ex.hold_until_ns.load(Acquire);
            if hold > now {
                next = next.min(hold);
            }
        }
        if others_wait && self.timeslice_ns > 0 && ex.running.load(Acquire) > 0 {
            let used = slice_used(ex, now);
            next = next.min(now.saturating_add(self.timeslice_ns.saturating_sub(used)));
        }
        next.max(now)
    }

    /// Brings device `d`'s schedule up to `now`: finishes kernels that are over (at their end
    /// time), preempts the serving context at slice end if another waits, hands an idle device to
    /// the longest-waiting context, starts kernels of the serving context up to the concurrency
    /// limit. Caller holds the device's lock. Returns whether anything changed.
    fn step(&self, d: usize, now: u64) -> bool {
        let st = self.st();
        let dev = &st.devices[d];
        let ex = &dev.exec;
        let high = (ex.high.load(Acquire) as usize).min(TURNS);
        let entries = &ex.entries[..high];
        let mut changed = false;
        if now.saturating_sub(ex.reaped_ns.load(Relaxed)) >= REAP_SPACING_NS {
            ex.reaped_ns.store(now, Relaxed);
            changed |= self.reap_dead(dev, d, now);
        }
        for _ in 0..8 {
            let mut again = false;
            // 1. Kernels that are over, in order of their end.
            loop {
                let mut first: Option<(u64, usize)> = None;
                for (i, e) in entries.iter().enumerate() {
                    if e.state.load(Acquire) != ENTRY_RUNNING {
                        continue;
                    }
                    if let Some(end) = self.end_of(e, now) {
                        if first.is_none_or(|f| end < f.0) {
                            first = Some((end, i));
                        }
                    }
                }
                let Some((end, i)) = first else { break };
                self.finish(dev, d, &entries[i], end, true);
                changed = true;
            }
            let mut active = ex.active_context.load(Relaxed);
            let waiting = |pred: &dyn Fn(u64) -> bool| {
                entries
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| {
                        e.state.load(Acquire) == ENTRY_WAITING && pred(e.context.load(Relaxed))
                    })
                    .min_by_key(|(_, e)| e.seq.load(Relaxed))
                    .map(|(i, _)| i)
            };
            // 2. The time slice: the serving context yields to another's waiting kernel.
            if active != 0
                && self.timeslice_ns > 0
                && slice_used(ex, now) >= self.timeslice_ns
                && waiting(&|c| c != active).is_some()
            {
                for e in entries {
                    if e.state.load(Acquire) == ENTRY_RUNNING {
                        let ran = now.saturating_sub(e.segment_ns.load(Relaxed));
                        let r = e.remaining_ns.load(Relaxed);
                        if r != UNTIL_ENDED {
                            e.remaining_ns.store(r.saturating_sub(ran), Relaxed);
                        }
                        e.seq.store(ex.next_seq.fetch_add(1, Relaxed), Relaxed);
                        e.preempted.fetch_add(1, Relaxed);
                        e.state.store(ENTRY_WAITING, Release);
                    }
                }
                if ex.running.swap(0, AcqRel) > 0 {
                    self.end_busy(dev, d, now);
                }
                ex.switches.fetch_add(1, AcqRel);
                ex.hold_until_ns.store(0, Relaxed);
                ex.hold_from_ns.store(0, Relaxed);
                ex.idle_since_ns.store(now, Relaxed);
                ex.idle_context.store(0, Relaxed);
                ex.idle_hold_until_ns.store(0, Relaxed);
                active = 0;
                changed = true;
            }
            // 3. A serving context with nothing left gives the device up (unless a kernel it has
            //    queued already is on its way: the hold).
            if active != 0
                && ex.running.load(Relaxed) == 0
                && waiting(&|c| c == active).is_none()
                && now >= ex.hold_until_ns.load(Relaxed)
            {
                // Idle since its last kernel ended (`end_busy` stored when); for other contexts,
                // since its hold ran out.
                ex.idle_context.store(active, Relaxed);
                ex.idle_hold_until_ns
                    .store(ex.hold_until_ns.load(Relaxed).min(now), Relaxed);
                active = 0;
                changed = true;
            }
            // 4. An idle device goes to the longest-waiting kernel's context. Its kernels start
            //    when they were ready, but not before the device became idle: the device did not
            //    wait for their host threads to come round.
            let mut floor = now;
            if active == 0 {
                ex.hold_until_ns.store(0, Relaxed);
                ex.hold_from_ns.store(0, Relaxed);
                if let Some(i) = waiting(&|_| true) {
                    active = entries[i].context.load(Relaxed);
                    ex.active_owner
                        .store(entries[i].owner.load(Relaxed), Relaxed);
                    let since = ex.idle_since_ns.load(Relaxed);
                    floor = if active == ex.idle_context.load(Relaxed) {
                        since
                    } else {
                        since.max(ex.idle_hold_until_ns.load(Relaxed))
                    }
                    .min(now);
                    let from = floor.max(entries[i].queued_ns.load(Relaxed)).min(now);
                    ex.slice_start_ns.store(from, Relaxed);
                    ex.slice_used_ns.store(0, Relaxed);
                    changed = true;
                }
                ex.active_context.store(active, Release);
            }
            // 5. Start the serving context's kernels, oldest first, up to the concurrency limit.
            while active != 0 && ex.running.load(Relaxed) < self.concurrent {
                let Some(i) = waiting(&|c| c == active) else {
                    break;
                };
                let e = &entries[i];
                // The kernel that follows a held context's last one on an idle device starts when
                // that one ended (or when it was ready, if later): on a GPU it was queued already,
                // and the device was not idle.
                let held_from = ex.hold_from_ns.swap(0, Relaxed);
                let idle = ex.running.load(Relaxed) == 0;
                if idle && held_from != 0 && now < ex.hold_until_ns.load(Relaxed) {
                    floor = held_from.min(now);
                }
                // The hold was for this kernel: it is over once the kernel runs (the kernel sets
                // a new one when it ends, if more work follows it).
                ex.hold_until_ns.store(0, Relaxed);
                let mut start = floor.max(e.queued_ns.load(Relaxed)).min(now);
                if !idle {
                    // Within the busy interval that is going on.
                    start = start.max(ex.busy_since_ns.load(Relaxed));
                }
                e.segment_ns.store(start, Relaxed);
                if e.first_ns.load(Relaxed) == 0 {
                    e.first_ns.store(start, Relaxed);
                }
                if ex.running.fetch_add(1, AcqRel) == 0 {
                    ex.busy_since_ns.store(start, Relaxed);
                    self.mark_busy_start(dev, d, start);
                }
                e.state.store(ENTRY_RUNNING, Release);
                changed = true;
                again |= self.arrive(e, now) || self.end_of(e, now).is_some();
            }
            if !again {
                break;
            }
        }
        changed
    }

    /// The end time of a running kernel if it is over by `now`.
    fn end_of(&self, e: &Entry, now: u64) -> Option<u64> {
        let seg = e.segment_ns.load(Relaxed);
        let b = e.barrier.load(Relaxed);
        if b != 0 {
            let slot = (b & 0xffff) as usize - 1;
            let bar = self.st().barriers.get(slot)?;
            let released = (bar.word.load(Acquire) >> 32) != e.barrier_round.load(Relaxed);
            let arrived = e.flags.load(Relaxed) & ENTRY_ARRIVED != 0;
            return (arrived && released).then(|| bar.released_ns.load(Acquire).clamp(seg, now));
        }
        let r = e.remaining_ns.load(Relaxed);
        (r != UNTIL_ENDED && seg.saturating_add(r) <= now).then(|| seg.saturating_add(r))
    }

    /// Ends a running (or, `running == false`, a queued) kernel at `end`.
    fn finish(&self, dev: &Device, d: usize, e: &Entry, end: u64, running: bool) {
        if running
            && e.flags.load(Relaxed) & ENTRY_FOLLOWED != 0
            && e.context.load(Relaxed) == dev.exec.active_context.load(Relaxed)
        {
            let hold = &dev.exec.hold_until_ns;
            hold.store(hold.load(Relaxed).max(end.saturating_add(HOLD_NS)), Relaxed);
            dev.exec.hold_from_ns.store(end, Relaxed);
        }
        e.remaining_ns.store(0, Relaxed);
        e.done_ns.store(end, Relaxed);
        e.state.store(ENTRY_DONE, Release);
        let ex = &dev.exec;
        if running
            && ex
                .running
                .fetch_update(AcqRel, Acquire, |r| r.checked_sub(1))
                == Ok(1)
        {
            self.end_busy(dev, d, end);
        }
        dev.kernels.fetch_add(1, AcqRel);
        if let Some(slot) = self.slot_of(e.owner.load(Relaxed)) {
            self.st().slots[slot].usage[d].kernels.fetch_add(1, AcqRel);
            if let Some(g) = self.group_of(slot) {
                g.usage[d].kernels.fetch_add(1, AcqRel);
            }
        }
    }

    /// The slot an owner word names, if that registration is still the slot's.
    fn slot_of(&self, owner: u64) -> Option<usize> {
        let slot = (owner >> 32) as usize;
        let s = self.st().slots.get(slot)?;
        (s.generation.load(Acquire) == owner as u32).then_some(slot)
    }

    /// A sample at the start of a busy interval bounds the utilization error (see `busy_at`).
    fn mark_busy_start(&self, dev: &Device, d: usize, now: u64) {
        record(&dev.history, now, dev.busy_ns.load(Acquire));
        if let Some(s) = self.slot_of(dev.exec.active_owner.load(Relaxed)) {
            let p = &self.st().slots[s];
            record(&p.history[d], now, p.usage[d].busy_ns.load(Acquire));
        }
    }

    /// The busy interval that began at `busy_since_ns` ended at `end`: charged to the device and to
    /// the serving context's process and group.
    fn end_busy(&self, dev: &Device, d: usize, end: u64) {
        let busy = end.saturating_sub(dev.exec.busy_since_ns.load(Relaxed));
        dev.exec.idle_since_ns.store(end, Relaxed);
        dev.exec.slice_used_ns.fetch_add(busy, Relaxed);
        let total = dev.busy_ns.fetch_add(busy, AcqRel) + busy;
        record(&dev.history, end, total);
        if let Some(s) = self.slot_of(dev.exec.active_owner.load(Relaxed)) {
            let p = &self.st().slots[s];
            let pbusy = p.usage[d].busy_ns.fetch_add(busy, AcqRel) + busy;
            record(&p.history[d], end, pbusy);
            if let Some(g) = self.group_of(s) {
                g.usage[d].busy_ns.fetch_add(busy, AcqRel);
            }
        }
    }

    /// A barrier kernel starting for the first time arrives at its barrier. True if that released
    /// the barrier (kernels on this device may now be over; others are woken).
    fn arrive(&self, e: &Entry, now: u64) -> bool {
        let b = e.barrier.load(Relaxed);
        if b == 0 || e.flags.load(Relaxed) & ENTRY_ARRIVED != 0 {
            return false;
        }
        let Some(bar) = self.st().barriers.get((b & 0xffff) as usize - 1) else {
            return false;
        };
        let participants = (b >> 16).max(1) as u64;
        let Ok(old) = bar.word.fetch_update(AcqRel, Acquire, |w| {
            let (round, arrived) = (w >> 32, (w & 0xffff_ffff) + 1);
            Some(if arrived >= participants {
                (round.wrapping_add(1) & 0xffff_ffff) << 32
            } else {
                (round << 32) | arrived
            })
        }) else {
            return false;
        };
        e.barrier_round.store(old >> 32, Relaxed);
        e.flags.fetch_or(ENTRY_ARRIVED, AcqRel);
        let released = (old & 0xffff_ffff) + 1 >= participants;
        if released {
            bar.released_ns.store(now, Release);
            // Kernels of this barrier on other devices can now end.
            for dev in &self.st().devices[..self.devices as usize] {
                wake(&dev.exec);
            }
        }
        released
    }

    /// The barrier slot of `tag` (claimed on first use; slots are never freed). Open addressing
    /// from the tag's hash, so that concurrent claimers of one tag agree on its slot.
    fn barrier_slot(&self, tag: u64) -> Option<usize> {
        let key = tag.wrapping_add(1).max(1);
        let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % MAX_BARRIERS;
        let bars = &self.st().barriers;
        for k in 0..MAX_BARRIERS {
            let i = (start + k) % MAX_BARRIERS;
            match bars[i].key.compare_exchange(0, key, AcqRel, Acquire) {
                Ok(_) => return Some(i),
                Err(cur) if cur == key => return Some(i),
                Err(_) => {}
            }
        }
        None
    }

    /// Removes kernels of processes that died: a running one counts as having run until `now`.
    fn reap_dead(&self, dev: &Device, d: usize, now: u64) -> bool {
        let ex = &dev.exec;
        let high = (ex.high.load(Acquire) as usize).min(TURNS);
        let mut checked: Vec<(u64, bool)> = Vec::new();
        let mut changed = false;
        for e in &ex.entries[..high] {
            let state = e.state.load(Acquire);
            if !matches!(state, ENTRY_WAITING | ENTRY_RUNNING) {
                continue;
            }
            let owner = e.owner.load(Relaxed);
            let alive = match checked.iter().find(|c| c.0 == owner) {
                Some(c) => c.1,
                None => {
                    let a = self.owner_alive(owner);
                    checked.push((owner, a));
                    a
                }
            };
            if !alive {
                self.finish(dev, d, e, now, state == ENTRY_RUNNING);
                changed = true;
            }
        }
        changed
    }

    /// Kernels of `device` that have run since the start of the current busy interval, for
    /// readers: ns busy now not yet in the counters (optionally only if `slot` is being served).
    pub(super) fn inflight_ns(&self, dev: &Device, slot: Option<usize>, now: u64) -> u64 {
        let ex = &dev.exec;
        if ex.running.load(Acquire) == 0 {
            return 0;
        }
        if slot.is_some_and(|s| (ex.active_owner.load(Acquire) >> 32) as usize != s) {
            return 0;
        }
        now.saturating_sub(ex.busy_since_ns.load(Acquire))
            .min(UTILIZATION_WINDOW_NS * 10)
    }

    /// Context tag the device serves now (0: idle), and its running kernels (tests, tools).
    pub fn serving(&self, device: u32) -> (u64, u32) {
        self.device(device).map_or((0, 0), |d| {
            (
                d.exec.active_context.load(Acquire),
                d.exec.running.load(Acquire),
            )
        })
    }
}

/// Device time the serving context of `ex` has used in its slice, up to `now`.
fn slice_used(ex: &Exec, now: u64) -> u64 {
    let running = if ex.running.load(Acquire) > 0 {
        now.saturating_sub(ex.busy_since_ns.load(Acquire))
    } else {
        0
    };
    ex.slice_used_ns.load(Acquire).saturating_add(running)
}

/// A free entry of `ex` (caller holds the lock): a free one, a finished one nobody freed for a
/// while, or a new one.
fn alloc_entry(ex: &Exec, now: u64) -> Option<usize> {
    let high = (ex.high.load(Relaxed) as usize).min(TURNS);
    for (i, e) in ex.entries[..high].iter().enumerate() {
        let state = e.state.load(Acquire);
        if state == ENTRY_FREE
            || (state == ENTRY_DONE && now.saturating_sub(e.done_ns.load(Relaxed)) > RECLAIM_NS)
        {
            return Some(i);
        }
    }
    (high < TURNS).then(|| {
        ex.high.store(high as u32 + 1, Release);
        high
    })
}

impl DeviceTurn<'_> {
    /// Says how long the kernel runs (from when it was last started), so that it ends by itself,
    /// even if this process stops.
    pub fn set_duration(&self, d: Duration) {
        let Some(dev) = self.shared.st().devices.get(self.device) else {
            return;
        };
        let e = &dev.exec.entries[self.index];
        let _g = lock_exec(&dev.exec);
        if e.id.load(Acquire) == self.id && e.remaining_ns.load(Relaxed) == UNTIL_ENDED {
            let ran = sys::realtime_ns().saturating_sub(e.segment_ns.load(Relaxed));
            let d = u64::try_from(d.as_nanos()).unwrap_or(UNTIL_ENDED - 1);
            e.remaining_ns.store(d.max(ran), Release);
        }
    }
}

impl Drop for DeviceTurn<'_> {
    fn drop(&mut self) {
        let Some(dev) = self.shared.st().devices.get(self.device) else {
            return;
        };
        let ex = &dev.exec;
        let e = &ex.entries[self.index];
        let g = lock_exec(ex);
        let now = sys::realtime_ns();
        // A duration that ran out while nobody looked ends the kernel at its end, not now.
        self.shared.step(self.device, now);
        if e.id.load(Acquire) == self.id {
            match e.state.load(Acquire) {
                ENTRY_RUNNING => self.shared.finish(dev, self.device, e, now, true),
                ENTRY_WAITING => self.shared.finish(dev, self.device, e, now, false),
                _ => {}
            }
            e.state.store(ENTRY_FREE, Release);
        }
        self.shared.step(self.device, now);
        drop(g);
        wake(ex);
    }
}
