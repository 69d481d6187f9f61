//! Environments: discovery (fake conda, environments.txt, flags, config
//! tables), addressing by name and prefix, activation, lazy pools, the
//! worker cap, /list-envs, /list-packages and admin-only /install — on real
//! Conda-layout prefixes built by the fixtures.

use std::time::{Duration, Instant};

use code_executor::config::EnvChoice;
use code_executor::config::{Config, Options};
use serde_json::{Value, json};

use crate::common::conda::{
    CondaFixture, Interpreter, add_activate_script, build_wheel, link_pip, site_packages,
};
use crate::common::{self, TestServer};

const WHO: &str = "import sys, platform; print(sys.executable); print(sys.prefix); print(platform.python_version())";

/// Discovery sees only the fixture; one warm worker per configured env.
fn config_for(fixture: &CondaFixture) -> Config {
    Config {
        host_env: fixture.host_env(),
        env: EnvChoice::Default,
        pool_size: 1,
        ..common::config()
    }
}

/// A Conda root on the primary interpreter with `ml` on the secondary one,
/// and a fake `conda` on PATH.
fn two_env_fixture() -> CondaFixture {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    fixture.create_env("ml", Interpreter::secondary());
    fixture.install_fake_conda();
    fixture
}

async fn request(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = server
        .client
        .request(method, format!("{}{path}", server.url));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("request is answered");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

async fn run_in(server: &TestServer, env: &str, code: &str) -> Value {
    let (status, body) = server.execute(json!({"code": code, "env": env})).await;
    assert_eq!(status, 200, "run in {env}: {body}");
    assert_eq!(body["exit_code"], 0, "run in {env}: {body}");
    body
}

async fn list_envs(server: &TestServer) -> Vec<Value> {
    let (status, body) = server.get("/list-envs").await;
    assert_eq!(status, 200, "{body}");
    body["envs"].as_array().unwrap().clone()
}

fn env_named<'a>(envs: &'a [Value], name: &str) -> &'a Value {
    envs.iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name} in {envs:?}"))
}

async fn wait_for_pool(server: &TestServer, env: &str, size: u64, within: Duration) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let envs = list_envs(server).await;
        if env_named(&envs, env)["pool"]["size"] == size {
            return envs;
        }
        assert!(
            start.elapsed() < within,
            "pool of {env} did not reach {size} within {within:?}: {envs:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn fake_conda_discovery_lists_envs_and_concurrent_runs_land_in_their_own_interpreter() {
    let fixture = two_env_fixture();
    let server = TestServer::with_config(config_for(&fixture)).await;
    let (primary, secondary) = (Interpreter::primary(), Interpreter::secondary());

    let envs = list_envs(&server).await;
    assert_eq!(envs.len(), 2, "{envs:?}");
    let base = env_named(&envs, "base");
    assert_eq!(base["kind"], "conda");
    assert_eq!(base["default"], true);
    assert_eq!(base["prefix"], fixture.root.display().to_string());
    assert_eq!(base["python_version"], primary.version.as_str());
    assert_eq!(base["pool"]["size"], 1, "configured envs are pre-warmed");
    assert!(base.get("error").is_none());
    let ml = env_named(&envs, "ml");
    assert_eq!(ml["kind"], "conda");
    assert_eq!(ml["default"], false);
    assert_eq!(ml["python_version"], secondary.version.as_str());

    let runs = (0..8).map(|i| {
        let env = if i % 2 == 0 { "base" } else { "ml" };
        let server = &server;
        async move { (env, run_in(server, env, WHO).await) }
    });
    for (env, body) in futures_util::future::join_all(runs).await {
        let out = body["stdout"].as_str().unwrap().to_string();
        let lines: Vec<&str> = out.lines().collect();
        let (prefix, version) = if env == "base" {
            (fixture.root.clone(), &primary.version)
        } else {
            (fixture.root.join("envs/ml"), &secondary.version)
        };
        assert_eq!(
            lines[0],
            prefix.join("bin/python").display().to_string(),
            "{env}"
        );
        assert_eq!(lines[1], prefix.display().to_string(), "{env}");
        assert_eq!(lines[2], version.as_str(), "{env}");
    }
    // The default env is the root prefix's.
    let body = server.run("import sys; print(sys.prefix)").await;
    assert_eq!(body["stdout"], format!("{}\n", fixture.root.display()));
    server.stop().await;
}

