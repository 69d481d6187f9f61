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
except PermissionError:
    print('outside refused')
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
        "1\n[(1, 'lo')]\n1\noutside refused\n",
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
