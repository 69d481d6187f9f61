//! The bounded store of run artifacts behind MCP resources
//! (`artifact://<run>/<path>`) and `GET /artifacts/{run}/{path}`: files a run
//! wrote are kept for a time to live, within a byte cap for the server and
//! one per owner, the oldest evicted first. An owner is whoever may read
//! them again: the bearer token's digest over HTTP, `stdio` for the stdio
//! client.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long artifacts are kept, and how many bytes.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactLimits {
    /// Time to live of a run's artifacts.
    pub ttl: Duration,
    /// Bytes the whole store may hold (see [`StoredArtifact::held`]).
    pub max_bytes: u64,
    /// Bytes one owner's artifacts may hold.
    pub max_owner_bytes: u64,
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        ArtifactLimits {
            ttl: Duration::from_secs(600),
            max_bytes: 512 << 20,
            max_owner_bytes: 128 << 20,
        }
    }
}

/// What a file's entry costs the store beyond its content, path and type.
const FILE_OVERHEAD: u64 = 96;
/// What a run costs the store beyond its files (its id, owner, place in line).
const RUN_OVERHEAD: u64 = 128;

/// One stored file.
#[derive(Debug, Clone)]
pub struct StoredArtifact {
    pub path: String,
    pub mime: String,
    /// Decoded size.
    pub size: u64,
    /// The content, base64 (as runs report it and MCP blobs carry it);
    /// shared, so a read copies none of it under the store's lock.
    pub base64: Arc<str>,
}

impl StoredArtifact {
    /// What the file counts against the caps: its decoded content (as its
    /// base64 says, whatever its `size`), its path and type, and its entry.
    /// A run of a thousand empty files with long names is not free.
    fn held(&self) -> u64 {
        let content = self.size.max(self.base64.len() as u64 / 4 * 3);
        content
            .saturating_add(self.path.len() as u64 + self.mime.len() as u64)
            .saturating_add(FILE_OVERHEAD)
    }
}

/// What [`ArtifactStore::put`] kept of a run.
#[derive(Debug)]
pub struct Kept {
    /// The run's id.
    pub run: String,
    /// Whether each file given, in order, is kept (one too large for an
    /// owner's whole cap is not).
    pub files: Vec<bool>,
}

/// A run's artifacts.
#[derive(Debug)]
struct StoredRun {
    id: String,
    owner: String,
    stored: Instant,
    files: Vec<StoredArtifact>,
    /// What it counts against the caps.
    bytes: u64,
}

/// The runs kept, oldest first, with their totals.
#[derive(Debug, Default)]
struct Runs {
    line: VecDeque<StoredRun>,
    bytes: u64,
    owners: HashMap<String, u64>,
}

impl Runs {
    fn push(&mut self, run: StoredRun) {
        self.bytes += run.bytes;
        *self.owners.entry(run.owner.clone()).or_default() += run.bytes;
        self.line.push_back(run);
    }

    fn remove(&mut self, i: usize) {
        let Some(run) = self.line.remove(i) else {
            return;
        };
        self.bytes -= run.bytes;
        if let Some(bytes) = self.owners.get_mut(&run.owner) {
            *bytes -= run.bytes;
            if *bytes == 0 {
                self.owners.remove(&run.owner);
            }
        }
    }

    fn owner_bytes(&self, owner: &str) -> u64 {
        self.owners.get(owner).copied().unwrap_or(0)
    }
}

/// The store; one per server, shared by every front end.
#[derive(Debug)]
pub struct ArtifactStore {
    limits: ArtifactLimits,
    runs: Mutex<Runs>,
    /// Source of run ids, with a random part so they cannot be guessed.
    salt: u64,
    next: std::sync::atomic::AtomicU64,
}

