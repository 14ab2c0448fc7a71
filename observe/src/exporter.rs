//! `gpuslice exporter`: serves `/metrics` (Prometheus text format 0.0.4), reading every ledger at
//! scrape time; nothing is cached between scrapes.
//!
//! One thread serves every connection from one `poll(2)` loop, so nothing a client does can hold
//! up another, and the server needs no thread, process or memory beyond what it had at start:
//!
//! - a request head is at most [`MAX_HEAD`] bytes (431 otherwise), requests with a body are refused
//!   (400), and a connection's input is read only while it has no answer waiting to be written:
//!   pipelined requests are answered one at a time, in order, and a client that never reads its
//!   answers only stops its own connection;
//! - each connection gets one request per turn of the loop (a scrape takes a few milliseconds even
//!   for hundreds of series, docs/BENCHMARKS.md);
//! - a connection that makes no progress for [`IDLE_TIMEOUT`], or takes longer than
//!   [`HEAD_TIMEOUT`] to send one request head, is closed;
//! - at most [`MAX_CONNECTIONS`] are open, and no more than the descriptor limit less
//!   [`RESERVED_FDS`] (kept for reading ledgers): past that, the one that has waited longest for a
//!   complete request (else the oldest idle one) is closed to make room;
//! - the accept loop never ends: out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), it
//!   closes the stalest connection and accepts again, or pauses accepting for [`ACCEPT_PAUSE`] when
//!   it holds none.

use crate::collect::Sources;
use crate::gpus::GpuIndex;
use crate::metrics;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Open connections at most.
pub const MAX_CONNECTIONS: usize = 128;
/// A connection with nothing read or written for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request head must arrive whole within this long of its first byte.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Accepting pauses this long when the process is out of descriptors or memory with no connection
/// to close.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Descriptors kept for reading ledgers and the rest: connections are held to the descriptor limit
/// less these.
pub const RESERVED_FDS: usize = 16;

/// Connections at most under this process's descriptor limit.
fn connection_limit() -> usize {
    // SAFETY: a zeroed rlimit is a valid value of this plain C struct.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to an rlimit we own.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
    } else {
        MAX_CONNECTIONS
    };
    MAX_CONNECTIONS.min(soft.saturating_sub(RESERVED_FDS).max(1))
}

/// A bound exporter: [`Exporter::bind`], then [`Exporter::run`].
pub struct Exporter {
    listener: TcpListener,
    addr: String,
}

struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    /// Close once the output is written.
    closing: bool,
    /// The client has sent all it will (its buffered requests are still answered).
    eof: bool,
    last_progress: Instant,
    /// When the first byte of the request being received came (none: between requests).
    head_started: Option<Instant>,
    opened: Instant,
}

