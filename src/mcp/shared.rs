//! One warm MCP server shared by a user's launches (`code-executor mcp
//! --shared`).
//!
//! An MCP client starts its stdio servers at every launch, so each launch
//! would pay a server's cold start. With `--shared`, a launch is a relay:
//! it connects to the shared server of its *configuration* over a Unix
//! socket and copies bytes between its stdin/stdout and the socket, starting
//! that server first when none is listening. The shared server keeps its
//! workers warm for the next launch, and exits once no client has been
//! connected for `--shared-idle`.
//!
//! * **One server per configuration.** Launches share a server only when
//!   their binary (path, inode, size, modification time), command line,
//!   environment (less a shell's incidental variables), working directory
//!   and config files are all the same: the socket's name is a digest of
//!   them. A new binary or any other flag starts its own server; the old one
//!   idles out.
//! * **Only this user.** The socket lives in a directory of its own, mode
//!   0700 and owned by the user (`$XDG_RUNTIME_DIR/code-executor`, else
//!   `$TMPDIR/code-executor-<uid>`); anything else there is refused. Both
//!   ends check the other's uid too (`SO_PEERCRED`).
//! * **One start at a time.** A launch that finds no server takes a lock
//!   file, starts the server (its own process group, stderr to a log file
//!   beside the socket) and waits for its `ready` line; launches meanwhile
//!   wait on the lock, then connect. A server that fails to start fails the
//!   launch with the server's own error, from the log.
//! * **Served or retried.** The server greets each connection it serves
//!   before anything else, and a launch forwards nothing before that: a
//!   connection a dying server took and closed is retried, and a socket
//!   that answers otherwise is refused.
//! * **A client per connection.** Each connection is served as a stdio
//!   client is: its own implicit session, and its in-flight runs killed when
//!   it closes its input or goes away.

use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Options};
use crate::executor::Executor;
use crate::mcp::McpHandler;
use crate::mcp::stdio::serve_until_closed;

/// The line the shared server writes on its stdout once it listens.
const READY: &str = "ready";

/// What the shared server writes first on every connection it serves. A
/// launch forwards nothing before it has read this, so a server that dies
/// between the kernel's accepting a connection and serving it costs the
/// launch a retry, not its client's `initialize`.
const HELLO: &[u8] = b"code-executor shared 1\n";

/// How long a launch waits for a listening server's [`HELLO`].
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a launch waits for the server it started to listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a stopping server waits for its clients' services to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The log's size past which a start moves it aside.
const LOG_ROTATE_BYTES: u64 = 8 << 20;

/// Connections a launch tries before it gives up on servers that close them
/// unserved.
const ATTEMPTS: u32 = 5;

