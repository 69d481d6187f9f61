//! What an environment is on disk, read without starting it: its Python
//! version and platform, its content hash (`env_hash`), and the fingerprint
//! of the places discovery looks at, which tells a rescan is due. Also the
//! Conda-free clone of a prefix (`conda create --clone` without Conda).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::EnvSpec;

/// An environment's Python version and platform, as `/list-envs` shows
/// them; read when the environment is found, and again when its
/// `conda-meta` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvFacts {
    /// `3.11.7` (or `3.11` when only the layout tells), when known.
    pub(crate) python_version: Option<String>,
    /// Conda's name of the platform: `linux-64`, `linux-aarch64`, `osx-arm64`.
    pub(crate) platform: String,
}

/// Conda's platform name (`subdir`) of this host.
pub(crate) fn host_platform() -> String {
    let os = match std::env::consts::OS {
        "macos" => "osx",
        "windows" => "win",
        other => other,
    };
    let arch = match (std::env::consts::OS, std::env::consts::ARCH) {
        (_, "x86_64") => "64",
        (_, "x86") => "32",
        ("macos", "aarch64") => "arm64",
        (_, "powerpc64") => "ppc64le",
        (_, other) => other,
    };
    format!("{os}-{arch}")
}

/// The Python version and platform of an environment, in this order of
/// sources: Conda's `conda-meta/python-X.Y.Z-*.json` (its `subdir` is the
/// platform), a venv's `pyvenv.cfg`, the layout's `lib/pythonX.Y/`, and only
/// then one run of the interpreter, remembered by its path and modification
/// time so that it never runs twice for the same binary.
pub(crate) async fn facts(spec: &EnvSpec) -> EnvFacts {
    let platform = conda_python_record(&spec.prefix)
        .and_then(|r| r.get("subdir").and_then(|s| s.as_str()).map(str::to_string))
        .filter(|s| !s.is_empty() && s != "noarch")
        .unwrap_or_else(host_platform);
    let python_version = match spec
        .python_version_hint()
        .or_else(|| layout_version(&spec.prefix))
    {
        Some(v) => Some(v),
        None => probed_version(&spec.python).await,
    };
    EnvFacts {
        python_version,
        platform,
    }
}

/// The `python` package record of a Conda prefix.
fn conda_python_record(prefix: &Path) -> Option<serde_json::Value> {
    let entries = std::fs::read_dir(prefix.join("conda-meta")).ok()?;
    let path = entries.flatten().map(|e| e.path()).find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python-3") && n.ends_with(".json"))
    })?;
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// `X.Y` of the one `lib/pythonX.Y/` holding a standard library (`os.py`).
fn layout_version(prefix: &Path) -> Option<String> {
    let mut found: Vec<String> = std::fs::read_dir(prefix.join("lib"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix("python")?.to_string();
            let numeric = version.split('.').count() == 2
                && version.split('.').all(|p| p.parse::<u32>().is_ok());
            (numeric && e.path().join("os.py").exists()).then_some(version)
        })
        .collect();
    (found.len() == 1).then(|| found.remove(0))
}

/// Versions probed so far, by interpreter path and modification time.
type ProbeCache = parking_lot::Mutex<HashMap<(PathBuf, Option<SystemTime>), Option<String>>>;

/// `platform.python_version()` of an interpreter, run at most once per
/// binary (path and modification time); bounded to 10 s.
async fn probed_version(python: &Path) -> Option<String> {
    static CACHE: OnceLock<ProbeCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mtime = std::fs::metadata(python).and_then(|m| m.modified()).ok();
    let key = (python.to_path_buf(), mtime);
    if let Some(known) = cache.lock().get(&key) {
        return known.clone();
    }
    let version = super::registry::probe_version(python).await;
    cache.lock().insert(key, version.clone());
    version
}

