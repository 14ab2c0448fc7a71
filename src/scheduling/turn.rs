//! A tenant's turn (docs/COMPUTE.md, "A tenant's processes share its turn"): pure decisions, no
//! shared memory.
//!
//! Ownership names one process slot (the *lead*), but the device is the tenant's while that slot
//! holds it: every process of the tenant may launch then. Taking turns between the tenant's own
//! processes would split the tenant's share by hand-overs among them and make each one's requests
//! wait for the other's slices as well as for the other tenants'.
//!
//! Charging: contexts are time-sliced on the device, so the lead's event intervals (chained
//! launches on its streams) also hold the time the device served the tenant's other processes in
//! the turn, and its charge (measured, at most the wall time it held the device) covers the turn.
//! The other processes' launches that complete outside their own ownership are therefore not
//! charged again: charged as well, the two-process tenant of a 30/70 pair got 58-65% instead of
//! 70 (`compute_shares`, `two`); charged once, 70.3.
//!
//! The stall time: how long an owner's work may complete nothing before the owner counts as
//! waiting for something outside the process. It follows the work's own progress: the longest
//! launch seen to complete, not only a fixed time.

/// At least this long without progress before an owner counts as stalled.
pub const STALL_MIN_NS: u64 = 1_000_000;
/// At most this long: past it, the owner's work waits for something else (a launch longer than this
/// is a stall as far as its neighbours are concerned; the drain bound covers what it leaves).
pub const STALL_MAX_NS: u64 = 100_000_000;

/// Whether a process of tenant `mine`, in slot `me`, may launch in the turn of the owner slot
/// `owner` (its state active: `owner_active`; its tenant word `owner_tenant`): the owner is another
/// slot of the same tenant. A slot's own ownership is not a shared turn (`Sched::owns_now`).
pub fn shares_turn(
    owner: Option<usize>,
    owner_active: bool,
    owner_tenant: usize,
    me: usize,
    mine: usize,
) -> bool {
    owner.is_some_and(|o| o != me) && owner_active && owner_tenant == mine
}

/// Whether the owner's slice, granted at `grant_ns` for `slice_ns` (untrusted words; the slice at
/// most `slice_max_ns`), still runs at `now`: the other processes of its tenant launch in the turn
/// only until then. Past it the owner renews (a new grant) or drains, and its drain waits only for
/// its own work: what another process of the tenant launched during the drain ran after the
/// owner's last event, was charged to nobody, and ran into the next tenant's ownership (the
/// share-30 tenant beside a two-process tenant of 70 got 27.8-28.1%).
pub fn in_slice(now: u64, grant_ns: u64, slice_ns: u64, slice_max_ns: u64) -> bool {
    now < grant_ns.min(now).saturating_add(slice_ns.min(slice_max_ns))
}

/// Whether a waiting slot of tenant `waiter` is a rival of an owner of tenant `mine` at the end of
/// its slice (the owner must hand over rather than renew): a process of the owner's own tenant
/// is not (it launches in the renewed turn); a high-priority owner yields only to another
/// high-priority tenant.
pub fn rival(waiter: usize, waiter_high: bool, mine: usize, high: bool) -> bool {
    waiter != mine && (!high || waiter_high)
}

/// Whether an owner that submitted nothing for the idle time (`quiet`) may count as idle and hand
/// the device over, with `flow_waiting` launch hooks of its process waiting in flow control: only
/// when none does. A thread waiting there has work to submit, and our work it waits for is on the
/// device (flow control takes that batch off the list of batches in flight while it waits, so
/// the look at our completions finds nothing running): the process is not idle. Counted idle, a
/// normal tenant keeping one kernel in flight beside an active high-priority tenant released the
/// device as idle every ~0.55 ms of each 2 ms kernel and was granted it again at once, each time a
/// ledger lock and a charge: 8,925 self-hand-overs in an 8 s run, none now (docs/BENCHMARKS.md,
/// "Where the slowest high-priority requests' time goes"). Stalls (an owner whose work waits for something outside
/// the process) are looked for on their own (`Sched::watch_stall`), and a flow-control wait is
/// bounded on its own (`flow::WaitBound`), so a waiter never keeps the device past its slice.
pub fn may_go_idle(quiet: bool, flow_waiting: u32) -> bool {
    quiet && flow_waiting == 0
}

/// Whether an owner whose slice ended and that may not renew it drains its work before the
/// hand-over: not when it is normal and a high-priority tenant waits (`high_waits`), which may not
/// have raised the preempt word yet (it publishes its wait first). It is handed over undrained, as
/// when preempted: what we have in flight runs before the high-priority work in the device's order
/// anyway. Drained, a request waited for our kernel in flight to complete before its grant, then
/// for the hand-over's wake-ups (2.4-3.3 ms in its first launch, about one request in 200 once an
/// owner waiting in flow control kept its slices to their end, `may_go_idle`).
pub fn drains_at_slice_end(high: bool, high_waits: bool) -> bool {
    high || !high_waits
}

