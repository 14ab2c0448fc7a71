//! Where a tenant's default ledger lives when several users share a machine.
//!
//! The ledger directory (`/dev/shm/gpuslice`, or `GPUSLICE_LEDGER_DIR`) is created sticky and
//! world-writable, as `/tmp` is: every user can create entries in it, nobody can remove or rename
//! another user's. Each user's default ledgers live in a directory of its own below it,
//! `uid-<uid>/` (mode 0700), or `group-<group>/` (0770) for a tenant shared through
//! `GPUSLICE_LEDGER_GROUP`, so no other user can plant a file at one of its ledger paths.
//!
//! Another user may have created a directory of that name first (to deny us, or by accident): it is
//! skipped, and the next name (`uid-<uid>.1` .. `.7`) is used. Every process of the user makes the
//! same choice: an existing directory of ours wins over a missing one, and a directory of ours
//! cannot be removed by anyone else (sticky parent).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Names tried per user: the plain one and this many minus one alternatives.
const CANDIDATES: u32 = 8;

/// Who may use a per-user directory.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub uid: u32,
    /// The sharing group's gid, for a tenant shared through `GPUSLICE_LEDGER_GROUP`.
    pub group: Option<u32>,
}

/// A GPU's measurement lock in the device directory `dir` (docs/MEMORY.md): the file every tenant of
/// the GPU `flock`s around an operation whose driver memory it measures. A node's `tenant create`
/// makes it (root, readable by the device group); elsewhere the first process to measure does.
pub fn measure_lock(dir: &Path, uuid: &str) -> PathBuf {
    dir.join(format!("{uuid}.measure"))
}

/// The first candidate directory: what the configuration reports before the filesystem is looked at.
pub fn first_candidate(base: &Path, group: Option<&str>, uid: u32) -> PathBuf {
    base.join(candidate_name(group, uid, 0))
}

fn candidate_name(group: Option<&str>, uid: u32, n: u32) -> String {
    let stem = match group.filter(|g| is_plain_name(g)) {
        Some(g) => format!("group-{g}"),
        None => format!("uid-{uid}"),
    };
    if n == 0 {
        stem
    } else {
        format!("{stem}.{n}")
    }
}

/// A group name usable in a file name (anything else falls back to the per-uid directory).
fn is_plain_name(g: &str) -> bool {
    !g.is_empty()
        && g.len() <= 64
        && !g.starts_with('.')
        && g.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// What a candidate directory is to us.
#[derive(Debug, PartialEq, Eq)]
enum Candidate {
    /// Ours (or our sharing group's), and nobody else can write it.
    Usable,
    Missing,
    /// Someone else's, or writable by others, or not a directory: the reason.
    Foreign(String),
}

fn judge(path: &Path, who: Owner, in_group: &dyn Fn(u32) -> bool) -> Candidate {
    let m = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Candidate::Missing,
        Err(e) => return Candidate::Foreign(format!("{}: {e}", path.display())),
        Ok(m) => m,
    };
    if !m.file_type().is_dir() {
        return Candidate::Foreign(format!("{} is not a directory", path.display()));
    }
    let mode = m.mode() & 0o7777;
    let ours = m.uid() == who.uid;
    let group_ok = match who.group {
        // Shared: the group's directory, writable by the group, by nobody else.
        Some(gid) => m.gid() == gid && in_group(gid) && mode & 0o070 == 0o070,
        None => false,
    };
    let others_write = match who.group {
        Some(_) => mode & 0o002 != 0,
        None => mode & 0o022 != 0,
    };
    if (ours || group_ok) && !others_write {
        Candidate::Usable
    } else {
        Candidate::Foreign(format!(
            "{} belongs to uid {} (mode {:o}), not to us (uid {})",
            path.display(),
            m.uid(),
            mode,
            who.uid
        ))
    }
}

/// Whether per-user directories can live in `base`: it is missing (we create it), ours, or root's
/// and sticky and world-writable. A directory another user owns is not: its owner may rename or
/// replace anything in it, sticky or not.
fn hosts_user_dirs(base: &Path, uid: u32) -> bool {
    match std::fs::symlink_metadata(base) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        Ok(m) => {
            m.file_type().is_dir()
                && (m.uid() == uid || (m.uid() == 0 && m.mode() & 0o1003 == 0o1003))
        }
    }
}