/// The content hash of an environment: SHA-256 over its interpreter's
/// version, the names of its Conda package records (`conda-meta/*.json`:
/// name, version and build) and the names of the distributions in its
/// `site-packages` (`NAME-VERSION.dist-info` / `.egg-info`), each list
/// sorted. An install changes it; runs, restarts and rescans do not.
/// Read from the directory listings only: no interpreter starts.
pub(crate) fn env_hash(prefix: &Path, python_version: Option<&str>) -> String {
    let mut lines = vec![format!("python {}", python_version.unwrap_or("?"))];
    let mut records: Vec<String> = list(&prefix.join("conda-meta"))
        .into_iter()
        .filter_map(|n| n.strip_suffix(".json").map(|s| format!("conda {s}")))
        .collect();
    records.sort();
    lines.extend(records);
    let mut dists: Vec<String> = site_packages(prefix)
        .iter()
        .flat_map(|dir| list(dir))
        .filter_map(|n| {
            let stem = n
                .strip_suffix(".dist-info")
                .or_else(|| n.strip_suffix(".egg-info"))?;
            Some(format!(
                "dist {}",
                stem.to_ascii_lowercase().replace('_', "-")
            ))
        })
        .collect();
    dists.sort();
    dists.dedup();
    lines.extend(dists);
    let digest = Sha256::digest(lines.join("\n").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Names in a directory (empty when it cannot be read).
fn list(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `lib/pythonX.Y/site-packages` folders of a prefix (and `lib64`'s).
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        for name in list(&prefix.join(lib)) {
            if name.starts_with("python") {
                let dir = prefix.join(lib).join(&name).join("site-packages");
                if dir.is_dir() {
                    out.push(dir);
                }
            }
        }
    }
    out
}

/// What discovery looks at, as of now: the modification time and size of
/// each watched path (`environments.txt`, the `envs/` folders, each found
/// prefix's `conda-meta/` and `conda-meta/history`), `None` where it is
/// missing. Two equal fingerprints mean nothing discovery reads has
/// changed; a few `stat`s, cheap enough to take every few seconds.
pub(crate) fn fingerprint(paths: &[PathBuf]) -> Stamp {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// What a Conda prefix's records look like now: the fingerprint of
/// `conda-meta/` (a package record added or removed) and of
/// `conda-meta/history` (a transaction written). Conda writes them after a
/// package's files, activation scripts included, so a stamp that moved
/// since an environment was read means Conda changed it meanwhile: a
/// `conda create` still filling it when it was found, an install.
pub(crate) fn conda_meta_stamp(prefix: &Path) -> Stamp {
    fingerprint(&conda_meta_paths(prefix))
}

/// The paths [`conda_meta_stamp`] reads.
pub(crate) fn conda_meta_paths(prefix: &Path) -> [PathBuf; 2] {
    [prefix.join("conda-meta"), prefix.join("conda-meta/history")]
}

/// A [`fingerprint`].
pub(crate) type Stamp = Vec<Option<(SystemTime, u64)>>;

/// A new environment's name: letters, digits, `.`, `_`, `-`, starting
/// with a letter or digit, at most 64 characters (a folder name that is
/// never an option, never hidden and never a path).
pub(crate) fn check_env_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "environment name {name:?} is refused: use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 characters"
        ))
    }
}

/// What a Conda-free clone did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyStats {
    /// Files hard-linked to the source's.
    pub(crate) linked: u64,
    /// Files copied (another file system, or text naming the source prefix).
    pub(crate) copied: u64,
    /// Symbolic links recreated.
    pub(crate) symlinks: u64,
}

/// Folders of a Conda root that belong to the installation, not to its
/// `base` environment.
const ROOT_ONLY: &[&str] = &["envs", "pkgs", "condabin", "conda-bld"];

/// Why deleting an environment's prefix would take more than that
/// environment with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Undeletable {
    /// Conda's root installation: discovery named it the root, or it has a
    /// root's own folders ([`ROOT_ONLY`]: `envs/`, `pkgs/`, `condabin/`,
    /// `conda-bld/`), which no environment made by `conda create` has.
    Root,
    /// Another environment's prefix (this one, canonical) lies inside it.
    Holds(PathBuf),
}

