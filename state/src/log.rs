//! Logging: one atomic load decides; messages go to stderr as `gpuslice: <level>: ...`.
//! `GPUSLICE_LOG` = off | error | warn (default) | info | debug | trace. Nothing else is ever printed.

// Process-local: the log level of this process.
#![allow(clippy::disallowed_types)]

use std::fmt;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

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

/// Whether a line is dropped rather than written when stderr cannot take it now ([`never_block`]).
static NEVER_BLOCK: AtomicBool = AtomicBool::new(false);
/// Lines dropped since the last one written, reported with the next.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// From now on a log line never waits for stderr: when it cannot take a line at once (a pipe
/// nobody reads has filled), the line is dropped and counted, and the next line that goes out says
/// how many were. The preloaded library sets this: its lines are written by the application's
/// threads and by its own scheduler thread, which must never wait on what the application does
/// with its stderr (a full pipe stopped a scheduler thread for a whole run and left its process
/// unscheduled). The tools keep blocking writes: their errors must reach the terminal.
pub fn never_block() {
    NEVER_BLOCK.store(true, Ordering::Relaxed);
}

/// The longest line written whole: up to `PIPE_BUF` bytes a write to a pipe is atomic, so lines of
/// concurrent threads and processes never interleave, and one the pipe has room for never blocks.
const LINE_MAX: usize = 4096;

/// Whether `fd` can take a line now (`poll` without waiting; a regular file always can).
fn ready(fd: libc::c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout: poll only reports on `fd`.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLOUT != 0
}

/// `line` as written: at most [`LINE_MAX`] bytes, still ending in a newline.
fn bounded(mut line: Vec<u8>) -> Vec<u8> {
    if line.len() > LINE_MAX {
        line.truncate(LINE_MAX - 4);
        line.extend_from_slice(b"...\n");
    }
    line
}

/// Writes `line` to `fd` whole; with `never_block`, only if `fd` can take it now (false if not).
/// The check and the write are one step for this process's threads: two lines passing the check
/// together could otherwise fill the room that let one through.
fn write_line(fd: libc::c_int, line: &[u8], never_block: bool) -> bool {
    static ONE_WRITER: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = ONE_WRITER.lock();
    if never_block && !ready(fd) {
        return false;
    }
    let mut rest = line;
    while !rest.is_empty() {
        // SAFETY: writes from a live slice of `rest.len()` bytes.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        rest = &rest[(n as usize).min(rest.len())..];
    }
    true
}

#[cold]
fn emit(level: Level, args: fmt::Arguments<'_>) {
    // One write per line so lines of concurrent threads/processes do not interleave.
    let never_block = NEVER_BLOCK.load(Ordering::Relaxed);
    let mut line = Vec::with_capacity(160);
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        let _ = writeln!(
            line,
            "gpuslice: warn: {dropped} log line(s) dropped: stderr could not take them"
        );
    }
    let _ = writeln!(line, "gpuslice: {}: {}", level.name(), args);
    if !write_line(libc::STDERR_FILENO, &bounded(line), never_block) {
        DROPPED.fetch_add(1 + dropped, Ordering::Relaxed);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe whose reader has not read: a blocking write to it would wait for good.
    #[test]
    fn a_line_to_a_full_pipe_is_dropped_without_waiting_and_written_once_there_is_room() {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors.
        let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
        assert_eq!(made, 0);
        let (rd, wr) = (fds[0], fds[1]);
        let chunk = [b'x'; 4096];
        // SAFETY: non-blocking writes from a live buffer until the pipe is full.
        while unsafe { libc::write(wr, chunk.as_ptr().cast(), chunk.len()) } > 0 {}
        // SAFETY: the write end back to blocking, as a program's stderr is.
        unsafe { libc::fcntl(wr, libc::F_SETFL, 0) };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(write_line(wr, b"gpuslice: warn: x\n", true)));
        let wrote = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a line to a full pipe waited");
        assert!(!wrote, "nothing can be written to a full pipe");
        let mut sink = vec![0u8; 1 << 20];
        // SAFETY: reads into a live buffer (the pipe holds data: this does not wait).
        assert!(unsafe { libc::read(rd, sink.as_mut_ptr().cast(), sink.len()) } > 0);
        assert!(write_line(wr, b"gpuslice: warn: y\n", true));
        // SAFETY: closes the two descriptors made above.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
    }

    #[test]
    fn a_line_is_at_most_pipe_buf_bytes_and_ends_in_a_newline() {
        let long = bounded(vec![b'a'; 10_000]);
        assert_eq!(long.len(), LINE_MAX);
        assert!(long.ends_with(b"...\n"));
        assert_eq!(bounded(b"short\n".to_vec()), b"short\n");
    }
}
