//! The container tier on this host (`sandbox_tier = "container"`): what a
//! container without namespaces gets, held to the same outcomes as the
//! namespace tier. The real container runs are in `container.rs`.

use serde_json::{Value, json};

use super::{Arena, pool, run};
use crate::common::{self, TestServer};
use code_executor::config::TierChoice;

fn container() -> code_executor::Config {
    let mut config = pool();
    config.sandbox.tier = TierChoice::Container;
    config
}

#[tokio::test]
async fn health_names_each_tier_and_its_mechanisms() {
    for (tier, name, has, lacks) in [
        (
            TierChoice::Namespaces,
            "namespaces",
            ["fresh_root", "network_namespace"],
            "seccomp_no_sockets",
        ),
        (
            TierChoice::Container,
            "container",
            ["seccomp_no_sockets", "landlock_net"],
            "fresh_root",
        ),
    ] {
        let mut config = pool();
        config.sandbox.tier = tier;
        let server = TestServer::with_config(config).await;
        let (_, health) = server.get("/health").await;
        let sandbox = &health["sandbox"];
        assert_eq!(sandbox["tier"], name, "{health}");
        let mechanisms: Vec<&str> = sandbox["mechanisms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        for m in has.iter().chain(&[
            "landlock_fs",
            "landlock_scope",
            "seccomp",
            "no_capabilities",
            "no_new_privs",
        ]) {
            assert!(mechanisms.contains(m), "{name} lacks {m}: {mechanisms:?}");
        }
        assert!(!mechanisms.contains(&lacks), "{name}: {mechanisms:?}");
        server.stop().await;
    }
}

#[tokio::test]
async fn the_container_tier_keeps_the_network_isolated_without_a_namespace() {
    let arena = Arena::with_config(container()).await;
    let port = arena.server.url.rsplit(':').next().unwrap().to_string();
    let code = format!(
        r#"
import errno, socket
for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),
                     (socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_STREAM),
                     (socket.AF_NETLINK, socket.SOCK_RAW)):
    try:
        s = socket.socket(family, kind)
        s.connect(("127.0.0.1", {port}))
        print("CONNECTED", family)
    except OSError as e:
        print(errno.errorcode[e.errno])
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("REACHED THE SERVER")
except OSError as e:
    print("server", errno.errorcode[e.errno])
"#
    );
    let body = arena.attack(run(&code, 10.0)).await;
    assert_eq!(
        body["stdout"], "EPERM\nEPERM\nEPERM\nEPERM\nEPERM\nserver EPERM\n",
        "{body}"
    );
    arena.assert_recovered().await;
}

