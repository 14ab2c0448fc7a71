//! The device ledgers' health through a real scrape (docs/OBSERVABILITY.md): what
//! `gpuslice status --compute` says of a ledger (squatted and free slots, a wrong size, forged
//! ownership and the other counters) is exported, the exposition passes `promtool check metrics`,
//! and an unreadable ledger is unhealthy without figures.

mod support;

use gpuslice_observe::exporter::Exporter;
use gpuslice_observe::Sources;
use gpuslice_state::compute::device::DeviceLedger;
use gpuslice_state::compute::shm::{Layout, MAX_SLOTS};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Release;
use support::scrape_timed;

const UUID: &str = "GPU-00000000-0000-4000-8000-0000000000a1";
const BROKEN: &str = "GPU-00000000-0000-4000-8000-0000000000b2";

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-exph-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    for sub in ["ledgers", "state", "devices"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    d
}

/// The body of one scrape.
fn scrape(addr: &str) -> String {
    let (_, out) = scrape_timed(addr);
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the one series `name{...UUID="uuid"...}`, if any.
fn value(text: &str, name: &str, uuid: &str) -> Option<f64> {
    let want = format!("UUID=\"{uuid}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&want))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .next()
}

fn promtool_check(text: &str) {
    let tool = Path::new("/usr/bin/promtool");
    assert!(
        tool.exists(),
        "promtool is missing: Debian's prometheus package (scripts/test installs it)"
    );
    let mut child = Command::new(tool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn device_ledger_health_is_exported() {
    let d = scratch("health");
    let path = d.join(format!("devices/{UUID}.dev"));
    let l = DeviceLedger::open(&path, UUID, true).unwrap();
    let h = &l.layout().header;
    h.forged_owner.store(4, Release);
    h.slot_denials.store(2, Release);
    h.lock_takeovers.store(3, Release);
    h.size_repairs.store(1, Release);
    std::fs::write(d.join(format!("devices/{BROKEN}.dev")), [0xffu8; 4096]).unwrap();
    // Another process squats ten free slots' locks (`lockf`, as a tenant would).
    let squatted = 10;
    let at = std::mem::size_of::<Layout>();
    let mut squatter = Command::new("/usr/bin/python3")
        .args([
            "-c",
            &format!(
                "import fcntl, os, sys\n\
                 fd = os.open('{}', os.O_RDWR)\n\
                 fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, {squatted}, {at}, os.SEEK_SET)\n\
                 print('locked', flush=True)\n\
                 sys.stdin.read()\n",
                path.display()
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(squatter.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");

    let e = Exporter::bind("127.0.0.1:0").unwrap();
    let addr = e.addr().to_string();
    let s = Sources::new(
        Some(d.join("state")),
        Some(d.join("ledgers")),
        Some(d.join("devices")),
    );
    std::thread::spawn(move || e.run(&s));

    let text = scrape(&addr);
    promtool_check(&text);
    for (name, want) in [
        ("gpuslice_device_ledger_unhealthy", 1.0),
        ("gpuslice_device_ledger_squatted_slots", squatted as f64),
        (
            "gpuslice_device_ledger_free_slots",
            (MAX_SLOTS - squatted) as f64,
        ),
        ("gpuslice_device_ledger_size_wrong", 0.0),
        ("gpuslice_compute_forged_owner_total", 4.0),
        ("gpuslice_compute_slot_denials_total", 2.0),
        ("gpuslice_compute_lock_takeovers_total", 3.0),
        ("gpuslice_device_ledger_size_repairs_total", 1.0),
    ] {
        assert_eq!(value(&text, name, UUID), Some(want), "{name}:\n{text}");
    }
    for name in [
        "gpuslice_compute_forged_owner_total",
        "gpuslice_device_ledger_squatted_slots",
    ] {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP"
        );
    }
    // The unreadable ledger: unhealthy, and no figures made up for it.
    assert_eq!(
        value(&text, "gpuslice_device_ledger_unhealthy", BROKEN),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "gpuslice_device_ledger_squatted_slots", BROKEN),
        None
    );

    // The squatter gone: healthy again, the counters kept.
    drop(squatter.stdin.take());
    squatter.wait().unwrap();
    let text = scrape(&addr);
    assert_eq!(
        value(&text, "gpuslice_device_ledger_unhealthy", UUID),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "gpuslice_device_ledger_squatted_slots", UUID),
        Some(0.0)
    );
    assert_eq!(
        value(&text, "gpuslice_compute_forged_owner_total", UUID),
        Some(4.0)
    );
    // Grown by a byte: the wrong size is said until someone repairs it.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(std::mem::size_of::<Layout>() as u64 + 1).unwrap();
    let text = scrape(&addr);
    assert_eq!(
        value(&text, "gpuslice_device_ledger_size_wrong", UUID),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "gpuslice_device_ledger_unhealthy", UUID),
        Some(1.0)
    );
    drop(l);
    let _ = std::fs::remove_dir_all(&d);
}