/// The longest path a Unix socket address holds (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Why a shared server could not be reached or served.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    /// The directory for the socket is missing, or not this user's alone.
    #[error("cannot keep the shared server's socket in {dir}: {reason}")]
    RuntimeDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The socket's path does not fit a Unix socket address.
    #[error(
        "the shared server's socket {0} is longer than a Unix socket address allows \
         ({MAX_SOCKET_PATH} bytes): set XDG_RUNTIME_DIR or TMPDIR to a shorter directory"
    )]
    PathTooLong(PathBuf),
    /// A file or socket operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The shared server exited before it listened.
    #[error("the shared server did not start ({status}); from its log {log}:\n{message}")]
    DidNotStart {
        /// How it exited.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// What it wrote there.
        message: String,
    },
    /// The process on the socket does not speak as a shared server.
    #[error("the process on {socket} is not a code-executor shared server: it said {said:?}")]
    NotShared {
        /// The socket.
        socket: PathBuf,
        /// What it sent first.
        said: String,
    },
    /// The shared server closed the connection while its client was still
    /// there.
    #[error("the shared server closed the connection (it was stopped or died); its log is {log}")]
    Gone {
        /// Its log file.
        log: PathBuf,
    },
    /// The other end of the socket is another user's process.
    #[error("the shared server's socket {socket} is served by uid {uid}, not this user")]
    Stranger {
        /// The socket.
        socket: PathBuf,
        /// The peer's uid.
        uid: u32,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> SharedError {
    let what = what.into();
    move |source| SharedError::Io { what, source }
}

/// Where a configuration's shared server listens, and its lock and log.
#[derive(Debug, Clone)]
pub struct SharedPlace {
    /// The Unix socket.
    pub socket: PathBuf,
    /// Held while a server starts or removes its socket.
    pub lock: PathBuf,
    /// The server's stderr.
    pub log: PathBuf,
}

impl SharedPlace {
    /// The place of this process's configuration: its binary, command line,
    /// environment, working directory and configuration files (`options`
    /// name them).
    pub fn for_this_launch(options: &Options) -> Result<SharedPlace, SharedError> {
        let dir = runtime_dir()?;
        let key = launch_key(&Config::files(options))
            .map_err(io_error("cannot identify this launch's configuration"))?;
        let place = SharedPlace::in_dir(&dir, &key);
        if place.socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(SharedError::PathTooLong(place.socket));
        }
        Ok(place)
    }

    /// The place whose socket is `socket`.
    pub fn of_socket(socket: &Path) -> SharedPlace {
        SharedPlace {
            socket: socket.to_path_buf(),
            lock: socket.with_extension("lock"),
            log: socket.with_extension("log"),
        }
    }

    fn in_dir(dir: &Path, key: &str) -> SharedPlace {
        SharedPlace::of_socket(&dir.join(format!("mcp-{key}.sock")))
    }

    /// Take the lock file (blocking until other holders let it go).
    fn take_lock(&self) -> Result<File, SharedError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.lock)
            .map_err(io_error(format!("cannot open {}", self.lock.display())))?;
        file.lock()
            .map_err(io_error(format!("cannot lock {}", self.lock.display())))?;
        Ok(file)
    }

    /// Connect to a server of this user's that is serving here (it greeted
    /// the connection), starting one when none listens.
    fn connect_served(&self) -> Result<UnixStream, SharedError> {
        let mut attempt = 1;
        loop {
            let mut stream = self.connect_or_start()?;
            let peer = nix::sys::socket::getsockopt(
                &stream,
                nix::sys::socket::sockopt::PeerCredentials,
            )
            .map_err(|e| io_error("cannot read the shared server's credentials")(e.into()))?;
            if peer.uid() != nix::unistd::geteuid().as_raw() {
                return Err(SharedError::Stranger {
                    socket: self.socket.clone(),
                    uid: peer.uid(),
                });
            }
            let mut said = [0; HELLO.len()];
            let greeted = stream
                .set_read_timeout(Some(HELLO_TIMEOUT))
                .and_then(|()| stream.read_exact(&mut said))
                .and_then(|()| stream.set_read_timeout(None));
            match greeted {
                Ok(()) if said == HELLO => return Ok(stream),
                Ok(()) => {
                    return Err(SharedError::NotShared {
                        socket: self.socket.clone(),
                        said: String::from_utf8_lossy(&said).into_owned(),
                    });
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(io_error(format!(
                        "the shared server at {} (pid {}) did not answer within {HELLO_TIMEOUT:?}",
                        self.socket.display(),
                        peer.pid()
                    ))(e));
                }
                // Closed unserved: the server is dying (or idled out and
                // went). Its socket soon refuses connections; then a new
                // server starts.
                Err(e) if attempt < ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "the shared server closed the connection unserved");
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(io_error(format!(
                        "the shared server at {} closed {ATTEMPTS} connections unserved",
                        self.socket.display()
                    ))(e));
                }
            }
        }
    }

    /// Connect to the server listening here; `None` when none does (the
    /// socket is absent, or refuses: stale).
    fn connect(&self) -> Result<Option<UnixStream>, SharedError> {
        match UnixStream::connect(&self.socket) {
            Ok(stream) => Ok(Some(stream)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(io_error(format!(
                "cannot connect to {}",
                self.socket.display()
            ))(e)),
        }
    }

    /// Connect to the server listening here, starting one when none is.
    fn connect_or_start(&self) -> Result<UnixStream, SharedError> {
        if let Some(stream) = self.connect()? {
            return Ok(stream);
        }
        let _lock = self.take_lock()?;
        // Another launch may have started it while this one waited.
        if let Some(stream) = self.connect()? {
            return Ok(stream);
        }
        match fs::remove_file(&self.socket) {
            Ok(()) => tracing::debug!(socket = %self.socket.display(), "removed a stale socket"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(io_error(format!(
                    "cannot remove the stale socket {}",
                    self.socket.display()
                ))(e));
            }
        }
        if let Err(e) = self.start() {
            // A server started by a launch that died before it was ready
            // may have taken the socket first: it serves as well.
            return match self.connect() {
                Ok(Some(stream)) => Ok(stream),
                _ => Err(e),
            };
        }
        UnixStream::connect(&self.socket).map_err(io_error(format!(
            "cannot connect to the shared server at {}",
            self.socket.display()
        )))
    }

    /// Start the server (this binary, this command line, `--serve-shared`)
    /// and wait until it listens; one that does not within
    /// [`START_TIMEOUT`] is killed.
    fn start(&self) -> Result<(), SharedError> {
        let (log, offset) = self.open_log()?;
        let exe =
            std::env::current_exe().map_err(io_error("cannot find this program's own binary"))?;
        let mut server = Command::new(exe)
            .args(std::env::args_os().skip(1))
            .arg("--serve-shared")
            .arg(&self.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            // Out of the client's process group: the client's signals to
            // its launch are not the server's.
            .process_group(0)
            .spawn()
            .map_err(io_error("cannot start the shared server"))?;
        let stdout = server.stdout.take().expect("stdout is piped");
        let (said, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = said.send(line.trim_end() == READY);
        });
        let status = match ready.recv_timeout(START_TIMEOUT) {
            // It outlives this launch; the kernel reaps it once this exits.
            Ok(true) => return Ok(()),
            Ok(false) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                match server.wait() {
                    Ok(status) => status.to_string(),
                    Err(e) => format!("its status is unknown: {e}"),
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let group = nix::unistd::Pid::from_raw(server.id() as i32);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                let _ = server.wait();
                format!("it did not listen within {START_TIMEOUT:?} and was killed")
            }
        };
        let mut message = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            use std::io::Seek;
            let _ = file.seek(io::SeekFrom::Start(offset));
            let _ = file.read_to_string(&mut message);
        }
        Err(SharedError::DidNotStart {
            status,
            log: self.log.clone(),
            message: message.trim_end().to_string(),
        })
    }

    /// The log, opened to append (a server still draining may write to it
    /// too), and its length before this start. A log past
    /// [`LOG_ROTATE_BYTES`] is moved to `.log.old` first.
    fn open_log(&self) -> Result<(File, u64), SharedError> {
        if fs::metadata(&self.log).is_ok_and(|m| m.len() > LOG_ROTATE_BYTES) {
            let _ = fs::rename(&self.log, self.log.with_extension("log.old"));
        }
        let log = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.log)
            .map_err(io_error(format!("cannot open {}", self.log.display())))?;
        let offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((log, offset))
    }
}

