//! Both ways a worker can fork its clean runs behave alike: through its
//! zygote (what every server does) and by itself (`CODE_EXECUTOR_NO_ZYGOTE`,
//! set here alone: a fork of the worker would hold what earlier requests
//! left in its memory).

use std::time::Duration;

use code_executor::testing::{ExecFrame, WireLimits, WireSelection, encode_frame};
use code_executor::testing::{RunOutput, Worker};

use code_executor::config::{Config, EnvChoice};

use crate::common::conda::{Interpreter, create_prefix, site_packages};
use crate::common::{self, TestServer};

/// The worker's environment: forking through its zygote or by itself.
fn forking(zygote: bool) -> &'static [(&'static str, &'static str)] {
    if zygote {
        &[]
    } else {
        &[("CODE_EXECUTOR_NO_ZYGOTE", "1")]
    }
}

async fn worker(zygote: bool) -> (Worker, tempfile::TempDir) {
    common::bare_worker(forking(zygote)).await
}

async fn run(worker: &mut Worker, code: &str, timeout: f64) -> RunOutput {
    let limits = WireLimits::default();
    let frame = encode_frame(&ExecFrame {
        t: "exec",
        id: 1,
        code,
        stdin: None,
        files: vec![],
        argv: &[],
        timeout,
        max_output: 1 << 20,
        limits: &limits,
        stream: false,
        artifacts: WireSelection::All(true),
        max_artifact_bytes: 1 << 20,
        max_artifacts_bytes: 1 << 20,
        max_result_chars: 1000,
        rusage: true,
        int_max_str_digits: None,
        max_image_pixels: None,
        call: None,
        compile: &[],
    })
    .unwrap();
    worker
        .execute(&frame, Duration::from_secs_f64(timeout + 5.0), None)
        .await
        .expect("the worker answers")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn runs_forked_with_and_without_a_zygote_behave_alike() {
    for zygote in [true, false] {
        let (mut worker, _dir) = worker(zygote).await;
        // The run's parent: the zygote, or the worker itself.
        let out = run(&mut worker, "import os\nprint(os.getppid())", 5.0).await;
        let parent: u32 = text(&out.stdout).trim().parse().unwrap();
        assert_eq!(
            parent == worker.pid(),
            !zygote,
            "zygote {zygote}: parent {parent}"
        );
        assert!(
            out.cpu_ms.is_some() && out.peak_rss_kb.unwrap_or(0) > 0,
            "{out:?}"
        );

        // What a run leaves running (in a session of its own) is killed
        // before the next run starts.
        let out = run(
            &mut worker,
            "import subprocess\nprint(subprocess.Popen(['sleep', '60'], start_new_session=True).pid)",
            5.0,
        )
        .await;
        let orphan: u32 = text(&out.stdout).trim().parse().unwrap();
        let out = run(&mut worker, "print('next')", 5.0).await;
        assert_eq!(text(&out.stdout), "next\n");
        assert!(
            !common::alive(orphan),
            "zygote {zygote}: {orphan} outlived its run"
        );

        // Exit statuses, signals and timeouts come through either way.
        let out = run(&mut worker, "import sys\nsys.exit(3)", 5.0).await;
        assert_eq!(out.exit_code, 3, "zygote {zygote}");
        let out = run(&mut worker, "import os\nos.kill(os.getpid(), 9)", 5.0).await;
        assert_eq!(
            (out.exit_code, out.signal.as_deref()),
            (-9, Some("SIGKILL"))
        );
        let out = run(&mut worker, "while True: pass", 0.5).await;
        assert!(out.timed_out, "zygote {zygote}: {out:?}");
        let out = run(&mut worker, "print('after')", 5.0).await;
        assert_eq!(text(&out.stdout), "after\n", "zygote {zygote}");
    }
}

/// Runs see `threading` as after any fork of a single-threaded process: one
/// thread, the main one, with its ident; threads start and join. And a fork
/// inside a run that has another thread running resets `threading` in the
/// new process as CPython always does (only the forking thread is left).
#[tokio::test]
async fn threading_in_runs_is_as_after_any_fork() {
    let code = r#"
import os, threading
main = threading.main_thread()
print(threading.current_thread() is main, main.ident == threading.get_ident(),
      threading.active_count())
names = []
t = threading.Thread(target=lambda: names.append(threading.current_thread().name), name="helper")
t.start(); t.join()
print(names, t.is_alive(), threading.active_count())
stop = threading.Event()
t = threading.Thread(target=stop.wait)
t.start()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, ("%d %s" % (threading.active_count(),
                            threading.current_thread() is threading.main_thread())).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 100).decode(), threading.active_count())
stop.set(); t.join()
"#;
    for zygote in [true, false] {
        let (mut spec, _dir) = common::bare_spec(forking(zygote));
        // Imported before the zygote forks, as site or a preload does.
        spec.preload = vec!["threading".into()];
        let mut worker = Worker::create(&spec, None).await.expect("worker starts");
        for _ in 0..3 {
            let out = run(&mut worker, code, 10.0).await;
            assert_eq!(
                text(&out.stdout),
                "True True 1\n['helper'] False 1\n1 True 2\n",
                "zygote {zygote}: {}",
                text(&out.stderr)
            );
        }
    }
}

/// A preload that keeps a logging handler of its own, which resets more
/// than its lock after a fork (the pid it logs for), and leaves a thread
/// running in the worker (not in its zygote, whose children's `threading`
/// state stays true).
const OWN_HANDLER: &str = r#"
import logging, os, threading

class PidHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.pid = os.getpid()

    def _at_fork_reinit(self):
        super()._at_fork_reinit()
        self.pid = os.getpid()

    def emit(self, record):
        pass

