//! Finding Conda and its environments the way Conda itself does: ask the
//! `conda` (or `mamba`, `micromamba`) binary named by `CONDA_EXE` or found on
//! `PATH` (`info --json`, `env list --json`); without one, read
//! `~/.conda/environments.txt` and the `envs/` folders of known roots.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::HostEnv;

/// Conda front ends tried on `PATH`, in order.
const CONDA_BINARIES: &[&str] = &["conda", "mamba", "micromamba"];

/// Roots tried under `HOME` and [`HostEnv::conda_install_dirs`] (`/opt`)
/// when no Conda binary answers.
const KNOWN_ROOTS: &[&str] = &[
    "miniconda3",
    "anaconda3",
    "miniforge3",
    "mambaforge",
    "micromamba",
    "conda",
];

/// What discovery found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Discovered {
    /// The Conda front end, used again for `conda install`.
    pub conda: Option<PathBuf>,
    /// Conda's root prefix: the `base` environment.
    pub root: Option<PathBuf>,
    /// Folders whose sub-folders are environments (`envs_dirs`).
    pub envs_dirs: Vec<PathBuf>,
    /// Every environment prefix found (canonical, existing, de-duplicated),
    /// the root first, then in path order.
    pub prefixes: Vec<PathBuf>,
}

/// The Conda front end: `CONDA_EXE` if it exists, else the first of
/// `conda`, `mamba`, `micromamba` on `PATH`.
pub(crate) fn find_conda(host: &HostEnv) -> Option<PathBuf> {
    host.conda_exe
        .clone()
        .filter(|p| p.is_file())
        .or_else(|| CONDA_BINARIES.iter().find_map(|name| host.which(name)))
}

/// Discover Conda environments. Every Conda command is bounded by
/// `timeout`; a Conda that fails or hangs is logged and the file-based
/// fallback is used instead. Never fails.
pub(crate) async fn discover(host: &HostEnv, timeout: Duration) -> Discovered {
    let conda = find_conda(host);
    let mut found = Discovered {
        conda: conda.clone(),
        ..Discovered::default()
    };
    let mut prefixes = Vec::new();
    let mut answered = false;
    if let Some(conda) = &conda {
        match conda_json(conda, &["info", "--json"], timeout).await {
            Ok(info) => {
                answered = true;
                found.root = info
                    .get("root_prefix")
                    .or_else(|| info.get("base environment"))
                    .and_then(Value::as_str)
                    .map(PathBuf::from);
                found.envs_dirs = strings(info.get("envs_dirs").or(info.get("envs directories")));
                prefixes.extend(strings(info.get("envs")));
            }
            Err(e) => tracing::warn!(conda = %conda.display(), "conda info failed: {e}"),
        }
        match conda_json(conda, &["env", "list", "--json"], timeout).await {
            Ok(list) => {
                answered = true;
                prefixes.extend(strings(list.get("envs")));
            }
            Err(e) => tracing::warn!(conda = %conda.display(), "conda env list failed: {e}"),
        }
    }
    if !answered {
        fallback(host, conda.as_deref(), &mut found, &mut prefixes);
    }
    if let Some(root) = &found.root {
        prefixes.push(root.clone());
        if found.envs_dirs.is_empty() {
            found.envs_dirs.push(root.join("envs"));
        }
    }
    for dir in &found.envs_dirs {
        if let Ok(entries) = std::fs::read_dir(dir) {
            prefixes.extend(entries.flatten().map(|e| e.path()));
        }
    }
    found.root = found.root.and_then(|r| r.canonicalize().ok());
    let envs_dirs: Vec<PathBuf> = found
        .envs_dirs
        .iter()
        .filter_map(|d| d.canonicalize().ok())
        .collect();
    // Order, which decides name clashes: the root, then the members of the
    // envs dirs (where `conda activate NAME` looks), then other prefixes;
    // by path within each group.
    let unique: BTreeSet<(usize, PathBuf)> = prefixes
        .into_iter()
        .filter(|p| p.join("conda-meta").is_dir())
        .filter_map(|p| p.canonicalize().ok())
        .filter(|p| Some(p) != found.root.as_ref())
        .map(|p| {
            let in_envs_dir = p
                .parent()
                .is_some_and(|parent| envs_dirs.iter().any(|d| d == parent));
            (if in_envs_dir { 0 } else { 1 }, p)
        })
        .collect();
    found.prefixes = found
        .root
        .iter()
        .cloned()
        .chain(unique.into_iter().map(|(_, p)| p))
        .collect();
    found
}