impl ArtifactStore {
    pub fn new(limits: ArtifactLimits) -> ArtifactStore {
        use std::io::Read;
        let mut random = [0u8; 8];
        let salt = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .map(|()| u64::from_le_bytes(random))
            .unwrap_or_else(|_| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            });
        ArtifactStore {
            limits,
            runs: Mutex::new(Runs::default()),
            salt,
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub fn limits(&self) -> ArtifactLimits {
        self.limits
    }

    /// Keep `files` for `owner`, evicting the oldest runs past the caps:
    /// the owner's own past its cap, then anyone's past the server's. What
    /// was kept, or None when nothing was: no file fits a cap, or the run
    /// alone is past one (then it evicts nothing).
    pub fn put(&self, owner: &str, files: Vec<StoredArtifact>) -> Option<Kept> {
        let largest = self.limits.max_owner_bytes.min(self.limits.max_bytes);
        let kept: Vec<bool> = files
            .iter()
            .map(|f| f.held().saturating_add(RUN_OVERHEAD) <= largest)
            .collect();
        let files: Vec<StoredArtifact> = files
            .into_iter()
            .zip(&kept)
            .filter_map(|(f, &k)| k.then_some(f))
            .collect();
        if files.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{:016x}{n:x}", self.salt.rotate_left(n as u32 % 64) ^ n);
        let bytes = files
            .iter()
            .map(StoredArtifact::held)
            .fold(RUN_OVERHEAD, u64::saturating_add);
        if bytes > largest {
            return None;
        }
        let mut runs = self.runs.lock();
        self.expire(&mut runs);
        runs.push(StoredRun {
            id: id.clone(),
            owner: owner.to_string(),
            stored: Instant::now(),
            files,
            bytes,
        });
        while runs.owner_bytes(owner) > self.limits.max_owner_bytes {
            let Some(i) = runs.line.iter().position(|r| r.owner == owner) else {
                break;
            };
            runs.remove(i);
        }
        while runs.bytes > self.limits.max_bytes && !runs.line.is_empty() {
            runs.remove(0);
        }
        // The newest run, last in line unless it went itself.
        let stored = runs.line.back().is_some_and(|r| r.id == id);
        stored.then_some(Kept {
            run: id,
            files: kept,
        })
    }

    /// The file `path` of run `run`, if `owner` stored it and it is live.
    pub fn get(&self, owner: &str, run: &str, path: &str) -> Option<StoredArtifact> {
        let mut runs = self.runs.lock();
        self.expire(&mut runs);
        runs.line
            .iter()
            .find(|r| r.id == run && r.owner == owner)?
            .files
            .iter()
            .find(|f| f.path == path)
            .cloned()
    }

    /// Every live file of `owner`, oldest first, as (run, file without its
    /// content).
    pub fn list(&self, owner: &str) -> Vec<(String, StoredArtifact)> {
        let mut runs = self.runs.lock();
        self.expire(&mut runs);
        let none: Arc<str> = Arc::from("");
        runs.line
            .iter()
            .filter(|r| r.owner == owner)
            .flat_map(|r| {
                r.files.iter().map(|f| {
                    (
                        r.id.clone(),
                        StoredArtifact {
                            base64: none.clone(),
                            ..f.clone()
                        },
                    )
                })
            })
            .collect()
    }

    fn expire(&self, runs: &mut Runs) {
        while runs
            .line
            .front()
            .is_some_and(|r| r.stored.elapsed() > self.limits.ttl)
        {
            runs.remove(0);
        }
    }
}

/// What a URI's path keeps as it is: the unreserved characters of RFC 3986
/// and `/`, which separates the file's directories. Everything else (a
/// space, `#`, `?`, `%`, a non-ASCII letter) is percent-encoded, so the
/// URI is one a client's URI parser leaves alone and the `{path}` of
/// `GET /artifacts/{run}/{path}` as it stands.
const PATH_KEEPS: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `artifact://<run>/<path>`, the path percent-encoded.
pub(crate) fn uri(run: &str, path: &str) -> String {
    format!("artifact://{run}/{}", utf8_percent_encode(path, PATH_KEEPS))
}

/// The run and path of an `artifact://` URI, and the path as written when
/// it reads otherwise percent-decoded: a client may send the URI it was
/// given (encoded), or one it decoded or built from the file's path.
pub(crate) fn parse_uri(uri: &str) -> Option<(&str, Vec<Cow<'_, str>>)> {
    let rest = uri.strip_prefix("artifact://")?;
    let (run, path) = rest.split_once('/')?;
    if run.is_empty() || path.is_empty() {
        return None;
    }
    let mut paths = Vec::with_capacity(2);
    if let Ok(decoded) = percent_decode_str(path).decode_utf8()
        && decoded != path
    {
        paths.push(decoded);
    }
    paths.push(Cow::Borrowed(path));
    Some((run, paths))
}

/// The owner name of a bearer token: a digest, so the store never holds a
/// token. No token: the anonymous owner (a server without auth).
pub(crate) fn owner_of_token(token: Option<&str>) -> String {
    match token {
        None | Some("") => "anonymous".into(),
        Some(t) => {
            // FNV-1a, twice with different offsets: 128 bits to tell
            // owners apart; not a secret (the token is checked before).
            let fnv = |seed: u64| {
                t.bytes().fold(seed, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
                })
            };
            format!(
                "token-{:016x}{:016x}",
                fnv(0xcbf2_9ce4_8422_2325),
                fnv(0x6c62_272e_07bb_0142)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> StoredArtifact {
        StoredArtifact {
            path: path.into(),
            mime: "text/plain".into(),
            size,
            base64: Arc::from("eA=="),
        }
    }

    fn put(store: &ArtifactStore, owner: &str, files: Vec<StoredArtifact>) -> String {
        store.put(owner, files).expect("the run is kept").run
    }

    #[test]
    fn owners_see_their_own_and_caps_evict_the_oldest() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_secs(60),
            max_bytes: 10_000,
            max_owner_bytes: 6_000,
        });
        let a1 = put(&store, "a", vec![file("x", 3_000)]);
        let b1 = put(&store, "b", vec![file("y", 3_000)]);
        assert!(store.get("a", &a1, "x").is_some());
        assert!(store.get("b", &a1, "x").is_none(), "another owner's");
        let a2 = put(&store, "a", vec![file("x", 4_000)]);
        // a's cap evicted a1, not b's run.
        assert!(store.get("a", &a1, "x").is_none());
        assert!(store.get("a", &a2, "x").is_some());
        assert!(store.get("b", &b1, "y").is_some());
        let _c = put(&store, "c", vec![file("z", 5_000)]);
        // The server's cap: the oldest run left (b1) goes.
        assert!(store.get("b", &b1, "y").is_none());
        assert_eq!(store.list("a").len(), 1);
        assert_ne!(a1, a2);
    }