#[tokio::test]
async fn envs_are_addressed_by_name_or_prefix_and_unknown_names_list_the_known_ones() {
    let fixture = two_env_fixture();
    let server = TestServer::with_config(config_for(&fixture)).await;
    let ml_prefix = fixture.root.join("envs/ml");

    let body = run_in(
        &server,
        &ml_prefix.display().to_string(),
        "import sys; print(sys.prefix)",
    )
    .await;
    assert_eq!(body["stdout"], format!("{}\n", ml_prefix.display()));
    // A prefix spelled with a trailing slash and `..` is the same env.
    let spelled = format!("{}/envs/../envs/ml/", fixture.root.display());
    let body = run_in(&server, &spelled, "import sys; print(sys.prefix)").await;
    assert_eq!(body["stdout"], format!("{}\n", ml_prefix.display()));

    let (status, body) = server.execute(json!({"code": "1", "env": "nope"})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_env");
    let message = crate::common::error_message(&body);
    assert!(
        message.contains("\"nope\"") && message.contains("base, ml"),
        "{message}"
    );
    let (status, _) = server
        .execute(json!({"code": "1", "env": "/no/such/prefix"}))
        .await;
    assert_eq!(status, 404);
    server.stop().await;
}

#[tokio::test]
async fn without_conda_environments_txt_and_the_roots_envs_are_discovered() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    fixture.create_env("ml", Interpreter::primary());
    let outside = fixture.dir.path().join("projects/tools-env");
    let outside = fixture.create_env_at(&outside, Interpreter::secondary());
    // No fake conda on PATH: only ~/.conda/environments.txt and envs/.
    assert!(!fixture.bin.join("conda").exists());
    let server = TestServer::with_config(config_for(&fixture)).await;

    let envs = list_envs(&server).await;
    let names: Vec<&str> = envs.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["base", "ml", "tools-env"]);
    assert_eq!(env_named(&envs, "base")["default"], true);
    let body = run_in(&server, "tools-env", "import sys; print(sys.prefix)").await;
    assert_eq!(body["stdout"], format!("{}\n", outside.display()));
    server.stop().await;
}

#[tokio::test]
async fn flags_and_envs_tables_choose_name_and_configure_environments() {
    let mut fixture = two_env_fixture();
    let other = fixture.dir.path().join("elsewhere/ml");
    let other = fixture.create_env_at(&other, Interpreter::primary());
    let venv = fixture.dir.path().join("venv");
    let out = std::process::Command::new(&Interpreter::secondary().binary)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(out.status.success(), "venv: {out:?}");

    let file: Options = toml::from_str(&format!(
        r#"
        conda_env = "base"
        [[envs]]
        name = "tools"
        prefix = "{other}"
        pool_size = 1
        preload = ["json"]
        timeout = 7
        [[envs]]
        python = "{venv}/bin/python"
        pool_size = 1
        "#,
        other = other.display(),
        venv = venv.display(),
    ))
    .unwrap();
    // --conda-env ml wins over the file's conda_env.
    let args = Options {
        conda_env: Some("ml".into()),
        ..Options::default()
    };
    let config = Config {
        host_env: fixture.host_env(),
        grace_period: Duration::from_millis(500),
        ..Config::merge(&args, file).unwrap()
    };
    let config = Config {
        port: 0,
        pool_size: 1,
        sandbox: common::sandbox_config(),
        ..config
    };
    let server = TestServer::with_config(config).await;

    let envs = list_envs(&server).await;
    let ml = env_named(&envs, "ml");
    assert_eq!(ml["default"], true);
    assert_eq!(ml["pool"]["size"], 1, "the --conda-env env is pre-warmed");
    let tools = env_named(&envs, "tools");
    assert_eq!(tools["prefix"], other.display().to_string());
    assert_eq!(tools["pool"]["size"], 1);
    let venv_env = env_named(&envs, "venv");
    assert_eq!(venv_env["kind"], "venv");
    assert_eq!(venv_env["pool"]["size"], 1);
    // The discovered copy of the `elsewhere/ml` prefix is the configured
    // `tools`; the discovered base stays lazy.
    assert_eq!(envs.len(), 4, "{envs:?}");
    assert_eq!(env_named(&envs, "base")["pool"]["size"], 0);

    let body = server.run("import sys; print(sys.prefix)").await;
    assert_eq!(
        body["stdout"],
        format!("{}\n", fixture.root.join("envs/ml").display())
    );
    let body = run_in(
        &server,
        "tools",
        "import sys; print('json' in sys.modules, sys.prefix)",
    )
    .await;
    assert_eq!(body["stdout"], format!("True {}\n", other.display()));
    let body = run_in(&server, "venv", "import sys; print(sys.prefix)").await;
    assert_eq!(
        body["stdout"],
        format!("{}\n", venv.canonicalize().unwrap().display())
    );
    // The table's timeout is that env's default.
    let body = run_in(&server, "tools", "import time; time.sleep(0.1)").await;
    assert_eq!(body["timed_out"], false);
    server.stop().await;
}

