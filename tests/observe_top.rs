//! `gpuslice top` on a real terminal (tmux, on a private server socket): with two tenants running on
//! simgpu it shows both, per GPU, with their quotas and shares, and it ends on `q` restoring the
//! terminal. Without a terminal it prints plain lines.

use gpuslice_testkit as common;

use common::*;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Processes killed (and reaped) when the test ends, however it ends.
struct Tenants(Vec<Child>);

impl Drop for Tenants {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two tenants spinning on the simulated GPU (shares 30/70, quotas 2/3 GiB) for `seconds`.
fn start_tenants(sim: &Sim, seconds: u32) -> Tenants {
    Tenants(
        [("alpha", "30", "2GiB"), ("beta", "70", "3GiB")]
            .into_iter()
            .map(|(name, share, quota)| {
                sim.command(profile_dir().join("gpuslice-workload"))
                    .env("LD_PRELOAD", profile_dir().join("libgpuslice.so"))
                    .env("GPUSLICE_TENANT", name)
                    .env("GPUSLICE_COMPUTE_SHARE", share)
                    .env("GPUSLICE_MEMORY_LIMIT", quota)
                    .args(["--spin-us", "200", "--seconds", &seconds.to_string()])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start gpuslice-workload")
            })
            .collect(),
    )
}

/// Waits until both tenants' ledgers and the device ledger exist.
fn wait_for_ledgers(sim: &Sim) {
    let start = Instant::now();
    // A tenant's default ledger is in the user's own directory below the ledger directory
    // (`uid-<uid>/`, docs/CONFIGURATION.md "Several users").
    let ledger = |name: &str| {
        std::fs::read_dir(&sim.dir).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.path().join(format!("{name}.ledger")).exists())
        })
    };
    while !(ledger("alpha")
        && ledger("beta")
        && std::fs::read_dir(sim.dir.join("devices")).is_ok_and(|mut d| d.next().is_some()))
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "tenants did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A tmux server of its own, its socket in the test's private directory.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket).args(["-f", "/dev/null"]);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("tmux is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn alive(&self) -> bool {
        self.cmd()
            .args(["has-session", "-t", "top"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").stderr(Stdio::null()).status();
    }
}

#[test]
fn top_in_tmux_shows_both_tenants_and_quits_on_q() {
    let sim = Sim::new("top");
    let _tenants = start_tenants(&sim, 30);
    wait_for_ledgers(&sim);

    // The command tmux runs: this machine's environment, spelled out for the shell tmux starts.
    let probe = sim.command("env");
    let mut line = String::from("env -i PATH=/usr/bin:/bin TERM=xterm-256color");
    for (k, v) in probe.get_envs() {
        if let Some(v) = v {
            line.push_str(&format!(
                " {}='{}'",
                k.to_string_lossy(),
                v.to_string_lossy()
            ));
        }
    }
    let done = sim.dir.join("top.exit");
    line.push_str(&format!(
        " {} top --state-dir {}; echo $? > {}; sleep 30",
        gpuslice_bin().display(),
        sim.dir.join("node").display(),
        done.display()
    ));
    let tmux = Tmux {
        socket: sim.dir.join("tmux.sock"),
    };
    let out = tmux
        .cmd()
        .args([
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "150",
            "-y",
            "30",
            &line,
        ])
        .output()
        .expect("tmux is installed (scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The screen shows one GPU with both tenants, their quotas and promised shares.
    let start = Instant::now();
    let screen = loop {
        let screen = tmux.run(&["capture-pane", "-p", "-t", "top"]);
        let row = |t: &str| {
            screen
                .lines()
                .find(|l| l.trim_start().starts_with(t))
                .map(str::to_owned)
        };
        if let (Some(a), Some(b)) = (row("alpha"), row("beta")) {
            if a.contains("2 GiB") && b.contains("3 GiB") && a.contains("30%") && b.contains("70%")
            {
                break screen;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "top never showed both tenants; the screen:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    println!("{screen}");
    assert!(screen.contains("GPU 0"), "{screen}");
    assert!(screen.contains("q quits"), "{screen}");

    // `q` ends it with status 0, and the shell's screen is back (alternate screen left).
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let start = Instant::now();
    while !done.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "top did not quit on q; the screen:\n{}",
            tmux.run(&["capture-pane", "-p", "-t", "top"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(std::fs::read_to_string(&done).unwrap().trim(), "0");
    let after = tmux.run(&["capture-pane", "-p", "-t", "top"]);
    assert!(
        !after.contains("q quits"),
        "the view stayed on screen:\n{after}"
    );
    assert!(tmux.alive());
}

#[test]
fn top_without_a_terminal_prints_plain_lines() {
    let sim = Sim::new("top-plain");
    let _tenants = start_tenants(&sim, 20);
    wait_for_ledgers(&sim);
    let node = sim.dir.join("node");
    let run = sim.run(
        gpuslice_bin(),
        &["top", "--once", "--state-dir", node.to_str().unwrap()],
    );
    run.assert_success();
    assert!(
        !run.stdout.contains('\x1b'),
        "escape codes:\n{}",
        run.stdout
    );
    for t in ["alpha", "beta"] {
        assert!(
            run.stdout.lines().any(|l| l.trim_start().starts_with(t)),
            "{}",
            run.stdout
        );
    }
}
