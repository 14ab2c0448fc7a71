//! Reconciliation of driver overhead: after each overhead operation (and before the program is
//! told how much memory it has), what the driver says this process holds beyond its allocations and
//! recorded overhead is charged as the device's unattributed overhead, never less than 0, never on
//! an impossible answer. The figure is the process's own line in NVML's lists, else (a process in
//! another PID namespace) the node's word in the ledger (`gpuslice node reconcile`), a bounded
//! hint. Measurement of single operations is `overhead` and `measurement`.

use super::overhead::{warn_once, Sample};
use super::{Device, Tenant};
use crate::driver::measure::ProcessFigure;
use crate::ledger::QuotaExceeded;
use crate::slotfile::sys::own_pid;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Per-process reconciliation state.
#[derive(Default)]
pub(super) struct State {
    /// Ledger device -> overhead found by reconciliation beyond the recorded charges (charged).
    pub unattributed: super::records::KeyMap<usize, u64>,
    /// Ledger device -> the PID of the process whose last reconciliation there read its own figure
    /// and left the ledger agreeing with it (no surplus, nothing beyond the charges left uncharged;
    /// a forked child's is not its parent's). See `measurement::settled_figure`.
    pub agreed: super::records::KeyMap<usize, u32>,
    /// Ledger device -> operations charged up front there since the last reading
    /// (`up_front`); a reconciliation's reading brings it back to 0.
    pub unmeasured: super::records::KeyMap<usize, u32>,
}

impl Tenant {
    /// Whether this process's last reconciliation on ledger device `slot` left the ledger agreeing
    /// with the driver's figure for it.
    pub(super) fn agreed(&self, slot: usize) -> bool {
        self.overhead.lock().agreed.get(&slot).copied() == Some(own_pid())
    }

    /// Marks ledger device `slot` as not agreeing (no PID to read for that), before a
    /// reconciliation: its reading also covers every operation charged up front there.
    fn disagree(&self, slot: usize) {
        let mut state = self.overhead.lock();
        state.agreed.insert(slot, 0);
        state.unmeasured.remove(&slot);
    }

    /// Operations charged up front on ledger device `slot` since the last reading there.
    pub(super) fn unmeasured_on(&self, slot: usize) -> u32 {
        self.overhead
            .lock()
            .unmeasured
            .get(&slot)
            .copied()
            .unwrap_or(0)
    }

    /// Counts one more operation charged up front on ledger device `slot`; returns the count.
    pub(super) fn note_unmeasured(&self, slot: usize) -> u32 {
        let mut state = self.overhead.lock();
        let n = state.unmeasured.entry(slot).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }
}

static WARNED_UNCHARGED: AtomicBool = AtomicBool::new(false);
static WARNED_NODE_BOUND: AtomicBool = AtomicBool::new(false);

/// The node's word this process last applied (its `node_ms`).
static NODE_APPLIED: AtomicU64 = AtomicU64::new(0);

/// A node's word older than this is not used (the node stopped, or the process is new).
const NODE_WORD_FRESH_MS: u64 = 30_000;

/// Per ledger device (index < 16): the recorded overhead the last reconciliation saw, and when it
/// last fell (unix ms): a node's word read before that counts an object since destroyed.
static RECORDED: [(AtomicU64, AtomicU64); crate::ledger::MAX_DEVICES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; crate::ledger::MAX_DEVICES];

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Notes the recorded overhead on ledger device `slot`; returns when it last fell (unix ms).
fn note_recorded(slot: usize, recorded: u64) -> u64 {
    let Some((last, fell)) = RECORDED.get(slot) else {
        return u64::MAX;
    };
    if recorded < last.swap(recorded, Ordering::Relaxed) {
        fell.store(unix_ms(), Ordering::Relaxed);
    }
    fell.load(Ordering::Relaxed)
}