/// The directory of this user's shared servers, made if missing (mode
/// 0700), refused unless it is a directory of this user's alone.
fn runtime_dir() -> Result<PathBuf, SharedError> {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(runtime) if runtime.is_absolute() && runtime.is_dir() => runtime.join("code-executor"),
        _ => std::env::temp_dir().join(format!("code-executor-{uid}")),
    };
    let refuse = |reason: String| SharedError::RuntimeDir {
        dir: dir.clone(),
        reason,
    };
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refuse(format!("cannot create it: {e}"))),
    }
    let meta = fs::symlink_metadata(&dir).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    if meta.uid() != uid {
        return Err(refuse(format!(
            "it belongs to uid {}, not {uid}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "its mode is {:o}: others may use it (want 700)",
            meta.mode() & 0o777
        )));
    }
    Ok(dir)
}

/// Variables a shell sets that say nothing of the configuration.
const INCIDENTAL_VARIABLES: [&str; 4] = ["_", "SHLVL", "OLDPWD", "PWD"];

/// A digest of what makes one launch's server another's: the binary, the
/// arguments, the environment (less [`INCIDENTAL_VARIABLES`]), the working
/// directory and the contents of `files`.
fn launch_key(files: &[PathBuf]) -> io::Result<String> {
    let mut digest = Sha256::new();
    let mut part = |bytes: &[u8]| {
        digest.update((bytes.len() as u64).to_le_bytes());
        digest.update(bytes);
    };
    part(b"code-executor mcp --shared 1");
    let exe = std::env::current_exe()?;
    let meta = fs::metadata(&exe)?;
    part(exe.as_os_str().as_bytes());
    for n in [
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
    ] {
        part(&n.to_le_bytes());
    }
    part(std::env::current_dir()?.as_os_str().as_bytes());
    for arg in std::env::args_os().skip(1) {
        part(arg.as_bytes());
    }
    let mut vars: Vec<_> = std::env::vars_os()
        .filter(|(name, _)| !INCIDENTAL_VARIABLES.iter().any(|v| name == v))
        .collect();
    vars.sort();
    for (name, value) in vars {
        part(name.as_bytes());
        part(value.as_bytes());
    }
    for file in files {
        part(file.as_os_str().as_bytes());
        match fs::read(file) {
            Ok(contents) => part(&contents),
            Err(e) if e.kind() == io::ErrorKind::NotFound => part(b"absent"),
            Err(e) => return Err(e),
        }
    }
    let hash = digest.finalize();
    Ok(hash[..16].iter().map(|b| format!("{b:02x}")).collect())
}