/// Whether `prefix` must never be deleted, and why. `roots` are the
/// prefixes discovery named Conda's root; `others` every other prefix known
/// to hold an environment (served ones, `environments.txt` lines). Paths
/// are compared canonical; `prefix` itself among `others` does not count.
/// Environments nobody listed are looked for too: the whole tree is walked
/// (as deleting it would), so call it off the async threads.
pub(crate) fn undeletable(
    prefix: &Path,
    roots: &[PathBuf],
    others: &[PathBuf],
) -> Option<Undeletable> {
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let prefix = canonical(prefix);
    if roots.iter().any(|r| canonical(r) == prefix)
        || ROOT_ONLY.iter().any(|d| prefix.join(d).is_dir())
    {
        return Some(Undeletable::Root);
    }
    // A listed prefix that no longer exists (a stale `environments.txt`
    // line) holds nothing to lose.
    others
        .iter()
        .chain(roots)
        .filter(|p| p.exists())
        .map(|p| canonical(p))
        .find(|p| *p != prefix && p.starts_with(&prefix))
        .or_else(|| nested_env(&prefix))
        .map(Undeletable::Holds)
}

/// The symbolic links an environment is reached through: entries of the
/// `envs_dirs` folders and paths `listed` in `environments.txt` that are
/// links resolving to `prefix` (canonical). Deleting the environment
/// removes them with it, each as a link: none is followed.
pub(crate) fn links_to(prefix: &Path, envs_dirs: &[PathBuf], listed: &[PathBuf]) -> Vec<PathBuf> {
    let mut links: Vec<PathBuf> = envs_dirs
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|entry| entry.path())
        .chain(listed.iter().cloned())
        .filter(|p| {
            std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
                && p.canonicalize().is_ok_and(|target| target == prefix)
        })
        .collect();
    links.sort();
    links.dedup();
    links
}

/// The first folder below `prefix` that is an environment of its own: a
/// Conda prefix (`conda-meta/history`) or a venv (`pyvenv.cfg` beside
/// `bin/python`). Symbolic links are not followed.
fn nested_env(prefix: &Path) -> Option<PathBuf> {
    let mut stack = vec![prefix.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            let conda = path.join("conda-meta/history").is_file();
            let venv = path.join("pyvenv.cfg").is_file() && super::python_in(&path).is_some();
            if conda || venv {
                return Some(path);
            }
            stack.push(path);
        }
    }
    None
}

/// Largest file whose text is searched for the source prefix (scripts,
/// `.pth` files, configs); larger ones are linked as they are.
const MAX_REWRITE_BYTES: u64 = 1 << 20;

/// Copy the prefix `src` to `dst` as `conda create --clone` lays it out:
/// directories made, symbolic links recreated (a link into `src` pointing
/// into `dst`), text files naming `src` (script shebangs, `.pth` files,
/// `conda-meta` records) copied with `dst` in its place, every other file
/// hard-linked where the file system allows and copied where it does not.
/// `conda-meta/history` is written anew. A root's own folders (`envs/`,
/// `pkgs/`, `condabin/`) are not part of an environment and are skipped,
/// so a clone of `base` is a plain environment. `dst` must not exist.
pub(crate) fn clone_prefix(src: &Path, dst: &Path) -> std::io::Result<CopyStats> {
    let mut stats = CopyStats::default();
    std::fs::create_dir(dst)?;
    let from = src.as_os_str().as_encoded_bytes();
    let to = dst.as_os_str().as_encoded_bytes();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(src.join(&rel))? {
            let entry = entry?;
            let top = rel.as_os_str().is_empty();
            let rel = rel.join(entry.file_name());
            if top && ROOT_ONLY.iter().any(|n| rel == Path::new(n)) {
                continue;
            }
            let (source, target) = (src.join(&rel), dst.join(&rel));
            if source == dst {
                continue;
            }
            let kind = entry.file_type()?;
            if kind.is_symlink() {
                let link = std::fs::read_link(&source)?;
                let link = match link.strip_prefix(src) {
                    Ok(inside) => dst.join(inside),
                    Err(_) => link,
                };
                std::os::unix::fs::symlink(link, &target)?;
                stats.symlinks += 1;
            } else if kind.is_dir() {
                std::fs::create_dir(&target)?;
                std::fs::set_permissions(&target, entry.metadata()?.permissions())?;
                stack.push(rel);
            } else if kind.is_file() {
                if rel == Path::new("conda-meta/history") {
                    continue;
                }
                let meta = entry.metadata()?;
                let rewritten = if meta.len() <= MAX_REWRITE_BYTES {
                    let data = std::fs::read(&source)?;
                    let named = !data.contains(&0) && contains(&data, from);
                    if named {
                        std::fs::write(&target, replace(&data, from, to))?;
                        std::fs::set_permissions(&target, meta.permissions())?;
                    }
                    named
                } else {
                    false
                };
                if rewritten {
                    stats.copied += 1;
                } else if std::fs::hard_link(&source, &target).is_ok() {
                    stats.linked += 1;
                } else {
                    std::fs::copy(&source, &target)?;
                    stats.copied += 1;
                }
            }
        }
    }
    write_history(src, dst)?;
    Ok(stats)
}