/// The driver memory the node last found this process using on ledger device `slot` beyond its
/// allocations (`gpuslice node reconcile`: NVML's figure for its host PID, which a process in
/// another PID namespace cannot find), and whether it may raise the charge. The ledger is the
/// tenant's to write, so the word is a hint, bounded: not believed when older than
/// [`NODE_WORD_FRESH_MS`] or larger than the device's memory; read before the recorded overhead
/// last fell (`fell`: an object destroyed since, which it still counts), it may only lower what
/// reconciliation added. It never lowers a recorded charge (the caller charges only what it
/// finds beyond them).
fn node_overhead(
    ledger: &crate::ledger::Ledger,
    slot: usize,
    uuid: &str,
    total: impl FnOnce() -> Option<u64>,
    fell: u64,
) -> Option<(u64, bool)> {
    let (overhead, ms) = ledger.node_word_for_me(slot)?;
    let now = unix_ms();
    if now.saturating_sub(ms) > NODE_WORD_FRESH_MS || ms > now.saturating_add(NODE_WORD_FRESH_MS) {
        return None;
    }
    if total().is_some_and(|total| overhead > total) {
        warn_once(
            &WARNED_NODE_BOUND,
            format_args!(
                "the node's word in the ledger says this process holds {overhead} bytes of driver \
                 memory on {uuid}, more than the device has: not believed"
            ),
        );
        return None;
    }
    Some((overhead, ms >= fell))
}

impl Tenant {
    /// Brings the unattributed overhead of a device to what the driver says this process holds
    /// beyond its allocations and recorded overhead (never below 0; never on an impossible answer):
    /// from the process's own line in NVML's lists, else from the node's word in the ledger (a
    /// process in another PID namespace; see [`node_overhead`]). Publishes which it was.
    fn reconcile(&self, device: &Device, slot: usize, sample: &Sample) {
        // Agreeing only once shown below.
        self.disagree(slot);
        if self.context_reserve_is_explicit() {
            // Contexts are charged what the operator said; what the driver holds beyond that is
            // mostly theirs, and cannot be told apart from other overhead.
            return;
        }
        let Some(Ok(ledger)) = self.ledger.get() else {
            return;
        };
        let mut state = self.overhead.lock();
        let unattributed = state.unattributed.get(&slot).copied().unwrap_or(0);
        drop(state);
        let recorded = self.overhead_on(Some(slot)).saturating_sub(unattributed);
        let fell = note_recorded(slot, recorded);
        let mut agrees = false;
        let wanted = match sample.process {
            ProcessFigure::Listed(holds) => {
                ledger.set_reconciled_by_me(crate::ledger::RECONCILED_OWN);
                let allocated = sample.charged.saturating_sub(recorded + unattributed);
                if holds < allocated {
                    return; // impossible (logged by `spent`): not believed
                }
                // The ledger agrees with the figure once unattributed is brought to `wanted`,
                // unless the records charge more than the driver holds beyond the allocations.
                agrees = holds - allocated >= recorded;
                holds.saturating_sub(allocated).saturating_sub(recorded)
            }
            _ => match node_overhead(
                ledger,
                slot,
                &device.uuid,
                || self.driver.device_total(&device.uuid),
                fell,
            ) {
                Some((overhead, raise)) => {
                    ledger.set_reconciled_by_me(crate::ledger::RECONCILED_NODE);
                    let wanted = overhead.saturating_sub(recorded);
                    if raise {
                        wanted
                    } else {
                        wanted.min(unattributed)
                    }
                }
                None => {
                    if self.driver.driver_pid_unknown() {
                        ledger.set_reconciled_by_me(crate::ledger::RECONCILED_ESTIMATED);
                    }
                    return;
                }
            },
        };
        state = self.overhead.lock();
        let state = &mut *state;
        let entry = state.unattributed.entry(slot).or_insert(0);
        if wanted > *entry {
            match ledger.try_reserve(slot, wanted - *entry) {
                Ok(()) => {
                    *entry = wanted;
                    state
                        .agreed
                        .insert(slot, if agrees { own_pid() } else { 0 });
                }
                Err(QuotaExceeded { used, limit, .. }) => warn_once(
                    &WARNED_UNCHARGED,
                    format_args!(
                        "the driver holds {} bytes for this process on {} beyond what was charged, \
                         and the quota has no room for them ({used} of {limit} in use): further \
                         allocations are refused until memory is freed",
                        wanted - *entry,
                        device.uuid
                    ),
                ),
            }
        } else {
            if wanted < *entry {
                ledger.release(slot, *entry - wanted);
                *entry = wanted;
            }
            state
                .agreed
                .insert(slot, if agrees { own_pid() } else { 0 });
        }
    }

