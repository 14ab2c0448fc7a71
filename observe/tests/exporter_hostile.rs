//! The exporter against hostile clients and planted files (docs/SECURITY.md): pipelined requests
//! never read, huge or endless request heads, more idle connections than it keeps, running out of
//! descriptors, hard links of a ledger. In every case another client's scrape is answered within
//! 1 s, and a ledger counts once.

mod support;

use gpuslice_observe::exporter::{Exporter, MAX_CONNECTIONS};
use gpuslice_observe::Sources;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-exp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("ledgers")).unwrap();
    std::fs::create_dir_all(d.join("state")).unwrap();
    d
}

fn sources(d: &Path) -> Sources {
    Sources::new(
        Some(d.join("state")),
        Some(d.join("ledgers")),
        Some(d.join("devices")),
    )
}

/// Starts an exporter in this process; its address.
fn start(d: &Path) -> String {
    let e = Exporter::bind("127.0.0.1:0").unwrap();
    let addr = e.addr().to_string();
    let s = sources(d);
    std::thread::spawn(move || e.run(&s));
    addr
}

use support::scrape_timed as scrape;

fn assert_prompt(addr: &str, during: &str) {
    let (took, _) = scrape(addr);
    assert!(
        took < Duration::from_secs(1),
        "a scrape took {took:?} during {during}"
    );
}

#[test]
fn pipelined_requests_never_read_stall_only_their_own_connection() {
    let d = scratch("pipe");
    let addr = start(&d);
    let mut greedy = TcpStream::connect(&addr).unwrap();
    let n = 300;
    let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(n);
    greedy.write_all(&req).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_prompt(
        &addr,
        "a connection with 300 pipelined requests it does not read",
    );
    // Its answers come, in order, once it reads them.
    greedy
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let count = |b: &[u8]| b.windows(15).filter(|w| w == b"HTTP/1.1 200 OK").count();
    while count(&got) < n {
        let k = greedy.read(&mut buf).unwrap();
        assert!(k > 0, "closed after {} answers", count(&got));
        got.extend_from_slice(&buf[..k]);
    }
    assert_eq!(count(&got), n);
}

#[test]
fn huge_and_endless_request_heads_are_cut_off() {
    let d = scratch("heads");
    let addr = start(&d);
    // A head past the bound: refused and closed, without buffering the rest.
    let mut big = TcpStream::connect(&addr).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    head.extend(std::iter::repeat(b'a').take(64 * 1024));
    let _ = big.write_all(&head);
    let mut out = Vec::new();
    let _ = big.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    // Heads sent a byte at a time by many clients: others are answered meanwhile.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(&addr).unwrap();
        let stop = stop.clone();
        slow.push(std::thread::spawn(move || {
            for b in b"GET /metrics HTTP/1.1\r\nX: ".iter().cycle() {
                if stop.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }));
    }
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        assert_prompt(&addr, "50 clients sending their heads a byte at a time");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
}

#[test]
fn more_idle_connections_than_it_keeps_cost_only_the_stalest() {
    let d = scratch("idle");
    let addr = start(&d);
    let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS * 2 + 10)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        assert_prompt(&addr, "twice as many idle connections as it keeps");
    }
    drop(idle);
}

/// Out of descriptors (`prlimit --nofile`), the accept loop goes on: the process answers again as
/// soon as clients go away, and meanwhile by closing its stalest connections.
#[test]
fn running_out_of_descriptors_never_ends_the_accept_loop() {
    let d = scratch("emfile");
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("gpuslice");
    assert!(bin.exists(), "{} (cargo build first)", bin.display());
    let mut child = std::process::Command::new("prlimit")
        .arg("--nofile=20:20")
        .arg(&bin)
        .args(["exporter", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(d.join("state"))
        .arg("--ledger-dir")
        .arg(d.join("ledgers"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_string();
    let hogs: Vec<TcpStream> = (0..60)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    assert_prompt(&addr, "descriptors exhausted by 60 idle connections");
    drop(hogs);
    std::thread::sleep(Duration::from_millis(300));
    assert_prompt(&addr, "after the idle connections went");
    let _ = child.kill();
    let _ = child.wait();
}

/// A user's hard links of a ledger (60,000 gave 60,000 series before) count for nothing, and a
/// ledger whose tenant name is a node tenant's does not overwrite that tenant's figures.
#[test]
fn hard_links_and_links_of_ledgers_are_not_tenants() {
    let d = scratch("links");
    let opts = gpuslice_state::ledger::LedgerOptions {
        tenant: "hl".into(),
        default_limit: gpuslice_state::config::Limit::Bytes(1 << 30),
        devices: vec![(
            "GPU-11111111-2222-3333-4444-555555555555".into(),
            gpuslice_state::config::Limit::Bytes(1 << 30),
        )],
        group: None,
    };
    let path = d.join("ledgers/hl.ledger");
    let _l = gpuslice_state::ledger::Ledger::open(&path, &opts).unwrap();
    let elsewhere = d.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let _l2 = gpuslice_state::ledger::Ledger::open(&elsewhere.join("x.ledger"), &opts).unwrap();
    let e = sources(&d).read();
    assert_eq!(e.tenants.len(), 1);
    for i in 0..200 {
        std::fs::hard_link(&path, d.join(format!("ledgers/link{i}.ledger"))).unwrap();
    }
    std::os::unix::fs::symlink(elsewhere.join("x.ledger"), d.join("ledgers/sym.ledger")).unwrap();
    let r = sources(&d).read();
    assert!(
        r.tenants.is_empty(),
        "hard links and links were read: {:?}",
        r.tenants.iter().map(|t| &t.ledger).collect::<Vec<_>>()
    );
}
