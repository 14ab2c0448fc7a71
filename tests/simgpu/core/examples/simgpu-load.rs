//! A stand-in simgpu client for checking readers (NVML, simgpu-stat) without libcuda:
//! `simgpu-load BYTES SECONDS DUTY` reserves BYTES on device 0, then for SECONDS holds device turns
//! DUTY (0..1) of the time in 10 ms periods, then exits without releasing (the next sweep frees it).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_owned());
    let bytes = simgpu_core::parse_size(&arg(0, "1GiB")).expect("BYTES");
    let seconds: f64 = arg(1, "2").parse().expect("SECONDS");
    let duty: f64 = arg(2, "0.5").parse().expect("DUTY");
    let s = simgpu_core::shared().unwrap_or_else(|e| panic!("{e}"));
    assert!(s.try_reserve(0, bytes), "out of memory");
    println!("{} reserved {bytes}", std::process::id());
    let period = std::time::Duration::from_millis(10);
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
    while std::time::Instant::now() < end {
        {
            let _turn = s.acquire_device(0);
            std::thread::sleep(period.mul_f64(duty));
        }
        std::thread::sleep(period.mul_f64(1.0 - duty));
    }
}
