//! The IPC decision against the fake driver: an exporter and an importer of one tenant (two
//! tenants on one ledger file, each with its own slot, as two processes are).

use super::super::tenant::LedgerCell;
use super::super::tests::{kit, Kit, MIB};
use super::super::Tenant;
use crate::ledger::Ledger;
use std::sync::OnceLock;

const HANDLE: [u8; 64] = [7; 64];
const EXPORTED: u64 = 0x1000;
const MAPPED: u64 = 0x7000;

/// Another process of `k`'s tenant: its own handle on the ledger, charged 1 MiB (its context), so
/// that it holds a slot.
fn importer(k: &Kit) -> Box<Tenant> {
    let ledger = Ledger::open_existing(&k.t.config.ledger_path).unwrap();
    let cell = OnceLock::new();
    let _ = cell.set(Ok(ledger));
    let t = Box::new(Tenant::with_driver(
        k.t.config,
        LedgerCell::Own(cell),
        k.fake,
    ));
    let d = t.device(0).unwrap();
    t.charged(d, MIB, "context", || Ok(0x9000)).unwrap();
    t
}

/// What `t`'s own slot is charged on device 0.
fn mine(t: &Tenant) -> u64 {
    let slot = t.device(0).unwrap().slot.clone().unwrap();
    t.ledger().unwrap().used_by_me(slot)
}

/// The exporter charges 8 MiB and exports it.
fn export(k: &Kit) {
    let d = k.t.device(0).unwrap();
    k.t.charged(d, 8 * MIB, "cuMemAlloc", || Ok(EXPORTED))
        .unwrap();
    k.t.ipc_exported(EXPORTED, &HANDLE);
}

#[test]
fn an_exported_allocation_freed_while_mapped_is_charged_to_the_importer_until_it_closes() {
    let k = kit("ipc-handover", 64 * MIB);
    let imp = importer(&k);
    export(&k);
    imp.ipc_opened(&HANDLE, || Ok(MAPPED)).unwrap();
    // Mapped: nothing more charged (the memory is the exporter's).
    assert_eq!((mine(&k.t), mine(&imp), k.used(0)), (8 * MIB, MIB, 9 * MIB));
    k.t.uncharge(EXPORTED, || Ok(())).unwrap();
    // Freed by the exporter: the importer's now, the tenant's total unchanged.
    assert_eq!((mine(&k.t), mine(&imp), k.used(0)), (0, 9 * MIB, 9 * MIB));
    imp.ipc_closed(MAPPED, || Ok(())).unwrap();
    assert_eq!((mine(&imp), k.used(0)), (MIB, MIB));
}

#[test]
fn an_exported_allocation_nobody_maps_is_released_at_its_free() {
    let k = kit("ipc-unmapped", 64 * MIB);
    let imp = importer(&k);
    export(&k);
    imp.ipc_opened(&HANDLE, || Ok(MAPPED)).unwrap();
    imp.ipc_closed(MAPPED, || Ok(())).unwrap();
    assert_eq!(k.used(0), 9 * MIB);
    k.t.uncharge(EXPORTED, || Ok(())).unwrap();
    assert_eq!((mine(&k.t), mine(&imp), k.used(0)), (0, MIB, MIB));
}

#[test]
fn a_mapping_opened_twice_holds_the_charge_until_its_last_close() {
    let k = kit("ipc-refs", 64 * MIB);
    let imp = importer(&k);
    export(&k);
    imp.ipc_opened(&HANDLE, || Ok(MAPPED)).unwrap();
    imp.ipc_opened(&HANDLE, || Ok(MAPPED)).unwrap();
    k.t.uncharge(EXPORTED, || Ok(())).unwrap();
    imp.ipc_closed(MAPPED, || Ok(())).unwrap();
    assert_eq!((mine(&imp), k.used(0)), (9 * MIB, 9 * MIB));
    imp.ipc_closed(MAPPED, || Ok(())).unwrap();
    assert_eq!((mine(&imp), k.used(0)), (MIB, MIB));
}

#[test]
fn a_registration_of_a_process_gone_gets_nothing() {
    let k = kit("ipc-gone", 64 * MIB);
    let imp = importer(&k);
    export(&k);
    imp.ipc_opened(&HANDLE, || Ok(MAPPED)).unwrap();
    // The importer's slot is now another claim's (the process ended, another took the slot).
    let dir = std::fs::read_dir(format!("{}.ipc", k.t.config.ledger_path.display())).unwrap();
    for e in dir.flatten() {
        let name = e.file_name().into_string().unwrap();
        let (stem, _) = name.rsplit_once('.').unwrap();
        std::fs::rename(e.path(), e.path().with_file_name(format!("{stem}.999"))).unwrap();
    }
    k.t.uncharge(EXPORTED, || Ok(())).unwrap();
    assert_eq!((mine(&k.t), mine(&imp), k.used(0)), (0, MIB, MIB));
}

#[test]
fn a_failed_close_keeps_the_mapping_and_its_charge() {
    let k = kit("ipc-failed-close", 64 * MIB);
    let imp = importer(&k);
    export(&k);
    imp.ipc_opened(&HANDLE, || Ok(MAPPED)).unwrap();
    k.t.uncharge(EXPORTED, || Ok(())).unwrap();
    assert!(imp
        .ipc_closed(MAPPED, || Err(gpuslice_api::CUerror::INVALID_CONTEXT))
        .is_err());
    assert_eq!(mine(&imp), 9 * MIB);
    imp.ipc_closed(MAPPED, || Ok(())).unwrap();
    assert_eq!(mine(&imp), MIB);
}

#[test]
fn an_export_never_freed_is_handed_to_its_importer_when_the_exporter_exits() {
    let k = kit("ipc-exit", 64 * MIB);
    let imp = importer(&k);
    export(&k);
    imp.ipc_opened(&HANDLE, || Ok(MAPPED)).unwrap();
    k.t.exports_at_exit();
    assert_eq!((mine(&k.t), mine(&imp), k.used(0)), (0, 9 * MIB, 9 * MIB));
    // Its record went with it: a later free (none comes after exit) would return nothing.
    k.t.uncharge(EXPORTED, || Ok(())).unwrap();
    assert_eq!(k.used(0), 9 * MIB);
}
