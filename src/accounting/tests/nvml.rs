//! What NVML shows a tenant: the quota as the card, its own processes only, in NVML's count
//! protocol (`accounting::nvml_view`).

use super::{kit, Kit, MIB, UUID};
use crate::accounting::nvml_view::{
    read_all, shown_processes, Listing, MemoryShown, NvmlView, ProcessList, Room, TenantProcess,
    MAX_ENTRIES,
};
use gpuslice_api::nvml::{
    nvmlProcessDetailList_v1, nvmlProcessesUtilizationInfo_v1, NVML_PROCESS_MODE_COMPUTE,
    NVML_PROCESS_MODE_GRAPHICS, NVML_PROCESS_MODE_MPS,
};
use gpuslice_api::{NvmlError, NvmlReturn};
use std::cell::Cell;
use std::ffi::c_uint;

/// The NVML handle the fake gives the kit's device.
const HANDLE: usize = 0xd0;
const GIB: u64 = 1 << 30;

fn me() -> u32 {
    std::process::id()
}

/// A kit limited to 8 MiB, its device known to NVML as [`HANDLE`], this process charged 3 MiB.
fn charged(tag: &str) -> Kit {
    let k = kit(tag, 8 * MIB);
    k.fake
        .with(|s| s.nvml_devices.insert(HANDLE, (UUID.to_owned(), None)));
    let d = k.t.device(0).unwrap();
    k.t.reserve(d, 3 * MIB, "test").unwrap().commit();
    k
}

/// A driver list in NVML's count protocol: no buffer, or too small a one, is `INSUFFICIENT_SIZE`
/// with the count needed; an empty list is success with 0. Counts the calls in `asked`.
fn driver<'a, T: Copy>(
    entries: &'a [T],
    asked: &'a Cell<u32>,
) -> impl FnMut(Option<&mut [T]>, &mut c_uint) -> NvmlReturn + 'a {
    move |buffer, n| {
        asked.set(asked.get() + 1);
        let room = *n as usize;
        *n = entries.len() as c_uint;
        match buffer {
            _ if entries.is_empty() => Ok(()),
            Some(b) if room >= entries.len() => {
                b[..entries.len()].copy_from_slice(entries);
                Ok(())
            }
            _ => Err(NvmlError::INSUFFICIENT_SIZE),
        }
    }
}

fn room(len: c_uint) -> Room {
    Room { len, array: true }
}

const NO_ARRAY: Room = Room {
    len: 0,
    array: false,
};

#[test]
fn memory_is_shown_as_the_quota_with_the_tenants_usage() {
    let k = charged("nvml-memory");
    let shown = k.t.nvml_memory(HANDLE, 80 * GIB, 70 * GIB).unwrap();
    assert_eq!(
        shown,
        MemoryShown {
            total: 8 * MIB,
            used: 3 * MIB,
            free: 5 * MIB
        }
    );
    assert_eq!(shown.reserved(), 0);
    assert_eq!(shown.used_with_reserved(), 3 * MIB, "v1's used");
}

#[test]
fn a_card_fuller_than_the_quotas_promise_shows_what_it_has_free() {
    let k = charged("nvml-memory-full");
    let shown = k.t.nvml_memory(HANDLE, 80 * GIB, MIB).unwrap();
    assert_eq!(
        (shown.total, shown.used, shown.free),
        (8 * MIB, 3 * MIB, MIB)
    );
    assert_eq!(
        shown.reserved(),
        4 * MIB,
        "v2's reserved: what the card holds back"
    );
    assert_eq!(
        shown.used_with_reserved(),
        7 * MIB,
        "v1's used: total - free"
    );
}

#[test]
fn a_card_smaller_than_the_quota_is_shown_as_it_is() {
    let k = charged("nvml-memory-small");
    let shown = k.t.nvml_memory(HANDLE, 6 * MIB, 6 * MIB).unwrap();
    assert_eq!(
        (shown.total, shown.used, shown.free),
        (6 * MIB, 3 * MIB, 3 * MIB)
    );
    // Used beyond the card is shown as the card, never as more than total.
    assert_eq!(
        MemoryShown::of(9 * MIB, 8 * MIB, 6 * MIB, 0),
        MemoryShown {
            total: 6 * MIB,
            used: 6 * MIB,
            free: 0
        }
    );
}