/// Whether a normal process holds its launches back for a high-priority tenant: it is normal, a
/// high-priority tenant is active (`beside_high`, found from the ledger's tenants at refresh) and
/// the `preempt` word says one of its processes asks for the device. The word alone, which any
/// tenant can write, never holds anyone back.
pub fn holds_back(high: bool, beside_high: bool, preempt: u32) -> bool {
    !high && beside_high && preempt != 0
}

/// Whether an owner going idle hands the rest of its tenant's turn to another process of the
/// tenant that wants the device (`companion`), rather than to arbitration: only an ownership that
/// arbitration granted. A hand-on keeps the grant and the slice's end and marks the slice word
/// (its lowest bit; the slice one nanosecond shorter), so the turn moves within the tenant once per grant, never back
/// and forth while the device idles. (A genuine slice with that bit set only forgoes a hand-on.)
pub fn may_hand_on(companion: bool, slice_ns: u64) -> bool {
    companion && slice_ns & HANDED_ON == 0
}

/// The slice word's mark of a turn handed on.
pub const HANDED_ON: u64 = 1;

/// What happens to a launch's measured device time when it completes: charged with the current
/// ownership (`Measured`), carried to the process's next charge (`Carried`), or nothing, when it
/// completed outside the process's own ownership after it launched in its tenant's turn held by
/// another process, whose charge covers the turn (`InTurn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    Measured,
    Carried,
    InTurn,
}

/// Whether a process stops counting as a member of its tenant's turn (its completions outside its
/// own ownership then carried, not taken as the turn's): it was one (`member`), neither it nor
/// another process of its tenant holds the device now (`turn_held`), and none of its launches is
/// between its check and its submission (`launching`). What completes after the turn ended ran
/// after the lead's last event, which the lead's charge did not cover, and the next tenant's
/// intervals did: left uncharged, the share-30 tenant beside a two-process tenant of 70 got
/// 27.8%.
pub fn membership_ends(member: bool, turn_held: bool, launching: bool) -> bool {
    member && !turn_held && !launching
}

pub fn completion(owned: bool, in_turn: bool) -> Completion {
    match (owned, in_turn) {
        (true, _) => Completion::Measured,
        (false, true) => Completion::InTurn,
        (false, false) => Completion::Carried,
    }
}

/// How long an owner's work may complete nothing (while it submits nothing and others wait) before
/// it counts as waiting for something outside the process: three launches' time (`launch_ns`, the
/// average gap between completions) or twice the longest launch seen to complete recently
/// (`longest_ns`: one kernel of a program that synchronises after each is as long as that, and is
/// progress, not a stall), within [`STALL_MIN_NS`] and [`STALL_MAX_NS`].
pub fn stall_ns(launch_ns: u64, longest_ns: u64) -> u64 {
    launch_ns
        .saturating_mul(3)
        .max(longest_ns.saturating_mul(2))
        .clamp(STALL_MIN_NS, STALL_MAX_NS)
}

/// The longest launch seen recently, after one of `ns` completed: a new longest at once, otherwise
/// decaying by an eighth of the difference (a program that stops running long kernels gets a short
/// stall time back within tens of launches).
pub fn longest_after(longest_ns: u64, ns: u64) -> u64 {
    if ns >= longest_ns {
        ns
    } else {
        longest_ns - (longest_ns - ns) / 8
    }
}