#[tokio::test]
async fn container_tier_runs_cannot_read_or_signal_the_server_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (child, address, mut logs) = crate::ops::spawn_server_wrapped(
        "export CANARY_SECRET=canary-5e1f\nexec",
        &["--sandbox-tier", "container", "--pool-size", "1"],
        tmp.path(),
    )
    .await;
    let server_pid = child.id().unwrap();
    // A sleeper this try alone starts: one a failed earlier try left cannot
    // fail this one.
    let nap = format!("300.{}", std::process::id());
    let sleeper = format!("sleep {nap}");
    let exec = |code: String, limits: Value, timeout: f64| {
        let address = address.clone();
        async move {
            let body = json!({"code": code, "limits": limits, "timeout": timeout});
            common::post_json(&address, "/execute", &body).await
        }
    };
    let code = format!(
        r#"
import errno, glob, os, signal
found = []
for path in glob.glob("/proc/*/environ") + ["/proc/{server_pid}/environ", "/proc/{server_pid}/cmdline", "/proc/{server_pid}/mem"]:
    try:
        if b"canary-5e1f" in open(path, "rb").read():
            found.append(path)
    except OSError:
        pass
print("found", found)
try:
    os.kill({server_pid}, signal.SIGTERM)
    print("SIGNALLED")
except OSError as e:
    print("signal", errno.errorcode[e.errno])
for target in ("/etc/ce-x", "{tmp}/ce-x", os.path.expanduser("~/../ce-x")):
    try:
        open(target, "w")
        print("WROTE", target)
    except OSError as e:
        print("write", errno.errorcode[e.errno])
import subprocess
subprocess.Popen(["setsid", "sleep", "{nap}"], start_new_session=True)
print("left a sleeper")
"#,
        tmp = tmp.path().display()
    );
    let body = exec(code, json!({}), 10.0).await;
    let stdout = body["stdout"].as_str().unwrap();
    assert!(stdout.contains("found []\n"), "{body}");
    assert!(stdout.contains("signal EPERM\n"), "{body}");
    assert_eq!(stdout.matches("write EACCES\n").count(), 3, "{body}");
    assert!(stdout.contains("left a sleeper\n"), "{body}");
    // The sleeper is gone once the run is.
    let started = std::time::Instant::now();
    loop {
        let left = super::processes_running(&sleeper);
        if left.is_empty() {
            break;
        }
        if started.elapsed() > std::time::Duration::from_secs(5) {
            let found: Vec<String> = left.iter().map(|pid| super::lineage(*pid)).collect();
            for pid in &left {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
            }
            let mut lines = Vec::new();
            while let Ok(line) = logs.try_recv() {
                lines.push(line);
            }
            panic!(
                "a process outlived its run: {found:?}\nserver log:\n{}",
                lines.join("\n")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Limits are reported as on the host.
    let body = exec(
        "x = bytearray(4 << 30)".into(),
        json!({"memory_bytes": 256 << 20}),
        10.0,
    )
    .await;
    assert_eq!(body["limit"], "memory", "{body}");
    let body = exec(
        "import os\nwhile True:\n    os.fork()".into(),
        json!({"processes": 8}),
        5.0,
    )
    .await;
    assert_eq!(body["limit"], "processes", "{body}");
    let body = exec("while True: pass".into(), json!({}), 1.0).await;
    assert_eq!(body["limit"], "timeout", "{body}");
    let body = exec("print('after')".into(), json!({}), 5.0).await;
    assert_eq!(body["stdout"], "after\n", "{body}");
    assert!(!tmp.path().join("ce-x").exists());
}

/// The binary probes the host in a child it forks before its runtime
/// starts; a configured launcher is still asked itself. Either way /health
/// names the same sandbox as a start that probes through the launcher.
#[tokio::test]
async fn the_binary_probes_before_its_runtime_and_finds_what_the_launcher_finds() {
    let launcher_probed = TestServer::with_config(pool()).await;
    let (_, expected) = launcher_probed.get("/health").await;
    launcher_probed.stop().await;
    let launcher = env!("CARGO_BIN_EXE_code-executor");
    for (args, forked) in [
        (vec!["--pool-size", "1"], "forked=true"),
        (
            vec!["--pool-size", "1", "--launcher", launcher],
            "forked=false",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let (mut child, address, mut logs) = crate::ops::spawn_server_wrapped(
            "export CODE_EXECUTOR_LOG=info,code_executor::sandbox=debug; exec",
            &args,
            tmp.path(),
        )
        .await;
        let mut probed = Vec::new();
        while let Ok(line) = logs.try_recv() {
            if line.contains("host probed") {
                probed.push(line);
            }
        }
        assert_eq!(probed.len(), 1, "{args:?}: {probed:?}");
        assert!(probed[0].contains(forked), "{args:?}: {}", probed[0]);
        let health: Value = reqwest::get(format!("http://{address}/health"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(health["sandbox"], expected["sandbox"], "{args:?}");
        let body = common::post_json(&address, "/execute", &json!({"code": "print(6 * 7)"})).await;
        assert_eq!(body["stdout"], "42\n", "{body}");
        child.kill().await.unwrap();
    }
}
