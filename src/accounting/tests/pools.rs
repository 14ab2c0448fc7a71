//! Stream-ordered pools: what is charged, how room is made at the quota, when a pool's figures
//! stop being believed, and how its charge settles.

use super::{kit, kit_with, Kit, MIB, UUID, UUID_B};
use crate::accounting::{FreedOn, PoolRequest};
use crate::driver::fake::{Call, Pool};
use gpuslice_api::types::{CUmemLocation, CU_MEM_LOCATION_TYPE_HOST};
use gpuslice_api::{CUerror, CUresult};
use std::cell::Cell;

const POOL: usize = 0x9000_0000;
const S: usize = 0x5001;
const S2: usize = 0x5002;

/// A pool current on device 0 that holds nothing yet.
fn with_pool(k: &Kit) {
    k.fake.set_pool(
        POOL,
        Pool {
            owner: Some(0),
            reserved: Some(0),
            used: Some(0),
            floor: 0,
        },
    );
    k.fake.with(|s| {
        s.current_pools.insert(0, POOL);
    });
}

fn request(bytes: u64, stream: usize) -> PoolRequest {
    PoolRequest {
        bytes,
        stream,
        per_thread: false,
        pool: None,
    }
}

/// Allocates `bytes` at `at` on `stream`; the driver's pool then holds at least `holds` (what it
/// had, grown by any shortfall) -- or exactly `report` when given (a driver whose figure is off).
fn alloc_reporting(k: &Kit, bytes: u64, at: u64, stream: usize, report: Option<u64>) -> CUresult {
    k.t.alloc_from_pool(
        request(bytes, stream),
        || {
            k.fake.with(|s| {
                let p = s.pools.get_mut(&POOL).unwrap();
                let used = p.used.unwrap_or(0) + bytes;
                p.used = Some(used);
                p.reserved = Some(report.unwrap_or(p.reserved.unwrap_or(0).max(used)));
            });
            Ok(at)
        },
        |_| Ok(()),
    )
}

fn alloc(k: &Kit, bytes: u64, at: u64, stream: usize) -> CUresult {
    alloc_reporting(k, bytes, at, stream, None)
}

/// Frees the block at `at` (of `bytes`) on `stream`: it goes back to the pool, which keeps it.
fn free(k: &Kit, at: u64, bytes: u64, stream: usize) -> CUresult {
    k.t.uncharge_on(
        at,
        Some(FreedOn {
            stream,
            per_thread: false,
        }),
        || {
            k.fake.with(|s| {
                let p = s.pools.get_mut(&POOL).unwrap();
                p.used = Some(p.used.unwrap_or(0) - bytes);
            });
            Ok(())
        },
    )
}

#[test]
fn a_pool_is_charged_what_it_holds() {
    let k = kit("pool-holds", 64 * MIB);
    with_pool(&k);
    alloc(&k, 4 * MIB, 0x1000, S).unwrap();
    assert_eq!(k.used(0), 4 * MIB);
    // The pool keeps a freed block: still charged.
    free(&k, 0x1000, 4 * MIB, S).unwrap();
    assert_eq!(k.used(0), 4 * MIB);
    // A block it reuses adds nothing.
    alloc(&k, 4 * MIB, 0x1000, S).unwrap();
    assert_eq!(k.used(0), 4 * MIB);
}

#[test]
fn a_pool_that_grows_by_more_than_the_request_is_charged_its_growth() {
    let k = kit("pool-granularity", 64 * MIB);
    with_pool(&k);
    alloc_reporting(&k, MIB, 0x1000, S, Some(2 * MIB)).unwrap();
    assert_eq!(k.used(0), 2 * MIB);
}

#[test]
fn at_the_quota_the_pool_is_synchronised_and_trimmed_to_what_it_has_handed_out() {
    let k = kit("pool-make-room", 8 * MIB);
    with_pool(&k);
    alloc(&k, 4 * MIB, 0x1000, S).unwrap();
    alloc(&k, 4 * MIB, 0x2000, S).unwrap();
    free(&k, 0x1000, 4 * MIB, S).unwrap();
    assert_eq!(k.used(0), 8 * MIB, "the freed block is still the pool's");
    k.fake.clear_calls();
    alloc(&k, 2 * MIB, 0x3000, S).unwrap();
    let calls = k.fake.calls();
    let sync = calls.iter().position(|c| {
        *c == Call::StreamSynchronize {
            stream: S,
            per_thread: false,
        }
    });
    let trim = calls.iter().position(|c| {
        *c == Call::PoolTrim {
            pool: POOL,
            keep: 4 * MIB,
        }
    });
    assert!(
        matches!((sync, trim), (Some(a), Some(b)) if a < b),
        "synchronised, then trimmed to what is used: {calls:?}"
    );
    assert_eq!(k.used(0), 6 * MIB);
    assert_eq!(k.denied(0), 0);
}