impl Exporter {
    /// Binds `listen` (`127.0.0.1:0` picks a free port: see [`Exporter::addr`]).
    pub fn bind(listen: &str) -> Result<Exporter, String> {
        let listener = TcpListener::bind(listen).map_err(|e| format!("--listen {listen}: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("--listen {listen}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_or_else(|_| listen.to_string(), |a| a.to_string());
        Ok(Exporter { listener, addr })
    }

    /// The address actually bound.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Answers requests until the process ends.
    pub fn run(self, sources: &Sources) {
        let mut gpus = GpuIndex::from_nvml();
        let mut conns: Vec<Conn> = Vec::new();
        let mut accept_paused_until: Option<Instant> = None;
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let max_connections = connection_limit();
        loop {
            let now = Instant::now();
            if accept_paused_until.is_some_and(|t| now >= t) {
                accept_paused_until = None;
            }
            fds.clear();
            fds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: if accept_paused_until.is_none() {
                    libc::POLLIN
                } else {
                    0
                },
                revents: 0,
            });
            for c in &conns {
                let pending = c.written < c.output.len();
                let events = if pending {
                    libc::POLLOUT
                } else if c.input.len() < MAX_HEAD && !c.closing && !c.eof {
                    libc::POLLIN
                } else {
                    0
                };
                fds.push(libc::pollfd {
                    fd: c.stream.as_raw_fd(),
                    events,
                    revents: 0,
                });
            }
            // A complete request already buffered (pipelined) needs no wait.
            let ready_now = conns
                .iter()
                .any(|c| c.output.is_empty() && !c.closing && head_end(&c.input).is_some());
            let timeout_ms = if ready_now { 0 } else { 200 };
            // SAFETY: `fds` is a valid array of pollfd of the length given.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
            if n < 0 {
                // EINTR, or ENOMEM: wait a little and go on.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let now = Instant::now();
            // Connections first (their indices match `fds[1..]`), then new ones.
            let mut close = vec![false; conns.len()];
            for (i, c) in conns.iter_mut().enumerate() {
                let re = fds[i + 1].revents;
                if re & (libc::POLLERR | libc::POLLNVAL) != 0 {
                    close[i] = true;
                    continue;
                }
                if re & libc::POLLOUT != 0 && !write_some(c, now) {
                    close[i] = true;
                    continue;
                }
                if re & (libc::POLLIN | libc::POLLHUP) != 0 && !read_some(c, now) {
                    close[i] = true;
                    continue;
                }
                if c.written >= c.output.len() {
                    c.output.clear();
                    c.written = 0;
                    if c.closing {
                        close[i] = true;
                        continue;
                    }
                    if let Some(end) = head_end(&c.input) {
                        answer(c, end, sources, &mut gpus);
                        c.closing |= c.eof && head_end(&c.input).is_none();
                        c.last_progress = now;
                        if !write_some(c, now) {
                            close[i] = true;
                            continue;
                        }
                    } else if c.input.len() >= MAX_HEAD {
                        respond(
                            c,
                            431,
                            "text/plain",
                            b"request head too large\n".to_vec(),
                            true,
                        );
                        let _ = write_some(c, now);
                    } else if c.eof {
                        close[i] = true;
                        continue;
                    }
                }
                let stalled = now.duration_since(c.last_progress) >= IDLE_TIMEOUT;
                let slow_head = c
                    .head_started
                    .is_some_and(|t| now.duration_since(t) >= HEAD_TIMEOUT);
                if stalled || slow_head {
                    close[i] = true;
                }
            }
            let mut i = 0;
            conns.retain(|_| {
                let keep = !close[i];
                i += 1;
                keep
            });
            if fds[0].revents & libc::POLLIN != 0 {
                loop {
                    match self.listener.accept() {
                        Ok((stream, _)) => {
                            if conns.len() >= max_connections {
                                evict_stalest(&mut conns);
                            }
                            if stream.set_nonblocking(true).is_err() {
                                continue;
                            }
                            let _ = stream.set_nodelay(true);
                            conns.push(Conn {
                                stream,
                                input: Vec::new(),
                                output: Vec::new(),
                                written: 0,
                                closing: false,
                                eof: false,
                                last_progress: now,
                                head_started: None,
                                opened: now,
                            });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            let exhausted = matches!(
                                e.raw_os_error(),
                                Some(libc::EMFILE)
                                    | Some(libc::ENFILE)
                                    | Some(libc::ENOBUFS)
                                    | Some(libc::ENOMEM)
                            );
                            if exhausted {
                                // Room for the next one, or a pause when nothing can be closed.
                                if conns.is_empty() {
                                    accept_paused_until = Some(now + ACCEPT_PAUSE);
                                    break;
                                }
                                evict_stalest(&mut conns);
                            }
                            // ECONNABORTED, EINTR, EPROTO...: that client only.
                        }
                    }
                }
            }
        }
    }
}

/// Closes the connection that has waited longest for a complete request (or the oldest).
fn evict_stalest(conns: &mut Vec<Conn>) {
    let victim = conns
        .iter()
        .enumerate()
        .min_by_key(|(_, c)| (c.head_started.is_none(), c.head_started.unwrap_or(c.opened)))
        .map(|(i, _)| i);
    if let Some(i) = victim {
        conns.swap_remove(i);
    }
}

/// Reads what is there (up to the head bound); false: the connection is finished.
fn read_some(c: &mut Conn, now: Instant) -> bool {
    let mut buf = [0u8; 4096];
    let room = MAX_HEAD.saturating_sub(c.input.len()).min(buf.len());
    if room == 0 {
        return true;
    }
    match c.stream.read(&mut buf[..room]) {
        Ok(0) => {
            c.eof = true;
            true
        }
        Ok(n) => {
            if c.head_started.is_none() {
                c.head_started = Some(now);
            }
            c.input.extend_from_slice(&buf[..n]);
            c.last_progress = now;
            true
        }
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    }
}

/// Writes what the socket takes; false: the connection is finished.
fn write_some(c: &mut Conn, now: Instant) -> bool {
    while c.written < c.output.len() {
        match c.stream.write(&c.output[c.written..]) {
            Ok(0) => return false,
            Ok(n) => {
                c.written += n;
                c.last_progress = now;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Where the first request head in `buf` ends (after its blank line).
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Answers the request whose head is `c.input[..end]`, and takes it off the input.
fn answer(c: &mut Conn, end: usize, sources: &Sources, gpus: &mut GpuIndex) {
    let head = String::from_utf8_lossy(&c.input[..end]).into_owned();
    c.input.drain(..end);
    c.head_started = (!c.input.is_empty()).then_some(Instant::now());
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let mut close = version != "HTTP/1.1";
    let mut body_follows = false;
    for h in lines {
        let Some((name, value)) = h.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "connection" if value.eq_ignore_ascii_case("close") => close = true,
            "connection" if value.eq_ignore_ascii_case("keep-alive") && version == "HTTP/1.0" => {
                close = false
            }
            "content-length" if value != "0" => body_follows = true,
            "transfer-encoding" => body_follows = true,
            _ => {}
        }
    }
    if body_follows || !version.starts_with("HTTP/1.") {
        // A body would have to be read and skipped; this server takes none.
        respond(c, 400, "text/plain", b"bad request\n".to_vec(), true);
        return;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let text = metrics::encode(&sources.read(), gpus);
            respond(c, 200, metrics::CONTENT_TYPE, text.into_bytes(), close);
        }
        ("GET", "/") => respond(
            c,
            200,
            "text/html; charset=utf-8",
            b"<html><body><a href=\"/metrics\">/metrics</a></body></html>\n".to_vec(),
            close,
        ),
        _ => respond(c, 404, "text/plain", b"not found\n".to_vec(), close),
    }
}

fn respond(c: &mut Conn, status: u16, content_type: &str, body: Vec<u8>, close: bool) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{}\r\n",
        body.len(),
        if close {
            "Connection: close\r\n"
        } else {
            ""
        }
    )
    .into_bytes();
    out.extend_from_slice(&body);
    c.output = out;
    c.written = 0;
    c.closing = close;
}

/// `gpuslice exporter`: binds, prints `listening on http://ADDR/metrics` (the actual address), and
/// serves until the process is stopped.
pub fn serve(listen: &str, sources: Sources) -> Result<(), String> {
    let exporter = Exporter::bind(listen)?;
    println!(
        "gpuslice exporter: listening on http://{}/metrics",
        exporter.addr()
    );
    println!(
        "  tenants: {}/tenants, {}; device ledgers: {}",
        sources.state_dir.display(),
        sources.ledger_dir.display(),
        sources.device_dir.display()
    );
    let _ = std::io::stdout().flush();
    exporter.run(&sources);
    Ok(())
}