#[tokio::test]
async fn discovered_name_clashes_get_a_numbered_name() {
    let mut fixture = two_env_fixture();
    let clash = fixture.dir.path().join("elsewhere/ml");
    let clash = fixture.create_env_at(&clash, Interpreter::primary());
    let server = TestServer::with_config(config_for(&fixture)).await;
    let envs = list_envs(&server).await;
    assert_eq!(
        env_named(&envs, "ml")["prefix"],
        fixture.root.join("envs/ml").display().to_string()
    );
    assert_eq!(
        env_named(&envs, "ml-2")["prefix"],
        clash.display().to_string()
    );
    let body = run_in(
        &server,
        "ml-2",
        "import os; print(os.environ['CONDA_DEFAULT_ENV'])",
    )
    .await;
    assert_eq!(body["stdout"], "ml-2\n");
    server.stop().await;
}

#[tokio::test]
async fn activation_scripts_set_variables_and_a_failing_one_only_disables_its_env() {
    let mut fixture = two_env_fixture();
    let good = fixture.root.join("envs/ml");
    add_activate_script(&good, "00-first.sh", "export GREETING=hello\n");
    add_activate_script(
        &good,
        "10-second.sh",
        "export GREETING=\"$GREETING-from-$CONDA_DEFAULT_ENV\"\nexport TOOL_HOME=\"$CONDA_PREFIX/share/tool\"\n",
    );
    let broken = fixture.create_env("broken", Interpreter::primary());
    add_activate_script(
        &broken,
        "libfoo.sh",
        "echo 'libfoo: cannot find libfoo.so.3' >&2\nreturn 3\n",
    );
    let server = TestServer::with_config(Config {
        token: Some("user-token-123".into()),
        ..config_for(&fixture)
    })
    .await;
    let get = |path: &'static str| {
        request(
            &server,
            reqwest::Method::GET,
            path,
            Some("user-token-123"),
            None,
        )
    };
    let exec = |env: &'static str, code: &'static str| {
        request(
            &server,
            reqwest::Method::POST,
            "/execute",
            Some("user-token-123"),
            Some(json!({"code": code, "env": env})),
        )
    };

    let (status, body) = exec(
        "ml",
        "import os; print(os.environ['GREETING'], os.environ['TOOL_HOME'], os.environ['CONDA_SHLVL']); print(os.environ['PATH'].split(':')[0]); print('CODE_EXECUTOR_TOKEN' in os.environ, 'user-token-123' in str(os.environ))",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["stdout"],
        format!(
            "hello-from-ml {}/share/tool 1\n{}/bin\nFalse False\n",
            good.display(),
            good.display()
        )
    );

    let (status, body) = get("/list-envs").await;
    assert_eq!(status, 200);
    let envs = body["envs"].as_array().unwrap();
    let error = env_named(envs, "broken")["error"].as_str().unwrap();
    assert!(error.contains("libfoo: cannot find libfoo.so.3"), "{error}");
    assert!(error.contains("libfoo.sh"), "{error}");
    assert!(env_named(envs, "ml").get("error").is_none());

    let (status, body) = exec("broken", "print(1)").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "env_unavailable");
    assert!(
        crate::common::error_message(&body).contains("cannot find libfoo.so.3"),
        "{body}"
    );
    // The other envs are fine.
    let (status, body) = exec("base", "print('still fine')").await;
    assert_eq!(
        (status, body["stdout"].as_str()),
        (200, Some("still fine\n"))
    );
    let (status, body) = server.get("/health").await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_discovered_env_starts_its_pool_on_first_use_and_shrinks_when_idle() {
    let fixture = two_env_fixture();
    let server = TestServer::with_config(Config {
        idle_timeout: Duration::from_millis(800),
        ..config_for(&fixture)
    })
    .await;
    let envs = list_envs(&server).await;
    assert_eq!(
        env_named(&envs, "ml")["pool"]["size"],
        0,
        "no worker before first use"
    );

    run_in(&server, "ml", "print(1)").await;
    let envs = list_envs(&server).await;
    assert_eq!(env_named(&envs, "ml")["pool"]["size"], 1, "{envs:?}");
    // The next run reuses the warm worker: same pid.
    let a = run_in(&server, "ml", "import os; print(os.getppid())").await;
    let b = run_in(&server, "ml", "import os; print(os.getppid())").await;
    assert_eq!(a["stdout"], b["stdout"]);

    let envs = wait_for_pool(&server, "ml", 0, Duration::from_secs(5)).await;
    assert_eq!(
        env_named(&envs, "base")["pool"]["size"],
        1,
        "configured envs stay warm"
    );
    run_in(&server, "ml", "print('back')").await;
    server.stop().await;
}

