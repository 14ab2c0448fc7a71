//! `gpuslice exporter`: serves `/metrics` (Prometheus text format 0.0.4), reading every ledger at
//! scrape time. One thread answers requests one after the other: a scrape takes a few milliseconds
//! even for hundreds of series (docs/BENCHMARKS.md), and nothing is cached between scrapes.

use crate::collect::Sources;
use crate::gpus::GpuIndex;
use crate::metrics;
use std::io::Write;

/// A bound exporter: [`Exporter::bind`], then [`Exporter::run`].
pub struct Exporter {
    server: tiny_http::Server,
    addr: String,
}

impl Exporter {
    /// Binds `listen` (`127.0.0.1:0` picks a free port: see [`Exporter::addr`]).
    pub fn bind(listen: &str) -> Result<Exporter, String> {
        let server =
            tiny_http::Server::http(listen).map_err(|e| format!("--listen {listen}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .map_or_else(|| listen.to_string(), |a| a.to_string());
        Ok(Exporter { server, addr })
    }

    /// The address actually bound.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Answers requests until the process ends.
    pub fn run(self, sources: &Sources) {
        let mut gpus = GpuIndex::from_nvml();
        for request in self.server.incoming_requests() {
            let path = request.url().split('?').next().unwrap_or("").to_string();
            let response = match (request.method(), path.as_str()) {
                (tiny_http::Method::Get, "/metrics") => {
                    let text = metrics::encode(&sources.read(), &mut gpus);
                    with_type(
                        tiny_http::Response::from_string(text),
                        metrics::CONTENT_TYPE,
                    )
                }
                (tiny_http::Method::Get, "/") => with_type(
                    tiny_http::Response::from_string(
                        "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n",
                    ),
                    "text/html; charset=utf-8",
                ),
                _ => tiny_http::Response::from_string("not found\n").with_status_code(404),
            };
            // A client that went away costs only its own answer.
            let _ = request.respond(response);
        }
    }
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

fn with_type(
    r: tiny_http::Response<std::io::Cursor<Vec<u8>>>,
    content_type: &str,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    match tiny_http::Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes()) {
        Ok(h) => r.with_header(h),
        Err(()) => r,
    }
}