    /// A new word of the node for this process (see [`node_overhead`]) is applied at its next
    /// reservation: one atomic load per reservation while there is none; the work, when there is,
    /// is skipped rather than waited for when another thread holds the bookkeeping.
    #[inline]
    pub(super) fn node_word_due(&self) -> bool {
        match self.ledger.get() {
            Some(Ok(ledger)) => {
                let stamp = ledger.node_stamp_for_me();
                stamp != 0 && stamp != Self::node_word_applied()
            }
            _ => false,
        }
    }

    /// The stamp of the node's last word this process applied (0: none): the allocation path's
    /// quick reservation is taken only while the node has written no other
    /// (`Ledger::reserve_quickly_unless_node`).
    #[inline(always)]
    pub(super) fn node_word_applied() -> u64 {
        NODE_APPLIED.load(Ordering::Relaxed)
    }

    /// Applies the node's new word ([`Tenant::node_word_due`]) on `device`, unless this process
    /// reads its own figures (then the node's are not needed) or the bookkeeping is busy.
    #[cold]
    #[inline(never)]
    pub(super) fn apply_node_word(&self, device: &Device) {
        let Some(Ok(ledger)) = self.ledger.get() else {
            return;
        };
        let stamp = ledger.node_stamp_for_me();
        let Ok(slot) = device.slot else { return };
        if !self.driver.driver_pid_unknown() || self.context_reserve_is_explicit() {
            NODE_APPLIED.store(stamp, Ordering::Relaxed);
            return;
        }
        // Never wait here for a lock the calling thread (or another) holds: the next reservation
        // tries again.
        let (Some(records), Some(state)) = (self.records.try_lock(), self.overhead.try_lock())
        else {
            return;
        };
        drop((records, state));
        NODE_APPLIED.store(stamp, Ordering::Relaxed);
        let sample = Sample {
            process: ProcessFigure::Unavailable,
            device: None,
            listed: None,
            charged_low: ledger.used_by_me(slot),
            charged: ledger.used_by_me(slot),
        };
        self.reconcile(device, slot, &sample);
        ledger.set_overhead_by_me(slot, self.overhead_on(Some(slot)));
    }

    /// Re-reads what the driver says `device` holds for this process and reconciles; publishes the
    /// process's overhead in the ledger (for `gpuslice status`).
    pub fn reconcile_device(&self, device: &Device) {
        let Ok(slot) = device.slot else { return };
        if !self.context_reserve_is_explicit() {
            let sample = self.sample(device);
            self.reconcile(device, slot, &sample);
        }
        if let Some(Ok(ledger)) = self.ledger.get() {
            ledger.set_overhead_by_me(slot, self.overhead_on(Some(slot)));
        }
    }

    /// [`Tenant::reconcile_device`] from the figures a measurement read after its operation
    /// ([`Tenant::charge_measured_sampled`]), once its charge is recorded; reads them when it read
    /// none.
    pub(super) fn reconcile_with(&self, device: &Device, after: Option<Sample>) {
        let (Ok(&slot), Some(sample)) = (device.slot.as_ref(), after) else {
            return self.reconcile_device(device);
        };
        if !self.context_reserve_is_explicit() {
            self.reconcile(device, slot, &sample);
        }
        if let Some(Ok(ledger)) = self.ledger.get() {
            ledger.set_overhead_by_me(slot, self.overhead_on(Some(slot)));
        }
    }

    /// [`Tenant::reconcile_device`] before the program is told how much memory it has
    /// (`cuMemGetInfo`): driver memory spent since the last overhead operation (code loaded lazily at
    /// a kernel's first launch, graph memory) is charged before the program sizes itself from the
    /// figure. Only once the process has driver overhead (it then has NVML loaded).
    pub fn reconcile_before_query(&self, device: &Device) {
        self.release_finished_graph_memory();
        if self.context_reserve_is_explicit()
            || self.overhead_on(device.slot.as_ref().ok().copied()) == 0
        {
            return;
        }
        self.reconcile_device(device);
    }