#[test]
fn each_device_shows_its_own_usage_and_a_handle_nvml_cannot_name_keeps_the_drivers_answer() {
    let k = charged("nvml-other-device");
    // The limit is for every device; what the tenant is charged on the first is not the other's.
    k.fake.with(|s| {
        s.nvml_devices
            .insert(0xd1, ("GPU-another".to_owned(), None))
    });
    let other = k.t.nvml_memory(0xd1, 80 * GIB, 70 * GIB).unwrap();
    assert_eq!((other.total, other.used, other.free), (8 * MIB, 0, 8 * MIB));
    assert_eq!(
        k.t.nvml_view(0xd1).unwrap(),
        NvmlView::new(vec![], (u32::MAX, u32::MAX))
    );
    assert_eq!(k.t.nvml_memory(0xd2, 80 * GIB, 70 * GIB), None);
    assert_eq!(k.t.nvml_view(0xd2), None);
}

#[test]
fn the_compute_list_is_the_tenants_charged_processes_without_asking_the_driver() {
    let k = charged("nvml-compute");
    let view = k.t.nvml_view(HANDLE).unwrap();
    let asked = Cell::new(0);
    let others = [99u32, 98];
    let listing = view
        .processes(
            ProcessList::Compute,
            room(4),
            |p| *p,
            driver(&others, &asked),
        )
        .unwrap();
    let mine = TenantProcess {
        pid: me(),
        used: 3 * MIB,
    };
    assert_eq!(
        listing,
        Listing {
            count: 1,
            entries: vec![mine],
            result: Ok(())
        }
    );
    assert_eq!(asked.get(), 0, "the compute list never reads the driver's");
}

#[test]
fn graphics_and_mps_lists_show_the_drivers_entries_that_are_the_tenants() {
    let k = charged("nvml-graphics");
    let view = k.t.nvml_view(HANDLE).unwrap();
    for list in [ProcessList::Graphics, ProcessList::Mps] {
        let asked = Cell::new(0);
        let listed = [99, me(), 98];
        let listing = view
            .processes(list, room(4), |p| *p, driver(&listed, &asked))
            .unwrap();
        assert_eq!(listing.count, 1, "{list:?}");
        assert_eq!(listing.entries[0].pid, me());
        assert_eq!(listing.entries[0].used, 3 * MIB, "with its charge");
        assert_eq!(asked.get(), 2, "asked for the count, then the entries");
        // The tenant is not in the driver's list: nothing shown, success with 0.
        let only_others = [99, 98];
        let listing = view
            .processes(list, room(4), |p| *p, driver(&only_others, &asked))
            .unwrap();
        assert_eq!((listing.count, listing.result), (0, Ok(())), "{list:?}");
    }
}

#[test]
fn a_list_answers_in_nvmls_count_protocol() {
    let view = NvmlView::new(
        vec![
            TenantProcess { pid: 10, used: 1 },
            TenantProcess { pid: 11, used: 2 },
        ],
        (u32::MAX, u32::MAX),
    );
    let asked = Cell::new(0);
    let none: [u32; 0] = [];
    let list = |room| {
        view.processes(ProcessList::Compute, room, |p| *p, driver(&none, &asked))
            .unwrap()
    };
    // Asking for the count (no array), then too little room: the count needed, nothing written.
    for r in [NO_ARRAY, room(1)] {
        let l = list(r);
        assert_eq!(l.count, 2);
        assert_eq!(l.result, Err(NvmlError::INSUFFICIENT_SIZE));
        assert!(l.entries.is_empty());
    }
    assert_eq!(list(room(2)).result, Ok(()));
    assert_eq!(list(room(2)).entries.len(), 2);
    // An empty list is success with 0, with or without an array; samples answer NOT_FOUND.
    assert_eq!(
        Listing::<u32>::of(vec![], NO_ARRAY, Ok(())),
        Listing {
            count: 0,
            entries: vec![],
            result: Ok(())
        }
    );
    let empty = Listing::<u32>::of(vec![], room(4), Err(NvmlError::NOT_FOUND));
    assert_eq!(empty.result, Err(NvmlError::NOT_FOUND));
}

