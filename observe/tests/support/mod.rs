//! What the exporter's integration tests share.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One scrape by a well-behaved client (HTTP/1.1, `Connection: close`): the time it took and the
/// whole response, which must be a 200.
pub fn scrape_timed(addr: &str) -> (Duration, String) {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    (started.elapsed(), out)
}
