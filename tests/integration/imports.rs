//! Learned imports: a standard-library module that runs keep importing is
//! imported ahead by the worker's zygote, so later runs find it imported;
//! nothing else is, whatever a run reports.

use serde_json::{Value, json};

use code_executor::config::{Config, EnvChoice};

use crate::common::conda::{CondaFixture, Interpreter};
use crate::common::{self, TestServer};

/// Which of the modules these tests import a run finds already imported.
const PROBE: &str = "import sys\n\
                     [m for m in ('statistics', 'this', 'mymod', 'telnetlib', 'wave', 'difflib') \
                     if m in sys.modules]";

/// A server on a clean Conda-layout environment (nothing imported at start
/// but what the interpreter itself imports), one worker.
async fn server(fixture: &mut CondaFixture, learn_imports: bool) -> TestServer {
    let prefix = fixture.create_env("clean", Interpreter::primary());
    TestServer::with_config(Config {
        env: EnvChoice::Python(prefix.join("bin/python")),
        pool_size: 1,
        learn_imports,
        ..common::config()
    })
    .await
}

async fn preloaded(server: &TestServer) -> Value {
    server.run(PROBE).await["result"].clone()
}

/// Imports `statistics` (stdlib), `this` (stdlib, prints as it is
/// imported), `telnetlib` (stdlib, deprecated: warns as it is imported) and
/// `mymod` (the run's own file).
async fn importing_run(server: &TestServer) -> Value {
    let (status, body) = server
        .execute(json!({
            "code": "import statistics, this, telnetlib, mymod\n\
                     print(statistics.mean([1, 2, 3]), mymod.X)",
            "files": {"mymod.py": "X = 7\n"},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    let stdout = body["stdout"].as_str().unwrap();
    assert!(
        stdout.starts_with("The Zen of Python") && stdout.ends_with("2 7\n"),
        "{body}"
    );
    assert!(
        body["stderr"]
            .as_str()
            .unwrap()
            .contains("DeprecationWarning: 'telnetlib' is deprecated"),
        "{body}"
    );
    body
}

#[tokio::test]
async fn a_stdlib_module_runs_keep_importing_is_imported_ahead_and_nothing_else() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let server = server(&mut fixture, true).await;
    assert_eq!(preloaded(&server).await, "[]");
    // Imported once: not learned.
    server.run("import difflib").await;
    importing_run(&server).await;
    assert_eq!(preloaded(&server).await, "[]");
    // Twice: the next runs find `statistics` imported. Not `this` (it
    // prints), not `telnetlib` (it warns: each run still sees the warning),
    // not the run's own module.
    importing_run(&server).await;
    assert_eq!(preloaded(&server).await, "['statistics']");
    for _ in 0..2 {
        importing_run(&server).await;
    }
    assert_eq!(preloaded(&server).await, "['statistics']");
    let body = server
        .run("import statistics\nstatistics.median([5, 1, 3])")
        .await;
    assert_eq!(body["result"], "3", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn with_learn_imports_off_runs_find_only_what_the_environment_imports() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let server = server(&mut fixture, false).await;
    for _ in 0..3 {
        importing_run(&server).await;
    }
    assert_eq!(preloaded(&server).await, "[]");
    server.stop().await;
}

/// User code can write its own report on the run's report pipe, naming
/// any module: the zygote imports none but a standard-library one without
/// side effects.
#[tokio::test]
async fn a_forged_report_makes_the_zygote_import_nothing_else() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let server = server(&mut fixture, true).await;
    let forge = r#"
import os, struct

def enc(o):
    if isinstance(o, dict):
        return bytes([0x80 | len(o)]) + b"".join(enc(k) + enc(v) for k, v in o.items())
    if isinstance(o, list):
        return bytes([0x90 | len(o)]) + b"".join(enc(x) for x in o)
    if isinstance(o, int):
        return bytes([o])
    data = o.encode()
    return bytes([0xa0 | len(data)]) + data

names = ["this", "antigravity", "mymod", "os;x", "wave", "../wave", "tkinter", 7]
report = enc({"status": 0, "imported": names})
ctl = []
for fd in sorted(int(fd) for fd in os.listdir("/proc/self/fd")):
    try:
        if fd > 2 and os.readlink("/proc/self/fd/%d" % fd).startswith("pipe:"):
            ctl.append(fd)
    except OSError:  # the listing's own descriptor, closed by now
        pass
print("forging", len(ctl))
for fd in ctl:
    os.write(fd, struct.pack("!I", len(report)) + report)
"#;
    for _ in 0..3 {
        let (status, body) = server
            .execute(json!({"code": forge, "files": {"mymod.py": "X = 1\n"}}))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["stdout"], "forging 1\n", "{body}");
    }
    // `wave` (stdlib, no side effects) is the one name taken.
    let body = server
        .run("import sys\nsorted(m for m in ('this', 'antigravity', 'mymod', 'wave', 'tkinter', 'webbrowser') if m in sys.modules)")
        .await;
    assert_eq!(body["result"], "['wave']", "{body}");
    server.stop().await;
}