    #[test]
    fn paths_and_entries_count_against_the_caps_not_only_content() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_secs(60),
            max_bytes: 1 << 20,
            max_owner_bytes: 100_000,
        });
        // Empty files with 4 KiB names: ~40 KiB a run, though no content.
        let named = |run: usize| -> Vec<StoredArtifact> {
            (0..10)
                .map(|i| StoredArtifact {
                    base64: Arc::from(""),
                    ..file(&format!("{run}-{i}-{}", "n".repeat(4096)), 0)
                })
                .collect()
        };
        let first = store.put("a", named(0)).expect("kept");
        let path = |run: usize, i: usize| format!("{run}-{i}-{}", "n".repeat(4096));
        assert!(store.get("a", &first.run, &path(0, 0)).is_some());
        put(&store, "a", named(1));
        assert!(store.get("a", &first.run, &path(0, 0)).is_some());
        // A third run puts the owner past 100,000 bytes: the first goes.
        put(&store, "a", named(2));
        assert!(store.get("a", &first.run, &path(0, 0)).is_none());
        assert_eq!(store.list("a").len(), 20);
    }

    #[test]
    fn put_says_which_files_it_kept() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_secs(60),
            max_bytes: 1 << 20,
            max_owner_bytes: 10_000,
        });
        let kept = store
            .put(
                "a",
                vec![file("small", 10), file("big", 20_000), file("other", 20)],
            )
            .expect("kept");
        assert_eq!(kept.files, [true, false, true]);
        assert!(store.get("a", &kept.run, "small").is_some());
        assert!(store.get("a", &kept.run, "big").is_none());
        assert!(store.get("a", &kept.run, "other").is_some());
        // Nothing fits: nothing kept.
        assert!(store.put("a", vec![file("big", 20_000)]).is_none());
        // Each file fits, the run does not: nothing of it is kept, and
        // it evicts nothing.
        assert!(
            store
                .put("a", vec![file("p", 6_000), file("q", 6_000)])
                .is_none()
        );
        assert!(store.get("a", &kept.run, "small").is_some());
        assert_eq!(store.list("a").len(), 2);
    }

    #[test]
    fn a_run_past_the_servers_cap_evicts_no_one() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_secs(60),
            max_bytes: 10_000,
            max_owner_bytes: 20_000,
        });
        let a = put(&store, "a", vec![file("x", 3_000)]);
        let b = put(&store, "b", vec![file("y", 3_000)]);
        assert!(
            store
                .put("c", vec![file("p", 6_000), file("q", 6_000)])
                .is_none()
        );
        assert!(store.get("a", &a, "x").is_some());
        assert!(store.get("b", &b, "y").is_some());
    }

    #[test]
    fn a_file_counts_its_content_whatever_its_size_says() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_secs(60),
            max_bytes: 1 << 20,
            max_owner_bytes: 10_000,
        });
        let lying = StoredArtifact {
            base64: Arc::from("A".repeat(20_000)),
            ..file("x", 0)
        };
        assert!(store.put("a", vec![lying]).is_none());
    }

    #[test]
    fn artifacts_expire_and_free_their_room() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_millis(500),
            max_bytes: 10_000,
            max_owner_bytes: 10_000,
        });
        let run = put(&store, "a", vec![file("x", 6_000)]);
        let other = put(&store, "b", vec![file("y", 1)]);
        assert!(store.get("a", &run, "x").is_some());
        std::thread::sleep(Duration::from_millis(600));
        assert!(store.get("a", &run, "x").is_none());
        // The expired runs count no more: this one evicts nothing live.
        let fresh = put(&store, "b", vec![file("z", 6_000)]);
        let again = put(&store, "a", vec![file("w", 3_000)]);
        assert!(store.get("b", &fresh, "z").is_some());
        assert!(store.get("a", &again, "w").is_some());
        assert!(store.get("b", &other, "y").is_none());
    }

    #[test]
    fn uris_round_trip() {
        let paths = |uri: &str| -> Option<(String, Vec<String>)> {
            parse_uri(uri).map(|(run, paths)| {
                (
                    run.to_string(),
                    paths.into_iter().map(Cow::into_owned).collect(),
                )
            })
        };
        let plain = uri("r1", "out/plot.png");
        assert_eq!(plain, "artifact://r1/out/plot.png");
        assert_eq!(
            paths(&plain),
            Some(("r1".into(), vec!["out/plot.png".into()]))
        );
        // What a URI may not hold as it is comes encoded, and is read back
        // decoded first, then as written (a file named with a `%`).
        let odd = uri("r1", "my dir/ü #1?.txt");
        assert_eq!(odd, "artifact://r1/my%20dir/%C3%BC%20%231%3F.txt");
        assert_eq!(
            paths(&odd),
            Some((
                "r1".into(),
                vec![
                    "my dir/ü #1?.txt".into(),
                    "my%20dir/%C3%BC%20%231%3F.txt".into()
                ]
            ))
        );
        assert_eq!(
            paths("artifact://r1/my dir/a.txt"),
            Some(("r1".into(), vec!["my dir/a.txt".into()]))
        );
        assert_eq!(
            paths("artifact://r1/100%.txt"),
            Some(("r1".into(), vec!["100%.txt".into()]))
        );
        assert_eq!(parse_uri("artifact:///x"), None);
        assert_eq!(parse_uri("file:///x"), None);
        assert_ne!(owner_of_token(Some("a")), owner_of_token(Some("b")));
        assert_eq!(owner_of_token(None), "anonymous");
    }
}
