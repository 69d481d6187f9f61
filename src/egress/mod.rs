//! The egress proxy behind `allowed_hosts`: the only way out of a worker's
//! network namespace.
//!
//! Each worker of an environment with an allow-list gets one listening TCP
//! socket on `127.0.0.1:3128` *inside its own network namespace*, made once
//! when the worker starts (the server enters the namespace from a thread of
//! its own, binds, and leaves: no veth, bridge or iptables). The server
//! serves it: runs see `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` pointing there
//! and nothing else is routable from the namespace (loopback only, no DNS).
//!
//! The proxy answers `CONNECT host:port` (any TLS, pip included) and
//! plain-HTTP absolute-form requests. It checks the host and port against
//! the run's [`Policy`], resolves the name itself, checks every address
//! again (a listed name may not lead to loopback, private or link-local
//! addresses, nor to the server's own listening addresses: the defence
//! against DNS rebinding and SSRF), then connects to a checked address. A
//! refusal is a `403` whose body names the rule.
//!
//! Each run's connections and bytes are counted and capped; the counts come
//! back in the run's result (`network`).

pub(crate) mod policy;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::api::{DeniedConnection, NetworkUsage};
pub(crate) use policy::Policy;
use policy::{Host, Refusal};

/// The port the proxy listens on inside each worker's namespace.
pub(crate) const PROXY_PORT: u16 = 3128;

/// Largest request head (request line and headers) the proxy reads.
const MAX_HEAD_BYTES: usize = 16 << 10;
/// Bound on resolving a name and on connecting to the destination.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Refusals kept per run (the count of connections still counts them all).
const MAX_DENIED_LISTED: usize = 32;

/// Caps on one run's network use.
#[derive(Debug, Clone, Copy)]
pub struct EgressLimits {
    /// Connections one run may open (refused ones included).
    pub max_connections: u64,
    /// Bytes one run may send, and receive, through the proxy.
    pub max_bytes: u64,
    /// A connection with no traffic either way for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for EgressLimits {
    fn default() -> Self {
        EgressLimits {
            max_connections: 256,
            max_bytes: 1 << 30,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What every proxy of one environment shares.
#[derive(Debug)]
pub(crate) struct ProxyContext {
    /// The environment's name, for log lines.
    env: String,
    limits: EgressLimits,
    /// Names resolved without DNS (`network_hosts`), checked like any other.
    hosts: HashMap<String, Vec<IpAddr>>,
    /// Connections allowed and refused, and bytes, across the env's runs.
    pub(crate) allowed: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) bytes_received: AtomicU64,
}

impl ProxyContext {
    pub(crate) fn new(
        env: String,
        limits: EgressLimits,
        hosts: HashMap<String, Vec<IpAddr>>,
    ) -> Arc<ProxyContext> {
        Arc::new(ProxyContext {
            env,
            limits,
            hosts: hosts
                .into_iter()
                .map(|(k, v)| (k.trim_end_matches('.').to_ascii_lowercase(), v))
                .collect(),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
        })
    }
}

/// This process's listening addresses (every server it runs), refused by
/// every proxy unless listed; environments found later see them too.
static SERVER_ADDRESSES: RwLock<Vec<SocketAddr>> = RwLock::new(Vec::new());

/// Tell the proxies where a server of this process listens (after it bound).
pub(crate) fn add_server_addresses(addrs: Vec<SocketAddr>) {
    let mut known = SERVER_ADDRESSES.write();
    for a in addrs {
        if !known.contains(&a) {
            known.push(a);
        }
    }
}

/// One run's network: its policy, what it did and whether a cap stopped it.
#[derive(Debug)]
struct RunNet {
    policy: Arc<Policy>,
    connections: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    /// A cap (connections or bytes) refused or cut something.
    capped: AtomicBool,
    denied: Mutex<Vec<DeniedConnection>>,
}

impl RunNet {
    fn usage(&self) -> NetworkUsage {
        NetworkUsage {
            connections: self.connections.load(Ordering::Acquire),
            bytes_sent: self.sent.load(Ordering::Acquire),
            bytes_received: self.received.load(Ordering::Acquire),
            denied: self.denied.lock().clone(),
            capped: self.capped.load(Ordering::Acquire),
        }
    }
}

/// A worker's proxy: its listener's accept loop, the policy of what runs
/// now and that run's counts.
#[derive(Debug)]
pub(crate) struct WorkerProxy {
    ctx: Arc<ProxyContext>,
    /// The policy the next run gets (set per run, or once per session).
    policy: Mutex<Arc<Policy>>,
    /// The run in progress; connections outside a run are refused.
    current: Mutex<Option<Arc<RunNet>>>,
    /// The accept loop; aborted with the proxy.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for WorkerProxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }
}

impl WorkerProxy {
    /// Serve `listener` (bound in the worker's namespace) with `policy`
    /// until the proxy is dropped.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        ctx: Arc<ProxyContext>,
        policy: Arc<Policy>,
    ) -> std::io::Result<Arc<WorkerProxy>> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let proxy = Arc::new(WorkerProxy {
            ctx,
            policy: Mutex::new(policy),
            current: Mutex::new(None),
            task: Mutex::new(None),
        });
        let weak = Arc::downgrade(&proxy);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let Some(proxy) = weak.upgrade() else {
                    return;
                };
                let run = proxy.current.lock().clone();
                let ctx = proxy.ctx.clone();
                drop(proxy);
                tokio::spawn(serve(stream, run, ctx));
            }
        });
        *proxy.task.lock() = Some(task);
        Ok(proxy)
    }

    /// The policy of the runs from now on.
    pub(crate) fn set_policy(&self, policy: Arc<Policy>) {
        *self.policy.lock() = policy;
    }

    /// A run starts: its connections are counted from zero.
    pub(crate) fn begin(&self) {
        let policy = self.policy.lock().clone();
        *self.current.lock() = Some(Arc::new(RunNet {
            policy,
            connections: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            capped: AtomicBool::new(false),
            denied: Mutex::new(Vec::new()),
        }));
    }

    /// The run ended: what it did. Later connections are refused until the
    /// next run begins; open ones end with the run's processes.
    pub(crate) fn end(&self) -> Option<NetworkUsage> {
        self.current.lock().take().map(|run| run.usage())
    }
}

