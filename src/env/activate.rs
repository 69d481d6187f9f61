//! Activation as `conda activate` does it: on top of the variables Conda
//! itself sets (see [`super::EnvSpec::activation`]), source the env's
//! `etc/conda/activate.d/*.sh` scripts in order and keep what they changed.
//!
//! The scripts run once per environment, in `bash` with nothing but the
//! activation variables, bounded by a timeout; `env -0` then dumps the
//! resulting environment, which is diffed against the input.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Stderr kept to explain a failed activation.
const STDERR_LIMIT: usize = 4096;

/// Sources every script given as an argument (its stdout goes to stderr so
/// that only `env -0` writes to stdout), stops at the first failing one.
const ACTIVATE_SCRIPT: &str = r#"for __ce_script in "$@"; do
  . "$__ce_script" 1>&2 || { __ce_status=$?; echo "activation script $__ce_script failed with exit status $__ce_status" 1>&2; exit $__ce_status; }
done
exec env -0"#;

/// Variables bash itself maintains; never part of an activation.
const SHELL_VARS: &[&str] = &["_", "PWD", "OLDPWD", "SHLVL"];

/// The env's `etc/conda/activate.d/*.sh`, in the order Conda runs them.
pub(crate) fn activation_scripts(prefix: &Path) -> Vec<PathBuf> {
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(prefix.join("etc/conda/activate.d"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sh") && p.is_file())
                .collect()
        })
        .unwrap_or_default();
    scripts.sort();
    scripts
}

/// `base` plus what the prefix's activation scripts export (and minus what
/// they unset). Without scripts, `base` as it is. The error is what the
/// user needs to fix the env: the failing script's stderr.
pub(crate) async fn activate(
    prefix: &Path,
    base: &HashMap<String, String>,
    timeout: Duration,
) -> Result<HashMap<String, String>, String> {
    let scripts = activation_scripts(prefix);
    if scripts.is_empty() {
        return Ok(base.clone());
    }
    let child = tokio::process::Command::new("/bin/bash")
        .args(["--noprofile", "--norc", "-c", ACTIVATE_SCRIPT, "activate"])
        .args(&scripts)
        .env_clear()
        .envs(base)
        .current_dir(prefix)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run the activation scripts with /bin/bash: {e}"))?;
    let pid = child.id().unwrap_or(0);
    let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(out) => out.map_err(|e| format!("error running the activation scripts: {e}"))?,
        Err(_) => {
            crate::worker::kill_process_tree(pid);
            return Err(format!(
                "activation scripts in {} did not finish within {timeout:?}",
                prefix.join("etc/conda/activate.d").display()
            ));
        }
    };
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if stderr.len() > STDERR_LIMIT {
            let cut = stderr.ceil_char_boundary(stderr.len() - STDERR_LIMIT);
            stderr.replace_range(..cut, "…");
        }
        return Err(format!("activation failed ({}): {stderr}", out.status));
    }
    let mut vars: HashMap<String, String> = out
        .stdout
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let entry = String::from_utf8_lossy(entry);
            let (k, v) = entry.split_once('=')?;
            (!k.is_empty() && !SHELL_VARS.contains(&k)).then(|| (k.to_string(), v.to_string()))
        })
        .collect();
    // Bash exports variables it was not given (PWD, SHLVL, _); keep ours.
    for key in SHELL_VARS {
        match base.get(*key) {
            Some(v) => vars.insert(key.to_string(), v.clone()),
            None => vars.remove(*key),
        };
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix_with(scripts: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("etc/conda/activate.d");
        std::fs::create_dir_all(&d).unwrap();
        for (name, body) in scripts {
            std::fs::write(d.join(name), body).unwrap();
        }
        dir
    }

    fn base() -> HashMap<String, String> {
        HashMap::from([
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ("GONE".to_string(), "x".to_string()),
        ])
    }

    #[tokio::test]
    async fn scripts_run_in_order_and_their_exports_are_kept() {
        let dir = prefix_with(&[
            (
                "10-b.sh",
                "export ORDER=\"$ORDER b\"\nunset GONE\necho chatter\n",
            ),
            ("00-a.sh", "export ORDER=a\nexport PATH=\"/opt/x:$PATH\"\n"),
            ("ignored.txt", "exit 1"),
        ]);
        let vars = activate(dir.path(), &base(), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(vars["ORDER"], "a b");
        assert_eq!(vars["PATH"], "/opt/x:/usr/bin:/bin");
        assert!(!vars.contains_key("GONE"));
        assert!(!vars.contains_key("SHLVL") && !vars.contains_key("PWD"));
    }

    #[tokio::test]
    async fn a_failing_script_reports_its_stderr() {
        let dir = prefix_with(&[("broken.sh", "echo 'cannot find libfoo' >&2\nfalse\n")]);
        let err = activate(dir.path(), &base(), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(err.contains("cannot find libfoo"), "{err}");
        assert!(err.contains("broken.sh"), "{err}");
    }

    #[tokio::test]
    async fn a_long_stderr_keeps_its_end_cut_at_a_character_boundary() {
        // 3000 two-byte characters: the cut falls inside one of them.
        let dir = prefix_with(&[(
            "loud.sh",
            "printf 'start' >&2\nfor i in $(seq 3000); do printf 'é' >&2; done\nprintf 'the end' >&2\nfalse\n",
        )]);
        let err = activate(dir.path(), &base(), Duration::from_secs(10))
            .await
            .unwrap_err();
        let stderr = err.split_once("): ").unwrap().1;
        assert!(stderr.starts_with('…'), "{}", &stderr[..20]);
        assert!(!stderr.contains("start"));
        assert!(stderr.contains("éthe endactivation script"), "{err}");
        assert!(
            stderr.ends_with("loud.sh failed with exit status 1"),
            "{err}"
        );
        assert!(
            stderr.len() - '…'.len_utf8() <= STDERR_LIMIT,
            "{}",
            stderr.len()
        );
    }

    #[tokio::test]
    async fn a_hanging_script_is_bounded() {
        let dir = prefix_with(&[("slow.sh", "sleep 30\n")]);
        let err = activate(dir.path(), &base(), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(err.contains("did not finish"), "{err}");
    }
}