/// Whether a launch of `ns` that completed in an ownership held for `held_ns` so far tells how long
/// one launch of the program runs: not when its interval is longer than the ownership (it began
/// before our grant and spans another tenant's work, or a hand-over).
pub fn tells_launch_length(ns: u64, held_ns: u64) -> bool {
    ns <= held_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn another_slot_of_the_tenant_shares_its_turn() {
        // Slot 3 of tenant 1 owns; slot 5 of tenant 1 launches in that turn.
        assert!(shares_turn(Some(3), true, 1, 5, 1));
        // Another tenant's turn is not ours.
        assert!(!shares_turn(Some(3), true, 2, 5, 1));
        // Our own ownership is not a shared turn (the owner's path decides it).
        assert!(!shares_turn(Some(5), true, 1, 5, 1));
        // Nobody owns, or the owner word names a slot no process holds.
        assert!(!shares_turn(None, true, 1, 5, 1));
        assert!(!shares_turn(Some(3), false, 1, 5, 1));
    }

    #[test]
    fn a_turn_is_shared_until_the_slice_ends() {
        let (grant, slice) = (100 * MS, 20 * MS);
        assert!(in_slice(110 * MS, grant, slice, 20 * MS));
        // Past the slice's end: the owner renews or drains.
        assert!(!in_slice(120 * MS, grant, slice, 20 * MS));
        // A slice word past the longest slice counts as the longest.
        assert!(!in_slice(125 * MS, grant, u64::MAX, 20 * MS));
        // A grant in the future counts from now.
        assert!(in_slice(110 * MS, u64::MAX, slice, 20 * MS));
    }

    #[test]
    fn the_tenants_own_waiters_are_no_rivals() {
        // A normal owner of tenant 1: another tenant's waiter ends its slice, its own does not.
        assert!(rival(2, false, 1, false));
        assert!(rival(2, true, 1, false));
        assert!(!rival(1, false, 1, false));
        // A high-priority owner yields only to another high-priority tenant.
        assert!(!rival(2, false, 1, true));
        assert!(rival(2, true, 1, true));
        assert!(!rival(1, true, 1, true));
    }

    #[test]
    fn a_shared_turn_is_charged_once() {
        // The lead measures; the other process's completions in the turn are not charged again;
        // what completes after the turn is carried.
        assert_eq!(completion(true, false), Completion::Measured);
        assert_eq!(completion(true, true), Completion::Measured);
        assert_eq!(completion(false, true), Completion::InTurn);
        assert_eq!(completion(false, false), Completion::Carried);
    }

    #[test]
    fn a_membership_ends_with_the_turn() {
        // Launched in the tenant's turn, the turn now another tenant's, nothing being launched.
        assert!(membership_ends(true, false, false));
        // The turn still held by the tenant, or a launch between its check and its submission.
        assert!(!membership_ends(true, true, false));
        assert!(!membership_ends(true, false, true));
        // Never a member.
        assert!(!membership_ends(false, false, false));
        // After it ends, a completion outside the process's ownership is carried.
        assert_eq!(completion(false, false), Completion::Carried);
    }

    #[test]
    fn a_thread_waiting_in_flow_control_keeps_its_owner_from_going_idle() {
        assert!(may_go_idle(true, 0));
        // Its work is on the device and it has more to submit: not idle.
        assert!(!may_go_idle(true, 1));
        assert!(!may_go_idle(true, 3));
        // Submitting: never idle.
        assert!(!may_go_idle(false, 0));
    }

    #[test]
    fn a_slice_ending_with_a_high_priority_waiter_is_not_drained() {
        assert!(!drains_at_slice_end(false, true));
        assert!(drains_at_slice_end(false, false));
        // A high-priority owner drains as before (another high-priority tenant's turn).
        assert!(drains_at_slice_end(true, true));
        assert!(drains_at_slice_end(true, false));
    }

    #[test]
    fn only_an_active_high_priority_tenant_holds_launches_back() {
        assert!(holds_back(false, true, 1));
        // No request, or a word written without an active high-priority tenant.
        assert!(!holds_back(false, true, 0));
        assert!(!holds_back(false, false, 1));
        // A high-priority process never holds back for another.
        assert!(!holds_back(true, true, 1));
    }

    #[test]
    fn an_idle_owner_hands_its_turn_on_once() {
        let slice = 20 * MS;
        assert!(may_hand_on(true, slice));
        // Nobody of its tenant wants the device.
        assert!(!may_hand_on(false, slice));
        // Handed the turn itself: it goes back to arbitration.
        assert!(!may_hand_on(true, slice | HANDED_ON));
    }

    #[test]
    fn the_stall_time_follows_the_longest_launch() {
        // Short kernels, never seen long ones: the minimum.
        assert_eq!(stall_ns(50_000, 50_000), STALL_MIN_NS);
        // Many launches' time.
        assert_eq!(stall_ns(2 * MS, 0), 6 * MS);
        // A program that synchronises after each 10 ms kernel: its gaps between completions seen
        // by flow control stay short (launch_ns 250 us), but its kernels are 10 ms: a 10 ms kernel
        // still running 1 ms after it began is progress, not a stall.
        assert_eq!(stall_ns(250_000, 10 * MS), 20 * MS);
        assert!(stall_ns(250_000, 10 * MS) > 10 * MS);
        // Bounded above, even for a word that cannot be genuine.
        assert_eq!(stall_ns(u64::MAX, u64::MAX), STALL_MAX_NS);
    }

    #[test]
    fn an_interval_longer_than_the_ownership_is_no_launch_length() {
        assert!(tells_launch_length(10 * MS, 12 * MS));
        // Began before the grant: it spans another tenant's slice.
        assert!(!tells_launch_length(20 * MS, 3 * MS));
    }

    #[test]
    fn the_longest_launch_decays() {
        assert_eq!(longest_after(0, 10 * MS), 10 * MS);
        assert_eq!(longest_after(10 * MS, 20 * MS), 20 * MS);
        let mut l = 10 * MS;
        for _ in 0..40 {
            l = longest_after(l, 50_000);
        }
        assert!(l < MS, "{l}");
        assert!(l >= 50_000);
    }
}