/// Make the proxy's listener inside the network namespace of process `pid`
/// (the worker's launcher, which made the namespace): a thread enters the
/// namespace, binds `127.0.0.1:PROXY_PORT` and ends; the socket stays in
/// that namespace.
pub(crate) fn listen_in_namespace_of(pid: u32) -> std::io::Result<std::net::TcpListener> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    std::thread::Builder::new()
        .name("egress-listen".into())
        .spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, PROXY_PORT))
        })?
        .join()
        .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
}

/// What a client asked for.
struct Asked {
    host: Host,
    port: u16,
    /// `CONNECT` (a tunnel) or a plain-HTTP request to forward.
    tunnel: bool,
    /// The request head to send upstream (plain HTTP), origin-form.
    head: Vec<u8>,
    /// Bytes read past the head.
    rest: Vec<u8>,
}

async fn serve(mut client: TcpStream, run: Option<Arc<RunNet>>, ctx: Arc<ProxyContext>) {
    let Some(run) = run else {
        let _ = refuse(&mut client, 403, "no run is in progress on this worker").await;
        return;
    };
    let asked = match tokio::time::timeout(ctx.limits.idle_timeout, read_head(&mut client)).await {
        Ok(Ok(asked)) => asked,
        Ok(Err(why)) => {
            let _ = refuse(&mut client, 400, &why).await;
            return;
        }
        Err(_) => return,
    };
    let target = format!("{}:{}", asked.host, asked.port);
    let deny = |reason: String| {
        ctx.denied.fetch_add(1, Ordering::Relaxed);
        let mut denied = run.denied.lock();
        if denied.len() < MAX_DENIED_LISTED {
            denied.push(DeniedConnection {
                host: asked.host.to_string(),
                port: asked.port,
                reason: reason.clone(),
            });
        }
        tracing::info!(env = %ctx.env, host = %asked.host, port = asked.port, decision = "denied", "egress: {reason}");
        reason
    };
    let n = run.connections.fetch_add(1, Ordering::AcqRel) + 1;
    if n > ctx.limits.max_connections {
        run.capped.store(true, Ordering::Release);
        let why = deny(format!(
            "the run's cap of {} connections is reached (network_max_connections)",
            ctx.limits.max_connections
        ));
        let _ = refuse(&mut client, 403, &format!("{target} refused: {why}")).await;
        return;
    }
    let upstream = match open(&asked, &run.policy, &ctx).await {
        Ok(upstream) => upstream,
        Err(why) => {
            let why = deny(why);
            let _ = refuse(&mut client, 403, &format!("{target} refused: {why}")).await;
            return;
        }
    };
    ctx.allowed.fetch_add(1, Ordering::Relaxed);
    let mut upstream = upstream;
    let ok = if asked.tunnel {
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_ok()
    } else {
        run.sent
            .fetch_add(asked.head.len() as u64, Ordering::AcqRel);
        upstream.write_all(&asked.head).await.is_ok()
    };
    if !ok {
        return;
    }
    if !asked.rest.is_empty() {
        if upstream.write_all(&asked.rest).await.is_err() {
            return;
        }
        run.sent
            .fetch_add(asked.rest.len() as u64, Ordering::AcqRel);
    }
    let (mut sent, received) = splice(client, upstream, &run, &ctx).await;
    sent += (asked.rest.len() + asked.head.len()) as u64;
    ctx.bytes_sent.fetch_add(sent, Ordering::Relaxed);
    ctx.bytes_received.fetch_add(received, Ordering::Relaxed);
    tracing::info!(
        env = %ctx.env,
        host = %asked.host,
        port = asked.port,
        decision = "allowed",
        bytes_sent = sent,
        bytes_received = received,
        "egress connection closed"
    );
}