#[test]
fn a_pool_with_nothing_to_release_is_neither_synchronised_nor_trimmed() {
    let k = kit("pool-nothing", 8 * MIB);
    with_pool(&k);
    alloc(&k, 8 * MIB, 0x1000, S).unwrap();
    k.fake.clear_calls();
    assert_eq!(alloc(&k, MIB, 0x2000, S), Err(CUerror::OUT_OF_MEMORY));
    let calls = k.fake.calls();
    assert!(
        !calls
            .iter()
            .any(|c| matches!(c, Call::StreamSynchronize { .. } | Call::PoolTrim { .. })),
        "{calls:?}"
    );
    assert_eq!(k.used(0), 8 * MIB);
    assert_eq!(k.denied(0), 1);
}

#[test]
fn a_failed_synchronisation_refuses_without_trimming() {
    let k = kit("pool-sync-fails", 8 * MIB);
    with_pool(&k);
    alloc(&k, 8 * MIB, 0x1000, S).unwrap();
    free(&k, 0x1000, 8 * MIB, S).unwrap();
    k.fake.with(|s| s.broken_streams.push(S));
    k.fake.clear_calls();
    assert_eq!(alloc(&k, MIB, 0x2000, S), Err(CUerror::OUT_OF_MEMORY));
    assert!(!k
        .fake
        .calls()
        .iter()
        .any(|c| matches!(c, Call::PoolTrim { .. })));
    assert_eq!(k.used(0), 8 * MIB);
}

#[test]
fn a_pool_grown_past_the_quota_gives_the_block_back_and_refuses() {
    let k = kit("pool-grew-past", 4 * MIB);
    with_pool(&k);
    let freed = Cell::new(false);
    let r = k.t.alloc_from_pool(
        request(MIB, S),
        || {
            // The driver grows the pool by 6 MiB for a 1 MiB block.
            k.fake.with(|s| {
                let p = s.pools.get_mut(&POOL).unwrap();
                p.used = Some(MIB);
                p.reserved = Some(6 * MIB);
            });
            Ok(0x1000)
        },
        |_| {
            freed.set(true);
            k.fake
                .with(|s| s.pools.get_mut(&POOL).unwrap().used = Some(0));
            Ok(())
        },
    );
    assert_eq!(r, Err(CUerror::OUT_OF_MEMORY));
    assert!(freed.get(), "the block is given back");
    assert!(k.fake.calls().contains(&Call::PoolTrim {
        pool: POOL,
        keep: 0
    }));
    assert_eq!(k.fake.pool(POOL).reserved, Some(0));
    assert_eq!(k.used(0), 0, "nothing stays charged");
}

#[test]
fn a_pool_that_says_it_holds_less_than_it_handed_out_is_no_longer_believed() {
    let k = kit("pool-untrusted", 64 * MIB);
    with_pool(&k);
    alloc_reporting(&k, 4 * MIB, 0x1000, S, Some(2 * MIB)).unwrap();
    assert!(k.t.pool_untrusted(POOL));
    assert_eq!(k.used(0), 4 * MIB, "charged the larger figure");
    // From then on each block cut from no freed range is growth, whatever the driver says.
    alloc_reporting(&k, 4 * MIB, 0x9000, S, Some(MIB)).unwrap();
    assert_eq!(k.used(0), 8 * MIB);
    // A block cut from a freed range adds nothing.
    free(&k, 0x9000, 4 * MIB, S).unwrap();
    alloc_reporting(&k, 2 * MIB, 0x9000, S, Some(MIB)).unwrap();
    assert_eq!(k.used(0), 8 * MIB);
}

/// An untrusted pool at the quota: charged 8 MiB, 4 MiB outstanding, 4 MiB freed on `S2`.
fn untrusted_at_quota(tag: &str) -> Kit {
    let k = kit(tag, 8 * MIB);
    with_pool(&k);
    alloc_reporting(&k, 4 * MIB, 0x1000, S, Some(MIB)).unwrap();
    alloc_reporting(&k, 4 * MIB, 0x2000, S, Some(MIB)).unwrap();
    assert!(k.t.pool_untrusted(POOL));
    free(&k, 0x1000, 4 * MIB, S2).unwrap();
    assert_eq!(k.used(0), 8 * MIB);
    k.fake.clear_calls();
    k
}

