//! Both ways a worker forks its clean runs behave alike: through its zygote
//! (the default) and by itself (where Landlock cannot keep a run's signals
//! from the zygote; `CODE_EXECUTOR_NO_ZYGOTE` forces it here).

use std::time::Duration;

use code_executor::testing::{ExecFrame, WireLimits, WireSelection, encode_frame};
use code_executor::testing::{RunOutput, Worker};

use crate::common;

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
