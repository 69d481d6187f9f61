//! POST /execute: output, exit status and exceptions as `python script.py` gives them.

use serde_json::json;

use crate::common::TestServer;

#[tokio::test]
async fn print_returns_stdout_and_exit_code_zero() {
    let server = TestServer::start().await;
    let body = server.run("print(2+2)").await;
    assert_eq!(body["stdout"], "4\n");
    assert_eq!(body["stderr"], "");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["timed_out"], false);
    assert_eq!(body["truncated"], false);
    assert_eq!(body["artifacts"], json!([]));
    assert!(body["signal"].is_null());
    assert!(body["limit"].is_null());
    assert!(body["duration_ms"].as_f64().unwrap() > 0.0);
    server.stop().await;
}

#[tokio::test]
async fn code_after_a_byte_order_mark_runs_as_a_file_with_one_would() {
    // `python script.py` skips a UTF-8 BOM at the start of its file; only
    // there: one further in is a character of the code.
    let server = TestServer::start().await;
    let body = server.run("\u{feff}print('after the mark')").await;
    assert_eq!(body["stdout"], "after the mark\n", "{body}");
    assert_eq!(body["exit_code"], 0);
    let body = server.run("print(1)\n\u{feff}print(2)").await;
    assert_eq!(body["exit_code"], 1, "{body}");
    assert_eq!(body["error"]["type"], "SyntaxError", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn the_caret_under_a_traceback_line_sits_where_python_puts_it() {
    // `python script.py` marks `1/0` with `~^~` under it, whether or not the
    // file ends with a newline.
    let server = TestServer::start().await;
    for code in ["y = 1/0", "y = 1/0\n", "x = 1\ny = 1/0"] {
        let body = server.run(code).await;
        let stderr = body["stderr"].as_str().unwrap();
        assert!(
            stderr.ends_with("    y = 1/0\n        ~^~\nZeroDivisionError: division by zero\n"),
            "{code:?}: {stderr}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_traceback_shows_the_line_python_counts_past_a_form_feed_or_unicode_break() {
    // Python counts lines on "\n", "\r\n" and "\r" alone; a form feed,
    // U+0085 or U+2028 in the code (in a string or a comment) is no break.
    let server = TestServer::start().await;
    for (code, line) in [
        ("s = '\x0c'\ny = 1/0\n", 2),
        ("\x0c\ns = 1\ny = 1/0", 3),
        ("# \u{2028} and \u{85}\ny = 1/0\n", 2),
        ("s = 1\r\ny = 1/0\r\n", 2),
        ("s = 1\ry = 1/0", 2),
    ] {
        let body = server.run(code).await;
        let stderr = body["stderr"].as_str().unwrap();
        assert!(
            stderr.ends_with("    y = 1/0\n        ~^~\nZeroDivisionError: division by zero\n"),
            "{code:?}: {stderr}"
        );
        assert_eq!(body["error"]["line"], line, "{code:?}: {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn exit_statuses_follow_python_script_semantics() {
    let server = TestServer::start().await;

    let body = server.run("x = 1\n\ndef f():\n    return 1/0\nf()").await;
    assert_eq!(body["exit_code"], 1);
    let stderr = body["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with("Traceback (most recent call last):"),
        "{stderr}"
    );
    assert!(
        stderr.contains("File \"<code>\", line 5, in <module>"),
        "{stderr}"
    );
    assert!(stderr.contains("File \"<code>\", line 4, in f"), "{stderr}");
    assert!(stderr.contains("return 1/0"), "source line shown: {stderr}");
    assert!(
        stderr
            .trim_end()
            .ends_with("ZeroDivisionError: division by zero"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("worker.py"),
        "worker frames leak: {stderr}"
    );

    let body = server.run("import sys\nsys.exit(3)").await;
    assert_eq!(
        (body["exit_code"].as_i64(), body["stderr"].as_str()),
        (Some(3), Some(""))
    );

    let body = server.run("import sys; sys.exit('bye')").await;
    assert_eq!(
        (body["exit_code"].as_i64(), body["stderr"].as_str()),
        (Some(1), Some("bye\n"))
    );

    let body = server.run("import sys; sys.exit()").await;
    assert_eq!(body["exit_code"], 0);

    let body = server
        .run("import os\nprint('partial', flush=True)\nos._exit(7)")
        .await;
    assert_eq!(
        (body["exit_code"].as_i64(), body["stdout"].as_str()),
        (Some(7), Some("partial\n"))
    );

    let body = server
        .run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
        .await;
    assert_eq!(body["exit_code"], -11);
    assert_eq!(body["signal"], "SIGSEGV");
    assert_eq!(body["timed_out"], false);

    let body = server.run("print(2+").await;
    assert_eq!(body["exit_code"], 1);
    assert!(
        body["stderr"].as_str().unwrap().contains("SyntaxError"),
        "{body}"
    );

    let body = server.run("raise KeyboardInterrupt").await;
    assert_eq!(body["exit_code"], 1);
    assert!(
        body["stderr"]
            .as_str()
            .unwrap()
            .contains("KeyboardInterrupt")
    );
    server.stop().await;
}

#[tokio::test]
async fn a_run_ends_as_the_interpreter_does_threads_joined_then_atexit() {
    let server = TestServer::start().await;
    // A non-daemon thread still running when the code ends is waited for,
    // and atexit handlers run after it, as at the end of `python script.py`.
    let body = server
        .run(
            "import atexit, threading, time\n\
             atexit.register(print, 'atexit')\n\
             def late():\n    time.sleep(0.3)\n    print('thread', flush=True)\n\
             threading.Thread(target=late).start()\n\
             print('main', flush=True)",
        )
        .await;
    assert_eq!(body["stdout"], "main\nthread\natexit\n", "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    // A daemon thread is not waited for.
    let body = server
        .run(
            "import threading, time\n\
             threading.Thread(target=lambda: (time.sleep(5), print('never')), daemon=True).start()\n\
             print('done')",
        )
        .await;
    assert_eq!(body["stdout"], "done\n", "{body}");
    assert!(body["duration_ms"].as_f64().unwrap() < 4000.0, "{body}");
    // With only the main thread, atexit handlers still run.
    let body = server
        .run("import atexit\natexit.register(print, 'bye')\nprint('hi')")
        .await;
    assert_eq!(body["stdout"], "hi\nbye\n", "{body}");
    server.stop().await;
}

#[tokio::test]
async fn what_the_code_left_in_main_is_freed_as_the_interpreter_exits() {
    let server = TestServer::start().await;
    // A file left open keeps its buffered writes (here all of them: 5,000
    // characters fit its buffer) until it is closed: `python script.py`
    // closes it as it exits, and so does a run. So does a file an object
    // holds, and a `__del__` runs, after atexit handlers, before the run's
    // output is read.
    let body = server
        .run(
            "import atexit\n\
             atexit.register(print, 'atexit')\n\
             class Log:\n    def __init__(self):\n        self.f = open('log.txt', 'w')\n\
             \x20   def __del__(self):\n        print('closing', flush=True)\n\
             f = open('out.txt', 'w')\n\
             f.write('x' * 5000)\n\
             log = Log()\n\
             log.f.write('entry')\n\
             print('done')",
        )
        .await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "done\natexit\nclosing\n", "{body}");
    let size = |body: &serde_json::Value, path: &str| {
        body["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["path"] == path)
            .unwrap_or_else(|| panic!("no artifact {path}: {body}"))["size"]
            .as_u64()
    };
    assert_eq!(size(&body, "out.txt"), Some(5000), "{body}");
    assert_eq!(size(&body, "log.txt"), Some(5), "{body}");

    // Files a class attribute, a reference cycle or a big run's oldest
    // objects hold keep what was written to them too, and a `__del__` sees
    // the module's globals (`os`, `g`), as `python script.py` does.
    let code = r#"
import os
g = 1
class Temp:
    def __init__(self):
        open('temp.txt', 'w').close()
    def __del__(self):
        os.remove('temp.txt')
        print('removed, g =', g)
class C:
    f = open('class.txt', 'w')
C.f.write('a')
class Node:
    pass
n = Node(); n.me = n; n.f = open('cycle.txt', 'w'); n.f.write('bc')
big = [[i] for i in range(100_000)]
t = Temp()
"#;
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "removed, g = 1\n", "{body}");
    assert_eq!(body["stderr"], "", "{body}");
    assert_eq!(size(&body, "class.txt"), Some(1), "{body}");
    assert_eq!(size(&body, "cycle.txt"), Some(2), "{body}");
    assert!(
        !body["artifacts"].to_string().contains("temp.txt"),
        "{body}"
    );

    // So do files only a function's closure or default, or the object of a
    // bound method (a class's, or a file's own `write`), holds.
    let code = r#"
def writer(path):
    f = open(path, 'w')
    def write(s):
        f.write(s)
    return write
w = writer('closure.txt')
w('def')
def log(s, f=open('default.txt', 'w')):
    f.write(s)
log('gh')
class Holder:
    def __init__(self):
        self.f = open('method.txt', 'w')
    def put(self, s):
        self.f.write(s)
put = Holder().put
put('ijkl')
write = open('builtin.txt', 'w').write
write('mn')
"#;
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stderr"], "", "{body}");
    assert_eq!(size(&body, "closure.txt"), Some(3), "{body}");
    assert_eq!(size(&body, "default.txt"), Some(2), "{body}");
    assert_eq!(size(&body, "method.txt"), Some(4), "{body}");
    assert_eq!(size(&body, "builtin.txt"), Some(2), "{body}");

    // Many functions with nothing in their closures or defaults do not use
    // up the search before it reaches a file further in: it is flushed
    // before the collection (whose `__del__` reads what is on disk).
    let code = r#"
import os
class Check:
    def __del__(self):
        print('on disk', os.path.getsize('further.txt'))
check = Check()
classes = [type('Many%d' % c, (), {'__module__': '__main__'}) for c in range(5)]
for many in classes:
    for i in range(500):
        setattr(many, 'm%d' % i, lambda self: None)
class Holder:
    pass
h = Holder()
h.d = {'l': [[open('further.txt', 'w')]]}
h.d['l'][0][0].write('opq')
"#;
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "on disk 3\n", "{body}");
    assert_eq!(size(&body, "further.txt"), Some(3), "{body}");

    // Nor does a collection the code made itself, which moves its objects
    // to the oldest generation, nor an object the search for files cannot
    // look into (a dead weak proxy), nor a container too large to search,
    // keep a `__del__` from running.
    let code = r#"
import gc, weakref
from collections import deque
class Temp:
    pass
class A:
    def __del__(self):
        print('del A')
a = A()
gone = weakref.proxy(Temp())
d = deque(range(1_000_000))
gc.collect()
"#;
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "del A\n", "{body}");
    assert_eq!(body["stderr"], "", "{body}");

    // A daemon thread still running holds the module: the run's files are
    // flushed, nothing is freed under the thread, and it is not disturbed.
    let code = r#"
import threading, time
f = open('daemon.txt', 'w')
f.write('kept')
def spin():
    while True:
        time.sleep(0.0005)
threading.Thread(target=spin, daemon=True).start()
print('ok')
"#;
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "ok\n", "{body}");
    assert_eq!(body["stderr"], "", "{body}");
    assert_eq!(size(&body, "daemon.txt"), Some(4), "{body}");

    // A `__del__` that fails is reported as the interpreter reports it, and
    // the run's exit status is still its code's.
    let body = server
        .run("class A:\n    def __del__(self):\n        1/0\na = A()\nprint('ran')")
        .await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "ran\n", "{body}");
    assert_eq!(body["error"], serde_json::Value::Null, "{body}");
    let stderr = body["stderr"].as_str().unwrap();
    assert!(
        stderr.starts_with("Exception ignored in: <function A.__del__"),
        "{stderr}"
    );
    assert!(
        stderr.ends_with("ZeroDivisionError: division by zero\n"),
        "{stderr}"
    );
    server.stop().await;
}

#[tokio::test]
async fn output_is_captured_at_the_file_descriptor_level() {
    let server = TestServer::start().await;
    let code = r#"
import os, subprocess, sys, ctypes
print("one")
os.write(1, b"two\n")
subprocess.run(["echo", "three"])
sys.stdout.flush()
ctypes.CDLL(None).puts(b"four")
ctypes.CDLL(None).fflush(None)
print("err", file=sys.stderr)
os.write(2, b"err2\n")
subprocess.run(["sh", "-c", "echo err3 >&2"])
"#;
    let body = server.run(code).await;
    assert_eq!(body["stdout"], "one\ntwo\nthree\nfour\n");
    assert_eq!(body["stderr"], "err\nerr2\nerr3\n");
    server.stop().await;
}

#[tokio::test]
async fn stdin_comes_from_the_request_or_is_empty() {
    let server = TestServer::start().await;
    let (status, body) = server
        .execute(json!({"code": "import sys\nprint(input())\nprint(sys.stdin.read().upper())", "stdin": "first\nrest of it"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["stdout"], "first\nREST OF IT\n");

    // No stdin: input() sees EOF at once instead of hanging.
    let started = std::time::Instant::now();
    let body = server.run("input()").await;
    assert!(started.elapsed().as_secs_f64() < 5.0);
    assert_eq!(body["exit_code"], 1);
    assert!(
        body["stderr"].as_str().unwrap().contains("EOFError"),
        "{body}"
    );

    let big = "x".repeat(300_000);
    let (_, body) = server
        .execute(json!({"code": "import sys; print(len(sys.stdin.read()))", "stdin": big}))
        .await;
    assert_eq!(body["stdout"], "300000\n");
    server.stop().await;
}

#[tokio::test]
async fn files_are_written_into_a_fresh_working_directory() {
    let server = TestServer::start().await;
    let code = r#"
import os
print(open("data/in.txt").read())
print(open("blob.bin", "rb").read())
print(sorted(os.listdir(".")))
print(os.getcwd() == os.environ["PWD"])
"#;
    let (status, body) = server
        .execute(json!({
            "code": code,
            "files": {"data/in.txt": "héllo", "blob.bin": {"base64": "AAH/"}}
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["stdout"],
        "héllo\nb'\\x00\\x01\\xff'\n['blob.bin', 'data']\nTrue\n"
    );

    // The next run starts in an empty directory: the old run's files are gone.
    let body = server
        .run("import os\nprint(os.listdir('.'))\nprint(os.getcwd())")
        .await;
    let out = body["stdout"].as_str().unwrap();
    assert!(out.starts_with("[]\n"), "{out}");

    // A module passed as a file can be imported, as next to a script.
    let (_, body) = server
        .execute(json!({"code": "import helper; print(helper.VALUE)", "files": {"helper.py": "VALUE = 42"}}))
        .await;
    assert_eq!(body["stdout"], "42\n");
    server.stop().await;
}

#[tokio::test]
async fn a_request_far_larger_than_the_workers_socket_buffer_arrives_whole() {
    // The request (a 6 MB file and 3 MB of stdin) is written to the worker
    // in many parts, each once the worker has read the last.
    let server = TestServer::start().await;
    let text: String = (0..6_000_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let stdin = "0123456789".repeat(300_000);
    let code = r#"
import sys
data = open("big.txt").read()
print(len(data), data == "".join(chr(97 + i % 26) for i in range(len(data))))
given = sys.stdin.read()
print(len(given), given == "0123456789" * 300000)
"#;
    for _ in 0..2 {
        let (status, body) = server
            .execute(json!({"code": code, "files": {"big.txt": text}, "stdin": stdin}))
            .await;
        assert_eq!(status, 200, "{}", body["error"]);
        assert_eq!(
            body["stdout"], "6000000 True\n3000000 True\n",
            "{}",
            body["error"]
        );
    }
    assert_eq!(server.run("print(2 + 2)").await["stdout"], "4\n");
    server.stop().await;
}

#[tokio::test]
async fn each_run_gets_a_fresh_main_module() {
    let server = TestServer::start().await;
    let body = server
        .run("import sys\nprint(__name__, '__file__' in globals(), sys.modules['__main__'].__dict__ is globals())")
        .await;
    assert_eq!(body["stdout"], "__main__ False True\n");
    let body = server
        .run("import pickle\nclass P: pass\nprint(type(pickle.loads(pickle.dumps(P()))).__name__)")
        .await;
    assert_eq!(body["stdout"], "P\n");
    server.stop().await;
}

#[tokio::test]
async fn invalid_utf8_output_is_replaced_not_rejected() {
    let server = TestServer::start().await;
    let body = server
        .run("import os; os.write(1, b'ok \\xff\\xfe end')")
        .await;
    assert_eq!(body["stdout"], "ok \u{fffd}\u{fffd} end");
    server.stop().await;
}

#[tokio::test]
async fn text_utf8_cannot_carry_comes_back_escaped() {
    // A file name of bytes that are not UTF-8 and an exception's message
    // with a lone surrogate: the run is answered, each written escaped.
    let server = TestServer::start().await;
    for round in 0..3 {
        let body = server
            .run("open(b'a\\xffb.txt', 'wb').write(b'x')\nraise ValueError(chr(0xd800) + chr(0xdcfe))")
            .await;
        assert_eq!(body["exit_code"], 1, "round {round}: {body}");
        assert_eq!(body["error"]["type"], "ValueError", "round {round}: {body}");
        assert_eq!(
            body["error"]["message"], "\\ud800\\udcfe",
            "round {round}: {body}"
        );
        assert_eq!(
            body["artifacts"][0]["path"], "a\\xffb.txt",
            "round {round}: {body}"
        );
        assert_eq!(body["artifacts"][0]["size"], 1, "round {round}: {body}");
    }
    // The worker that answered them still serves.
    assert_eq!(server.run("print(4)").await["stdout"], "4\n");
    server.stop().await;
}

#[tokio::test]
async fn input_files_are_written_whatever_the_runs_own_limits() {
    // The request's files are its input: a file over its own
    // `file_size_bytes`, or more files than its `open_files` leaves room
    // for, is still written; the limits hold for what the code does.
    let server = TestServer::start().await;
    let (status, body) = server
        .execute(json!({
            "code": "print(len(open('a.txt').read()))\nopen('b.txt', 'wb').write(b'y' * 100000)",
            "files": {"a.txt": "x".repeat(1000)},
            "limits": {"file_size_bytes": 10},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "1000\n", "{body}");
    assert_eq!(body["limit"], "file_size", "{body}");
    assert_eq!(body["error"]["type"], "OSError", "{body}");
    let (status, body) = server
        .execute(json!({
            "code": "import os\nprint([os.stat(n).st_size for n in ('a.txt', 'b.txt', 'c.txt')])",
            "files": {"a.txt": "1", "b.txt": "22", "c.txt": "333"},
            "limits": {"open_files": 3},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "[1, 2, 3]\n", "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_runs_own_modules_leave_no_bytecode_behind() {
    // A run's directory goes with it: bytecode cached there would only come
    // back as artifacts.
    let server = TestServer::start().await;
    let (status, body) = server
        .execute(json!({
            "code": "import helper, sys\nprint(helper.VALUE, sys.dont_write_bytecode)",
            "files": {"helper.py": "VALUE = 42"},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "42 True\n", "{body}");
    assert_eq!(body["artifacts"], json!([]), "{body}");
    server.stop().await;
}