/// Without a Conda that answers: the root above `CONDA_EXE` or the active
/// env, roots listed in `~/.conda/environments.txt`, well-known install
/// folders; every listed prefix; `~/.conda/envs` and the `envs/` of every
/// well-known install folder, root install or not.
fn fallback(
    host: &HostEnv,
    conda: Option<&Path>,
    found: &mut Discovered,
    prefixes: &mut Vec<PathBuf>,
) {
    let listed: Vec<PathBuf> = host
        .home
        .as_ref()
        .and_then(|home| std::fs::read_to_string(home.join(".conda/environments.txt")).ok())
        .map(|text| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default();
    let mut roots: Vec<PathBuf> = Vec::new();
    // <root>/bin/conda or <root>/condabin/conda
    if let Some(root) = conda.and_then(Path::parent).and_then(Path::parent) {
        roots.push(root.to_path_buf());
    }
    // <root>/envs/<name>
    if let Some(active) = &host.conda_prefix {
        prefixes.push(active.clone());
        if let Some(parent) = active.parent()
            && parent.file_name().is_some_and(|n| n == "envs")
            && let Some(root) = parent.parent()
        {
            roots.push(root.to_path_buf());
        }
        roots.push(active.clone());
    }
    roots.extend(listed.iter().cloned());
    let known: Vec<PathBuf> = KNOWN_ROOTS
        .iter()
        .flat_map(|name| {
            host.home
                .iter()
                .chain(&host.conda_install_dirs)
                .map(move |dir| dir.join(name))
        })
        .collect();
    roots.extend(known.iter().cloned());
    found.root = roots.into_iter().find(|r| is_root(r));
    prefixes.extend(listed);
    if let Some(home) = &host.home {
        found.envs_dirs.push(home.join(".conda/envs"));
    }
    if let Some(root) = &found.root {
        found.envs_dirs.insert(0, root.join("envs"));
    }
    // The `envs/` of a well-known install folder counts even without a root
    // install there: containers mount one env alone at /opt/conda/envs/NAME.
    for envs in known.iter().map(|root| root.join("envs")) {
        if envs.is_dir() && !found.envs_dirs.contains(&envs) {
            found.envs_dirs.push(envs);
        }
    }
}

/// A Conda root prefix: an environment that holds Conda itself.
fn is_root(prefix: &Path) -> bool {
    prefix.join("conda-meta").is_dir()
        && (prefix.join("condabin").is_dir() || prefix.join("envs").is_dir())
}

fn strings(value: Option<&Value>) -> Vec<PathBuf> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Run `conda ARGS` (no shell, bounded by `timeout`) and parse its JSON.
async fn conda_json(conda: &Path, args: &[&str], timeout: Duration) -> Result<Value, String> {
    let child = tokio::process::Command::new(conda)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("unreadable JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(path: &Path) {
        std::fs::create_dir_all(path.join("conda-meta")).unwrap();
    }

    #[tokio::test]
    async fn without_conda_reads_environments_txt_and_root_envs() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let root = home.join("miniforge3");
        env(&root);
        std::fs::create_dir_all(root.join("condabin")).unwrap();
        env(&root.join("envs/ml"));
        let elsewhere = dir.path().join("projects/tools");
        env(&elsewhere);
        std::fs::create_dir_all(home.join(".conda")).unwrap();
        std::fs::write(
            home.join(".conda/environments.txt"),
            format!(
                "{}\n{}\n/does/not/exist\n",
                root.display(),
                elsewhere.display()
            ),
        )
        .unwrap();
        let host = HostEnv {
            home: Some(home),
            ..HostEnv::default()
        };
        let found = discover(&host, Duration::from_secs(5)).await;
        assert_eq!(found.conda, None);
        let root = root.canonicalize().unwrap();
        assert_eq!(found.root.as_ref(), Some(&root));
        assert_eq!(
            found.prefixes,
            vec![
                root.clone(),
                root.join("envs/ml"),
                elsewhere.canonicalize().unwrap()
            ]
        );
    }

    #[tokio::test]
    async fn an_env_mounted_alone_under_a_known_install_folder_is_found() {
        // As `docker run -v ENV:/opt/conda/envs/target_env` lays it out: no
        // conda-meta/ at /opt/conda, only the env.
        let dir = tempfile::tempdir().unwrap();
        let opt = dir.path().join("opt");
        env(&opt.join("conda/envs/target_env"));
        std::fs::create_dir_all(opt.join("miniforge3/envs/not-an-env")).unwrap();
        let host = HostEnv {
            conda_install_dirs: vec![opt.clone()],
            ..HostEnv::default()
        };
        let found = discover(&host, Duration::from_secs(5)).await;
        assert_eq!(found.root, None);
        let envs = opt.join("conda/envs");
        assert_eq!(
            found.envs_dirs,
            vec![opt.join("miniforge3/envs"), envs.clone()],
            "in the order of the known names"
        );
        assert_eq!(
            found.prefixes,
            vec![envs.join("target_env").canonicalize().unwrap()]
        );
        // Without the install folder it is not looked for.
        let found = discover(&HostEnv::default(), Duration::from_secs(5)).await;
        assert!(found.prefixes.is_empty(), "{:?}", found.prefixes);
    }
}
