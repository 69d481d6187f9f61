//! Learned imports: a standard-library module that runs keep importing is
//! imported ahead by the worker's zygote, so later runs find it imported;
//! nothing else is, whatever a run reports.

use std::path::PathBuf;

use serde_json::{Value, json};

use code_executor::config::{Config, EnvChoice};

use crate::common::conda::{CondaFixture, Interpreter, site_packages};
use crate::common::{self, TestServer};

/// Which of the modules these tests import a run finds already imported.
const PROBE: &str = "import sys\n\
                     [m for m in ('statistics', 'this', 'mymod', 'telnetlib', 'wave', 'difflib') \
                     if m in sys.modules]";

/// A server on a clean Conda-layout environment (nothing imported at start
/// but what the interpreter itself imports), one worker.
async fn server(fixture: &mut CondaFixture, learn_imports: bool) -> (TestServer, PathBuf) {
    let prefix = fixture.create_env("clean", Interpreter::primary());
    let server = TestServer::with_config(Config {
        env: EnvChoice::Python(prefix.join("bin/python")),
        pool_size: 1,
        learn_imports,
        ..common::config()
    })
    .await;
    (server, prefix)
}

async fn preloaded(server: &TestServer) -> Value {
    server.run(PROBE).await["result"].clone()
}

/// The result of `probe`, run until it is `expected` or 12 times: the
/// zygote learns between two runs, but not while the next request already
/// waits (for up to 8 runs), as these often do.
async fn settled(server: &TestServer, probe: &str, expected: &str) -> Value {
    let mut result = Value::Null;
    for _ in 0..12 {
        result = server.run(probe).await["result"].clone();
        if result == expected {
            break;
        }
    }
    result
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
    let (server, _) = server(&mut fixture, true).await;
    assert_eq!(preloaded(&server).await, "[]");
    // Imported once: not learned.
    server.run("import difflib").await;
    importing_run(&server).await;
    assert_eq!(preloaded(&server).await, "[]");
    // Twice: the next runs find `statistics` imported. Not `this` (it
    // prints), not `telnetlib` (it warns: each run still sees the warning),
    // not the run's own module.
    importing_run(&server).await;
    assert_eq!(
        settled(&server, PROBE, "['statistics']").await,
        "['statistics']"
    );
    for _ in 0..2 {
        importing_run(&server).await;
    }
    assert_eq!(settled(&server, PROBE, "-").await, "['statistics']");
    let body = server
        .run("import statistics\nstatistics.median([5, 1, 3])")
        .await;
    assert_eq!(body["result"], "3", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_module_runs_import_alone_is_learned_too() {
    // `colorsys` imports nothing: runs that import it bring one module.
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let (server, _) = server(&mut fixture, true).await;
    let probe = "import sys\n'colorsys' in sys.modules";
    assert_eq!(server.run(probe).await["result"], "False");
    for _ in 0..2 {
        let body = server
            .run("import colorsys\nprint(colorsys.ONE_THIRD)")
            .await;
        assert_eq!(body["exit_code"], 0, "{body}");
    }
    assert_eq!(settled(&server, probe, "True").await, "True");
    server.stop().await;
}

#[tokio::test]
async fn with_learn_imports_off_runs_find_only_what_the_environment_imports() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let (server, _) = server(&mut fixture, false).await;
    for _ in 0..3 {
        importing_run(&server).await;
    }
    assert_eq!(settled(&server, PROBE, "-").await, "[]");
    server.stop().await;
}

/// What every prepared zygote imports ahead, learned imports or not (json
/// for runs, pickle's C part for every session's process), a run finds
/// imported; a run's own `json.py` or `_compat_pickle.py` is still the one
/// it imports.
#[tokio::test]
async fn modules_imported_ahead_give_way_to_a_runs_own_files_with_learning_off() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let (server, _) = server(&mut fixture, false).await;
    let probe = "import sys\n[m for m in ('json', '_pickle') if m in sys.modules]";
    assert_eq!(
        settled(&server, probe, "['json', '_pickle']").await,
        "['json', '_pickle']"
    );
    let (status, body) = server
        .execute(json!({
            "code": "import json, _compat_pickle\nprint(json.WHO, _compat_pickle.WHO)",
            "files": {"json.py": "WHO = 'mine'\n", "_compat_pickle.py": "WHO = 'mine too'\n"},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "mine mine too\n", "{body}");
    server.stop().await;
}

/// User code can write its own report on the run's report pipe, naming
/// any module: the zygote imports none but a standard-library one without
/// side effects, and a name counts once per report.
#[tokio::test]
async fn a_forged_report_makes_the_zygote_import_nothing_else() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let (server, _) = server(&mut fixture, true).await;
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

names = ["wave", "wave", "this", "antigravity", "unittest.__main__", "logging", "mymod",
         "os;x", "../wave", "tkinter", 7]
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
    let probe = "import sys\nsorted(m for m in ('this', 'antigravity', 'unittest', 'logging', \
                 'mymod', 'wave', 'tkinter', 'webbrowser') if m in sys.modules)";
    for round in 0..3 {
        let (status, body) = server
            .execute(json!({"code": forge, "files": {"mymod.py": "X = 1\n"}}))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["stdout"], "forging 1\n", "{body}");
        // `wave` (stdlib, no side effects) is the one name taken, and
        // named twice in one report it counts once.
        let result = settled(&server, probe, "['wave']").await;
        let expected = if round == 0 { "[]" } else { "['wave']" };
        assert_eq!(result, expected, "round {round}");
    }
    server.stop().await;
}

