//! Scrape time of `gpuslice exporter` for many tenants (docs/BENCHMARKS.md, "Exporter scrape"):
//! creates TENANTS memory ledgers with GPUS devices each (every device with some memory used) and
//! GPUS device ledgers (up to 32 tenants each, the device ledger's limit) in a private directory,
//! serves them on a loopback port in this process, and times SCRAPES HTTP scrapes end to end
//! (connect, request, whole answer read).
//!
//! usage: cargo run --release -p gpuslice-observe --example scrape_bench -- [TENANTS GPUS SCRAPES]
//!        (defaults 50 4 200)

use gpuslice_observe::exporter::Exporter;
use gpuslice_observe::Sources;
use gpuslice_state::compute::device::DeviceLedger;
use gpuslice_state::config::Limit;
use gpuslice_state::ledger::{Ledger, LedgerOptions};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("TENANTS GPUS SCRAPES are numbers"))
        .collect();
    let tenants = args.first().copied().unwrap_or(50);
    let gpus = args.get(1).copied().unwrap_or(4);
    let scrapes = args.get(2).copied().unwrap_or(200);
    let dir = std::env::temp_dir().join(format!("gpuslice-scrape-bench-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("devices")).unwrap();
    let uuids: Vec<String> = (0..gpus)
        .map(|g| format!("GPU-00000000-0000-4000-8000-{g:012}"))
        .collect();
    let mut keep = Vec::new();
    for t in 0..tenants {
        let opts = LedgerOptions {
            tenant: format!("tenant-{t:03}"),
            default_limit: Limit::Bytes(8 << 30),
            devices: uuids
                .iter()
                .map(|u| (u.clone(), Limit::Bytes(8 << 30)))
                .collect(),
            group: None,
        };
        let l = Ledger::open(&dir.join(format!("tenant-{t:03}.ledger")), &opts).unwrap();
        for d in 0..gpus {
            l.try_reserve(d, ((t + d) as u64 + 1) << 20).unwrap();
        }
        keep.push(l);
    }
    for u in &uuids {
        let l = DeviceLedger::open(
            &gpuslice_state::compute::device::path_for(&dir.join("devices"), u),
            u,
            true,
        )
        .unwrap();
        let g = l.lock(0);
        for t in 0..tenants.min(32) {
            l.find_or_add_tenant(
                &g,
                gpuslice_state::compute::TenantId(t as u128 + 1),
                &format!("tenant-{t:03}"),
                100 / tenants.min(32) as u32 + 1,
                0,
                false,
            );
        }
        drop(g);
        keep_device(l);
    }
    let sources = Sources::new(
        Some(dir.join("no-node")),
        Some(dir.clone()),
        Some(dir.join("devices")),
    );
    let exporter = Exporter::bind("127.0.0.1:0").unwrap();
    let addr = exporter.addr().to_string();
    std::thread::spawn(move || exporter.run(&sources));

    let scrape = || {
        let start = Instant::now();
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        (start.elapsed(), body)
    };
    let (_, body) = scrape(); // NVML look-up and first-touch of every mapping
    let lines = body.lines().filter(|l| !l.starts_with('#')).count();
    let memory_series = body
        .lines()
        .filter(|l| l.starts_with("gpuslice_memory_used_bytes{"))
        .count();
    let mut times: Vec<Duration> = (0..scrapes).map(|_| scrape().0).collect();
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{tenants} tenants x {gpus} GPUs: {memory_series} gpuslice_memory_used_bytes series, {lines} samples in all, {} bytes",
        body.len()
    );
    println!(
        "scrape over HTTP, {scrapes} scrapes: median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        ms(times[times.len() / 2]),
        ms(times[times.len() * 9 / 10]),
        ms(times[times.len() - 1])
    );
    drop(keep);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Device ledgers stay mapped for the whole run (as a tenant's process would keep them).
fn keep_device(l: DeviceLedger) {
    std::mem::forget(l);
}
