//! Python environments: what an environment is, how the configured one is
//! resolved, and the variables its workers start with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::error::ConfigError;

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

/// One environment the server can run code in.
#[derive(Debug, Clone)]
pub struct EnvSpec {
    /// Name used in requests: `base`, the prefix's folder name, or `default`.
    pub name: String,
    /// The environment's prefix (`sys.prefix` of its interpreter).
    pub prefix: PathBuf,
    /// The interpreter workers run.
    pub python: PathBuf,
    pub kind: EnvKind,
    /// Variables an activated shell would have, beyond the allowlist.
    pub activation: HashMap<String, String>,
}

/// How the operator chose the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvChoice {
    /// `--python PATH`: any interpreter.
    Python(PathBuf),
    /// `--conda-prefix PATH`: a Conda environment's prefix.
    CondaPrefix(PathBuf),
    /// Nothing given: the active Conda env, else `python3` on `PATH`.
    Default,
}

/// Variables of the server's own environment that workers may see. Nothing
/// else is passed on: the server's secrets (its tokens above all) stay out.
const ALLOWED_VARS: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSL_CERT_FILE"];

impl EnvSpec {
    /// Resolve the operator's choice to a concrete environment.
    pub fn resolve(choice: &EnvChoice) -> Result<EnvSpec, ConfigError> {
        match choice {
            EnvChoice::Python(python) => Self::from_interpreter(python, None),
            EnvChoice::CondaPrefix(prefix) => Self::from_prefix(prefix),
            EnvChoice::Default => match std::env::var_os("CONDA_PREFIX") {
                Some(prefix) if !prefix.is_empty() => Self::from_prefix(Path::new(&prefix)),
                _ => Self::from_interpreter(Path::new("python3"), Some("default")),
            },
        }
    }

    /// A Conda prefix: its interpreter is `bin/python`, its name the folder's.
    pub fn from_prefix(prefix: &Path) -> Result<EnvSpec, ConfigError> {
        let prefix = prefix
            .canonicalize()
            .map_err(|e| ConfigError::NoInterpreter(format!("prefix {}: {e}", prefix.display())))?;
        let python = ["python", "python3"]
            .iter()
            .map(|n| prefix.join("bin").join(n))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                ConfigError::NoInterpreter(format!("prefix {} has no bin/python", prefix.display()))
            })?;
        let kind = kind_of(&prefix);
        Ok(EnvSpec {
            name: name_of(&prefix),
            activation: activation_vars(&prefix, kind, &name_of(&prefix)),
            prefix,
            python,
            kind,
        })
    }

    /// Any interpreter: ask it for its real executable and prefix (this also
    /// sees through launcher shims such as pyenv's).
    pub fn from_interpreter(python: &Path, name: Option<&str>) -> Result<EnvSpec, ConfigError> {
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
        let kind = kind_of(&prefix);
        let name = name.map(str::to_string).unwrap_or_else(|| name_of(&prefix));
        Ok(EnvSpec {
            activation: activation_vars(&prefix, kind, &name),
            name,
            python: PathBuf::from(exe),
            prefix,
            kind,
        })
    }
}

fn kind_of(prefix: &Path) -> EnvKind {
    if prefix.join("conda-meta").is_dir() {
        EnvKind::Conda
    } else if prefix.join("pyvenv.cfg").is_file() {
        EnvKind::Venv
    } else {
        EnvKind::Python
    }
}

/// Conda's naming: the prefix's last path component.
fn name_of(prefix: &Path) -> String {
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
        let spec = EnvSpec::from_prefix(&prefix).unwrap();
        assert_eq!(spec.name, "target_env");
        assert_eq!(spec.kind, EnvKind::Conda);
        assert_eq!(spec.activation["CONDA_DEFAULT_ENV"], "target_env");
        assert!(
            spec.activation["PATH"].starts_with(&format!("{}", spec.prefix.join("bin").display()))
        );
    }

    #[test]
    fn prefix_without_interpreter_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = EnvSpec::from_prefix(dir.path()).unwrap_err();
        assert!(err.to_string().contains("no bin/python"), "{err}");
    }
}
