//! The claim of a slot whose ledger byte a losing claimer still holds (`slots.rs`, kept apart:
//! that file is long enough).

use super::slots::BYTE_RETRY_NS;
use super::*;
use std::os::fd::AsRawFd;

const UUID: &str = "GPU-00000000-0000-0000-0000-0000000000c2";

/// The state word's claim, as `claim_slot`'s, labelling the slot with `tenant` (also the
/// take-back tests' in `slots.rs`).
pub(super) fn taker(l: &DeviceLedger, tenant: usize) -> impl Fn(usize) -> bool + '_ {
    move |i| {
        let s = &l.layout().slots[i];
        let took = s
            .state
            .compare_exchange(SLOT_FREE, SLOT_ACTIVE, AcqRel, Acquire)
            .is_ok();
        if took {
            s.tenant.store(tenant as u32, Release);
        }
        took
    }
}

/// Two processes of different tenants that start together claim the same free slot at once
/// (docs/COMPUTE.md, "Forged ownership evidence"): the loser holds the slot's ledger byte
/// when the winner tries it, and lets it go once its own compare-and-swap failed. The winner
/// must hold the byte all the same: without it the other tenants judge it dead (their sweep
/// frees its slot, "our slot was overwritten"; a waiter revokes it as owner).
#[test]
fn a_claim_that_wins_a_slot_a_loser_still_locks_holds_its_byte() {
    let _serial = slotfile::serial_test();
    let dir = crate::compute::scratch("claimbyte");
    let path = dir.join(format!("{UUID}.dev"));
    let l = DeviceLedger::open(&path, UUID, true).unwrap();
    let own = dir.join("t2.ledger");
    std::fs::write(&own, b"").unwrap();
    let winner = DeviceLedger::open(&path, UUID, false).unwrap();
    winner.use_tenant_locks(&own, TenantId(2)).unwrap();
    // The loser: its own open file description, holding slot 0's byte until it sees the slot
    // taken (its compare-and-swap failed), as a claim does.
    let loser = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let at = <Layout as slotfile::SlotLayout>::lock_offset(0);
    assert!(matches!(sys::try_lock(loser.as_raw_fd(), at), Ok(true)));
    let state = &l.layout().slots[0].state;
    let late = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let deadline = now_ns() + 10_000_000_000;
            while state.load(Acquire) == SLOT_FREE && now_ns() < deadline {
                std::thread::yield_now();
            }
            let seen = now_ns();
            sys::unlock(loser.as_raw_fd(), at);
            seen
        });
        let cas_ns = std::cell::Cell::new(0u64);
        let take = taker(&winner, 1);
        let got = winner.claim_with_tenant_lock(|i| {
            let took = take(i);
            cas_ns.set(now_ns());
            took
        });
        let seen = watcher.join().unwrap();
        assert_eq!(got, Some(Some(0)));
        // Let go later than the claim's retries (the host did not run the loser): nothing
        // to check.
        seen.saturating_sub(cas_ns.get()) >= BYTE_RETRY_NS
    });
    if !late {
        assert!(
            winner.holds_shared_slot_lock(),
            "the winner of a contended claim does not hold its slot's ledger byte"
        );
        assert!(
            l.slot_alive(0, None),
            "the winner looks dead to other tenants"
        );
    }
    drop((winner, l, loser));
    let _ = std::fs::remove_dir_all(&dir);
}
