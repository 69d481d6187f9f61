//! Python environments: what an environment is, how the ones the server can
//! use are found and named, and the variables their workers start with.
//!
//! * [`discover`]: finding Conda and its environments, as `conda env list` does.
//! * [`activate`]: the variables `conda activate` would set, scripts included.
//! * [`registry`]: configured + discovered environments, named without clashes.
//! * [`packages`]: listing installed distributions and checking install specs.
//! * [`install`]: the installer commands (pip, uv, conda; never a shell).
//! * [`lifecycle`]: facts read from disk (Python version, platform,
//!   `env_hash`), rescan fingerprints, Conda-free clones.

pub(crate) mod activate;
pub(crate) mod discover;
pub(crate) mod install;
pub(crate) mod lifecycle;
pub(crate) mod packages;
pub(crate) mod registry;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Serialize;

use crate::error::ConfigError;

pub use registry::{EnvConfig, EnvSettings};
pub(crate) use registry::{Registry, RegistryConfig};

/// The name an environment is served under now, shared by everything that
/// names it after the fact (its sessions, their audit records): a rescan
/// that serves it under another name (a clash resolved anew) sets it once,
/// and they all show the new name. Read only where a name is shown, never
/// on a call's path.
#[derive(Debug, Clone)]
pub(crate) struct ServedName(Arc<RwLock<Arc<str>>>);

impl ServedName {
    pub(crate) fn new(name: &str) -> ServedName {
        ServedName(Arc::new(RwLock::new(Arc::from(name))))
    }

    /// The name now.
    pub(crate) fn get(&self) -> Arc<str> {
        self.0.read().clone()
    }

    /// Serve under `name` from now on.
    pub(crate) fn set(&self, name: &str) {
        *self.0.write() = Arc::from(name);
    }
}

/// What kind of prefix an environment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvKind {
    /// A Conda prefix (has `conda-meta/`).
    Conda,
    /// A virtual environment (has `pyvenv.cfg`).
    Venv,
    /// Any other interpreter.
    Python,
}

impl EnvKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EnvKind::Conda => "conda",
            EnvKind::Venv => "venv",
            EnvKind::Python => "python",
        }
    }
}

/// One environment the server can run code in.
#[derive(Debug, Clone)]
pub struct EnvSpec {
    /// Name used in requests: `base`, the prefix's folder name, or `default`.
    pub name: String,
    /// The environment's prefix (`sys.prefix` of its interpreter).
    pub prefix: PathBuf,
    /// The interpreter workers run.
    pub python: PathBuf,
    /// Conda prefix, venv or plain interpreter.
    pub kind: EnvKind,
    /// Variables an activated shell would have, beyond the allowlist
    /// (before the env's `activate.d` scripts ran; see [`activate`]).
    pub activation: HashMap<String, String>,
}

/// How the operator chose the default environment on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvChoice {
    /// `--python PATH`: any interpreter.
    Python(PathBuf),
    /// `--conda-prefix PATH`: a Conda environment's prefix.
    CondaPrefix(PathBuf),
    /// `--conda-env NAME`: a discovered Conda environment, by name.
    CondaEnv(String),
    /// Nothing given: the active Conda env, else Conda's base env, else
    /// `python3` on `PATH`.
    Default,
}

/// What configuration and discovery read from the server's own environment.
/// Captured once (see [`HostEnv::from_process`]) so that tests can pass their
/// own instead of changing the test process's variables.
#[derive(Debug, Clone, Default)]
pub struct HostEnv {
    /// `PATH`, searched for `conda`/`mamba`/`micromamba` and `python3`.
    pub path: Option<OsString>,
    /// `CONDA_EXE`: the Conda the user's shell was set up with.
    pub conda_exe: Option<PathBuf>,
    /// `CONDA_PREFIX`: the active Conda environment.
    pub conda_prefix: Option<PathBuf>,
    /// `HOME`: where `~/.conda/environments.txt` lives.
    pub home: Option<PathBuf>,
    /// Folders where Conda installs are looked for by their usual names
    /// (`/opt`: `/opt/conda`, `/opt/miniforge3`, ...), besides `HOME`.
    pub conda_install_dirs: Vec<PathBuf>,
    /// The variables that choose the default environment, below the flags.
    pub env_vars: EnvVars,
    /// The config file read when neither `--config` nor
    /// `CODE_EXECUTOR_CONFIG` names one and it exists
    /// (`/etc/code-executor/config.toml`).
    pub system_config: Option<PathBuf>,
    /// `CODE_EXECUTOR_DEFAULTS`: a TOML file of defaults beneath the config
    /// file (a container image's own settings).
    pub defaults_file: Option<PathBuf>,
}

/// The variables that choose the default environment; empty values count as
/// unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvVars {
    /// `CODE_EXECUTOR_CONDA_ENV`
    pub conda_env: Option<String>,
    /// `CODE_EXECUTOR_CONDA_PREFIX`
    pub conda_prefix: Option<PathBuf>,
    /// `CODE_EXECUTOR_PYTHON`
    pub python: Option<PathBuf>,
    /// `CONDA_ENV_NAME`: the name the seed's `docker run` line passes.
    pub conda_env_name: Option<String>,
}

