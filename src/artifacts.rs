//! The bounded store of run artifacts behind MCP resources
//! (`artifact://<run>/<path>`) and `GET /artifacts/{run}/{path}`: files a run
//! wrote are kept for a time to live, within a byte cap for the server and
//! one per owner, the oldest evicted first. An owner is whoever may read
//! them again: the bearer token's digest over HTTP, `stdio` for the stdio
//! client.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long artifacts are kept, and how many bytes.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactLimits {
    /// Time to live of a run's artifacts.
    pub ttl: Duration,
    /// Bytes (decoded) the whole store may hold.
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

/// One stored file.
#[derive(Debug, Clone)]
pub struct StoredArtifact {
    pub path: String,
    pub mime: String,
    /// Decoded size.
    pub size: u64,
    /// The content, base64 (as runs report it and MCP blobs carry it).
    pub base64: String,
}

/// A run's artifacts.
#[derive(Debug)]
struct StoredRun {
    id: String,
    owner: String,
    stored: Instant,
    files: Vec<StoredArtifact>,
    bytes: u64,
}

/// The store; one per server, shared by every front end.
#[derive(Debug)]
pub struct ArtifactStore {
    limits: ArtifactLimits,
    /// Runs, oldest first.
    runs: Mutex<VecDeque<StoredRun>>,
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
            runs: Mutex::new(VecDeque::new()),
            salt,
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub fn limits(&self) -> ArtifactLimits {
        self.limits
    }

    /// Keep `files` for `owner`; the run's id. Files larger than the owner's
    /// whole cap are not kept (named in the result as such by the caller).
    pub fn put(&self, owner: &str, files: Vec<StoredArtifact>) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{:016x}{n:x}", self.salt.rotate_left(n as u32 % 64) ^ n);
        let files: Vec<StoredArtifact> = files
            .into_iter()
            .filter(|f| f.size <= self.limits.max_owner_bytes.min(self.limits.max_bytes))
            .collect();
        let bytes = files.iter().map(|f| f.size).sum();
        let mut runs = self.runs.lock();
        self.expire(&mut runs);
        runs.push_back(StoredRun {
            id: id.clone(),
            owner: owner.to_string(),
            stored: Instant::now(),
            files,
            bytes,
        });
        // Oldest first: the owner's own past its cap, then anyone's past
        // the server's.
        while owner_bytes(&runs, owner) > self.limits.max_owner_bytes {
            let Some(i) = runs.iter().position(|r| r.owner == owner) else {
                break;
            };
            runs.remove(i);
        }
        while runs.iter().map(|r| r.bytes).sum::<u64>() > self.limits.max_bytes {
            runs.pop_front();
        }
        id
    }

    /// The file `path` of run `run`, if `owner` stored it and it is live.
    pub fn get(&self, owner: &str, run: &str, path: &str) -> Option<StoredArtifact> {
        let mut runs = self.runs.lock();
        self.expire(&mut runs);
        runs.iter()
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
        runs.iter()
            .filter(|r| r.owner == owner)
            .flat_map(|r| {
                r.files.iter().map(|f| {
                    (
                        r.id.clone(),
                        StoredArtifact {
                            base64: String::new(),
                            ..f.clone()
                        },
                    )
                })
            })
            .collect()
    }

    fn expire(&self, runs: &mut VecDeque<StoredRun>) {
        while runs
            .front()
            .is_some_and(|r| r.stored.elapsed() > self.limits.ttl)
        {
            runs.pop_front();
        }
    }
}

fn owner_bytes(runs: &VecDeque<StoredRun>, owner: &str) -> u64 {
    runs.iter()
        .filter(|r| r.owner == owner)
        .map(|r| r.bytes)
        .sum()
}

/// `artifact://<run>/<path>`.
pub(crate) fn uri(run: &str, path: &str) -> String {
    format!("artifact://{run}/{path}")
}

/// The run and path of an `artifact://` URI.
pub(crate) fn parse_uri(uri: &str) -> Option<(&str, &str)> {
    let rest = uri.strip_prefix("artifact://")?;
    let (run, path) = rest.split_once('/')?;
    (!run.is_empty() && !path.is_empty()).then_some((run, path))
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
            base64: "eA==".into(),
        }
    }

    #[test]
    fn owners_see_their_own_and_caps_evict_the_oldest() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_secs(60),
            max_bytes: 100,
            max_owner_bytes: 60,
        });
        let a1 = store.put("a", vec![file("x", 30)]);
        let b1 = store.put("b", vec![file("y", 30)]);
        assert!(store.get("a", &a1, "x").is_some());
        assert!(store.get("b", &a1, "x").is_none(), "another owner's");
        let a2 = store.put("a", vec![file("x", 40)]);
        // a's cap (60) evicted a1, not b's run.
        assert!(store.get("a", &a1, "x").is_none());
        assert!(store.get("a", &a2, "x").is_some());
        assert!(store.get("b", &b1, "y").is_some());
        let _c = store.put("c", vec![file("z", 50)]);
        // The server's cap (100): the oldest run left (b1) goes.
        assert!(store.get("b", &b1, "y").is_none());
        assert_eq!(store.list("a").len(), 1);
        assert_ne!(a1, a2);
    }

    #[test]
    fn artifacts_expire() {
        let store = ArtifactStore::new(ArtifactLimits {
            ttl: Duration::from_millis(20),
            ..ArtifactLimits::default()
        });
        let run = store.put("a", vec![file("x", 1)]);
        assert!(store.get("a", &run, "x").is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(store.get("a", &run, "x").is_none());
    }

    #[test]
    fn uris_round_trip() {
        assert_eq!(
            parse_uri(&uri("r1", "out/plot.png")),
            Some(("r1", "out/plot.png"))
        );
        assert_eq!(parse_uri("artifact:///x"), None);
        assert_eq!(parse_uri("file:///x"), None);
        assert_ne!(owner_of_token(Some("a")), owner_of_token(Some("b")));
        assert_eq!(owner_of_token(None), "anonymous");
    }
}
