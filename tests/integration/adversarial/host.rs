//! What the server does on hosts that lack part of the sandbox: refuse, or
//! say so loudly — never a silent downgrade. A fake launcher stands in for a
//! host without namespaces or Landlock by answering the probe differently.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::{self, TestServer};

/// A launcher that answers `--probe` with `probe` and runs the real one otherwise.
fn fake_launcher(dir: &Path, probe: &str) -> PathBuf {
    let path = dir.join("launcher");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$2\" = --probe ]; then echo '{probe}'; exit 0; fi\nexec {} \"$@\"\n",
            common::launcher().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A server whose launcher's probe answers `probe`; `dir` holds the launcher.
async fn server_probed_as(dir: &Path, probe: &str) -> TestServer {
    let mut sandbox = common::sandbox_config();
    sandbox.launcher = Some(fake_launcher(dir, probe));
    TestServer::with_config(code_executor::Config {
        sandbox,
        ..common::config()
    })
    .await
}

#[tokio::test]
async fn without_namespaces_or_seccomp_isolation_cannot_hold_and_the_server_refuses() {
    let dir = tempfile::tempdir().unwrap();
    // Without namespaces the container tier keeps the network isolated with
    // the syscall filter; without that too, nothing could.
    let launcher = fake_launcher(
        dir.path(),
        r#"{"namespaces":{"Err":"Operation not permitted"},"landlock":true,"seccomp":{"Err":"Invalid argument"}}"#,
    );
    let mut sandbox = common::sandbox_config();
    sandbox.launcher = Some(launcher.clone());
    let err = TestServer::try_with_config(code_executor::Config {
        sandbox: sandbox.clone(),
        ..common::config()
    })
    .await
    .err()
    .expect("the server refuses to start");
    let message = format!("{err:#}");
    assert!(
        message.contains("isolated networking cannot be enforced"),
        "{message}"
    );
    assert!(message.contains("Operation not permitted"), "{message}");
    assert!(message.contains("Invalid argument"), "{message}");
    assert!(message.contains("network = \"host\""), "{message}");
}

#[tokio::test]
async fn without_namespaces_the_container_tier_serves_and_says_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = fake_launcher(
        dir.path(),
        r#"{"namespaces":{"Err":"Operation not permitted"},"landlock":true,"landlock_net":true,"landlock_scope":true,"seccomp":{"Ok":null}}"#,
    );
    let mut sandbox = common::sandbox_config();
    sandbox.launcher = Some(launcher.clone());
    // The host network, asked for explicitly, in the same tier.
    sandbox.network = code_executor::config::Network::Host;
    sandbox.disk_bytes = 2 << 20;
    let server = TestServer::with_config(code_executor::Config {
        sandbox,
        ..common::config()
    })
    .await;
    let (_, health) = server.get("/health").await;
    assert_eq!(health["sandbox"]["tier"], "container", "{health}");
    assert!(
        health["sandbox"]["mechanisms"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("seccomp_no_unix_sockets")),
        "{health}"
    );
    assert_eq!(health["sandbox"]["network_namespace"], false, "{health}");
    assert_eq!(health["sandbox"]["pid_namespace"], false, "{health}");
    // No mount namespace, no scratch tmpfs: no quota is claimed.
    assert_eq!(health["sandbox"]["disk_quota"], false, "{health}");
    assert_eq!(health["sandbox"].get("disk_bytes"), None, "{health}");
    assert!(
        health["sandbox"]["problem"]
            .as_str()
            .unwrap()
            .contains("disk_bytes is not enforced"),
        "{health}"
    );
    // The syscall filter does not need namespaces.
    assert_eq!(health["sandbox"]["seccomp"], true, "{health}");
    let body = server
        .run("print('on the host network', open('/proc/self/status').read().split('Seccomp:')[1].split()[0])")
        .await;
    assert_eq!(body["stdout"], "on the host network 2\n");
    // Nothing caps the total but the file size: past the 2 MiB asked for.
    let body = server
        .run("open('big', 'wb').write(b'x' * (8 << 20)); import os; print(os.path.getsize('big') >> 20)")
        .await;
    assert_eq!(body["stdout"], "8\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn without_landlock_health_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_probed_as(
        dir.path(),
        r#"{"namespaces":{"Ok":null},"landlock":false,"seccomp":{"Ok":null}}"#,
    )
    .await;
    let (_, health) = server.get("/health").await;
    assert_eq!(health["sandbox"]["landlock"], false, "{health}");
    assert!(
        health["sandbox"]["problem"]
            .as_str()
            .unwrap()
            .contains("landlock"),
        "{health}"
    );
    // The rest of the sandbox still holds.
    assert_eq!(health["sandbox"]["network_namespace"], true, "{health}");
    let body = server
        .run("import socket; print(socket.if_nameindex())")
        .await;
    assert_eq!(body["stdout"], "[(1, 'lo')]\n");
    // Without Landlock a root run still cannot reach its cgroups to raise
    // its caps: the hierarchies are covered by an empty read-only tmpfs.
    let body = server
        .run("import errno, os\nprint(os.listdir('/sys/fs/cgroup'))\ntry:\n    os.mkdir('/sys/fs/cgroup/pids')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])")
        .await;
    assert_eq!(body["stdout"], "[]\nEROFS\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn without_seccomp_health_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_probed_as(
        dir.path(),
        r#"{"namespaces":{"Ok":null},"landlock":true,"seccomp":{"Err":"Invalid argument"}}"#,
    )
    .await;
    let (_, health) = server.get("/health").await;
    assert_eq!(health["sandbox"]["seccomp"], false, "{health}");
    let problem = health["sandbox"]["problem"].as_str().unwrap();
    assert!(
        problem.contains("no seccomp filter: Invalid argument"),
        "{health}"
    );
    // Workers start without the filter; the rest of the sandbox holds.
    assert_eq!(health["sandbox"]["disk_quota"], true, "{health}");
    let body = server
        .run("print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])")
        .await;
    assert_eq!(body["stdout"], "0\n", "{body}");
    server.stop().await;
}
