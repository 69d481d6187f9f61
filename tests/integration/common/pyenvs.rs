//! Virtualenvs with pinned third-party packages (`tests/python_envs/NAME.txt`),
//! created once by `tests/python_envs/setup.sh` and reused across runs.

use std::path::{Path, PathBuf};

use tokio::sync::OnceCell;

/// The interpreter of the `plot` venv (matplotlib, numpy). A failed install
/// fails the test.
pub async fn plot_python() -> PathBuf {
    static PLOT: OnceCell<PathBuf> = OnceCell::const_new();
    PLOT.get_or_init(|| async { setup("plot", &target_venv("plot")).await })
        .await
        .clone()
}

/// The interpreter of the `codec` venv: `msgpack`, the C codec a worker
/// uses in its stead of its own where an environment has it. A failed
/// install fails the test.
pub async fn codec_python() -> PathBuf {
    static CODEC: OnceCell<PathBuf> = OnceCell::const_new();
    CODEC
        .get_or_init(|| async { setup("codec", &target_venv("codec")).await })
        .await
        .clone()
}

/// The `kubernetes-validate` program of the `kubernetes` venv, kept under
/// /tmp (it holds ~150 MB of schemas) and shared by every test process
/// (setup.sh takes a file lock). A failed install fails the test.
pub async fn kubernetes_validate() -> PathBuf {
    static VALIDATE: OnceCell<PathBuf> = OnceCell::const_new();
    VALIDATE
        .get_or_init(|| async {
            let venv = Path::new("/tmp/code-executor-kubernetes-venv");
            let python = setup("kubernetes", venv).await;
            python.with_file_name("kubernetes-validate")
        })
        .await
        .clone()
}

fn target_venv(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-venv"))
}

async fn setup(name: &str, venv: &Path) -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python_envs/setup.sh");
    let out = tokio::process::Command::new("bash")
        .arg(script)
        .arg(name)
        .arg(venv)
        .env("TEST_PYTHON", super::python())
        .output()
        .await
        .expect("bash runs tests/python_envs/setup.sh");
    assert!(
        out.status.success(),
        "installing tests/python_envs/{name}.txt failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("venv python")
            .trim(),
    )
}