/// Be a relay to this configuration's shared server (starting it if none
/// listens): copy stdin to it and its answers to stdout until it closes the
/// connection. End of stdin is passed on, so the server cancels this
/// client's runs as a stdio server would.
pub fn attach(options: &Options) -> Result<(), SharedError> {
    let place = SharedPlace::for_this_launch(options)?;
    let stream = place.connect_served()?;
    let mut to_server = stream
        .try_clone()
        .map_err(io_error("cannot duplicate the connection"))?;
    let input_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ended = input_ended.clone();
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            if pump(io::stdin().lock(), &mut to_server).is_ok() {
                ended.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            let _ = to_server.shutdown(std::net::Shutdown::Write);
        })
        .map_err(io_error("cannot start the relay's thread"))?;
    match pump(&stream, io::stdout().lock()) {
        // The server ends a connection after its client's end of input;
        // before that, it went away (stopped, or killed).
        Ok(()) if input_ended.load(std::sync::atomic::Ordering::SeqCst) => Ok(()),
        Ok(()) => Err(SharedError::Gone { log: place.log }),
        // The client closed our stdout: it is gone.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(io_error("relaying the shared server's answers failed")(e)),
    }
}

/// Copy `from` to `to`, flushing each read, until end of input.
fn pump(mut from: impl Read, mut to: impl Write) -> io::Result<()> {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}