#[tokio::test]
async fn the_worker_cap_retires_idle_workers_of_the_least_recently_used_env() {
    let mut fixture = two_env_fixture();
    fixture.create_env("other", Interpreter::primary());
    let server = TestServer::with_config(Config {
        max_workers: 2,
        ..config_for(&fixture)
    })
    .await;
    let sizes = |envs: &[Value]| -> Vec<u64> {
        ["base", "ml", "other"]
            .iter()
            .map(|n| env_named(envs, n)["pool"]["size"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(sizes(&list_envs(&server).await), [1, 0, 0]);

    run_in(&server, "ml", "print(1)").await;
    assert_eq!(sizes(&list_envs(&server).await), [1, 1, 0]);
    assert_eq!(server.executor.live_workers(), (2, 2));

    // base was used least recently: its idle worker makes room.
    run_in(&server, "other", "print(1)").await;
    let envs = wait_for_pool(&server, "base", 0, Duration::from_secs(5)).await;
    assert_eq!(sizes(&envs), [0, 1, 1]);
    assert!(server.executor.live_workers().0 <= 2);

    // Now ml is the least recently used.
    run_in(&server, "base", "print(1)").await;
    let envs = wait_for_pool(&server, "ml", 0, Duration::from_secs(5)).await;
    assert_eq!(sizes(&envs), [1, 0, 1]);
    assert!(server.executor.live_workers().0 <= 2);
    server.stop().await;
}

#[tokio::test]
async fn list_packages_reports_distributions_and_conda_packages() {
    let fixture = two_env_fixture();
    let prefix = fixture.root.join("envs/ml");
    let dist = site_packages(&prefix, Interpreter::secondary());
    // Debian's interpreter reads dist-packages; give both a distribution.
    for dir in [dist.clone(), dist.with_file_name("dist-packages")] {
        let info = dir.join("Tiny_Dist-2.5.dist-info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("METADATA"),
            "Metadata-Version: 2.1\nName: Tiny_Dist\nVersion: 2.5\n",
        )
        .unwrap();
    }
    std::fs::write(
        prefix.join("conda-meta/openssl-3.0.13-h0.json"),
        r#"{"name": "openssl", "version": "3.0.13", "build": "h0"}"#,
    )
    .unwrap();
    let server = TestServer::with_config(config_for(&fixture)).await;

    let (status, body) = server.get("/list-packages?env=ml").await;
    assert_eq!(status, 200, "{body}");
    let packages = body["packages"].as_array().unwrap();
    assert!(
        packages.contains(&json!({"name": "Tiny_Dist", "version": "2.5"})),
        "{body}"
    );
    assert!(
        packages.contains(&json!({"name": "openssl", "version": "3.0.13"})),
        "{body}"
    );
    assert!(
        packages.contains(&json!({"name": "python", "version": Interpreter::secondary().version})),
        "{body}"
    );
    let (status, body) = server.get("/list-packages?env=nope").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_env"))
    );
    let (status, body) = server.get("/list-packages").await;
    assert_eq!(status, 200, "default env: {body}");
    server.stop().await;
}

#[tokio::test]
async fn pip_install_of_a_local_wheel_is_importable_on_the_next_run() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let prefix = fixture.create_env("ml", Interpreter::primary());
    fixture.install_fake_conda();
    link_pip(&prefix, Interpreter::primary());
    let wheel = build_wheel(fixture.dir.path(), "tinypkg", "1.0", "42");
    let server = TestServer::with_config(Config {
        admin_token: Some("admin-secret".into()),
        ..config_for(&fixture)
    })
    .await;
    // A warm worker from before the install.
    run_in(&server, "ml", "print(1)").await;
    let (_, before) = run_in(
        &server,
        "ml",
        "import importlib.util as u; print(u.find_spec('tinypkg'))",
    )
    .await
    .as_object()
    .map(|b| ((), b["stdout"].clone()))
    .unwrap();
    assert_eq!(before, "None\n");

    let install = request(
        &server,
        reqwest::Method::POST,
        "/install",
        Some("admin-secret"),
        Some(json!({
            "env": "ml",
            "packages": [format!("tinypkg @ file://{}", wheel.display())],
            "manager": "pip"
        })),
    );
    // Runs keep working while the install runs.
    let during = run_in(&server, "ml", "print('during')");
    let ((status, body), during) = tokio::join!(install, during);
    assert_eq!(during["stdout"], "during\n");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["env"], "ml");
    assert!(
        body["stdout"]
            .as_str()
            .unwrap()
            .contains("Successfully installed tinypkg-1.0"),
        "{body}"
    );
    assert_eq!(body["installed"], json!(["tinypkg==1.0"]));

    let body = run_in(&server, "ml", "import tinypkg; print(tinypkg.VALUE)").await;
    assert_eq!(body["stdout"], "42\n");
    let (_, packages) = server.get("/list-packages?env=ml").await;
    assert!(
        packages["packages"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "tinypkg", "version": "1.0"}))
    );
    server.stop().await;
}