/// A module of a stdlib name that is not the interpreter's own (the run's
/// file, a package in site-packages) is never learned; and once a stdlib
/// module is learned (or imported by the zygote, as json), a run that ships
/// its own module of that name imports its own.
#[tokio::test]
async fn a_run_imports_its_own_module_of_a_learned_name() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let (server, prefix) = server(&mut fixture, true).await;
    let site = site_packages(&prefix, Interpreter::primary());
    // `winsound` is a stdlib name, but not this platform's: here it is a
    // package's.
    std::fs::write(site.join("winsound.py"), "FROM = 'site-packages'\n").unwrap();
    let probe = "import sys\n[m for m in ('winsound', 'statistics') if m in sys.modules]";
    for _ in 0..3 {
        let (_, body) = server
            .execute(json!({
                "code": "import winsound, statistics\n(winsound.FROM, statistics.X)",
                "files": {"statistics.py": "X = 'mine'\n"},
            }))
            .await;
        assert_eq!(body["result"], "('site-packages', 'mine')", "{body}");
    }
    assert_eq!(settled(&server, probe, "-").await, "[]");
    for _ in 0..2 {
        server.run("import statistics").await;
    }
    assert_eq!(
        settled(&server, probe, "['statistics']").await,
        "['statistics']"
    );
    for (name, file) in [
        ("statistics", "statistics.py"),
        ("json", "json/__init__.py"),
    ] {
        let (_, body) = server
            .execute(json!({
                "code": format!("import {name}\n{name}.X"),
                "files": {file: "X = 'mine'\n"},
            }))
            .await;
        assert_eq!(body["result"], "'mine'", "{body}");
    }
    server.stop().await;
}

