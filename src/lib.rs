//! gpuslice: device-memory quotas and compute shares for unmodified CUDA programs, enforced by a
//! library preloaded into them. See docs/ARCHITECTURE.md.

pub mod config;
pub mod ledger;
pub mod scheduling;
pub mod slotfile;

pub mod accounting;
pub mod driver;
pub mod hooks;
pub mod log;

/// The configured log level as the logger's.
pub fn log_level(level: config::LogLevel) -> log::Level {
    match level {
        config::LogLevel::Off => log::Level::Off,
        config::LogLevel::Error => log::Level::Error,
        config::LogLevel::Warn => log::Level::Warn,
        config::LogLevel::Info => log::Level::Info,
        config::LogLevel::Debug => log::Level::Debug,
        config::LogLevel::Trace => log::Level::Trace,
    }
}