#[tokio::test]
async fn conda_install_runs_the_discovered_conda_with_the_prefix() {
    let fixture = two_env_fixture();
    let server = TestServer::with_config(Config {
        admin_token: Some("admin-secret".into()),
        ..config_for(&fixture)
    })
    .await;
    let (status, body) = request(
        &server,
        reqwest::Method::POST,
        "/install",
        Some("admin-secret"),
        Some(json!({"env": "ml", "packages": ["zlib=1.3"], "manager": "conda"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["installed"], json!(["zlib==1.0"]));
    let prefix = fixture.root.join("envs/ml");
    assert!(
        fixture
            .conda_calls()
            .contains(&format!("install -y -p {} zlib=1.3", prefix.display())),
        "{:?}",
        fixture.conda_calls()
    );
    server.stop().await;
}

const SHOW_ACTIVATOR: &str = "import os; print(os.environ.get('ACTIVATOR'))";

#[tokio::test]
async fn conda_install_is_read_at_once_and_restarts_the_workers_once() {
    let fixture = two_env_fixture();
    let server = TestServer::with_config(Config {
        admin_token: Some("admin-secret".into()),
        rescan_interval: Duration::from_millis(300),
        ..config_for(&fixture)
    })
    .await;
    let body = run_in(&server, "ml", SHOW_ACTIVATOR).await;
    assert_eq!(body["stdout"], "None\n");
    // The package brings an activation script, as a real one may.
    let (status, body) = request(
        &server,
        reqwest::Method::POST,
        "/install",
        Some("admin-secret"),
        Some(json!({"env": "ml", "packages": ["activator=1.0"], "manager": "conda"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["installed"], json!(["activator==1.0"]));
    let installed_hash = body["env_hash"].clone();

    // The next run has the environment as the install left it, its
    // activation included, without waiting for a rescan.
    let body = run_in(&server, "ml", SHOW_ACTIVATOR).await;
    assert_eq!(body["stdout"], "installed\n");
    // The old pool's worker, closed as the install answered, may still be
    // ending: the workers are the two pools' one each once it is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let workers = loop {
        let workers = common::worker_pids(&server);
        if workers.len() == 2 || Instant::now() > deadline {
            break workers;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(workers.len(), 2, "{workers:?}");
    // Several rescans later, nothing read the environment again: the same
    // workers serve it, with the hash the install answered.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let body = run_in(&server, "ml", SHOW_ACTIVATOR).await;
    assert_eq!(body["stdout"], "installed\n");
    assert_eq!(common::worker_pids(&server), workers);
    assert_eq!(
        env_named(&list_envs(&server).await, "ml")["env_hash"],
        installed_hash
    );
    assert_ne!(installed_hash, json!(null));
    server.stop().await;
}

/// The server's two workers (one per env) once the ones an install
/// closed have ended and, if `not` is given, once they are not all of it.
async fn settled_workers(server: &TestServer, not: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut workers = common::worker_pids(server);
        workers.sort_unstable();
        if (workers.len() == 2 && workers != not) || Instant::now() > deadline {
            return workers;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two installs into one environment at once both succeed, each naming
/// its own package: the second runs once the first is done, on the
/// environment as the first left it. The first's answer has the
/// environment read again, as documented, though the second already holds
/// it. Afterwards the environment's workers are new and serve it as both
/// left it, its packages list both, and its `env_hash` is the one the
/// later install answered, different from the earlier's, and stays so.
#[tokio::test]
async fn two_installs_racing_into_one_env_both_land() {
    let fixture = two_env_fixture();
    let server = TestServer::with_config(Config {
        admin_token: Some("admin-secret".into()),
        rescan_interval: Duration::from_millis(300),
        ..config_for(&fixture)
    })
    .await;
    let body = run_in(&server, "ml", SHOW_ACTIVATOR).await;
    assert_eq!(body["stdout"], "None\n");
    let workers_before = settled_workers(&server, &[]).await;
    let hash_before = env_named(&list_envs(&server).await, "ml")["env_hash"].clone();
    let install = |packages: Value| {
        request(
            &server,
            reqwest::Method::POST,
            "/install",
            Some("admin-secret"),
            Some(json!({"env": "ml", "packages": packages, "manager": "conda"})),
        )
    };
    // The second asks while the first runs, and waits for it. The first's
    // answer comes with its activation read: a run made at once, while
    // the second install still runs, has it.
    let first_then_run = async {
        let answer = install(json!(["slowa=1.0", "activator=1.0"])).await;
        let body = run_in(&server, "ml", SHOW_ACTIVATOR).await;
        (answer, body["stdout"].clone())
    };
    let second = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        install(json!(["slowb=1.0"])).await
    };
    let (((status_a, a), seen), (status_b, b)) = tokio::join!(first_then_run, second);
    assert_eq!(seen, "installed\n", "the run after the first answer");
    assert_eq!((status_a, &a["exit_code"]), (200, &json!(0)), "{a}");
    assert_eq!((status_b, &b["exit_code"]), (200, &json!(0)), "{b}");
    assert_eq!(
        a["installed"],
        json!(["activator==1.0", "slowa==1.0"]),
        "{a}"
    );
    assert_eq!(b["installed"], json!(["slowb==1.0"]), "{b}");
    let (first, second) = (&a, &b);
    assert_ne!(first["env_hash"], hash_before, "{first}");
    assert_ne!(second["env_hash"], first["env_hash"], "{second}");

    // The default env's worker stays; ml's is a new one, which has the
    // activation the first install brought.
    let body = run_in(&server, "ml", SHOW_ACTIVATOR).await;
    assert_eq!(body["stdout"], "installed\n");
    let workers = settled_workers(&server, &workers_before).await;
    let kept = workers
        .iter()
        .filter(|p| workers_before.contains(p))
        .count();
    assert_eq!(kept, 1, "before {workers_before:?}, after {workers:?}");
    let (status, body) = server.get("/list-packages?env=ml").await;
    assert_eq!(status, 200, "{body}");
    for name in ["slowa", "slowb", "activator"] {
        assert!(
            body["packages"]
                .as_array()
                .unwrap()
                .contains(&json!({"name": name, "version": "1.0"})),
            "{name} lost: {body}"
        );
    }
    assert_eq!(
        env_named(&list_envs(&server).await, "ml")["env_hash"],
        second["env_hash"]
    );
    // Rescans later, nothing changed: the same worker, the same hash.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let body = run_in(&server, "ml", SHOW_ACTIVATOR).await;
    assert_eq!(body["stdout"], "installed\n");
    assert_eq!(settled_workers(&server, &[]).await, workers);
    assert_eq!(
        env_named(&list_envs(&server).await, "ml")["env_hash"],
        second["env_hash"]
    );
    server.stop().await;
}

#[tokio::test]
async fn install_refuses_options_and_invalid_specs_and_runs_nothing() {
    let fixture = two_env_fixture();
    let server = TestServer::with_config(Config {
        admin_token: Some("admin-secret".into()),
        ..config_for(&fixture)
    })
    .await;
    let calls_before = fixture.conda_calls().len();
    for manager in ["pip", "conda"] {
        for packages in [
            json!(["--version;", "echo", "INJECTED"]),
            json!(["-r", "/etc/passwd"]),
            json!(["numpy; rm -rf /"]),
            json!(["ok-name", "$(touch /tmp/pwned)"]),
            json!([]),
        ] {
            let (status, body) = request(
                &server,
                reqwest::Method::POST,
                "/install",
                Some("admin-secret"),
                Some(json!({"env": "ml", "packages": packages, "manager": manager})),
            )
            .await;
            assert_eq!(status, 400, "{manager} {packages}: {body}");
            assert_eq!(body["error"]["code"], "bad_request");
            assert!(!body.to_string().contains("INJECTED\\n"), "{body}");
        }
    }
    let (status, body) = request(
        &server,
        reqwest::Method::POST,
        "/install",
        Some("admin-secret"),
        Some(json!({"packages": ["--version;", "echo", "INJECTED"]})),
    )
    .await;
    assert_eq!(status, 400);
    let message = crate::common::error_message(&body);
    assert!(
        message.contains("\"--version;\"") && message.contains("options"),
        "{message}"
    );
    assert_eq!(
        fixture.conda_calls().len(),
        calls_before,
        "conda ran: {:?}",
        fixture.conda_calls()
    );
    server.stop().await;
}

#[tokio::test]
async fn install_needs_the_admin_token_and_listing_needs_the_user_token() {
    let fixture = two_env_fixture();
    let body = json!({"env": "ml", "packages": ["zlib"], "manager": "conda"});
    let server = TestServer::with_config(Config {
        token: Some("user-token".into()),
        admin_token: Some("admin-secret".into()),
        ..config_for(&fixture)
    })
    .await;
    for token in [None, Some("user-token"), Some("wrong")] {
        let (status, answer) = request(
            &server,
            reqwest::Method::POST,
            "/install",
            token,
            Some(body.clone()),
        )
        .await;
        assert_eq!(status, 403, "{token:?}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden");
    }
    for path in ["/list-envs", "/list-packages?env=ml"] {
        let (status, answer) = request(&server, reqwest::Method::GET, path, None, None).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{path}"
        );
        let (status, _) = request(
            &server,
            reqwest::Method::GET,
            path,
            Some("user-token"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{path}");
    }
    assert!(
        fixture
            .conda_calls()
            .iter()
            .all(|c| !c.starts_with("install"))
    );
    server.stop().await;

    // No admin token configured: installs are disabled, and say so.
    let server = TestServer::with_config(config_for(&fixture)).await;
    let (status, answer) = request(
        &server,
        reqwest::Method::POST,
        "/install",
        Some("anything"),
        Some(body),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(answer["error"]["code"], "forbidden");
    assert!(
        crate::common::error_message(&answer).contains("no admin token"),
        "{answer}"
    );
    server.stop().await;
}

/// `--python` reads a binary's prefix from its layout, with no Python
/// started: what it finds is what the interpreter itself says, for a plain
/// install and for a venv; a launcher script is still asked.
#[test]
fn an_interpreters_prefix_from_its_layout_is_what_it_says_itself() {
    use code_executor::testing::EnvSpec;
    let asked = |python: &std::path::Path| {
        let out = std::process::Command::new(python)
            .args([
                "-I",
                "-c",
                "import sys; print(sys.prefix); print(sys.executable)",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines().map(std::path::PathBuf::from);
        let prefix = lines.next().unwrap();
        (
            prefix.canonicalize().unwrap_or(prefix),
            lines.next().unwrap(),
        )
    };
    let real = common::python();
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let made = std::process::Command::new(&real)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    // A launcher script in front of the real interpreter (as pyenv's shims are).
    let shim_bin = dir.path().join("shim/bin");
    std::fs::create_dir_all(&shim_bin).unwrap();
    let shim = shim_bin.join("python3");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\nexec {} \"$@\"\n", real.display()),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for python in [real.clone(), venv.join("bin/python"), shim.clone()] {
        let spec = EnvSpec::from_interpreter(&python, None).unwrap();
        let (prefix, executable) = asked(&python);
        assert_eq!(spec.prefix, prefix, "{}", python.display());
        if python != shim {
            assert_eq!(spec.python, executable, "{}", python.display());
        } else {
            // The shim is seen through: the workers run the real binary.
            assert_eq!(spec.python, real, "{}", python.display());
        }
    }
}
