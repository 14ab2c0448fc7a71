//! `gpuslice top`: per GPU and tenant, memory against the quota, achieved against promised compute
//! share, and waiting, refreshed every second. On a terminal it takes the alternate screen and ends
//! on `q`, Esc or Ctrl-C (the terminal is restored however it ends); otherwise it prints one plain
//! block per refresh (`--once`: a single block).

use crate::collect::{Reading, Sources};
use crate::gpus::GpuIndex;
use gpuslice_state::config::format_bytes;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const BAR: usize = 20;

/// One tenant on one GPU, as shown.
#[derive(Default, Clone, Debug)]
struct Row {
    used: Option<u64>,
    limit: Option<u64>,
    denied: u64,
    share: Option<u32>,
    /// Achieved share (0..=1): measured between two refreshes, else the ledger's recent window.
    achieved: Option<f64>,
    waiting: u32,
    /// Seconds waited per second since the last refresh.
    wait_rate: Option<f64>,
    busy_ns: Option<u64>,
    wait_ns: Option<u64>,
}

/// What the previous frame saw (for rates).
#[derive(Default)]
struct Previous {
    at: Option<Instant>,
    counters: BTreeMap<(String, String), (u64, u64)>,
}

/// GPU UUID -> tenant -> row, plus the ledgers that could not be read.
fn rows(
    r: &Reading,
    prev: &Previous,
    now: Instant,
) -> (BTreeMap<String, BTreeMap<String, Row>>, Vec<String>) {
    let mut gpus: BTreeMap<String, BTreeMap<String, Row>> = BTreeMap::new();
    let mut broken = Vec::new();
    for t in &r.tenants {
        match &t.memory {
            Ok(m) => {
                for d in &m.devices {
                    let row = gpus
                        .entry(d.uuid.clone())
                        .or_default()
                        .entry(t.tenant.clone())
                        .or_default();
                    row.used = Some(d.used);
                    row.limit = d.limit;
                    row.denied = d.denied;
                }
            }
            Err(e) => broken.push(e.clone()),
        }
    }
    let elapsed = prev.at.map(|t| now.duration_since(t).as_secs_f64());
    for d in &r.devices {
        let c = match &d.compute {
            Ok(c) => c,
            Err(e) => {
                broken.push(e.clone());
                continue;
            }
        };
        for t in &c.tenants {
            let row = gpus
                .entry(d.uuid.clone())
                .or_default()
                .entry(t.tenant.clone())
                .or_default();
            row.share = Some(t.share);
            row.waiting = t.waiting;
            row.busy_ns = Some(t.busy_ns);
            row.wait_ns = Some(t.wait_ns);
            let before = prev.counters.get(&(d.uuid.clone(), t.tenant.clone()));
            match (before, elapsed) {
                (Some(&(busy, wait)), Some(s)) if s > 0.05 => {
                    row.achieved = Some((t.busy_ns.saturating_sub(busy) as f64 / 1e9 / s).min(1.0));
                    row.wait_rate = Some(t.wait_ns.saturating_sub(wait) as f64 / 1e9 / s);
                }
                _ => row.achieved = t.recent_share,
            }
        }
    }
    (gpus, broken)
}

fn bar(used: u64, limit: Option<u64>) -> String {
    let Some(limit) = limit else {
        return format!("[{}] unlimited", "-".repeat(BAR));
    };
    let frac = if limit == 0 {
        1.0
    } else {
        (used as f64 / limit as f64).min(1.0)
    };
    let full = (frac * BAR as f64).round() as usize;
    format!(
        "[{}{}] {:>3.0}%",
        "#".repeat(full),
        ".".repeat(BAR - full),
        used as f64 * 100.0 / limit.max(1) as f64
    )
}

