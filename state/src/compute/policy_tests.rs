//! Tests of the node's compute policy ([`super::policy`]).
use super::*;

fn rec(id: u128, share: u32, cap: u32, high: bool) -> Record {
    Record {
        id: TenantId(id),
        share,
        cap,
        high,
        label: "t 1".into(),
        entry: None,
        lock: None,
    }
}

#[test]
fn what_the_node_renders_reads_back_and_bad_records_are_left_out() {
    let p = Path::new("x.policy");
    let records = vec![rec(0xabc, 30, 0, false), rec(u128::MAX, 10_000, 99, true)];
    let (back, errors) = parse(p, &render(&records)).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(back.len(), 2);
    assert_eq!(
        (back[1].share, back[1].cap, back[1].high),
        (10_000, 99, true)
    );
    assert_eq!(back[0].label, "t_1");
    assert!(parse(p, "gpuslice-device-policy 2\n").is_err());
    let text = format!(
        "{HEADER}\n{:032x} 0 0 normal a\n{:032x} 10001 0 normal b\n{:032x} 5 101 normal c\n\
         {:032x} 5 0 urgent d\n{} 5 0 normal e\n{:032x} 5 100 high f\n",
        1, 2, 3, 4, "12", 5
    );
    let (back, errors) = parse(p, &text).unwrap();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(errors[0].contains("x.policy:2") && errors[0].contains("share"));
    assert_eq!(
        back,
        vec![Record {
            cap: 0,
            label: "f".into(),
            ..rec(5, 5, 0, true)
        }]
    );
}

#[test]
fn lookup_lists_what_the_file_says() {
    let dir = std::env::temp_dir().join(format!("gpuslice-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = dir.join("GPU-x.dev");
    let o = Overlay::new(&ledger);
    assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
    o.store(Some(&[rec(7, 30, 20, true)]));
    assert_eq!(
        o.lookup(TenantId(7)),
        Lookup::Listed {
            share: 30,
            cap: 20,
            high: true
        }
    );
    assert_eq!(o.lookup(TenantId(8)), Lookup::Unlisted);
    o.store(None);
    assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
    // A file that is not root's (unit tests may run as anyone) or is group-writable is refused.
    let path = path_for_ledger(&ledger);
    std::fs::write(&path, render(&[rec(7, 30, 0, false)])).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    o.reload();
    assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    o.reload();
    // SAFETY: no arguments; cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(
            o.lookup(TenantId(7)),
            Lookup::Listed {
                share: 30,
                cap: 0,
                high: false
            }
        );
        // Removed (only root can, in the node's directory): the ledger decides again.
        std::fs::remove_file(&path).unwrap();
        o.reload();
        assert_eq!(o.lookup(TenantId(7)), Lookup::NoPolicy);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Entries and memory ledgers read back; an entry's settings are those of the tenant the
/// policy gives it, whatever identity its words carry; a listed tenant's identity in another
/// entry gets share 1 (unlisted) there, unless its record gives it no entry (an older node).
#[test]
fn an_entry_gets_the_settings_the_policy_gives_its_index() {
    let p = Path::new("x.policy");
    let mut a = rec(7, 30, 20, true);
    a.entry = Some(3);
    a.lock = Some((64769, 1234));
    let b = rec(8, 10, 0, false);
    let (back, errors) = parse(p, &render(&[a.clone(), b.clone()])).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(back[0].entry, Some(3));
    assert_eq!(back[0].lock, Some((64769, 1234)));
    assert_eq!((back[1].entry, back[1].lock), (None, None));
    let text = format!("{HEADER}\n{:032x} 5 0 normal a entry={MAX_TENANTS}\n", 1);
    assert_eq!(
        parse(p, &text).unwrap().1.len(),
        1,
        "an entry past the table"
    );
    let o = Overlay::none();
    assert_eq!(o.lookup_entry(3, TenantId(1)), Lookup::NoPolicy);
    o.store(Some(&[a, b]));
    let a_settings = Lookup::Listed {
        share: 30,
        cap: 20,
        high: true,
    };
    for words in [TenantId(7), TenantId(0x5a5a), TenantId(8), TenantId(0)] {
        assert_eq!(o.lookup_entry(3, words), a_settings, "{words:?}");
    }
    assert_eq!(o.lookup_entry(4, TenantId(7)), Lookup::Unlisted);
    assert_eq!(o.lookup_entry(4, TenantId(9)), Lookup::Unlisted);
    assert_eq!(
        o.lookup_entry(4, TenantId(8)),
        Lookup::Listed {
            share: 10,
            cap: 0,
            high: false
        }
    );
    assert_eq!(o.entry_of(TenantId(7)), Some(3));
    assert_eq!(o.entry_of(TenantId(8)), None);
    assert_eq!(o.reserved(3), Some((TenantId(7), Some((64769, 1234)))));
    assert_eq!(o.reserved(4), None);
}