/// Check, resolve, check again, connect.
async fn open(asked: &Asked, policy: &Policy, ctx: &ProxyContext) -> Result<TcpStream, String> {
    let rule = policy
        .check(&asked.host, asked.port)
        .map_err(|r| r.to_string())?
        .clone();
    let addrs: Vec<IpAddr> = match &asked.host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => match ctx.hosts.get(name) {
            Some(addrs) => addrs.clone(),
            None => {
                let found = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::lookup_host((name.as_str(), asked.port)),
                )
                .await
                .map_err(|_| format!("resolving {name} timed out"))?
                .map_err(|e| format!("{name} does not resolve: {e}"))?;
                found.map(|a| a.ip()).collect()
            }
        },
    };
    let server = SERVER_ADDRESSES.read().clone();
    let mut refusal: Option<Refusal> = None;
    let mut last_error = None;
    for ip in addrs {
        if let Err(r) = policy.check_address(&asked.host, &rule, ip, asked.port, &server) {
            refusal.get_or_insert(r);
            continue;
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((ip, asked.port))).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last_error = Some(format!("cannot connect to {ip}: {e}")),
            Err(_) => last_error = Some(format!("connecting to {ip} timed out")),
        }
    }
    Err(last_error
        .or_else(|| refusal.map(|r| r.to_string()))
        .unwrap_or_else(|| format!("{} has no address", asked.host)))
}

/// Read and parse the request head.
async fn read_head(client: &mut TcpStream) -> Result<Asked, String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("the client closed the connection before its request".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => return parse_request(&req, &buf, len),
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD_BYTES => continue,
            Ok(httparse::Status::Partial) => return Err("request head too large".into()),
            Err(e) => return Err(format!("malformed request: {e}")),
        }
    }
}

fn parse_request(req: &httparse::Request<'_, '_>, buf: &[u8], len: usize) -> Result<Asked, String> {
    let method = req.method.unwrap_or_default();
    let path = req.path.unwrap_or_default();
    let rest = buf[len..].to_vec();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_host_port(path, None)?;
        return Ok(Asked {
            host,
            port,
            tunnel: true,
            head: Vec::new(),
            rest,
        });
    }
    let Some(after) = path.strip_prefix("http://") else {
        return Err(format!(
            "{method} {path}: a proxy request needs an absolute http:// URL (https goes through CONNECT)"
        ));
    };
    let (authority, origin) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = split_host_port(authority, Some(80))?;
    let mut head = format!("{method} {origin} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        head.extend_from_slice(h.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    // One request per connection: the next may name another host.
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Asked {
        host,
        port,
        tunnel: false,
        head,
        rest,
    })
}

