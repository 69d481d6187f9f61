//! Rich results: the last expression's value, structured errors, artifacts, plots.

use base64::Engine;
use serde_json::{Value, json};

use code_executor::config::{Config, EnvChoice};

use crate::common::conda::{CondaFixture, Interpreter};
use crate::common::{self, TestServer, pyenvs};

fn decode(artifact: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(artifact["base64"].as_str().expect("artifact has content"))
        .unwrap()
}

#[tokio::test]
async fn result_is_the_repr_of_the_last_expression() {
    let server = TestServer::start().await;
    assert_eq!(server.run("1+1").await["result"], "2");
    assert_eq!(server.run("x = 1").await["result"], Value::Null);
    assert_eq!(server.run("None").await["result"], Value::Null);
    assert_eq!(server.run("print('hi')").await["result"], Value::Null);
    let body = server.run("import math\nx = [1, 'a']\nx").await;
    assert_eq!(body["result"], "[1, 'a']");
    assert_eq!(body["stdout"], "", "the value is returned, not printed");
    // A trailing semicolon hides the value, as in a notebook.
    assert_eq!(server.run("1+1;").await["result"], Value::Null);
    // An exception leaves no result.
    assert_eq!(server.run("1/0").await["result"], Value::Null);

    let body = server.run("'x' * 100_000").await;
    let result = body["result"].as_str().unwrap();
    assert!(
        result.len() < 11_000,
        "cut to the cap: {} chars",
        result.len()
    );
    assert!(result.starts_with("'xxxx"));
    assert!(
        result.ends_with("[truncated, 100002 characters in all]"),
        "{}",
        &result[result.len() - 60..]
    );

    let body = server
        .run("class C:\n    def __repr__(self): raise ValueError('no')\nC()")
        .await;
    assert_eq!(body["exit_code"], 0);
    assert!(
        body["result"]
            .as_str()
            .unwrap()
            .contains("repr failed: ValueError: no")
    );
    server.stop().await;
}

/// The worker compiles a run's code for its child and keeps what it made of
/// the last few programs: what a run shows is still what Python shows when
/// it compiles the code itself, the first time and every later time, under
/// the run's own digit limit, and for programs too long to keep.
#[tokio::test]
async fn code_compiles_as_python_compiles_it_on_every_run() {
    let server = TestServer::with_config(Config {
        pool_size: 1,
        ..common::config()
    })
    .await;
    // A compile-time warning reaches the run's stderr, every time.
    for _ in 0..3 {
        let body = server.run("x = 1\nprint(x is 1)").await;
        assert_eq!(body["stdout"], "True\n", "{body}");
        assert!(
            body["stderr"]
                .as_str()
                .unwrap()
                .starts_with("<code>:2: SyntaxWarning: \"is\" with a literal"),
            "{body}"
        );
    }
    // A final expression that cannot compile fails after the body has run.
    for _ in 0..2 {
        let body = server.run("print('body ran')\nyield 5").await;
        assert_eq!(body["stdout"], "body ran\n", "{body}");
        assert_eq!(body["error"]["type"], "SyntaxError", "{body}");
        assert_eq!(body["exit_code"], 1);
    }
    // The same source under different digit limits.
    let code = format!("n = {}\nlen(str(n))", "7".repeat(700));
    for _ in 0..2 {
        let (_, body) = server
            .execute(json!({"code": code, "int_max_str_digits": 0}))
            .await;
        assert_eq!(body["result"], "700", "{body}");
        assert_eq!(server.run(&code).await["result"], "700");
        let (status, body) = server
            .execute(json!({"code": code, "int_max_str_digits": 640}))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["error"]["type"], "SyntaxError", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Exceeds the limit (640 digits)"),
            "{body}"
        );
    }
    // One source, then the same with a trailing semicolon.
    assert_eq!(server.run("6 * 7").await["result"], "42");
    assert_eq!(server.run("6 * 7;").await["result"], Value::Null);
    assert_eq!(server.run("6 * 7").await["result"], "42");
    // A program longer than the worker keeps (64 KiB) runs all the same.
    let long = format!("x = 0\n{}x", "x += 1\n".repeat(10_000));
    assert!(long.len() > 1 << 16);
    for _ in 0..2 {
        let body = server.run(&long).await;
        assert_eq!(body["result"], "10000", "{body}");
    }
    let body = server
        .run(&format!("{long}\nraise ValueError('late')"))
        .await;
    assert_eq!(body["error"]["line"], 10_003, "{body}");
    server.stop().await;
}

