//! This replica among others behind a load balancer: its identity, whether it
//! is draining, and what a session id says about the replica that holds it.
//!
//! Sessions live in the memory of the replica that created them; nothing is
//! shared between replicas. The balancer keeps a session's calls on its
//! replica (an affinity cookie, see docs/scaling.md), and a call that reaches
//! another replica anyway is told so: every session id names its replica
//! (`<32 hex digits>.<replica id>`), so the replica that cannot serve it says
//! which one can, instead of answering as if the id were garbage.

use std::sync::atomic::{AtomicBool, Ordering};

/// Longest replica id: a DNS name's length.
pub(crate) const MAX_REPLICA_ID: usize = 253;

/// This replica's identity and serving state, shared by the executor, the
/// HTTP front end and the metrics.
#[derive(Debug)]
pub struct Replica {
    /// Shown in `/health`, the `x-replica` header, session ids and the
    /// message of a call that reached the wrong replica.
    id: String,
    /// Set on SIGTERM: readiness (`/health`) answers 503 so that balancers
    /// stop sending work, while everything is still served.
    draining: AtomicBool,
}

impl Replica {
    pub fn new(id: String) -> Replica {
        Replica {
            id,
            draining: AtomicBool::new(false),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Turn readiness off (for good: a drain ends with the process).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// The replica id when none is configured: the host name (a pod's name in
/// Kubernetes), made valid; `code-executor` if there is none.
pub(crate) fn default_replica_id() -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cleaned: String = host
        .chars()
        .map(|c| if is_id_char(c) { c } else { '-' })
        .take(MAX_REPLICA_ID)
        .collect();
    if cleaned.is_empty() {
        "code-executor".into()
    } else {
        cleaned
    }
}

/// Why `id` cannot name a replica, if it cannot: it goes into session ids,
/// URLs and headers, so it is 1 to 253 of `A-Z a-z 0-9 . _ -`.
pub(crate) fn check_replica_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_REPLICA_ID {
        return Err(format!(
            "replica_id must be 1 to {MAX_REPLICA_ID} characters, got {}",
            id.len()
        ));
    }
    if let Some(bad) = id.chars().find(|c| !is_id_char(*c)) {
        return Err(format!(
            "replica_id {id:?} has {bad:?}; use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A session id for a session of replica `replica`: `random` (hex) first,
/// then the replica.
pub(crate) fn session_id(random: &str, replica: &str) -> String {
    format!("{random}.{replica}")
}

/// The replica a session id names, if it has the shape [`session_id`] makes.
pub(crate) fn replica_of(session_id: &str) -> Option<&str> {
    let (random, replica) = session_id.split_once('.')?;
    let well_formed = random.len() == 32
        && random.bytes().all(|b| b.is_ascii_hexdigit())
        && check_replica_id(replica).is_ok();
    well_formed.then_some(replica)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_names_its_replica_even_with_dots_in_it() {
        let random = "0123456789abcdef0123456789abcdef";
        let id = session_id(random, "pod-7.example.org");
        assert_eq!(replica_of(&id), Some("pod-7.example.org"));
        assert_eq!(replica_of("nope"), None);
        assert_eq!(replica_of("abc.replica"), None);
        assert_eq!(replica_of(&format!("{random}.bad/replica")), None);
    }

    #[test]
    fn replica_ids_are_checked_and_the_default_is_valid() {
        assert!(check_replica_id("r1").is_ok());
        assert!(check_replica_id("").is_err());
        assert!(check_replica_id("a b").is_err());
        assert!(check_replica_id(&"x".repeat(254)).is_err());
        assert!(check_replica_id(&default_replica_id()).is_ok());
    }
}
