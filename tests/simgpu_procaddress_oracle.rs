//! cuGetProcAddress, with NVIDIA's real 535 driver as the oracle: the same client
//! (tests/clients/procaddress.c) asks both drivers the same questions -- every base name the real
//! driver exports, at many CUDA versions and all flags, through cuGetProcAddress (v1) and
//! cuGetProcAddress_v2 -- and every answer (return code, status, symbol the pointer belongs to) must
//! be identical. simgpu runs as the real driver's CUDA version (SIMGPU_DRIVER_VERSION=12020).

use gpuslice_testkit as common;

use common::*;
use std::collections::BTreeSet;

const VERSIONS: [i32; 15] = [
    2000, 3000, 3020, 4000, 6050, 7000, 9020, 10000, 11030, 11040, 12000, 12020, 12030, 99999, -1,
];
const FLAGS: [u64; 5] = [0, 1, 2, 3, 4];
/// The CUDA version of NVIDIA's 535 driver.
const REAL_DRIVER_VERSION: u32 = 12020;

/// The questions: (name, version, flags) lines for the client's stdin.
fn questions() -> (String, usize) {
    let table = std::fs::read_to_string(root().join("src/api/driver_entry_points.tsv")).unwrap();
    let mut exported = BTreeSet::new();
    let mut newer = BTreeSet::new();
    let mut older_bases = BTreeSet::new();
    for line in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split('\t').collect();
        let (base, version, in_535) = (f[1], f[2].parse::<u32>().unwrap(), f[5] == "1");
        if in_535 && version > 0 {
            exported.insert(base.to_string());
        }
        if version > 0 && version <= REAL_DRIVER_VERSION {
            older_bases.insert(base.to_string());
        }
        if !in_535 && version > REAL_DRIVER_VERSION {
            newer.insert(base.to_string());
        }
    }
    assert!(
        exported.len() > 300,
        "driver_entry_points.tsv: only {} bases",
        exported.len()
    );
    // Bases introduced after 535: a 12.2 driver does not know them.
    let newer: Vec<String> = newer.difference(&older_bases).cloned().collect();
    let mut names: Vec<String> = exported.into_iter().chain(newer).collect();
    names.extend(["cuMemAlloc_v2", "cuNope", ""].map(String::from));
    let mut input = String::new();
    let mut n = 0;
    for name in &names {
        for v in VERSIONS {
            for flags in FLAGS {
                input.push_str(&format!("{name}\t{v}\t{flags}\n"));
                n += 1;
            }
        }
    }
    (input, n)
}

#[test]
fn cu_get_proc_address_matches_the_real_driver() {
    let (input, n) = questions();
    let client = compile(&PROCADDRESS);
    let sim = Sim::new("procaddr").env("SIMGPU_DRIVER_VERSION", "12020");

    let real = {
        let mut cmd = sim.command_with_driver(&client, &nvidia_driver_dir());
        feed(sim.spawn(&mut cmd), &input, "procaddress (NVIDIA 535)")
    };
    real.assert_success();
    let simgpu = {
        let mut cmd = sim.command(&client);
        feed(sim.spawn(&mut cmd), &input, "procaddress (simgpu)")
    };
    simgpu.assert_success();

    let real_lines: Vec<&str> = real.stdout.lines().collect();
    let sim_lines: Vec<&str> = simgpu.stdout.lines().collect();
    assert_eq!(
        real_lines.len(),
        n,
        "real driver answered {} of {n}",
        real_lines.len()
    );
    // Sanity of the oracle itself: it resolves something.
    assert!(
        real_lines
            .iter()
            .any(|l| l.starts_with("cuMemAlloc 3020 0 | v1 0 cuMemAlloc_v2 ")),
        "the real driver's answers look wrong: {:?}",
        &real_lines[..real_lines.len().min(5)]
    );
    let mismatches: Vec<String> = real_lines
        .iter()
        .zip(sim_lines.iter().map(Some).chain(std::iter::repeat(None)))
        .filter(|(r, s)| Some(**r) != s.copied())
        .map(|(r, s)| {
            format!(
                "  real:   {r}\n  simgpu: {}",
                s.copied().unwrap_or("<no answer>")
            )
        })
        .collect();
    assert!(
        mismatches.is_empty() && sim_lines.len() == n,
        "{} of {n} answers differ (simgpu answered {}); first ones:\n{}\nsimgpu stderr:\n{}",
        mismatches.len(),
        sim_lines.len(),
        mismatches
            .iter()
            .take(25)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        simgpu
            .stderr
            .lines()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