#[test]
fn the_drivers_list_is_read_again_when_it_grew_and_its_errors_stand() {
    // The list grows by 20 between the count and the read: read again with room for it.
    let calls = Cell::new(0);
    let all = read_all::<u32>(|buffer, n| {
        calls.set(calls.get() + 1);
        let have: c_uint = if calls.get() == 1 { 2 } else { 22 };
        let room = *n;
        *n = have;
        match buffer {
            Some(b) if room >= have => {
                for (i, e) in b.iter_mut().take(have as usize).enumerate() {
                    *e = i as u32;
                }
                Ok(())
            }
            _ => Err(NvmlError::INSUFFICIENT_SIZE),
        }
    })
    .unwrap();
    assert_eq!(all.len(), 22);
    assert_eq!(calls.get(), 3);
    // No entry at all: the first answer stands, no second read.
    let asked = Cell::new(0);
    assert_eq!(read_all::<u32>(driver(&[], &asked)), Ok(vec![]));
    assert_eq!(asked.get(), 1);
    // The driver's errors stand.
    let off = read_all::<u32>(|_, _| Err(NvmlError::NOT_SUPPORTED));
    assert_eq!(off, Err(NvmlError::NOT_SUPPORTED));
}

#[test]
fn a_driver_count_never_makes_a_buffer_larger_than_the_bound() {
    let largest = Cell::new(0usize);
    let answer = read_all::<u32>(|buffer, n| {
        if let Some(b) = buffer {
            largest.set(largest.get().max(b.len()));
        }
        *n = c_uint::MAX;
        Err(NvmlError::INSUFFICIENT_SIZE)
    });
    assert_eq!(answer, Err(NvmlError::INSUFFICIENT_SIZE));
    assert_eq!(largest.get(), MAX_ENTRIES as usize);
}

#[test]
fn utilisation_keeps_the_tenants_own_samples_and_none_is_not_found() {
    let k = charged("nvml-samples");
    let view = k.t.nvml_view(HANDLE).unwrap();
    let asked = Cell::new(0);
    // Samples as (pid, utilisation).
    let samples = [(99u32, 50u32), (me(), 30), (98, 20)];
    let mine = view
        .samples(room(1), |s| s.0, driver(&samples, &asked))
        .unwrap();
    assert_eq!(mine.entries, vec![(me(), 30)]);
    assert_eq!(
        mine.count, 1,
        "the count never tells of other tenants' processes"
    );
    let others = [(99u32, 50u32)];
    let none = view
        .samples(room(4), |s| s.0, driver(&others, &asked))
        .unwrap();
    assert_eq!((none.count, none.result), (0, Err(NvmlError::NOT_FOUND)));
    // A struct version gpuslice does not know is refused before the driver is read.
    let asked = Cell::new(0);
    let refused = view.samples_info(
        nvmlProcessesUtilizationInfo_v1 + 1,
        room(4),
        |s| s.0,
        driver(&samples, &asked),
    );
    assert_eq!(refused, Err(NvmlError::ARGUMENT_VERSION_MISMATCH));
    assert_eq!(asked.get(), 0);
    let info = view.samples_info(
        nvmlProcessesUtilizationInfo_v1,
        room(4),
        |s| s.0,
        driver(&samples, &asked),
    );
    assert_eq!(info.unwrap().entries, vec![(me(), 30)]);
}