/// Serve MCP on `socket` (a launch has just removed any stale one) to every
/// connection of this user, each as a stdio client, until no client has been
/// connected for `idle` or `shutdown` resolves; then remove the socket and
/// shut the executor down.
///
/// Writes `ready` on stdout once it listens (and points stdout at
/// /dev/null): the launch that started it waits for that line.
pub async fn serve_shared(
    executor: Arc<Executor>,
    config: &Config,
    socket: &Path,
    idle: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), SharedError> {
    let place = SharedPlace::of_socket(socket);
    let handler = McpHandler::new(executor.clone(), config);
    let listener = UnixListener::bind(socket)
        .map_err(io_error(format!("cannot listen on {}", socket.display())))?;
    let bound = fs::symlink_metadata(socket)
        .map_err(io_error(format!("cannot stat {}", socket.display())))?;
    if let Err(e) = announce_ready() {
        // The launch that started it died meanwhile; others can connect.
        tracing::warn!(error = %e, "cannot tell the launch that the server is ready");
    }
    tracing::info!(socket = %socket.display(), ?idle, "shared MCP server listening");
    let uid = nix::unistd::geteuid().as_raw();
    let stop = CancellationToken::new();
    let mut clients = JoinSet::new();
    let serve = |clients: &mut JoinSet<()>, stream: tokio::net::UnixStream| {
        match stream.peer_cred() {
            Ok(cred) if cred.uid() == uid => {}
            Ok(cred) => {
                tracing::warn!(uid = cred.uid(), "refused a connection from another user");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "refused a connection whose peer is unknown");
                return;
            }
        }
        let handler = handler.for_connection();
        let stop = stop.clone();
        clients.spawn(async move {
            let mut stream = stream;
            if let Err(e) = stream.write_all(HELLO).await {
                tracing::debug!(error = %e, "a launch left before it was greeted");
                return;
            }
            let (input, output) = stream.into_split();
            let over = "shared socket";
            if let Err(e) =
                serve_until_closed(handler, input, output, over, stop.cancelled_owned()).await
            {
                tracing::debug!(error = %e, "shared MCP connection ended");
            }
        });
    };
    tokio::pin!(shutdown);
    let mut stopping = false;
    loop {
        let none_connected = clients.is_empty();
        let idle_timer = async move {
            if none_connected {
                tokio::time::sleep(idle).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => serve(&mut clients, stream),
                Err(e) => tracing::warn!(error = %e, "accepting a connection failed"),
            },
            Some(_) = clients.join_next(), if !clients.is_empty() => {
                if clients.is_empty() {
                    tracing::info!(?idle, "no client is connected: idling");
                }
            }
            _ = idle_timer => {
                tracing::info!("idle: stopping the shared server");
                break;
            }
            _ = &mut shutdown => {
                tracing::info!("shutting down: cancelling MCP requests");
                stop.cancel();
                stopping = true;
                break;
            }
        }
    }
    // No new client from here: the socket's name goes first (under the lock,
    // and only if it is still this server's). Idling out, whoever connected
    // before that is served; stopping, they are dropped ungreeted, and
    // their launches start a new server.
    let removing = {
        let place = place.clone();
        tokio::task::spawn_blocking(move || remove_own_socket(&place, &bound)).await
    };
    match removing {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove the shared server's socket"),
        Err(e) => tracing::warn!(error = %e, "removing the shared server's socket failed"),
    }
    while !stopping
        && let Ok(Ok((stream, _))) = tokio::time::timeout(Duration::ZERO, listener.accept()).await
    {
        serve(&mut clients, stream);
    }
    drop(listener);
    // Served to their end when idling out; bounded when stopping.
    let patience = if stopping {
        STOP_TIMEOUT
    } else {
        Duration::MAX
    };
    let finished = tokio::time::timeout(patience, async {
        while clients.join_next().await.is_some() {}
    });
    if finished.await.is_err() {
        tracing::warn!(?STOP_TIMEOUT, "clients still connected: dropping them");
        clients.shutdown().await;
    }
    executor.shutdown().await;
    Ok(())
}

/// Remove `place`'s socket if it is still the one `bound` describes (a later
/// server may have replaced a stale-looking one).
fn remove_own_socket(place: &SharedPlace, bound: &fs::Metadata) -> Result<(), SharedError> {
    let _lock = place.take_lock()?;
    match fs::symlink_metadata(&place.socket) {
        Ok(now) if now.dev() == bound.dev() && now.ino() == bound.ino() => {
            fs::remove_file(&place.socket).map_err(io_error(format!(
                "cannot remove {}",
                place.socket.display()
            )))
        }
        _ => Ok(()),
    }
}

/// Write the ready line, then point stdout at /dev/null: the launch reads
/// one line and goes.
fn announce_ready() -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{READY}")?;
    stdout.flush()?;
    let null = File::options().write(true).open("/dev/null")?;
    nix::unistd::dup2_stdout(&null)?;
    Ok(())
}
