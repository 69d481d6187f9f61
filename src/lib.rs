//! code-executor: run Python code in warm, fork-isolated workers of chosen
//! environments and return stdout, stderr, exit status and more.
//!
//! # Layout
//!
//! * [`artifacts`]: the bounded store of run artifacts behind MCP resources and `GET /artifacts`.
//! * [`config`]: command line, `CODE_EXECUTOR_*` variables and the TOML file.
//! * [`env`]: what an environment is; resolving the configured one; activation variables.
//! * [`protocol`]: the length-prefixed msgpack frames spoken with `python/worker.py`.
//! * [`worker`]: one worker process: spawn, handshake, run, terminate.
//! * [`pool`]: a pre-warmed `deadpool` of workers per environment, refilled in the background.
//! * [`session`]: stateful sessions: a persistent namespace per session, TTL, caps, interrupts.
//! * [`executor`]: the one service front ends call: validate, pick a pool, run, shape the result.
//! * [`grade`]: one submission against many test cases (`Executor::grade`): verdicts, rusage.
//! * [`metrics`]: Prometheus metrics: run, queue, worker, HTTP and MCP counters.
//! * [`types`]: request and result types shared by every front end.
//! * [`http`]: the axum HTTP/JSON API and its error type.
//! * [`mcp`]: the MCP server (`rmcp`): tools over the executor, stdio and streamable HTTP.
//! * [`sandbox`]: the launcher workers start through (namespaces, Landlock,
//!   `no_new_privs`, `run_as`) and what the host supports.
//! * [`replica`]: this replica behind a load balancer: its id, draining, what a
//!   session id says about the replica that holds it.
//! * [`server`]: serving the HTTP API (and MCP at `/mcp`): drain on SIGTERM, then
//!   graceful shutdown.
//! * [`error`]: typed errors, one enum per layer.
//! * [`sys`]: the only `unsafe` code: system calls no safe crate wraps (`close_range`).

#![deny(unsafe_code)]

pub mod api;
pub mod artifacts;
pub mod config;
pub mod env;
pub mod error;
pub mod executor;
pub mod grade;
pub mod http;
pub mod limits;
pub mod mcp;
pub mod metrics;
pub mod outcome;
pub mod pool;
pub mod protocol;
pub mod replica;
pub mod sandbox;
pub mod server;
pub mod session;
pub mod sys;
pub mod worker;

pub use config::Config;
pub use executor::Executor;