fn split_host_port(authority: &str, default: Option<u16>) -> Result<(Host, u16), String> {
    let bad = || format!("{authority:?} is not host:port");
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad())?,
        None => default.ok_or_else(bad)?,
    };
    let host = Host::parse(host).ok_or_else(bad)?;
    Ok((host, port))
}

/// Answer a refusal. The reason phrase carries the text too: clients show
/// it where they do not show a body (`urllib`'s `HTTP Error 403: ...`,
/// `Tunnel connection failed: 403 ...` for `CONNECT`, and pip).
async fn refuse(client: &mut TcpStream, status: u16, why: &str) -> std::io::Result<()> {
    let text = format!("code-executor egress proxy: {why}");
    let phrase: String = text
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                ' '
            }
        })
        .collect();
    let body = format!("{text}\n");
    let response = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}

/// Copy both ways until either side closes, the connection idles past the
/// limit, or the run's byte cap is reached. Returns the bytes sent and
/// received.
async fn splice(
    client: TcpStream,
    upstream: TcpStream,
    run: &RunNet,
    ctx: &ProxyContext,
) -> (u64, u64) {
    let started = Instant::now();
    let last = AtomicU64::new(0);
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let sent = AtomicU64::new(0);
    let received = AtomicU64::new(0);
    let max = ctx.limits.max_bytes;
    let up = copy_half(
        &mut cr,
        &mut uw,
        &run.sent,
        &sent,
        &last,
        started,
        max,
        &run.capped,
    );
    let down = copy_half(
        &mut ur,
        &mut cw,
        &run.received,
        &received,
        &last,
        started,
        max,
        &run.capped,
    );
    let idle = ctx.limits.idle_timeout;
    let watchdog = async {
        loop {
            tokio::time::sleep(idle / 4 + Duration::from_millis(10)).await;
            let since = started.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
            if Duration::from_millis(since) >= idle {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        () = watchdog => {}
    }
    (
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
    )
}

/// One direction of [`splice`]: `total` is the run's count for this
/// direction (capped at `max`), `mine` this connection's.
#[allow(clippy::too_many_arguments)]
async fn copy_half(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    total: &AtomicU64,
    mine: &AtomicU64,
    last: &AtomicU64,
    started: Instant,
    max: u64,
    capped: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        let before = total.fetch_add(n as u64, Ordering::AcqRel);
        let room = max.saturating_sub(before);
        let n_ok = (n as u64).min(room) as usize;
        if n_ok > 0 && to.write_all(&buf[..n_ok]).await.is_err() {
            break;
        }
        mine.fetch_add(n_ok as u64, Ordering::Relaxed);
        if n_ok < n {
            // The run's cap: what it allows went through, then the end.
            total.fetch_sub((n - n_ok) as u64, Ordering::AcqRel);
            capped.store(true, Ordering::Release);
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_requests_are_forwarded_in_origin_form_one_per_connection() {
        let raw = b"GET http://example.test:8080/simple/pkg/?x=1 HTTP/1.1\r\nHost: example.test:8080\r\nProxy-Connection: keep-alive\r\nUser-Agent: t\r\n\r\nBODY";
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        let len = match req.parse(raw).unwrap() {
            httparse::Status::Complete(len) => len,
            httparse::Status::Partial => panic!("partial"),
        };
        let asked = parse_request(&req, raw, len).unwrap();
        assert_eq!(asked.host, Host::Name("example.test".into()));
        assert_eq!(asked.port, 8080);
        assert!(!asked.tunnel);
        let head = String::from_utf8(asked.head).unwrap();
        assert!(
            head.starts_with("GET /simple/pkg/?x=1 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(!head.to_lowercase().contains("proxy-connection"), "{head}");
        assert!(head.ends_with("Connection: close\r\n\r\n"), "{head}");
        assert_eq!(asked.rest, b"BODY");
    }

    #[test]
    fn authorities_parse_with_their_ports() {
        assert_eq!(
            split_host_port("[::1]:443", None).unwrap(),
            (Host::Ip("::1".parse().unwrap()), 443)
        );
        assert_eq!(split_host_port("pypi.org", Some(80)).unwrap().1, 80);
        assert!(split_host_port("pypi.org", None).is_err());
        assert!(split_host_port("pypi.org:http", None).is_err());
    }
}