/// `text` safe for a terminal: control characters (escape sequences, carriage returns, backspaces),
/// Unicode's invisible format characters (bidirectional overrides, zero-width ones) and
/// separators other than the space are written as `\u{..}` escapes; tabs and newlines are kept.
/// Tenants' labels and names come from files tenants write.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let invisible = matches!(c as u32,
            0x00AD | 0x061C | 0x180E | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB);
        if (c.is_control() && c != '\n' && c != '\t') || invisible {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// One frame as text lines; also the counters for the next frame's rates.
fn frame(sources: &Sources, gpus: &mut GpuIndex, prev: &mut Previous, hint: &str) -> Vec<String> {
    let now = Instant::now();
    let reading = sources.read();
    let (table, broken) = rows(&reading, prev, now);
    let mut out = Vec::new();
    let tenants: std::collections::BTreeSet<&String> =
        table.values().flat_map(|m| m.keys()).collect();
    out.push(format!(
        "gpuslice top - {} tenant(s) on {} GPU(s){hint}",
        tenants.len(),
        table.len()
    ));
    let mut order: Vec<(String, &String)> = table.keys().map(|u| (gpus.label(u), u)).collect();
    order.sort_by(|a, b| {
        (a.0.is_empty(), a.0.len(), &a.0, a.1).cmp(&(b.0.is_empty(), b.0.len(), &b.0, b.1))
    });
    for (gpu, uuid) in order {
        out.push(String::new());
        let name = if gpu.is_empty() {
            "GPU ?".to_string()
        } else {
            format!("GPU {gpu}")
        };
        out.push(format!("{name}  {uuid}"));
        out.push(format!(
            "  {:<16} {:<31} {:>21}  {:>18}  {}",
            "tenant", "memory", "used / limit", "share got/promised", "waiting"
        ));
        for (tenant, row) in &table[uuid] {
            let memory = match row.used {
                Some(u) => bar(u, row.limit),
                None => String::new(),
            };
            let amounts = match row.used {
                Some(u) => format!(
                    "{} / {}",
                    format_bytes(u),
                    row.limit.map_or_else(|| "-".into(), format_bytes)
                ),
                None => String::new(),
            };
            let share = match (row.achieved, row.share) {
                (Some(a), Some(s)) => format!("{:>5.1}% / {:>3}%", a * 100.0, s),
                (None, Some(s)) => format!("{:>6} / {:>3}%", "-", s),
                _ => String::new(),
            };
            let mut waiting = String::new();
            if row.share.is_some() {
                let _ = write!(waiting, "{} proc", row.waiting);
                if let Some(w) = row.wait_rate {
                    let _ = write!(waiting, ", {w:.2} s/s");
                }
            }
            if row.denied > 0 {
                let _ = write!(waiting, "  {} refused", row.denied);
            }
            out.push(format!(
                "  {tenant:<16} {memory:<31} {amounts:>21}  {share:>17}  {waiting}"
            ));
            if let (Some(b), Some(w)) = (row.busy_ns, row.wait_ns) {
                prev.counters.insert((uuid.clone(), tenant.clone()), (b, w));
            }
        }
    }
    if table.is_empty() {
        out.push(String::new());
        out.push(format!(
            "no tenant yet (ledgers: {}, {}/tenants; device ledgers: {})",
            sources.ledger_dir.display(),
            sources.state_dir.display(),
            sources.device_dir.display()
        ));
    }
    for b in broken {
        out.push(format!("unreadable: {b}"));
    }
    prev.at = Some(now);
    out.iter().map(|l| printable(l)).collect()
}

/// Runs until `q`/Esc/Ctrl-C (terminal) or forever (plain lines); `once`: one frame, then returns.
pub fn run(sources: &Sources, interval: Duration, once: bool) -> Result<(), String> {
    let mut gpus = GpuIndex::from_nvml();
    let mut prev = Previous::default();
    let stdout = std::io::stdout();
    if once || !stdout.is_terminal() {
        let mut first = true;
        loop {
            let lines = frame(sources, &mut gpus, &mut prev, "");
            let mut w = stdout.lock();
            if !first {
                let _ = writeln!(w);
            }
            first = false;
            for l in lines {
                // A closed pipe (`gpuslice top | head`) ends the view.
                if writeln!(w, "{l}").is_err() {
                    return Ok(());
                }
            }
            if w.flush().is_err() || once {
                return Ok(());
            }
            drop(w);
            std::thread::sleep(interval);
        }
    }
    let _screen = Screen::take()?;
    loop {
        let lines = frame(sources, &mut gpus, &mut prev, "   (q quits)");
        draw(&lines).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + interval;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if crossterm::event::poll(left).map_err(|e| e.to_string())? {
                use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
                match crossterm::event::read().map_err(|e| e.to_string())? {
                    Event::Key(k) if k.kind != KeyEventKind::Release => match k.code {
                        KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            return Ok(())
                        }
                        _ => {}
                    },
                    Event::Resize(..) => break,
                    _ => {}
                }
            }
        }
    }
}

fn draw(lines: &[String]) -> std::io::Result<()> {
    use crossterm::{cursor, queue, terminal};
    let (cols, rows) = terminal::size().unwrap_or((120, 40));
    let mut w = std::io::stdout().lock();
    queue!(
        w,
        cursor::MoveTo(0, 0),
        terminal::Clear(terminal::ClearType::All)
    )?;
    for (i, l) in lines.iter().take(rows as usize).enumerate() {
        let cut: String = l.chars().take(cols as usize).collect();
        queue!(w, cursor::MoveTo(0, i as u16))?;
        write!(w, "{cut}")?;
    }
    w.flush()
}

/// The terminal in raw mode on the alternate screen, restored on drop (also on error or panic).
struct Screen;

impl Screen {
    fn take() -> Result<Screen, String> {
        crossterm::terminal::enable_raw_mode().map_err(|e| format!("terminal: {e}"))?;
        let screen = Screen;
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )
        .map_err(|e| format!("terminal: {e}"))?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::cursor::Show,
            crossterm::terminal::LeaveAlternateScreen
        );
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn escapes_reach_the_terminal_as_text() {
        assert_eq!(printable("ok name-1"), "ok name-1");
        assert_eq!(printable("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("x\ry\u{8}"), "x\\u{d}y\\u{8}");
        assert_eq!(printable("\u{202e}evil"), "\\u{202e}evil");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(printable("a\tb\nc"), "a\tb\nc");
    }
}