/// A `__repr__` may return a str subclass (an enum member, a class of the
/// user's): the result is its text, and none of its own methods run, in a
/// clean run and in a session alike.
#[tokio::test]
async fn a_repr_that_is_a_str_subclass_is_its_text() {
    let server = TestServer::start().await;
    let code = "import enum\n\
                class S(str):\n    def __str__(self): return self\n\
                \x20   def encode(self, *a): raise RuntimeError('called')\n\
                class Color(str, enum.Enum):\n    RED = 'red'\n\
                class C:\n    def __init__(self, text): self.text = text\n\
                \x20   def __repr__(self): return self.text\n";
    let body = server.run(&format!("{code}C(S('shown'))")).await;
    assert_eq!(body["result"], "shown", "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    let body = server.run(&format!("{code}C(Color.RED)")).await;
    assert_eq!(body["result"], "red", "{body}");

    let (status, session) = server.post("/sessions", json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap();
    let (status, body) = server
        .execute(json!({ "code": format!("{code}C(S('kept'))"), "session": id }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], "kept", "{body}");
    let (_, body) = server
        .execute(json!({ "code": "C(S('again'))", "session": id }))
        .await;
    assert_eq!(body["result"], "again", "the session lives on: {body}");
    server.stop().await;
}

#[tokio::test]
async fn error_describes_the_uncaught_exception_at_the_users_line() {
    let server = TestServer::start().await;
    let code = "a = 1\nb = 0\nvalue = a / b\nprint('never')";
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 1);
    let error = &body["error"];
    assert_eq!(error["type"], "ZeroDivisionError");
    assert_eq!(error["message"], "division by zero");
    assert_eq!(error["line"], 3);
    let tb = error["traceback"].as_str().unwrap();
    assert!(tb.contains("File \"<code>\", line 3, in <module>"), "{tb}");
    assert!(
        tb.contains("value = a / b"),
        "the source line is shown: {tb}"
    );
    assert!(!tb.contains("worker.py"), "{tb}");
    // stderr still shows the traceback as Python prints it.
    assert_eq!(body["stderr"].as_str().unwrap(), tb);

    let body = server
        .run("class BadInput(Exception):\n    pass\n\ndef check():\n    raise BadInput('nope')\n\ncheck()")
        .await;
    assert_eq!(body["error"]["type"], "BadInput");
    assert_eq!(body["error"]["message"], "nope");
    assert_eq!(body["error"]["line"], 5);

    let body = server.run("x = 1\nif x\n    pass").await;
    assert_eq!(body["error"]["type"], "SyntaxError");
    assert_eq!(body["error"]["line"], 2);

    let body = server.run("import sys; sys.exit(2)").await;
    assert_eq!(body["error"], Value::Null, "sys.exit is not an error");
    assert_eq!(body["exit_code"], 2);
    server.stop().await;
}

/// A worker's first children run before it imports `linecache` and
/// `traceback` (in an environment whose start-up imported neither): their
/// tracebacks, warnings and stacks show the run's source lines all the same,
/// as those of every later run do.
#[tokio::test]
async fn every_run_of_a_new_worker_shows_its_source_lines() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let prefix = fixture.create_env("clean", Interpreter::primary());
    let server = TestServer::with_config(Config {
        env: EnvChoice::Python(prefix.join("bin/python")),
        pool_size: 1,
        ..common::config()
    })
    .await;
    for round in 0..4 {
        let code = format!(
            "import sys\npreloaded = 'linecache' in sys.modules\n\
             import traceback, warnings\nwarnings.warn('careful {round}')\n\
             print(preloaded, ''.join(traceback.format_stack()))\n\
             raise ValueError({round})"
        );
        let body = server.run(&code).await;
        let stdout = body["stdout"].as_str().unwrap();
        if round == 0 {
            assert!(
                stdout.starts_with("False"),
                "the first run of the worker had no linecache: {body}"
            );
        }
        assert!(
            stdout.contains("print(preloaded, ''.join(traceback.format_stack()))"),
            "run {round}: {body}"
        );
        let stderr = body["stderr"].as_str().unwrap();
        assert!(
            stderr.contains(&format!("warnings.warn('careful {round}')")),
            "run {round}: {body}"
        );
        let traceback = body["error"]["traceback"].as_str().unwrap();
        assert!(
            traceback.contains(&format!("raise ValueError({round})")),
            "run {round}: {body}"
        );
        assert_eq!(body["error"]["line"], 6, "run {round}: {body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn artifacts_are_new_or_changed_files_only() {
    let server = TestServer::start().await;
    let code = r#"
import os
os.makedirs("out", exist_ok=True)
open("out/new.txt", "w").write("created")
open("changed.txt", "a").write(" + more")
open("blob.bin", "wb").write(bytes(range(256)))
os.symlink("/etc/passwd", "link")
"#;
    let (status, body) = server
        .execute(json!({
            "code": code,
            "files": {"changed.txt": "input", "same.txt": "unchanged", "data/keep.csv": "a,b"}
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    let artifacts = body["artifacts"].as_array().unwrap();
    let paths: Vec<&str> = artifacts
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["blob.bin", "changed.txt", "out/new.txt"], "{body}");
    let by_path = |p: &str| artifacts.iter().find(|a| a["path"] == p).unwrap();
    assert_eq!(decode(by_path("changed.txt")), b"input + more");
    assert_eq!(by_path("changed.txt")["mime"], "text/plain");
    assert_eq!(decode(by_path("out/new.txt")), b"created");
    assert_eq!(decode(by_path("blob.bin")), (0..=255u8).collect::<Vec<_>>());
    assert_eq!(by_path("blob.bin")["size"], 256);
    assert_eq!(by_path("blob.bin")["mime"], "application/octet-stream");

    // Globs select; `false` turns artifacts off.
    let (_, body) = server
        .execute(json!({"code": "open('a.png','wb').write(b'x'); open('b.txt','w').write('y')", "artifacts": ["*.png"]}))
        .await;
    let paths: Vec<&str> = body["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["a.png"]);
    assert_eq!(body["artifacts"][0]["mime"], "image/png");
    // A glob matches the whole relative path, `*` across `/` too (as
    // api.md says), and `[...]` is a class.
    let (_, body) = server
        .execute(json!({
            "code": "import os\nos.makedirs('figs/2024')\nos.makedirs('out/x')\nfor p in ['plot.png', 'figs/2024/p.png', 'out/x/a.csv', 'out/b.csv', 'c.csv', 'out/b1.txt', 'out/b2.txt', 'out/b3.txt']:\n    open(p, 'w').write(p)",
            "artifacts": ["*.png", "out/*.csv", "out/b[12].txt"],
        }))
        .await;
    let mut paths: Vec<&str> = body["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "figs/2024/p.png",
            "out/b.csv",
            "out/b1.txt",
            "out/b2.txt",
            "out/x/a.csv",
            "plot.png"
        ],
        "{body}"
    );
    let (_, body) = server
        .execute(json!({"code": "open('a.txt','w').write('x')", "artifacts": false}))
        .await;
    assert_eq!(body["artifacts"], json!([]));
    server.stop().await;
}

#[tokio::test]
async fn artifacts_over_a_cap_are_listed_but_omitted() {
    let mut config = common::config();
    config.results.max_artifact_bytes = 1000;
    config.results.max_artifacts_bytes = 1500;
    let server = TestServer::with_config(config).await;
    let code = "open('a_small.txt','w').write('s' * 800)\nopen('b_big.txt','w').write('b' * 5000)\nopen('c_small.txt','w').write('c' * 800)";
    let body = server.run(code).await;
    let artifacts = body["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 3, "{body}");
    assert_eq!(artifacts[0]["path"], "a_small.txt");
    assert_eq!(decode(&artifacts[0]).len(), 800);
    assert_eq!(artifacts[1]["path"], "b_big.txt");
    assert_eq!(artifacts[1]["omitted"], true, "over the per-artifact cap");
    assert_eq!(artifacts[1]["size"], 5000);
    assert!(artifacts[1].get("base64").is_none());
    assert_eq!(artifacts[2]["path"], "c_small.txt");
    assert_eq!(artifacts[2]["omitted"], true, "over the total cap");
    server.stop().await;
}

#[tokio::test]
async fn a_file_the_run_made_unreadable_is_listed_without_its_content() {
    let server = TestServer::start().await;
    let code = "import os\nfor name in ('a.txt', 'in.txt'):\n    open(name, 'w').write('secret')\n    os.chmod(name, 0)\nopen('b.txt', 'w').write('b')";
    let (status, body) = server
        .execute(json!({"code": code, "files": {"in.txt": "secret"}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    let artifacts = body["artifacts"].as_array().unwrap();
    let paths: Vec<&str> = artifacts
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["a.txt", "b.txt", "in.txt"], "{body}");
    for unreadable in [&artifacts[0], &artifacts[2]] {
        assert_eq!(unreadable["omitted"], true, "{body}");
        assert_eq!(unreadable["size"], 6, "{body}");
        assert!(unreadable.get("base64").is_none(), "{body}");
    }
    assert_eq!(decode(&artifacts[1]), b"b");
    // The worker clears the unreadable files away: the next run is clean.
    for _ in 0..2 {
        let body = server.run("import os\nprint(os.listdir('.'))").await;
        assert_eq!(body["stdout"], "[]\n", "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_run_that_leaves_over_a_thousand_files_lists_a_thousand_and_says_so() {
    let server = TestServer::start().await;
    let make = |n: usize| format!("for i in range({n}):\n    open('f%05d' % i, 'w').close()");
    let body = server.run(&make(1000)).await;
    assert_eq!(body["artifacts"].as_array().unwrap().len(), 1000, "{body}");
    assert!(body.get("artifacts_truncated").is_none(), "{body}");
    let body = server.run(&make(1001)).await;
    let artifacts = body["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1000, "{body}");
    assert_eq!(artifacts[999]["path"], "f00999", "{body}");
    assert_eq!(body["artifacts_truncated"], true, "{body}");
    // An input file left as it was sent is no artifact, nor a thousand-and-first.
    let (status, body) = server
        .execute(json!({"code": make(1000), "files": {"zz.txt": "input"}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["artifacts"].as_array().unwrap().len(), 1000, "{body}");
    assert!(body.get("artifacts_truncated").is_none(), "{body}");
    // What the globs select is what counts.
    let (status, body) = server
        .execute(json!({"code": make(1001), "artifacts": ["f0000*"]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["artifacts"].as_array().unwrap().len(), 10, "{body}");
    assert!(body.get("artifacts_truncated").is_none(), "{body}");
    server.stop().await;
}

/// A worker whose walks of a run's directory read at most 100 entries.
async fn walk_budget_of_100() -> (TestServer, tempfile::TempDir) {
    common::server_with_patched_worker("w.WALK_ENTRIES = 100\n", |_| {}).await
}

#[tokio::test]
async fn the_walk_of_a_runs_files_stops_at_its_budget_and_says_so() {
    let (server, _dir) = walk_budget_of_100().await;
    // 99 entries: the whole directory is read.
    let spread = |dirs: usize, each: usize| {
        format!(
            "import os\nfor d in range({dirs}):\n    os.mkdir('d%d' % d)\n    for i in range({each}):\n        open('d%d/f%03d.txt' % (d, i), 'w').close()\nopen('z.png', 'wb').close()"
        )
    };
    let (status, body) = server
        .execute(json!({"code": spread(2, 48), "artifacts": ["*.png"]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["artifacts"][0]["path"], "z.png", "{body}");
    assert!(body.get("artifacts_truncated").is_none(), "{body}");
    // 4 + 3 x 40 entries: the walk stops in the last directory it reads
    // (d2), and the answer says its listing is cut.
    let (status, body) = server
        .execute(json!({"code": spread(3, 40), "artifacts": ["d2/*"]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["artifacts_truncated"], true, "{body}");
    let listed = body["artifacts"].as_array().unwrap();
    assert!(
        !listed.is_empty() && listed.len() < 40,
        "some of d2, not all: {body}"
    );
    assert!(
        listed
            .iter()
            .all(|a| a["path"].as_str().unwrap().starts_with("d2/")),
        "{body}"
    );
    // The worker goes on, its directory clean.
    let (status, body) = server
        .execute(json!({"code": "import os\nprint(os.listdir('.'))"}))
        .await;
    assert_eq!(
        (status, body["stdout"].as_str()),
        (200, Some("[]\n")),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn matplotlib_figures_come_back_as_png_artifacts() {
    let python = pyenvs::plot_python().await;
    let server = TestServer::with_config(code_executor::Config {
        env: code_executor::config::EnvChoice::Python(python),
        pool_size: 1,
        ..common::config()
    })
    .await;
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('shown')\nplt.show()\nplt.figure()\nplt.bar([1, 2], [3, 4])\nprint('done')";
    let body = server.run(code).await;
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "done\n");
    assert!(
        !body["stderr"].as_str().unwrap().contains("non-interactive"),
        "{body}"
    );
    let artifacts = body["artifacts"].as_array().unwrap();
    let paths: Vec<&str> = artifacts
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["figure-1.png", "figure-2.png"]);
    for artifact in artifacts {
        assert_eq!(artifact["mime"], "image/png");
        let png = decode(artifact);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        assert!(
            png.len() > 5000,
            "a real plot, not an empty image: {} bytes",
            png.len()
        );
        assert_eq!(artifact["size"], png.len());
    }
    // A file the user saves is an ordinary artifact; no figure is left open.
    let body = server
        .run("import matplotlib.pyplot as plt\nplt.plot([1])\nplt.savefig('mine.png')\nplt.close('all')")
        .await;
    let paths: Vec<&str> = body["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["mine.png"]);
    server.stop().await;
}
