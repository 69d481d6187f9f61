//! The launcher on its own: `code-executor sandbox-exec ... -- PROGRAM`.

use std::process::Command;

use crate::common;

#[test]
fn the_probe_reports_what_the_host_offers() {
    let out = Command::new(common::launcher())
        .args(["sandbox-exec", "--probe"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["namespaces"], serde_json::json!({"Ok": null}));
    assert_eq!(report["landlock"], true);
    assert_eq!(report["seccomp"], serde_json::json!({"Ok": null}));
}

#[test]
fn the_launcher_confines_the_program_it_starts() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let code = format!(
        r#"
import os, socket
print(os.getpid())
print(socket.if_nameindex())
print(open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])
open(os.path.join({scratch:?}, 'ok'), 'w').write('x')
try:
    open(os.path.join({outside:?}, 'no'), 'w')
except (PermissionError, FileNotFoundError):
    print('outside refused')
# The root holds the --read and --write paths only: no /run, no host /tmp.
print(os.path.exists('/run'), os.path.exists({outside:?}), sorted(os.listdir('/dev')))
"#,
        scratch = scratch.path().display().to_string(),
        outside = outside.path().display().to_string(),
    );
    let out = Command::new(common::launcher())
        .args(["sandbox-exec", "--net", "isolated", "--landlock"])
        .args([
            "--read", "/usr", "--read", "/lib", "--read", "/lib64", "--read", "/etc",
        ])
        .args(["--read", "/proc", "--read", "/dev", "--write", "/dev/null"])
        .arg("--write")
        .arg(scratch.path())
        .args(["--", "/usr/bin/python3.11", "-I", "-c", &code])
        .env_clear()
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout,
        "1\n[(1, 'lo')]\n1\noutside refused\n\
         False False ['fd', 'null', 'shm', 'stderr', 'stdin', 'stdout']\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(scratch.path().join("ok").exists());
    assert!(!outside.path().join("no").exists());
}

#[test]
fn a_launcher_that_cannot_start_the_program_says_why() {
    let out = Command::new(common::launcher())
        .args(["sandbox-exec", "--", "/nonexistent/python"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/python"), "{stderr}");
}

#[test]
fn a_launcher_refuses_arguments_it_does_not_know() {
    for (args, named) in [
        (
            &["sandbox-exec", "--bogus", "--", "/bin/true"][..],
            "'--bogus'",
        ),
        (
            &["sandbox-exec", "--net", "nowhere", "--", "/bin/true"],
            "'nowhere'",
        ),
        (
            &["sandbox-exec", "--disk-bytes", "1", "--", "/bin/true"],
            "--scratch",
        ),
    ] {
        let out = Command::new(common::launcher())
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

#[test]
fn the_launcher_caps_the_scratch_root_and_filters_syscalls() {
    let scratch = tempfile::tempdir().unwrap();
    let code = r#"
import ctypes, os, shutil
print(os.getcwd() == os.environ['SCRATCH'], shutil.disk_usage('.').total)
try:
    open('big', 'wb').write(b'x' * (3 << 20))
except OSError as e:
    print(e.errno)
libc = ctypes.CDLL(None, use_errno=True)
print(libc.syscall(int(os.environ['NR_UNSHARE']), 0x10000000), ctypes.get_errno())
"#;
    let out = Command::new(common::launcher())
        .args(["sandbox-exec", "--net", "isolated", "--seccomp"])
        .args([
            "--read", "/usr", "--read", "/lib", "--read", "/lib64", "--read", "/etc",
        ])
        .arg("--scratch")
        .arg(scratch.path())
        .args(["--disk-bytes", "2097152"])
        .args(["--", "/usr/bin/python3.11", "-I", "-c", code])
        .current_dir(scratch.path())
        .env_clear()
        .env("SCRATCH", scratch.path())
        .env("NR_UNSHARE", nix::libc::SYS_unshare.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "True 2097152\n{}\n-1 {}\n",
            nix::libc::ENOSPC,
            nix::libc::EPERM
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The tmpfs was the launcher's own: nothing reached the directory.
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
}

#[test]
fn a_scratch_quota_without_namespaces_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(common::launcher())
        .args(["sandbox-exec", "--net", "host", "--no-namespaces"])
        .arg("--scratch")
        .arg(scratch.path())
        .args(["--disk-bytes", "2097152", "--", "/bin/true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--scratch needs a mount namespace"),
        "{stderr}"
    );
}

/// What a worker's launch code does with `--join-async`: read the launcher's
/// word on `CODE_EXECUTOR_CGROUP_FD`, then show its own cgroups.
const JOIN_PROBE: &str = r#"
import os
fd = int(os.environ["CODE_EXECUTOR_CGROUP_FD"])
print(repr(os.read(fd, 1)))
print(open('/proc/self/cgroup').read(), end='')
"#;

fn launch_joining(cgroup: &std::path::Path) -> std::process::Output {
    Command::new(common::launcher())
        .args([
            "sandbox-exec",
            "--net",
            "isolated",
            "--join-async",
            "--cgroup",
        ])
        .arg(cgroup)
        .args([
            "--read", "/usr", "--read", "/lib", "--read", "/lib64", "--read", "/etc",
        ])
        .args([
            "--read",
            "/proc",
            "--",
            "/usr/bin/python3.11",
            "-I",
            "-c",
            JOIN_PROBE,
        ])
        .env_clear()
        .output()
        .unwrap()
}

/// A cgroup of the pids hierarchy (v1) or of the unified one, for this test
/// alone; removed when dropped.
struct ScratchCgroup(std::path::PathBuf);

impl ScratchCgroup {
    fn new(name: &str) -> ScratchCgroup {
        let parent = ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"]
            .into_iter()
            .map(std::path::Path::new)
            .find(|p| p.join("cgroup.procs").exists())
            .expect("a cgroup hierarchy to make a cgroup in");
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        ScratchCgroup(dir)
    }
}

impl Drop for ScratchCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn with_join_async_the_program_is_told_once_it_is_in_its_cgroup() {
    let cgroup = ScratchCgroup::new("ce-join");
    let out = launch_joining(&cgroup.0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("b'1'"), "{stdout}");
    let name = cgroup.0.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        lines.any(|l| l.ends_with(&format!("/{name}"))),
        "the program is not in {name}: {stdout}"
    );
}

#[test]
fn with_join_async_a_failed_join_reaches_the_program_as_an_empty_pipe() {
    // A "cgroup" whose process list cannot be written to: opening it works,
    // the write that would move the program in fails.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/full", dir.path().join("cgroup.procs")).unwrap();
    let out = launch_joining(dir.path());
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("b''\n"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot join cgroup") && stderr.contains("No space left"),
        "{stderr}"
    );
}