/// A run's own module of a name the zygote imported for the bootstrap
/// (`traceback`, `linecache` and what they import: `token`, `textwrap`, ...)
/// or for runs (`json`) is the one its code imports, as in a fresh
/// interpreter, wherever in its files' paths (`./json.py`); the run's
/// traceback is still printed as the interpreter prints it.
#[tokio::test]
async fn a_runs_own_module_of_a_name_the_bootstrap_imported_is_its_own() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let (server, _) = server(&mut fixture, true).await;
    let probe = "import sys\n[m for m in ('json', 'traceback', 'token') if m in sys.modules]";
    assert_eq!(
        settled(&server, probe, "['json', 'traceback', 'token']").await,
        "['json', 'traceback', 'token']"
    );
    let names = ["token", "textwrap", "traceback", "linecache", "json"];
    let mut files = serde_json::Map::new();
    for name in names {
        let path = if name == "json" {
            "./json.py".to_string()
        } else {
            format!("{name}.py")
        };
        files.insert(path, json!(format!("WHO = '{name}'\n")));
    }
    for round in 0..3 {
        let (status, body) = server
            .execute(json!({
                "code": "import token, textwrap, traceback, linecache, json\n\
                         print(token.WHO, textwrap.WHO, traceback.WHO, linecache.WHO, json.WHO)\n\
                         raise ValueError('shown')",
                "files": files,
            }))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["stdout"], "token textwrap traceback linecache json\n",
            "round {round}: {body}"
        );
        assert_eq!(body["error"]["type"], "ValueError", "round {round}: {body}");
        assert_eq!(body["error"]["line"], 3, "round {round}: {body}");
        let stderr = body["stderr"].as_str().unwrap();
        assert!(
            stderr.contains("line 3, in <module>\n    raise ValueError('shown')\n")
                && stderr.ends_with("ValueError: shown\n"),
            "round {round}: {stderr}"
        );
    }
    // A directory without `__init__.py` (data) hides no module: the run's
    // `enum` is the one `re` uses, as in a fresh interpreter.
    let (status, body) = server
        .execute(json!({
            "code": "import enum, re\nisinstance(re.I, enum.Enum)",
            "files": {"enum/data.txt": "1"},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], "True", "{body}");
    // Nor does a file whose name only looks like a package's or a
    // module's: `__init__.txt`, `json.also`.
    let (status, body) = server
        .execute(json!({
            "code": "import enum, re, json\n(isinstance(re.I, enum.Enum), json.dumps([1]))",
            "files": {"enum/__init__.txt": "1", "json.also": "2"},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], "(True, '[1]')", "{body}");
    server.stop().await;
}

/// A stdlib module that imports one never learned (concurrent.futures.process
/// imports multiprocessing, whose authentication key is made as it is
/// imported) is not learned either; one that imports logging is (asyncio),
/// and each run's logging counts its records' time from the run's start.
#[tokio::test]
async fn a_module_that_imports_one_never_learned_is_not_learned() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let (server, _) = server(&mut fixture, true).await;
    for _ in 0..3 {
        let body = server
            .run("import asyncio, concurrent.futures.process, statistics")
            .await;
        assert_eq!(body["exit_code"], 0, "{body}");
    }
    let probe = "import sys\nsorted(m for m in ('asyncio', 'concurrent.futures.process', 'logging', \
                 'multiprocessing', 'statistics') if m in sys.modules)";
    let learned = "['asyncio', 'logging', 'statistics']";
    // The zygote learns a few modules in each gap between runs: these are
    // ~60, each tried in a child of its own first.
    let mut found = Value::Null;
    for _ in 0..60 {
        found = server.run(probe).await["result"].clone();
        if found == learned {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(found, learned);
    assert_eq!(settled(&server, probe, "-").await, learned);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let body = server
        .run("import logging\n0 <= logging.makeLogRecord({}).relativeCreated < 1000")
        .await;
    assert_eq!(body["result"], "True", "{body}");
    // The zygote's children skip logging's after-fork handler, yet find its
    // locks free, and a fork in a run resets them as Python's handler does.
    let body = server.run(LOGGING_AFTER_FORKS).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "the child logs\nchild exited 0\n", "{body}");
    assert_eq!(body["result"], "True", "{body}");
    assert!(
        body["stderr"].as_str().unwrap().contains("from a thread"),
        "{body}"
    );
    server.stop().await;
}

/// A preload that leaves a thread running in the worker (one its zygote,
/// a fork of it, does not have) stops no learning.
#[tokio::test]
async fn a_preload_that_leaves_a_thread_running_stops_no_learning() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let prefix = fixture.create_env("threaded", Interpreter::primary());
    std::fs::write(
        site_packages(&prefix, Interpreter::primary()).join("background.py"),
        "import threading\n\
         threading.Thread(target=threading.Event().wait, daemon=True).start()\n",
    )
    .unwrap();
    let server = TestServer::with_config(Config {
        env: EnvChoice::Python(prefix.join("bin/python")),
        pool_size: 1,
        learn_imports: true,
        preload: vec!["background".into()],
        ..common::config()
    })
    .await;
    for _ in 0..3 {
        let body = server.run("import statistics").await;
        assert_eq!(body["exit_code"], 0, "{body}");
    }
    let probe = "import sys\n'statistics' in sys.modules";
    let mut found = Value::Null;
    for _ in 0..60 {
        let body = server.run(probe).await;
        assert_eq!(body["stderr"], "", "{body}");
        found = body["result"].clone();
        if found == "True" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(found, "True");
    server.stop().await;
}

/// A run that logs from a second thread (it would wait forever for a
/// logging lock held at the fork), then forks while another thread holds a
/// handler's lock and logs through that handler in the child.
const LOGGING_AFTER_FORKS: &str = r#"
import logging, os, sys, threading, time
thread = threading.Thread(target=lambda: logging.getLogger("t").warning("from a thread"))
thread.start()
thread.join(5)
free = not thread.is_alive()
handler = logging.StreamHandler(sys.stdout)
log = logging.getLogger("f")
log.addHandler(handler)
log.propagate = False
held, done = threading.Event(), threading.Event()
def hold():
    with handler.lock:
        held.set()
        done.wait()
holder = threading.Thread(target=hold)
holder.start()
held.wait()
pid = os.fork()
if pid == 0:
    log.warning("the child logs")
    sys.stdout.flush()
    os._exit(0)
done.set()
holder.join()
deadline = time.monotonic() + 5
while True:
    ended, status = os.waitpid(pid, os.WNOHANG)
    if ended:
        print("child exited", os.waitstatus_to_exitcode(status))
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("the child is stuck")
        break
    time.sleep(0.01)
free
"#;
