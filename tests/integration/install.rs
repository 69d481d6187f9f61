//! `/install` as pip users expect: plain wheel paths, `requirements` text,
//! index options, `uv`, refusals of anything that could smuggle an option
//! or a command (nothing runs), and `env_hash` following installs only.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use code_executor::config::{Config, EnvChoice};
use serde_json::{Value, json};

use crate::common::conda::{CondaFixture, Interpreter, build_wheel, link_pip};
use crate::common::{self, TestServer};

const ADMIN: &str = "admin-secret";

/// A Conda root with `ml` (pip linked in) and a set of `n` local wheels
/// `wpkgN` (`VALUE = N`).
fn fixture_with_wheels(n: usize) -> (CondaFixture, Vec<PathBuf>) {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let prefix = fixture.create_env("ml", Interpreter::primary());
    fixture.install_fake_conda();
    link_pip(&prefix, Interpreter::primary());
    let wheels_dir = fixture.dir.path().join("wheels");
    std::fs::create_dir_all(&wheels_dir).unwrap();
    let wheels = (0..n)
        .map(|i| build_wheel(&wheels_dir, &format!("wpkg{i}"), "1.0", &i.to_string()))
        .collect();
    (fixture, wheels)
}

fn config_for(fixture: &CondaFixture) -> Config {
    Config {
        host_env: fixture.host_env(),
        env: EnvChoice::Default,
        pool_size: 1,
        admin_token: Some(ADMIN.into()),
        ..common::config()
    }
}

