//! The bootstrap's compiled code, kept so that a worker start does not
//! compile `worker.py` again.
//!
//! Compiling the bootstrap is a large part of a worker's start (15–25 ms of
//! a 40–80 ms start), and the result depends only on the script and the
//! interpreter. A worker that finds no usable code compiles the script and
//! sends the marshalled result in its `ready` frame (after a 4-byte header,
//! the interpreter's bytecode magic); the server keeps it in two places:
//!
//! * *staged*, in the server's own temporary folder, where every later worker
//!   of the environment reads it (the sandbox lets workers read that folder,
//!   not the cache below), and
//! * *persistent*, in the cache folder (`cache_dir`), copied to the staged
//!   place at the next start, so that a server's first worker is warm too.
//!
//! One file per environment (prefix and interpreter), never shared between
//! environments: code sent by a worker has run in that worker only after its
//! environment's own start-up code (`.pth` files, preloads), so a file written
//! from it can affect no environment but the one that already runs that code.
//! A file whose magic does not match the interpreter (Python was upgraded in
//! place) is compiled again and replaced.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where one environment's compiled bootstrap is read and kept.
#[derive(Debug, Clone)]
pub struct CodeCache {
    /// Read by every worker of the environment (`LAUNCH`'s second argument).
    pub(crate) staged: PathBuf,
    /// Kept across server starts.
    pub(crate) persistent: Option<PathBuf>,
}

impl CodeCache {
    /// The cache of the environment `python` runs in, for `script`: staged
    /// under `staging_dir`, kept under `persistent_dir`. A kept copy is
    /// staged now, so that the environment's first worker reads it.
    pub(crate) fn new(
        script: &[u8],
        python: &Path,
        prefix: &Path,
        staging_dir: &Path,
        persistent_dir: Option<&Path>,
    ) -> CodeCache {
        let mut key = Sha256::new();
        for part in [
            script,
            python.as_os_str().as_encoded_bytes(),
            prefix.as_os_str().as_encoded_bytes(),
        ] {
            key.update((part.len() as u64).to_le_bytes());
            key.update(part);
        }
        let digest = key.finalize();
        let name = format!("bootstrap-{}.code", crate::auth::hex(&digest[..16]));
        let cache = CodeCache {
            staged: staging_dir.join(&name),
            persistent: persistent_dir.map(|d| d.join(&name)),
        };
        if let Some(kept) = &cache.persistent
            && !cache.staged.exists()
            && let Ok(code) = std::fs::read(kept)
        {
            let _ = write_atomically(&cache.staged, &code);
            // Used now: the folder keeps the most recently used files.
            let _ = std::fs::File::options()
                .append(true)
                .open(kept)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        }
        cache
    }

    /// Keep `code`, as a worker sent it, for the environment's next workers
    /// and the next server start. Failures only cost later starts a compile.
    pub(crate) fn store(&self, code: &[u8]) {
        // The magic, then at least one byte of marshalled code.
        if code.len() < 5 {
            return;
        }
        if let Err(e) = write_atomically(&self.staged, code) {
            tracing::debug!(path = %self.staged.display(), "bootstrap code not staged: {e}");
            return;
        }
        if let Some(kept) = &self.persistent {
            let unchanged = std::fs::read(kept).is_ok_and(|old| old == code);
            if !unchanged && let Err(e) = write_atomically(kept, code) {
                tracing::debug!(path = %kept.display(), "bootstrap code not cached: {e}");
            }
        }
    }
}

/// The default cache folder: `$XDG_CACHE_HOME/code-executor`, else
/// `$HOME/.cache/code-executor`.
pub(crate) fn default_dir() -> Option<PathBuf> {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    from("XDG_CACHE_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| Some(from("HOME")?.join(".cache")))
        .filter(|p| p.is_absolute())
        .map(|p| p.join("code-executor"))
}

/// Files the cache folder keeps: the most recently used ones (a file is
/// one environment's, about 130 KB).
const KEPT_FILES: usize = 32;

/// Make `dir` (mode 0700 when created) and drop all but its [`KEPT_FILES`]
/// most recently used files; `None` when it cannot be used.
pub(crate) fn prepare_dir(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        tracing::debug!(dir = %dir.display(), "no bootstrap code cache: {e}");
        return None;
    }
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("bootstrap-") && name.ends_with(".code")
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() > KEPT_FILES {
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (_, old) in &files[KEPT_FILES..] {
            let _ = std::fs::remove_file(old);
        }
    }
    Some(dir.to_path_buf())
}

/// Replace `path` with `bytes` so that a reader sees the old file or the new
/// one, never a part. Readable by all: workers may run as another user, and
/// the code is the embedded bootstrap's, no secret.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut file = tempfile::Builder::new()
        .prefix(".bootstrap-")
        .tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_environment_has_its_own_file_and_a_kept_copy_is_staged() {
        let staging = tempfile::tempdir().unwrap();
        let kept = tempfile::tempdir().unwrap();
        let (py, a, b) = (
            Path::new("/e/a/bin/python"),
            Path::new("/e/a"),
            Path::new("/e/b"),
        );
        let first = CodeCache::new(b"script", py, a, staging.path(), Some(kept.path()));
        let other = CodeCache::new(b"script", py, b, staging.path(), Some(kept.path()));
        let newer = CodeCache::new(b"script 2", py, a, staging.path(), Some(kept.path()));
        assert_ne!(first.staged, other.staged);
        assert_ne!(first.staged, newer.staged);
        assert!(!first.staged.exists());
        first.store(b"MAGIcode");
        assert_eq!(std::fs::read(&first.staged).unwrap(), b"MAGIcode");
        assert_eq!(
            std::fs::read(first.persistent.as_ref().unwrap()).unwrap(),
            b"MAGIcode"
        );
        // A later server start stages the kept copy.
        let staging2 = tempfile::tempdir().unwrap();
        let again = CodeCache::new(b"script", py, a, staging2.path(), Some(kept.path()));
        assert_eq!(std::fs::read(&again.staged).unwrap(), b"MAGIcode");
        // Too short to be code: nothing is replaced.
        again.store(b"MAG");
        assert_eq!(std::fs::read(&again.staged).unwrap(), b"MAGIcode");
    }

    #[test]
    fn the_folder_keeps_the_most_recently_used_files() {
        let kept = tempfile::tempdir().unwrap();
        let day = std::time::Duration::from_secs(86_400);
        let now = std::time::SystemTime::now();
        for i in 0..(KEPT_FILES + 3) {
            let path = kept.path().join(format!("bootstrap-{i:02}.code"));
            std::fs::write(&path, b"MAGIcode").unwrap();
            let f = std::fs::File::options().append(true).open(&path).unwrap();
            f.set_modified(now - day * (i as u32)).unwrap();
        }
        std::fs::write(kept.path().join("other"), b"x").unwrap();
        assert!(prepare_dir(kept.path()).is_some());
        let left = |i: usize| kept.path().join(format!("bootstrap-{i:02}.code")).exists();
        assert!((0..KEPT_FILES).all(left));
        assert!(!(KEPT_FILES..KEPT_FILES + 3).any(left));
        assert!(kept.path().join("other").exists(), "only its own files");
    }
}
