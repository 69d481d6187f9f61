//! Virtualenvs with pinned third-party packages (`tests/python_envs/NAME.txt`),
//! created once by `tests/python_envs/setup.sh` and reused across runs.

use std::path::PathBuf;

use tokio::sync::OnceCell;

/// The interpreter of the `plot` venv (matplotlib, numpy). A failed install
/// fails the test.
pub async fn plot_python() -> PathBuf {
    static PLOT: OnceCell<PathBuf> = OnceCell::const_new();
    PLOT.get_or_init(|| setup("plot")).await.clone()
}

async fn setup(name: &str) -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python_envs/setup.sh");
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-venv"));
    let out = tokio::process::Command::new("bash")
        .arg(script)
        .arg(name)
        .arg(&venv)
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