async fn install(server: &TestServer, body: Value) -> (u16, Value) {
    let resp = server
        .client
        .post(format!("{}/install", server.url))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

async fn run_in(server: &TestServer, env: &str, code: &str) -> Value {
    let (status, body) = server.execute(json!({"code": code, "env": env})).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn env_hash(server: &TestServer, env: &str) -> String {
    let (_, body) = server.get("/list-envs").await;
    body["envs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == env)
        .unwrap()["env_hash"]
        .as_str()
        .unwrap()
        .to_string()
}

const IMPORT_ALL: &str = "import wpkg0, wpkg1, wpkg2; print(wpkg0.VALUE, wpkg1.VALUE, wpkg2.VALUE)";

#[tokio::test]
async fn a_plain_wheel_path_and_requirements_text_install_a_local_wheel_set() {
    let (fixture, wheels) = fixture_with_wheels(3);
    let server = TestServer::with_config(config_for(&fixture)).await;
    let hash_before = env_hash(&server, "ml").await;
    // A run does not change the hash; it names it.
    let ran = run_in(&server, "ml", "print(1)").await;
    assert_eq!(ran["env_hash"], hash_before.as_str());
    assert_eq!(env_hash(&server, "ml").await, hash_before);

    // What a pip user types: the wheel's path.
    let (status, body) = install(
        &server,
        json!({"env": "ml", "packages": [wheels[0].display().to_string()], "no_index": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["manager"], "pip");
    assert_eq!(body["installed"], json!(["wpkg0==1.0"]));
    let hash_one = body["env_hash"].as_str().unwrap().to_string();
    assert_ne!(hash_one, hash_before, "an install changes env_hash");
    assert_eq!(env_hash(&server, "ml").await, hash_one);

    // A requirements file's text: paths, a comment, a blank line.
    let requirements = format!(
        "# the rest of the set\n{}\n\n{}  # pinned by path\n",
        wheels[1].display(),
        wheels[2].display()
    );
    let (status, body) = install(
        &server,
        json!({"env": "ml", "requirements": requirements, "no_index": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["installed"], json!(["wpkg1==1.0", "wpkg2==1.0"]));
    assert_ne!(body["env_hash"], hash_one.as_str());

    let ran = run_in(&server, "ml", IMPORT_ALL).await;
    assert_eq!(ran["stdout"], "0 1 2\n", "{ran}");
    assert_eq!(
        ran["env_hash"], body["env_hash"],
        "the run names the new hash"
    );
    // Nothing installed into the default env.
    let base = run_in(&server, "base", "import wpkg0").await;
    assert_eq!(base["error"]["type"], "ModuleNotFoundError", "{base}");
    server.stop().await;
}

#[tokio::test]
async fn uv_installs_the_same_wheel_set_and_auto_picks_it() {
    let (fixture, wheels) = fixture_with_wheels(3);
    let server = TestServer::with_config(Config {
        uv: Some(common::uv()),
        ..config_for(&fixture)
    })
    .await;
    let before = env_hash(&server, "ml").await;
    let (status, body) = install(
        &server,
        json!({
            "env": "ml",
            "manager": "uv",
            "packages": [wheels[0].display().to_string()],
            "requirements": format!("{}\n{}\n", wheels[1].display(), wheels[2].display()),
            "no_index": true,
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["manager"], "uv");
    assert_eq!(
        body["installed"],
        json!(["wpkg0==1.0", "wpkg1==1.0", "wpkg2==1.0"]),
        "{body}"
    );
    assert_ne!(body["env_hash"], before.as_str());
    let ran = run_in(&server, "ml", IMPORT_ALL).await;
    assert_eq!(ran["stdout"], "0 1 2\n", "{ran}");

    // `auto` picks uv where the server has one.
    let extra = build_wheel(fixture.dir.path(), "wextra", "2.0", "7");
    let (status, body) = install(
        &server,
        json!({"env": "ml", "manager": "auto", "packages": [extra.display().to_string()], "no_index": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["manager"], "uv", "{body}");
    assert_eq!(body["installed"], json!(["wextra==2.0"]));
    server.stop().await;
}

#[tokio::test]
async fn uv_without_a_uv_is_a_clear_refusal() {
    let (fixture, wheels) = fixture_with_wheels(1);
    let server = TestServer::with_config(config_for(&fixture)).await;
    let (status, body) = install(
        &server,
        json!({"env": "ml", "manager": "uv", "packages": [wheels[0].display().to_string()]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        common::error_message(&body).contains("needs a uv"),
        "{body}"
    );
    // `auto` falls back to pip.
    let (status, body) = install(
        &server,
        json!({"env": "ml", "manager": "auto", "packages": [wheels[0].display().to_string()], "no_index": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["manager"], "pip");
    server.stop().await;
}

/// A stand-in `uv` that records that it ran.
fn recording_uv(dir: &Path) -> (PathBuf, PathBuf) {
    let log = dir.join("uv.log");
    let exe = dir.join("uv");
    std::fs::write(
        &exe,
        format!("#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    (exe, log)
}

#[tokio::test]
async fn injection_attempts_in_every_field_are_refused_and_run_nothing() {
    let (fixture, wheels) = fixture_with_wheels(1);
    let (uv, uv_log) = recording_uv(fixture.dir.path());
    let server = TestServer::with_config(Config {
        uv: Some(uv),
        ..config_for(&fixture)
    })
    .await;
    let marker = fixture.dir.path().join("pwned");
    let touch = format!("$(touch {})", marker.display());
    let wheel = wheels[0].display().to_string();
    let hash = env_hash(&server, "ml").await;
    let attempts: Vec<(Value, &str)> = vec![
        (
            json!({"packages": ["--index-url=https://evil.example/simple"]}),
            "options are not accepted",
        ),
        (
            json!({"packages": ["-r/etc/passwd"]}),
            "options are not accepted",
        ),
        (json!({"packages": [format!("wpkg0; {touch}")]}), "refused"),
        (
            json!({"packages": [format!("wpkg0 && {touch}")]}),
            "refused",
        ),
        (
            json!({"packages": ["/etc/passwd"]}),
            "not of a wheel or sdist",
        ),
        (
            json!({"packages": ["./wpkg0-1.0-py3-none-any.whl"]}),
            "relative path",
        ),
        (
            json!({"packages": [format!("{wheel}\n--pre")]}),
            "control character",
        ),
        (
            json!({"packages": ["/nonexistent/x-1.0-py3-none-any.whl"]}),
            "cannot be read",
        ),
        (
            json!({"packages": [format!("/tmp/../{}", wheel.trim_start_matches('/'))]}),
            "`..`",
        ),
        (
            json!({"requirements": "--extra-index-url https://evil.example/simple\nwpkg0\n"}),
            "requirements line 1",
        ),
        (
            json!({"requirements": format!("wpkg0\n-r /etc/passwd\n")}),
            "requirements line 2",
        ),
        (
            json!({"requirements": format!("{wheel}\n-e .\n")}),
            "options are not accepted",
        ),
        (
            json!({"requirements": format!("wpkg0 --hash=sha256:{}\n", "0".repeat(64))}),
            "refused",
        ),
        (
            json!({"packages": [wheel.clone()], "index_url": "--trusted-host=evil.example"}),
            "index_url",
        ),
        (
            json!({"packages": [wheel.clone()], "index_url": "https://x.example/simple --pre"}),
            "index_url",
        ),
        (
            json!({"packages": [wheel.clone()], "extra_index_urls": ["file:///etc"]}),
            "extra_index_urls",
        ),
        (
            json!({"packages": [wheel.clone()], "find_links": ["../wheels"]}),
            "find_links",
        ),
        (
            json!({"packages": [wheel.clone()], "find_links": [format!("/tmp/{touch}")]}),
            "find_links",
        ),
        (json!({"packages": []}), "at least one package"),
        (
            json!({"packages": ["zlib"], "manager": "conda", "index_url": "https://x.example"}),
            "not to manager \"conda\"",
        ),
        (
            json!({"packages": ["zlib; id"], "manager": "conda"}),
            "refused",
        ),
        (
            json!({"packages": ["--force"], "manager": "conda"}),
            "options are not accepted",
        ),
    ];
    for (mut body, expected) in attempts {
        for manager in ["pip", "uv"] {
            let mut body = body.clone();
            body["env"] = json!("ml");
            if body.get("manager").is_none() {
                body["manager"] = json!(manager);
            }
            let (status, answer) = install(&server, body.clone()).await;
            assert_eq!(status, 400, "{body}: {answer}");
            assert_eq!(answer["error"]["code"], "bad_request", "{answer}");
            assert!(
                common::error_message(&answer).contains(expected),
                "{body}: {answer} does not say {expected:?}"
            );
        }
        body["manager"] = json!("sh");
        let (status, answer) = install(&server, body).await;
        assert_eq!(status, 400, "an unknown manager is refused: {answer}");
    }
    // Raw flags are not a field.
    let (status, answer) = install(
        &server,
        json!({"env": "ml", "packages": [wheel], "flags": ["--pre"]}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert!(!marker.exists(), "a command ran");
    assert!(
        !uv_log.exists(),
        "uv ran: {:?}",
        std::fs::read_to_string(&uv_log)
    );
    assert!(
        fixture
            .conda_calls()
            .iter()
            .all(|c| !c.starts_with("install"))
    );
    assert_eq!(env_hash(&server, "ml").await, hash, "nothing was installed");
    server.stop().await;
}

#[tokio::test]
async fn index_options_reach_pip_as_their_flags() {
    let (fixture, _) = fixture_with_wheels(0);
    let (uv, uv_log) = recording_uv(fixture.dir.path());
    let server = TestServer::with_config(Config {
        uv: Some(uv),
        ..config_for(&fixture)
    })
    .await;
    let (status, body) = install(
        &server,
        json!({
            "env": "ml",
            "manager": "uv",
            "packages": ["wpkg0==1.0"],
            "index_url": "https://pypi.example/simple",
            "extra_index_urls": ["https://extra.example/simple"],
            "find_links": ["/srv/wheels"],
            "upgrade": true,
            "pre": true,
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let calls = std::fs::read_to_string(&uv_log).unwrap();
    let prefix = fixture.root.join("envs/ml").canonicalize().unwrap();
    assert_eq!(
        calls.trim(),
        format!(
            "pip install --python {}/bin/python --index-url https://pypi.example/simple \
             --extra-index-url https://extra.example/simple --find-links /srv/wheels --upgrade \
             --prerelease allow -- wpkg0==1.0",
            prefix.display()
        )
    );
    server.stop().await;
}