#[test]
fn an_untrusted_pool_waits_for_its_pending_frees_then_holds_its_outstanding_blocks() {
    let k = untrusted_at_quota("pool-untrusted-room");
    alloc_reporting(&k, 2 * MIB, 0x7000, S, Some(MIB)).unwrap();
    let calls = k.fake.calls();
    for stream in [S, S2] {
        assert!(
            calls.contains(&Call::StreamSynchronize {
                stream,
                per_thread: false
            }),
            "stream {stream:#x} waited for: {calls:?}"
        );
    }
    assert!(calls.contains(&Call::PoolTrim {
        pool: POOL,
        keep: 0
    }));
    // 4 MiB outstanding + the new 2 MiB block.
    assert_eq!(k.used(0), 6 * MIB);
}

#[test]
fn a_pending_free_on_a_destroyed_stream_refuses_once_then_counts_as_run() {
    let k = untrusted_at_quota("pool-untrusted-gone");
    k.fake.with(|s| s.broken_streams.push(S2));
    assert_eq!(
        alloc_reporting(&k, 2 * MIB, 0x7000, S, Some(MIB)),
        Err(CUerror::OUT_OF_MEMORY)
    );
    assert_eq!(k.used(0), 8 * MIB);
    // Forgotten: the next attempt does not wait for it, and the pool holds its outstanding block.
    k.fake.clear_calls();
    alloc_reporting(&k, 2 * MIB, 0x7000, S, Some(MIB)).unwrap();
    assert!(!k.fake.calls().contains(&Call::StreamSynchronize {
        stream: S2,
        per_thread: false
    }));
    assert_eq!(k.used(0), 6 * MIB);
}

#[test]
fn an_allocation_captured_into_a_graph_is_not_charged_now() {
    let k = kit("pool-capturing", 8 * MIB);
    with_pool(&k);
    k.fake.with(|s| s.capturing.push(S));
    let called = Cell::new(false);
    k.t.alloc_from_pool(
        request(4 * MIB, S),
        || {
            called.set(true);
            Ok(0x1000)
        },
        |_| Ok(()),
    )
    .unwrap();
    assert!(called.get());
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_pool_in_host_memory_is_not_charged() {
    let k = kit("pool-host", 8 * MIB);
    with_pool(&k);
    const HOST: usize = 0x7777;
    k.t.pool_created(
        HOST,
        CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
    );
    k.t.alloc_from_pool(
        PoolRequest {
            pool: Some(HOST),
            ..request(16 * MIB, S)
        },
        || Ok(0x1000),
        |_| Ok(()),
    )
    .unwrap();
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_pool_of_another_device_charges_that_device() {
    let k = kit_with("pool-other-device", 64 * MIB, &[UUID, UUID_B], &[]);
    with_pool(&k);
    k.fake
        .with(|s| s.pools.get_mut(&POOL).unwrap().owner = Some(1));
    alloc(&k, 4 * MIB, 0x1000, S).unwrap();
    assert_eq!((k.used(0), k.used(1)), (0, 4 * MIB));
}

#[test]
fn without_a_pool_the_allocation_itself_is_charged_until_freed() {
    let k = kit("pool-none", 64 * MIB);
    k.t.alloc_from_pool(request(3 * MIB, S), || Ok(0x1000), |_| Ok(()))
        .unwrap();
    assert_eq!(k.used(0), 3 * MIB);
    k.t.uncharge(0x1000, || Ok(())).unwrap();
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_synchronisation_settles_a_pool_the_driver_trimmed() {
    let k = kit("pool-settle", 64 * MIB);
    with_pool(&k);
    alloc(&k, 4 * MIB, 0x1000, S).unwrap();
    free(&k, 0x1000, 4 * MIB, S).unwrap();
    assert_eq!(k.used(0), 4 * MIB);
    k.fake
        .with(|s| s.pools.get_mut(&POOL).unwrap().reserved = Some(MIB));
    k.t.synchronized();
    assert_eq!(k.used(0), MIB);
}

#[test]
fn a_pool_destroyed_with_blocks_outstanding_stays_charged_until_they_are_freed() {
    let k = kit("pool-destroyed", 64 * MIB);
    with_pool(&k);
    alloc(&k, 4 * MIB, 0x1000, S).unwrap();
    k.t.forget_pool(POOL);
    assert_eq!(
        k.used(0),
        4 * MIB,
        "the driver releases it once its blocks are freed"
    );
    k.t.uncharge(0x1000, || Ok(())).unwrap();
    k.t.synchronized();
    assert_eq!(k.used(0), 0);
}

#[test]
fn a_pool_destroyed_empty_is_returned_at_once() {
    let k = kit("pool-destroyed-empty", 64 * MIB);
    with_pool(&k);
    alloc(&k, 4 * MIB, 0x1000, S).unwrap();
    free(&k, 0x1000, 4 * MIB, S).unwrap();
    k.t.forget_pool(POOL);
    assert_eq!(k.used(0), 0);
}
