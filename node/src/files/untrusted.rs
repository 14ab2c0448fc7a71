//! Reading a file someone else may have planted or replaced (a record in a directory a container
//! can write, a CDI spec).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Reads a file someone else may have planted or replaced: opened without following a link and
/// without blocking (a FIFO, a device), a regular file only, at most `max` bytes.
pub fn read_untrusted(path: &Path, max: u64) -> Result<String, String> {
    let shown = path.display();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                format!("{shown}: a symbolic link (not followed)")
            } else {
                format!("{shown}: {e}")
            }
        })?;
    let meta = f.metadata().map_err(|e| format!("{shown}: {e}"))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(format!("{shown}: {what}, expected a regular file"));
    }
    if meta.len() > max {
        return Err(format!(
            "{shown}: {} bytes, more than the {max} expected",
            meta.len()
        ));
    }
    let mut text = String::new();
    f.take(max + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{shown}: {e}"))?;
    if text.len() as u64 > max {
        return Err(format!("{shown}: more than the {max} bytes expected"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn untrusted_files_are_read_defensively() {
        let dir = std::env::temp_dir().join(format!("gpuslice-untrusted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("plain");
        std::fs::write(&plain, "a\nb\n").unwrap();
        assert_eq!(read_untrusted(&plain, 100).unwrap(), "a\nb\n");
        assert!(read_untrusted(&plain, 2).unwrap_err().contains("more than"));
        let link = dir.join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_untrusted(&link, 100)
            .unwrap_err()
            .contains("symbolic link"));
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let start = std::time::Instant::now();
        assert!(read_untrusted(&fifo, 100).unwrap_err().contains("FIFO"));
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(read_untrusted(Path::new("/dev/zero"), 100)
            .unwrap_err()
            .contains("device"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
