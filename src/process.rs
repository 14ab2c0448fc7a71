//! The process runtime: what this process decides once, below accounting and scheduling, which both
//! read it and never each other.
//!
//! * the configuration, loaded once and its notes, warnings and errors logged once;
//! * whether a gpuslice drop-in below this preloaded copy enforces (then this copy counts and gates
//!   nothing: everything would be charged and gated twice);
//! * whether memory quotas apply (something configured, or a ledger to join);
//! * the tenant's memory ledger, joined on first use: the tenant's identity, which its compute
//!   shares are accounted under too;
//! * one fork handler and one exit handler, which the layers above register their steps with.

use crate::config::{self, Config};
use crate::driver::{self, calls::visible_devices};
use crate::ledger::{Ledger, LedgerOptions};
use crate::log;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// What the process decided once.
pub struct Process {
    pub config: Config,
    deferring: OnceLock<bool>,
    quotas: OnceLock<bool>,
    ledger: OnceLock<Result<Ledger, String>>,
}

static PROCESS: OnceLock<Process> = OnceLock::new();

/// The process runtime, loaded on first use.
pub fn get() -> &'static Process {
    PROCESS.get_or_init(Process::load)
}

impl Process {
    fn load() -> Process {
        let config = config::load();
        log::set_level(config.log_level);
        log::never_block();
        for note in &config.notes {
            log::info(format_args!("{note}"));
        }
        for warning in &config.warnings {
            log::warn(format_args!("{warning}"));
        }
        for line in config.error_lines() {
            log::error(format_args!("{line}"));
        }
        Process {
            config,
            deferring: OnceLock::new(),
            quotas: OnceLock::new(),
            ledger: OnceLock::new(),
        }
    }

    /// Preloaded over a gpuslice drop-in libcuda: the drop-in enforces and gates. Finding the driver
    /// decides it, so it is found now (once).
    pub fn deferring(&self) -> bool {
        *self.deferring.get_or_init(|| {
            if driver::role() != driver::Role::Preload {
                return false;
            }
            driver::library_handle(driver::Library::Cuda);
            driver::deferring()
        })
    }

    /// Whether memory quotas apply here: something is configured or there is a ledger to join, and
    /// no drop-in below enforces them. Otherwise every memory call is the driver's own.
    pub fn quotas_apply(&self) -> bool {
        *self.quotas.get_or_init(|| {
            (self.config.is_configured() || self.config.ledger_path.exists()) && !self.deferring()
        })
    }

    /// The tenant's ledger, joined (or created) on first use. Only asked when quotas apply.
    pub fn ledger(&self) -> Result<&Ledger, &str> {
        self.ledger
            .get_or_init(|| {
                let visible = visible_devices();
                let options = LedgerOptions::from_config(&self.config, &visible);
                Ledger::open(&self.config.ledger_path, &options).map_err(|e| {
                    log::error(format_args!(
                        "{e}; every allocation is refused until this is fixed"
                    ));
                    e.to_string()
                })
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The ledger's cell: set once [`Process::ledger`] has been asked.
    pub fn ledger_cell(&'static self) -> &'static OnceLock<Result<Ledger, String>> {
        &self.ledger
    }

    /// The tenant's identity: its memory ledger's id, when quotas apply and the ledger could be
    /// joined. `None`: the process is a tenant of its own.
    pub fn tenant_id(&self) -> Option<u128> {
        if !self.quotas_apply() {
            return None;
        }
        self.ledger().ok().and_then(Ledger::id)
    }
}

/// Steps registered by the layers above, run in registration order: in a child forked without exec
/// (async-signal-safe steps only), and at exit.
const MAX_STEPS: usize = 4;
static FORK_CHILD_STEPS: [AtomicUsize; MAX_STEPS] = [const { AtomicUsize::new(0) }; MAX_STEPS];
static EXIT_STEPS: [AtomicUsize; MAX_STEPS] = [const { AtomicUsize::new(0) }; MAX_STEPS];

/// Runs `step` in every child this process forks without exec, before the child returns from
/// `fork` (so only atomic stores and other async-signal-safe work).
pub fn on_fork_child(step: extern "C" fn()) {
    register(&FORK_CHILD_STEPS, step);
}

/// Runs `step` at exit (`atexit`, registered after the driver was loaded, so before its teardown).
pub fn on_exit(step: extern "C" fn()) {
    register(&EXIT_STEPS, step);
}

fn register(steps: &[AtomicUsize; MAX_STEPS], step: extern "C" fn()) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers plain `extern "C"` functions with no arguments.
        unsafe {
            libc::atexit(run_exit_steps);
            libc::pthread_atfork(None, None, Some(run_fork_child_steps));
        }
    });
    let step = step as usize;
    let free = steps
        .iter()
        .find(|s| s.load(Acquire) == step || s.compare_exchange(0, step, AcqRel, Acquire).is_ok());
    if free.is_none() {
        log::error(format_args!(
            "internal: more than {MAX_STEPS} fork or exit steps registered; one is not run"
        ));
    }
}

fn run(steps: &[AtomicUsize; MAX_STEPS]) {
    for s in steps {
        match s.load(Acquire) {
            0 => {}
            p => {
                // SAFETY: a non-zero value was stored by `register` from an `extern "C" fn()`.
                let step = unsafe { std::mem::transmute::<usize, extern "C" fn()>(p) };
                step();
            }
        }
    }
}

extern "C" fn run_fork_child_steps() {
    run(&FORK_CHILD_STEPS);
}

extern "C" fn run_exit_steps() {
    run(&EXIT_STEPS);
}
