//! code-executor: run Python code in warm, fork-isolated workers of chosen
//! environments and return stdout, stderr, exit status and more.
//!
//! # Layout
//!
//! The service and what it is made of:
//!
//! * [`executor`]: the one service front ends call. `start.rs` finds and
//!   activates environments and starts their pools; `prepare.rs` validates a
//!   request (every refusal of its content); `run.rs` runs it on a worker
//!   and shapes the result; `sessions.rs` starts and ends sessions;
//!   `mod.rs` holds environment lookup, `/list-envs`, `/health`, installs
//!   and shutdown.
//! * [`api`]: every request and result type a client sends or sees
//!   (`/execute`, `/grade`, `/sessions`, `/list-envs`, `/health`, installs).
//! * [`outcome`]: how a run ended: the [`outcome::Limit`] that stopped it,
//!   its signal and errno, computed once for results, verdicts and metrics.
//! * [`limits`]: request caps, result caps, narrowing a request's limits
//!   and timeout to the server's.
//! * [`grade`]: one submission against many test cases (`Executor::grade`):
//!   verdicts, checkers, test-code mode, batches.
//! * [`error`]: typed errors, one enum per layer, with the codes and HTTP
//!   statuses clients see.
//! * [`config`]: every option in one layered shape (flag, `CODE_EXECUTOR_*`
//!   variable, TOML key, default) resolved into [`Config`].
//!
//! Workers and environments:
//!
//! * [`env`]: what an environment is (`EnvSpec`); discovering Conda
//!   environments (`discover.rs`); naming them (`registry.rs`); activation
//!   scripts (`activate.rs`); package listing and installs (`install.rs`,
//!   spec checks in `packages.rs`).
//! * [`protocol`]: the length-prefixed msgpack frames spoken with
//!   `python/worker.py` (the bootstrap every worker runs).
//! * [`worker`]: one worker process: spawn, handshake, run, terminate;
//!   a session's calls written to its process and answered by it
//!   (`direct.rs`).
//! * [`pool`]: a pre-warmed `deadpool` of workers per environment, refilled
//!   in the background; spare rotation in `spares.rs`, the server-wide
//!   worker cap in `budget.rs`.
//! * [`session`]: stateful sessions: a persistent namespace per session,
//!   TTL, caps, interrupts.
//! * [`sandbox`]: how workers are confined: the launcher they start through
//!   (`launch.rs`: namespaces, pivot_root, Landlock, capabilities, rlimits),
//!   seccomp filters (`seccomp.rs`), cgroups for memory and processes
//!   (`cgroup.rs`), and what the host supports (`mod.rs`, `/health`'s
//!   `sandbox`).
//! * [`artifacts`]: the bounded store of run artifacts behind MCP resources
//!   and `GET /artifacts`.
//!
//! Front ends and operations:
//!
//! * [`http`]: the axum HTTP/JSON API, its error type (`error.rs`),
//!   streaming (`stream.rs`), request deadlines (`guard.rs`), OpenAPI
//!   (`openapi.rs`).
//! * [`mcp`]: the MCP server (`rmcp`): tools over the executor
//!   (`handler.rs`), tool results (`result.rs`), stdio and streamable HTTP.
//! * [`auth`]: who is calling and what they may do: the clients file
//!   (scopes, env allow-lists, ceilings), token hashing, the request's
//!   [`auth::Caller`]; quotas (in-flight runs, token-bucket rate) in
//!   `quota.rs`. Enforced by the HTTP gate (`http/gate.rs`), the MCP
//!   handler and the executor.
//! * [`audit`]: the audit record (versioned schema) and its non-blocking
//!   sink: a bounded queue, one writer thread, fail open or closed,
//!   SIGHUP reopen and size rotation.
//! * [`server`]: serving the HTTP API (and MCP at `/mcp`): connection
//!   limits, drain on SIGTERM, graceful shutdown.
//! * [`metrics`]: Prometheus metrics: runs, queues, workers, HTTP and MCP.
//! * [`replica`]: this replica behind a load balancer: its id, draining,
//!   what a session id says about the replica that holds it.
//! * [`sys`]: the only `unsafe` code: system calls no safe crate wraps.

#![deny(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

pub mod api;
pub(crate) mod artifacts;
pub mod audit;
pub mod auth;
pub mod config;
pub(crate) mod egress;
pub(crate) mod env;
pub mod error;
pub mod executor;
pub(crate) mod grade;
pub mod http;
pub mod limits;
pub(crate) mod marshal;
pub mod mcp;
pub(crate) mod metrics;
pub mod outcome;
pub(crate) mod pool;
pub(crate) mod protocol;
pub(crate) mod replica;
pub(crate) mod sandbox;
pub mod server;
pub(crate) mod session;
pub(crate) mod sys;
pub(crate) mod worker;

pub use config::Config;
pub use executor::Executor;

/// `code-executor sandbox-exec`: start a program inside the worker sandbox
/// (see the `sandbox` module); never returns.
pub fn sandbox_exec(args: config::LaunchArgs) -> ! {
    sandbox::launch::main(args)
}

/// Probe the host's sandbox now, while the process has one thread (the
/// binary, before its runtime starts); the next start takes the report.
pub fn probe_sandbox_early() {
    sandbox::probe_early()
}

/// What the crate's own tests and benchmarks drive below the service: a
/// worker alone, a pool alone, the wire protocol. Not a stable interface.
#[doc(hidden)]
pub mod testing {
    pub use crate::env::EnvSpec;
    pub use crate::pool::{EnvPool, PoolConfig};
    pub use crate::protocol::{
        ExecFrame, FileEntry, MAX_FRAME_BYTES, PROTOCOL_VERSION, WireLimits, WireSelection,
        decode_frame, encode_frame, encode_marshal_frame,
    };
    pub use crate::sandbox::launch::LaunchArgs;
    pub use crate::worker::{RunOutput, Worker, WorkerSpec};
}