HANDLER = PidHandler()
logging.getLogger("ownhandler").addHandler(HANDLER)
BACKGROUND = threading.Thread(target=threading.Event().wait, daemon=True)
BACKGROUND.start()
"#;

/// The same with the reset set on a stock handler itself.
const OWN_RESET: &str = r#"
import logging, os, threading

HANDLER = logging.Handler()
HANDLER.pid = os.getpid()

def reset(handler=HANDLER):
    logging.Handler._at_fork_reinit(handler)
    handler.pid = os.getpid()

HANDLER._at_fork_reinit = reset
BACKGROUND = threading.Thread(target=threading.Event().wait, daemon=True)
BACKGROUND.start()
"#;

#[tokio::test]
async fn a_preloads_logging_handler_is_reset_in_every_run_as_after_any_fork() {
    for (module, source) in [("ownhandler", OWN_HANDLER), ("ownreset", OWN_RESET)] {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("logs");
        let python = Interpreter::primary();
        create_prefix(&prefix, python);
        std::fs::write(
            site_packages(&prefix, python).join(format!("{module}.py")),
            source,
        )
        .unwrap();
        let server = TestServer::with_config(Config {
            env: EnvChoice::Python(prefix.join("bin/python")),
            pool_size: 1,
            preload: vec![module.into()],
            ..common::config()
        })
        .await;
        let code = format!(
            "import os, threading, {module}\n\
             ({module}.HANDLER.pid == os.getpid(), {module}.BACKGROUND.is_alive(), \
              threading.active_count())"
        );
        // The first run comes before its zygote prepares, the others after.
        for _ in 0..4 {
            let out = server.run(&code).await;
            assert_eq!(out["result"], "(True, False, 1)", "{module}: {out}");
        }
        server.stop().await;
    }
}

/// A module whose import leaves a large heap behind (~30 MiB of small
/// objects and the tables that hold them), as a heavy preload does.
const BIG_HEAP: &str = "DATA = [str(i) * 3 for i in range(300_000)]\n\
                        TABLE = {i: (i, str(i)) for i in range(100_000)}\n";

/// This kernel's transparent-huge-page mode (`always`, `madvise` or
/// `never`), and whether it has `MADV_COLLAPSE` (Linux 6.1).
fn huge_page_support() -> (String, bool) {
    let enabled =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let mode = enabled
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .unwrap_or("never")
        .to_string();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (mode, version >= (6, 1))
}

/// KiB of `pid`'s anonymous memory mapped with huge pages.
fn anon_huge_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// A server of one worker preloading [`BIG_HEAP`], with or without
/// `huge_pages`, after four runs that each read the preloaded data, change
/// it all, and say how much of their own memory is mapped with huge pages:
/// KiB of huge pages of the worker's zygote and of the last run.
async fn huge_pages_of_runs(huge_pages: bool) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("heavy");
    let python = Interpreter::primary();
    create_prefix(&prefix, python);
    std::fs::write(site_packages(&prefix, python).join("bigheap.py"), BIG_HEAP).unwrap();
    let code = "import bigheap\n\
                print(len(bigheap.DATA), bigheap.DATA[7], len(bigheap.TABLE), bigheap.TABLE[5])\n\
                bigheap.DATA[7] = 'changed'\n\
                bigheap.DATA.append(0)\n\
                bigheap.TABLE.clear()\n\
                print([l.split()[1] for l in open('/proc/self/smaps_rollup')\n\
                       if l.startswith('AnonHugePages:')][0])";
    let server = TestServer::with_config(Config {
        env: EnvChoice::Python(prefix.join("bin/python")),
        pool_size: 1,
        preload: vec!["bigheap".into()],
        huge_pages,
        ..common::config()
    })
    .await;
    // The zygote maps its memory once its first run has ended. No run sees
    // what an earlier one changed.
    let mut run_kib = 0;
    for _ in 0..4 {
        let out = server.run(code).await;
        let stdout = out["stdout"].as_str().unwrap_or_default();
        let (seen, kib) = stdout.split_once('\n').unwrap_or_default();
        assert_eq!(
            seen, "300000 777 100000 (5, '5')",
            "huge pages {huge_pages}: {out}"
        );
        run_kib = kib.trim().parse().unwrap();
    }
    let zygote_kib = anon_huge_kib(common::zygote_of(common::worker_pids(&server)[0]));
    (zygote_kib, run_kib)
}

#[tokio::test]
async fn with_huge_pages_a_large_preload_is_forked_from_huge_pages_and_runs_stay_clean() {
    let (mode, collapse) = huge_page_support();
    let (zygote_kib, run_kib) = huge_pages_of_runs(true).await;
    if mode != "never" && collapse {
        assert!(
            zygote_kib >= 4096 && run_kib >= 2048,
            "zygote {zygote_kib} KiB, run {run_kib} KiB of huge pages ({mode})"
        );
    } else {
        // Nothing to map them with: the memory stays as it was.
        assert_eq!(
            (zygote_kib, run_kib),
            (0, 0),
            "{mode}, MADV_COLLAPSE {collapse}"
        );
    }
}

#[tokio::test]
async fn without_huge_pages_a_large_preload_is_forked_from_small_pages() {
    let (mode, _) = huge_page_support();
    let (zygote_kib, run_kib) = huge_pages_of_runs(false).await;
    // Where the kernel gives huge pages only to what asks for them (or to
    // nothing); with `always` it may give some on its own.
    if mode != "always" {
        assert_eq!((zygote_kib, run_kib), (0, 0), "{mode}");
    }
}
