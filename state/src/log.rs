//! Logging: one atomic load decides; messages go to stderr as `gpuslice: <level>: ...`.
//! `GPUSLICE_LOG` = off | error | warn (default) | info | debug | trace. Nothing else is ever printed.

// Process-local: the log level of this process.
#![allow(clippy::disallowed_types)]

use std::fmt;
use std::io::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

/// A log level; also the configuration's `GPUSLICE_LOG` value (`config::LogLevel` is this type).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Off = 0,
    Error = 1,
    #[default]
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl Level {
    pub fn parse(text: &str) -> Option<Level> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "off" | "none" | "0" => Level::Off,
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

#[cold]
fn emit(level: Level, args: fmt::Arguments<'_>) {
    // One write per line so lines of concurrent threads/processes do not interleave.
    let mut line = Vec::with_capacity(160);
    let _ = writeln!(line, "gpuslice: {}: {}", level.name(), args);
    let _ = std::io::stderr().write_all(&line);
}

#[inline]
pub fn log(level: Level, args: fmt::Arguments<'_>) {
    if enabled(level) {
        emit(level, args);
    }
}

pub fn error(args: fmt::Arguments<'_>) {
    log(Level::Error, args)
}
pub fn warn(args: fmt::Arguments<'_>) {
    log(Level::Warn, args)
}
pub fn info(args: fmt::Arguments<'_>) {
    log(Level::Info, args)
}
pub fn debug(args: fmt::Arguments<'_>) {
    log(Level::Debug, args)
}
