//! The trusted walk and the file operations, on real directories.

use super::*;
use std::os::unix::fs::PermissionsExt;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuslice-files-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn writes_replace_links_and_never_follow_them() {
    let d = scratch("links");
    let victim = d.join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    std::os::unix::fs::symlink(&victim, d.join("policy")).unwrap();
    write_atomically(&d.join("policy"), b"new", 0o644).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    assert_eq!(std::fs::read_to_string(d.join("policy")).unwrap(), "new");
    let meta = std::fs::symlink_metadata(d.join("policy")).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
    // Nothing else is left beside it.
    let mut names: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["policy", "victim"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn untrusted_directories_are_refused() {
    let d = scratch("trust");
    let open = d.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = write_atomically(&open.join("x"), b"x", 0o644).unwrap_err();
    assert!(e.contains("writable by others"), "{e}");
    assert!(!open.join("x").exists());
    // A directory of another user, and a link into a directory another user could write.
    let theirs = d.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).ok();
    if geteuid() == 0 {
        let e = write_atomically(&theirs.join("x"), b"x", 0o644).unwrap_err();
        assert!(e.contains("uid 4242"), "{e}");
    }
    std::os::unix::fs::symlink(&open, d.join("via")).unwrap();
    assert!(write_atomically(&d.join("via/x"), b"x", 0o644).is_err());
    // A link in a trusted directory to a trusted one is followed (`/var/run -> /run`).
    let fine = d.join("fine");
    std::fs::create_dir(&fine).unwrap();
    std::os::unix::fs::symlink("fine", d.join("alias")).unwrap();
    write_atomically(&d.join("alias/y"), b"y", 0o600).unwrap();
    assert_eq!(std::fs::read_to_string(fine.join("y")).unwrap(), "y");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn trees_are_removed_without_following_links() {
    let d = scratch("tree");
    let outside = d.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "k").unwrap();
    let t = d.join("t");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    std::os::unix::fs::symlink(&outside, t.join("sub/link")).unwrap();
    std::fs::write(t.join("f"), "f").unwrap();
    Dir::open(&d).unwrap().remove_tree("t").unwrap();
    assert!(!t.exists());
    assert!(outside.join("keep").exists());
    std::fs::remove_dir_all(&d).unwrap();
}