/// `conda-meta/history` of a clone: one revision naming the command and
/// every package record (`+channel::name-version-build`), as Conda writes it.
fn write_history(src: &Path, dst: &Path) -> std::io::Result<()> {
    if !dst.join("conda-meta").is_dir() {
        return Ok(());
    }
    let mut records: Vec<String> = list(&dst.join("conda-meta"))
        .into_iter()
        .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
        .collect();
    records.sort();
    let now = humantime_now();
    let mut text = format!(
        "==> {now} <==\n# cmd: code-executor create --clone {} -p {}\n",
        src.display(),
        dst.display()
    );
    for record in records {
        text.push('+');
        text.push_str(&record);
        text.push('\n');
    }
    std::fs::write(dst.join("conda-meta/history"), text)
}

/// Now as Conda's history writes it: `2024-01-31 12:34:56` (UTC).
fn humantime_now() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn replace(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

/// An explicit Conda spec of a prefix (`conda list --explicit`): the
/// `url` of every `conda-meta` record, when every record has one.
pub(crate) fn conda_explicit(prefix: &Path) -> Option<String> {
    let mut urls = Vec::new();
    for name in list(&prefix.join("conda-meta")) {
        if !name.ends_with(".json") {
            continue;
        }
        let text = std::fs::read_to_string(prefix.join("conda-meta").join(&name)).ok()?;
        let record: serde_json::Value = serde_json::from_str(&text).ok()?;
        urls.push(record.get("url")?.as_str()?.to_string());
    }
    if urls.is_empty() {
        return None;
    }
    urls.sort();
    Some(format!(
        "# platform: {}\n@EXPLICIT\n{}\n",
        host_platform(),
        urls.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_follows_the_installed_distributions_only() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path();
        let site = prefix.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
        std::fs::write(prefix.join("conda-meta/python-3.11.7-h0_0.json"), "{}").unwrap();
        std::fs::write(prefix.join("conda-meta/history"), "").unwrap();
        let first = env_hash(prefix, Some("3.11.7"));
        assert!(
            first.starts_with("sha256:") && first.len() == 7 + 64,
            "{first}"
        );
        // Files that are not distributions do not count.
        std::fs::write(site.join("scratch.txt"), "x").unwrap();
        std::fs::create_dir_all(site.join("__pycache__")).unwrap();
        assert_eq!(env_hash(prefix, Some("3.11.7")), first);
        std::fs::create_dir_all(site.join("tiny_pkg-1.0.dist-info")).unwrap();
        let second = env_hash(prefix, Some("3.11.7"));
        assert_ne!(second, first);
        std::fs::remove_dir(site.join("tiny_pkg-1.0.dist-info")).unwrap();
        std::fs::create_dir_all(site.join("tiny_pkg-1.1.dist-info")).unwrap();
        assert_ne!(env_hash(prefix, Some("3.11.7")), second);
        assert_ne!(
            env_hash(prefix, Some("3.12.0")),
            env_hash(prefix, Some("3.11.7"))
        );
    }

    #[test]
    fn the_layout_names_the_version_when_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("lib/python3.12")).unwrap();
        std::fs::write(dir.path().join("lib/python3.12/os.py"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("lib/python-extras")).unwrap();
        assert_eq!(layout_version(dir.path()).as_deref(), Some("3.12"));
        std::fs::create_dir_all(dir.path().join("lib/python3.13")).unwrap();
        std::fs::write(dir.path().join("lib/python3.13/os.py"), "").unwrap();
        assert_eq!(layout_version(dir.path()), None, "two stdlibs: ambiguous");
    }

    #[test]
    fn a_clone_links_files_rewrites_the_prefix_and_writes_its_history() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("bin")).unwrap();
        std::fs::create_dir_all(src.join("conda-meta")).unwrap();
        std::fs::create_dir_all(src.join("lib/python3.11/site-packages")).unwrap();
        std::fs::write(src.join("bin/python"), b"\x7fELF\0binary").unwrap();
        std::fs::write(
            src.join("bin/tool"),
            format!("#!{}/bin/python\nprint(1)\n", src.display()),
        )
        .unwrap();
        std::os::unix::fs::symlink("python", src.join("bin/python3")).unwrap();
        std::os::unix::fs::symlink(src.join("bin/python"), src.join("bin/py-abs")).unwrap();
        std::fs::write(src.join("conda-meta/zlib-1.3-h0_0.json"), "{}").unwrap();
        std::fs::write(src.join("conda-meta/history"), "old").unwrap();
        let dst = dir.path().join("dst");
        let stats = clone_prefix(&src, &dst).unwrap();
        assert_eq!(stats.symlinks, 2);
        assert_eq!(stats.copied, 1, "the script naming the prefix");
        assert_eq!(stats.linked, 2, "the binary and the record");
        let tool = std::fs::read_to_string(dst.join("bin/tool")).unwrap();
        assert_eq!(tool, format!("#!{}/bin/python\nprint(1)\n", dst.display()));
        assert_eq!(
            std::fs::read_link(dst.join("bin/python3")).unwrap(),
            Path::new("python")
        );
        assert_eq!(
            std::fs::read_link(dst.join("bin/py-abs")).unwrap(),
            dst.join("bin/python")
        );
        let history = std::fs::read_to_string(dst.join("conda-meta/history")).unwrap();
        assert!(history.starts_with("==> 20"), "{history}");
        assert!(
            history.contains("# cmd: code-executor create --clone"),
            "{history}"
        );
        assert!(history.ends_with("+zlib-1.3-h0_0\n"), "{history}");
        assert!(
            clone_prefix(&src, &dst).is_err(),
            "the target must not exist"
        );
    }

    #[test]
    fn a_root_or_a_prefix_holding_another_env_is_never_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().canonicalize().unwrap();
        let env = |p: &Path| std::fs::create_dir_all(p.join("conda-meta")).unwrap();
        // A micromamba-style root: no condabin/, no envs/ yet.
        let root = top.join("micromamba");
        env(&root);
        let plain = top.join("plain");
        env(&plain);
        assert_eq!(undeletable(&plain, &[], &[]), None);
        assert_eq!(undeletable(&root, &[], &[]), None, "nothing marks it yet");
        assert_eq!(
            undeletable(&root, std::slice::from_ref(&root), &[]),
            Some(Undeletable::Root),
            "discovery named it the root"
        );
        // Through a symbolic link too.
        let link = top.join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        assert_eq!(
            undeletable(&link, std::slice::from_ref(&root), &[]),
            Some(Undeletable::Root)
        );
        for folder in ["envs", "pkgs", "condabin"] {
            let marked = top.join(format!("with-{folder}"));
            env(&marked);
            std::fs::create_dir_all(marked.join(folder)).unwrap();
            assert_eq!(
                undeletable(&marked, &[], &[]),
                Some(Undeletable::Root),
                "{folder}/"
            );
        }
        // Another environment inside: a known one, or the root itself.
        let inner = plain.join("tools/.venv");
        std::fs::create_dir_all(&inner).unwrap();
        assert_eq!(
            undeletable(&plain, &[], &[plain.clone(), inner.clone()]),
            Some(Undeletable::Holds(inner.clone())),
            "the prefix itself among the others does not count; the one inside does"
        );
        assert_eq!(
            undeletable(&top, std::slice::from_ref(&root), &[]),
            Some(Undeletable::Holds(root.clone()))
        );
        // A listed environment inside that no longer exists (a stale
        // environments.txt line) holds nothing.
        assert_eq!(undeletable(&plain, &[], &[plain.join("gone/env")]), None);
        // A sibling whose name extends the prefix's is not inside it.
        let sibling = top.join("plain-2");
        env(&sibling);
        assert_eq!(undeletable(&plain, &[], &[sibling]), None);
        // Environments nobody listed: a venv, a Conda prefix, deep inside.
        let venv = plain.join("work/.venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        assert_eq!(undeletable(&plain, &[], &[]), None, "no interpreter yet");
        std::fs::write(venv.join("bin/python"), "").unwrap();
        assert_eq!(
            undeletable(&plain, &[], &[]),
            Some(Undeletable::Holds(venv.clone()))
        );
        std::fs::remove_dir_all(&venv).unwrap();
        let conda = plain.join("a/b/c/env");
        env(&conda);
        assert_eq!(undeletable(&plain, &[], &[]), None, "no history yet");
        std::fs::write(conda.join("conda-meta/history"), "").unwrap();
        assert_eq!(
            undeletable(&plain, &[], &[]),
            Some(Undeletable::Holds(conda.clone()))
        );
        // A link to another environment is not followed.
        std::fs::remove_dir_all(plain.join("a")).unwrap();
        std::fs::write(top.join("plain-2/conda-meta/history"), "").unwrap();
        std::os::unix::fs::symlink(top.join("plain-2"), plain.join("linked")).unwrap();
        assert_eq!(undeletable(&plain, &[], &[]), None);
    }

    #[test]
    fn only_links_that_resolve_to_the_prefix_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().canonicalize().unwrap();
        let prefix = top.join("data/ml");
        let other = top.join("data/other");
        std::fs::create_dir_all(&prefix).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let envs = top.join("envs");
        std::fs::create_dir_all(envs.join("plain")).unwrap();
        std::os::unix::fs::symlink(&prefix, envs.join("ml")).unwrap();
        std::os::unix::fs::symlink("../data/ml", envs.join("relative")).unwrap();
        std::os::unix::fs::symlink(&other, envs.join("other")).unwrap();
        std::os::unix::fs::symlink(top.join("gone"), envs.join("dangling")).unwrap();
        let listed_link = top.join("listed");
        std::os::unix::fs::symlink(&prefix, &listed_link).unwrap();
        let found = links_to(
            &prefix,
            std::slice::from_ref(&envs),
            &[listed_link.clone(), prefix.clone(), other.clone()],
        );
        assert_eq!(
            found,
            vec![envs.join("ml"), envs.join("relative"), listed_link],
            "never the prefix itself, another env's link, a folder or a dangling link"
        );
    }

    #[test]
    fn env_names_are_plain_folder_names() {
        for good in ["ml", "py3.12", "team_a-1"] {
            assert!(check_env_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-x", ".hidden", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(check_env_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_host_platform_is_named_as_conda_names_it() {
        let p = host_platform();
        assert!(
            [
                "linux-64",
                "linux-aarch64",
                "osx-64",
                "osx-arm64",
                "linux-ppc64le"
            ]
            .contains(&p.as_str()),
            "{p}"
        );
    }
}