#[test]
fn the_detail_list_checks_its_request_and_keeps_the_drivers_entry_of_each_process() {
    let k = charged("nvml-detail");
    k.fake.with(|s| {
        s.nvml_devices
            .insert(HANDLE, (UUID.to_owned(), Some((3, 4))))
    });
    let view = k.t.nvml_view(HANDLE).unwrap();
    assert_eq!(view.instance, (3, 4), "a MIG device's instance ids");
    // Entries as (pid, protected memory).
    let listed = [(99u32, 7u64), (me(), 5)];
    let asked = Cell::new(0);
    let v1 = nvmlProcessDetailList_v1;
    for (version, mode) in [(v1 + 1, NVML_PROCESS_MODE_COMPUTE), (v1, 7)] {
        let refused = view.detail_list(version, mode, room(4), |e| e.0, driver(&listed, &asked));
        assert_eq!(refused, Err(NvmlError::INVALID_ARGUMENT));
    }
    assert_eq!(asked.get(), 0, "refused before the driver is read");
    for mode in [
        NVML_PROCESS_MODE_COMPUTE,
        NVML_PROCESS_MODE_GRAPHICS,
        NVML_PROCESS_MODE_MPS,
    ] {
        let l = view
            .detail_list(v1, mode, room(4), |e| e.0, driver(&listed, &asked))
            .unwrap();
        let mine = TenantProcess {
            pid: me(),
            used: 3 * MIB,
        };
        assert_eq!(l.entries, vec![(mine, Some((me(), 5)))], "mode {mode}");
    }
    // Even the compute list reads the driver's first, whose answer stands.
    let unsupported = view.detail_list(
        v1,
        NVML_PROCESS_MODE_COMPUTE,
        room(4),
        |e: &(u32, u64)| e.0,
        |_, _| Err(NvmlError::NOT_SUPPORTED),
    );
    assert_eq!(unsupported, Err(NvmlError::NOT_SUPPORTED));
}

#[test]
fn accounting_mode_names_and_describes_the_tenants_own_processes_only() {
    let k = charged("nvml-accounting");
    let view = k.t.nvml_view(HANDLE).unwrap();
    let asked = Cell::new(0);
    // A terminated process (97) may be anyone's: not shown.
    let listed = [97u32, me(), 99];
    let pids = view
        .accounting_pids(room(4), driver(&listed, &asked))
        .unwrap();
    assert_eq!((pids.count, pids.entries), (1, vec![me()]));
    let off = view.accounting_pids(room(4), |_, _| Err(NvmlError::NOT_SUPPORTED));
    assert_eq!(off, Err(NvmlError::NOT_SUPPORTED));
    assert_eq!(view.accounting_stats(me(), Ok(())), Ok(()));
    // Another pid is not found, whether or not the driver has statistics of it.
    for driver in [Ok(()), Err(NvmlError::NOT_FOUND)] {
        assert_eq!(view.accounting_stats(99, driver), Err(NvmlError::NOT_FOUND));
    }
    // Errors that do not depend on the pid stand.
    let off = Err(NvmlError::NOT_SUPPORTED);
    assert_eq!(view.accounting_stats(me(), off), off);
    assert_eq!(view.accounting_stats(99, off), off);
}

const MINE: [TenantProcess; 2] = [
    TenantProcess { pid: 10, used: 100 },
    TenantProcess { pid: 11, used: 200 },
];

#[test]
fn the_compute_list_is_the_tenants_charged_processes() {
    assert_eq!(
        shown_processes(ProcessList::Compute, &MINE, &[10, 99]),
        MINE
    );
    assert_eq!(shown_processes(ProcessList::Compute, &[], &[10, 99]), []);
}

#[test]
fn graphics_and_mps_lists_keep_only_the_tenants_own_entries_with_their_charge() {
    for list in [ProcessList::Graphics, ProcessList::Mps] {
        // 99 and 98 are another tenant's (or anyone's): never shown.
        assert_eq!(
            shown_processes(list, &MINE, &[99, 11, 98]),
            [TenantProcess { pid: 11, used: 200 }],
            "{list:?}"
        );
        assert_eq!(shown_processes(list, &MINE, &[99, 98]), [], "{list:?}");
        assert_eq!(shown_processes(list, &[], &[99]), [], "{list:?}");
    }
}