/// Where a host keeps its own config file for the server.
pub(crate) const SYSTEM_CONFIG: &str = "/etc/code-executor/config.toml";

impl HostEnv {
    /// The values of the server process's own environment.
    pub fn from_process() -> HostEnv {
        let text = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        HostEnv {
            path: std::env::var_os("PATH"),
            conda_exe: path("CONDA_EXE"),
            conda_prefix: path("CONDA_PREFIX"),
            home: path("HOME"),
            conda_install_dirs: vec![PathBuf::from("/opt")],
            env_vars: EnvVars {
                conda_env: text("CODE_EXECUTOR_CONDA_ENV"),
                conda_prefix: path("CODE_EXECUTOR_CONDA_PREFIX"),
                python: path("CODE_EXECUTOR_PYTHON"),
                conda_env_name: text("CONDA_ENV_NAME"),
            },
            system_config: Some(PathBuf::from(SYSTEM_CONFIG)),
            defaults_file: path("CODE_EXECUTOR_DEFAULTS"),
        }
    }

    /// The first executable file called `name` in `PATH`.
    pub fn which(&self, name: &str) -> Option<PathBuf> {
        let path = self.path.as_ref()?;
        std::env::split_paths(path)
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Variables of the server's own environment that workers may see. Nothing
/// else is passed on: the server's secrets (its tokens above all) stay out.
const ALLOWED_VARS: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSL_CERT_FILE"];

impl EnvSpec {
    /// A prefix: its interpreter is `bin/python` (or `bin/python3`), its name
    /// the folder's unless `name` is given.
    pub fn from_prefix(prefix: &Path, name: Option<&str>) -> Result<EnvSpec, ConfigError> {
        let prefix = prefix
            .canonicalize()
            .map_err(|e| ConfigError::NoInterpreter(format!("prefix {}: {e}", prefix.display())))?;
        let python = python_in(&prefix).ok_or_else(|| {
            ConfigError::NoInterpreter(format!("prefix {} has no bin/python", prefix.display()))
        })?;
        let name = name.map(str::to_string).unwrap_or_else(|| name_of(&prefix));
        Ok(EnvSpec::new(name, prefix, python))
    }

    /// Any interpreter: its prefix from its layout when that says it as
    /// Python would (see [`EnvSpec::from_layout`]), else asked from the
    /// interpreter itself, which also sees through launcher shims such as
    /// pyenv's.
    pub fn from_interpreter(python: &Path, name: Option<&str>) -> Result<EnvSpec, ConfigError> {
        if let Some(spec) = EnvSpec::from_layout(python, name) {
            return Ok(spec);
        }
        let out = Command::new(python)
            .args([
                "-I",
                "-c",
                "import sys; print(sys.executable); print(sys.prefix)",
            ])
            .output()
            .map_err(|e| ConfigError::NoInterpreter(format!("{}: {e}", python.display())))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        let (Some(exe), Some(prefix), true) = (lines.next(), lines.next(), out.status.success())
        else {
            return Err(ConfigError::NoInterpreter(format!(
                "{} did not run: {}",
                python.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        };
        let prefix = PathBuf::from(prefix);
        let prefix = prefix.canonicalize().unwrap_or(prefix);
        let name = name.map(str::to_string).unwrap_or_else(|| name_of(&prefix));
        Ok(EnvSpec::new(name, prefix, PathBuf::from(exe)))
    }

    /// An interpreter binary (not a launcher script) at `PREFIX/bin/NAME`
    /// whose `PREFIX` carries the landmark Python finds its prefix by: a
    /// venv's `pyvenv.cfg`, or the standard library's
    /// `lib/pythonX.Y/os.py`. Its prefix is then `PREFIX` and its executable
    /// the path given, as `sys.prefix` and `sys.executable` would say, with
    /// no interpreter started (a cold start saves one Python start).
    fn from_layout(python: &Path, name: Option<&str>) -> Option<EnvSpec> {
        use std::io::Read;
        if !python.is_absolute() {
            return None;
        }
        let mut magic = [0u8; 4];
        std::fs::File::open(python)
            .ok()?
            .read_exact(&mut magic)
            .ok()?;
        if &magic != b"\x7fELF" {
            return None; // a shim or wrapper script: only running it tells
        }
        let bin = python.parent()?;
        if bin.file_name()? != "bin" {
            return None;
        }
        let prefix = bin.parent()?;
        let venv = prefix.join("pyvenv.cfg").is_file();
        let stdlib = || {
            std::fs::read_dir(prefix.join("lib"))
                .ok()
                .is_some_and(|entries| {
                    entries.flatten().any(|e| {
                        e.file_name().to_string_lossy().starts_with("python3")
                            && e.path().join("os.py").is_file()
                    })
                })
        };
        if !venv && !stdlib() {
            return None;
        }
        let prefix = prefix.canonicalize().ok()?;
        let name = name.map(str::to_string).unwrap_or_else(|| name_of(&prefix));
        Some(EnvSpec::new(name, prefix, python.to_path_buf()))
    }

    fn new(name: String, prefix: PathBuf, python: PathBuf) -> EnvSpec {
        let kind = kind_of(&prefix);
        EnvSpec {
            activation: activation_vars(&prefix, kind, &name),
            name,
            prefix,
            python,
            kind,
        }
    }

    /// Give the environment another name (clash resolution); the activation
    /// variables follow.
    pub fn rename(&mut self, name: String) {
        if self.kind == EnvKind::Conda {
            self.activation
                .insert("CONDA_DEFAULT_ENV".into(), name.clone());
            self.activation
                .insert("CONDA_PROMPT_MODIFIER".into(), format!("({name}) "));
        }
        self.name = name;
    }

    /// The Python version, read from the prefix without running anything:
    /// Conda's `conda-meta/python-X.Y.Z-*.json` or a venv's `pyvenv.cfg`.
    pub fn python_version_hint(&self) -> Option<String> {
        if let Ok(entries) = std::fs::read_dir(self.prefix.join("conda-meta")) {
            for entry in entries.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                if let Some(rest) = file.strip_prefix("python-")
                    && file.ends_with(".json")
                    && let Some(version) = rest.split('-').next()
                    && version.starts_with(|c: char| c.is_ascii_digit())
                {
                    return Some(version.to_string());
                }
            }
        }
        let cfg = std::fs::read_to_string(self.prefix.join("pyvenv.cfg")).ok()?;
        cfg.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            matches!(key.trim(), "version" | "version_info").then(|| value.trim().to_string())
        })
    }
}

/// `bin/python` or `bin/python3` of a prefix.
pub(crate) fn python_in(prefix: &Path) -> Option<PathBuf> {
    ["python", "python3"]
        .iter()
        .map(|n| prefix.join("bin").join(n))
        .find(|p| p.is_file())
}

pub(crate) fn kind_of(prefix: &Path) -> EnvKind {
    if prefix.join("conda-meta").is_dir() {
        EnvKind::Conda
    } else if prefix.join("pyvenv.cfg").is_file() {
        EnvKind::Venv
    } else {
        EnvKind::Python
    }
}

/// Conda's naming: the prefix's last path component.
pub(crate) fn name_of(prefix: &Path) -> String {
    prefix
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "default".into())
}

/// The variables `conda activate` (or a venv's `activate`) sets, plus the
/// allowlisted variables of the server's own environment.
fn activation_vars(prefix: &Path, kind: EnvKind, name: &str) -> HashMap<String, String> {
    let mut vars: HashMap<String, String> = ALLOWED_VARS
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    vars.entry("LANG".into())
        .or_insert_with(|| "C.UTF-8".into());
    let bin = prefix.join("bin");
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display());
    vars.insert("PATH".into(), path);
    match kind {
        EnvKind::Conda => {
            vars.insert("CONDA_PREFIX".into(), prefix.display().to_string());
            vars.insert("CONDA_DEFAULT_ENV".into(), name.to_string());
            vars.insert("CONDA_SHLVL".into(), "1".into());
            vars.insert("CONDA_PROMPT_MODIFIER".into(), format!("({name}) "));
        }
        EnvKind::Venv => {
            vars.insert("VIRTUAL_ENV".into(), prefix.display().to_string());
        }
        EnvKind::Python => {}
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conda_prefix_is_named_by_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("target_env");
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
        std::fs::write(prefix.join("bin/python"), "").unwrap();
        std::fs::write(prefix.join("conda-meta/python-3.12.1-h1_0.json"), "{}").unwrap();
        let spec = EnvSpec::from_prefix(&prefix, None).unwrap();
        assert_eq!(spec.name, "target_env");
        assert_eq!(spec.kind, EnvKind::Conda);
        assert_eq!(spec.activation["CONDA_DEFAULT_ENV"], "target_env");
        assert!(
            spec.activation["PATH"].starts_with(&format!("{}", spec.prefix.join("bin").display()))
        );
        assert_eq!(spec.python_version_hint().as_deref(), Some("3.12.1"));
    }

    #[test]
    fn prefix_without_interpreter_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = EnvSpec::from_prefix(dir.path(), None).unwrap_err();
        assert!(err.to_string().contains("no bin/python"), "{err}");
    }

    #[test]
    fn which_searches_the_given_path_only() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("conda");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        let host = HostEnv {
            path: Some(dir.path().as_os_str().to_owned()),
            ..HostEnv::default()
        };
        assert_eq!(host.which("conda"), None, "not executable yet");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(host.which("conda"), Some(exe));
        assert_eq!(HostEnv::default().which("conda"), None);
    }
}