    /// [`Tenant::reconcile_device`] for every device this process used (after a context was
    /// destroyed or a module unloaded, when the driver gave memory back).
    pub fn reconcile_all(&self) {
        for device in self.known_devices() {
            self.reconcile_device(device);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limit;
    use crate::ledger::{Ledger, LedgerOptions, MAX_DEVICES, NODE_NOT_LISTED};

    const UUID: &str = "GPU-00000000-0000-4000-8000-0000000000aa";
    const MIB: u64 = 1 << 20;

    /// A process's ledger with a slot, and the node's handle on it.
    fn ledgers(tag: &str) -> (std::path::PathBuf, Ledger, Ledger, usize) {
        let dir =
            std::env::temp_dir().join(format!("gpuslice-node-word-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.ledger");
        let opts = LedgerOptions {
            tenant: "t".into(),
            default_limit: Limit::Bytes(1 << 30),
            devices: vec![(UUID.into(), Limit::Bytes(1 << 30))],
            group: None,
        };
        let me = Ledger::open(&path, &opts).unwrap();
        let d = me.device_index(UUID).unwrap();
        me.try_reserve(d, MIB).unwrap();
        let node = Ledger::open_existing(&path).unwrap();
        (dir, me, node, d)
    }

    fn word(node: &Ledger, me: &Ledger, d: usize, bytes: u64, ms: u64) {
        let slot = me.slot().unwrap();
        let claim = node.slot_charges(slot, d).unwrap().0;
        let mut words = [NODE_NOT_LISTED; MAX_DEVICES];
        words[d] = bytes;
        let word = crate::ledger::NodeWord {
            claim,
            host_pid: 77,
            overhead: words,
            now_ms: ms,
        };
        node.publish_node_word(slot, &word);
    }

    /// The node's word is a hint: used while fresh, only to lower what reconciliation added when it
    /// was read before the recorded overhead last fell, and not at all when stale, from the future
    /// or for a device the process is not listed on.
    #[test]
    fn the_nodes_word_is_used_fresh_and_bounded() {
        let _serial = crate::slotfile::serial_test();
        let (dir, me, node, d) = ledgers("fresh");
        let now = unix_ms();
        assert_eq!(node_overhead(&me, d, UUID, || None, 0), None, "no word yet");
        word(&node, &me, d, 40 * MIB, now);
        assert_eq!(
            node_overhead(&me, d, UUID, || None, 0),
            Some((40 * MIB, true))
        );
        // Read before the recorded overhead fell: it still counts what was destroyed since.
        assert_eq!(
            node_overhead(&me, d, UUID, || None, now + 1),
            Some((40 * MIB, false))
        );
        word(&node, &me, d, 40 * MIB, now - NODE_WORD_FRESH_MS - 1_000);
        assert_eq!(node_overhead(&me, d, UUID, || None, 0), None, "stale");
        word(&node, &me, d, 40 * MIB, now + NODE_WORD_FRESH_MS + 60_000);
        assert_eq!(
            node_overhead(&me, d, UUID, || None, 0),
            None,
            "from the future"
        );
        word(&node, &me, d, NODE_NOT_LISTED, now);
        assert_eq!(node_overhead(&me, d, UUID, || None, 0), None, "not listed");
        drop((me, node));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A fall of the recorded overhead is noted with its time; a rise is not.
    #[test]
    fn a_fall_of_the_recorded_overhead_is_dated() {
        let slot = MAX_DEVICES - 1;
        let before = unix_ms();
        note_recorded(slot, 100);
        let first = note_recorded(slot, 200);
        assert!(first < before || first == 0, "a rise is no fall");
        let fell = note_recorded(slot, 50);
        assert!(fell >= before, "{fell} < {before}");
        assert_eq!(note_recorded(MAX_DEVICES, 1), u64::MAX, "no such device");
    }
}