/// The directory of this user's default ledgers for the ledger directory `base`: the first usable
/// candidate, else the first missing one (created later, by the first ledger). Candidates are
/// `base/uid-<uid>` (`.1` .. `.7`) when `base` can host them (`hosts_user_dirs`), else siblings
/// `<base>-uid-<uid>` in its parent (`/dev/shm`, root's and sticky). `Err` names every one taken.
pub fn user_dir(
    base: &Path,
    group_name: Option<&str>,
    who: Owner,
    in_group: &dyn Fn(u32) -> bool,
) -> Result<PathBuf, String> {
    let group_name = group_name.filter(|g| is_plain_name(g));
    let who = Owner {
        group: who.group.filter(|_| group_name.is_some()),
        ..who
    };
    let (dir, prefix) = if hosts_user_dirs(base, who.uid) {
        (base.to_path_buf(), String::new())
    } else {
        let (Some(parent), Some(name)) = (base.parent(), base.file_name()) else {
            return Err(format!(
                "{} cannot hold this user's ledgers",
                base.display()
            ));
        };
        (parent.to_path_buf(), format!("{}-", name.to_string_lossy()))
    };
    let mut first_missing = None;
    let mut taken = Vec::new();
    for n in 0..CANDIDATES {
        let path = dir.join(format!(
            "{prefix}{}",
            candidate_name(group_name, who.uid, n)
        ));
        match judge(&path, who, in_group) {
            Candidate::Usable => return Ok(path),
            Candidate::Missing => {
                first_missing.get_or_insert(path);
            }
            Candidate::Foreign(why) => taken.push(why),
        }
    }
    first_missing.ok_or_else(|| {
        format!(
            "no directory for this user's ledgers in {}: every name is taken by another user ({})",
            dir.display(),
            taken.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpuslice-paths-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        d
    }

    #[test]
    fn missing_then_ours_then_squatted() {
        let base = scratch("a");
        let me = Owner {
            uid: 4242,
            group: None,
        };
        let no = |_| false;
        // Nothing there: the plain name.
        assert_eq!(
            user_dir(&base, None, me, &no).unwrap(),
            base.join("uid-4242")
        );
        // Squatted by another uid (we run as someone else than 4242): the next name.
        std::fs::create_dir(base.join("uid-4242")).unwrap();
        assert_eq!(
            user_dir(&base, None, me, &no).unwrap(),
            base.join("uid-4242.1")
        );
        // A directory of ours further down wins over a missing earlier one.
        let real_me = Owner {
            uid: crate::slotfile::sys::geteuid(),
            group: None,
        };
        let mine = base.join(format!("uid-{}.3", real_me.uid));
        std::fs::create_dir(&mine).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(user_dir(&base, None, real_me, &no).unwrap(), mine);
        // Ours but writable by others: not usable.
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            user_dir(&base, None, real_me, &no).unwrap(),
            base.join(format!("uid-{}", real_me.uid))
        );
        // Every name taken: an error naming them.
        for n in 0..CANDIDATES {
            let _ = std::fs::create_dir(base.join(candidate_name(None, 4242, n)));
        }
        let e = user_dir(&base, None, me, &no).unwrap_err();
        assert!(
            e.contains("every name is taken") && e.contains("uid-4242.7"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_ledger_directory_of_another_user_is_not_used() {
        let root = scratch("b");
        let base = root.join("gpuslice");
        std::fs::create_dir(&base).unwrap();
        // Owned by root (the test's uid) but private: another user uses a sibling.
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
        let other = Owner {
            uid: 4242,
            group: None,
        };
        let no = |_| false;
        assert_eq!(
            user_dir(&base, None, other, &no).unwrap(),
            root.join("gpuslice-uid-4242")
        );
        // Root's, sticky and world-writable: hosts per-user directories (when root runs the test).
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let expected = if crate::slotfile::sys::geteuid() == 0 {
            base.join("uid-4242")
        } else {
            root.join("gpuslice-uid-4242")
        };
        assert_eq!(user_dir(&base, None, other, &no).unwrap(), expected);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn group_names_that_are_not_plain_use_the_uid_directory() {
        let base = Path::new("/x");
        assert_eq!(
            first_candidate(base, Some("gpu"), 7),
            base.join("group-gpu")
        );
        assert_eq!(first_candidate(base, Some("../etc"), 7), base.join("uid-7"));
        assert_eq!(first_candidate(base, None, 7), base.join("uid-7"));
    }
}
