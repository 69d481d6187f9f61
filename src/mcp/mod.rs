//! The MCP front end, on the official Rust SDK (`rmcp`): a thin adapter over
//! [`Executor`](crate::executor::Executor), served over stdio
//! (`code-executor mcp`) and over streamable HTTP at `/mcp`.
//!
//! * [`args`]: tool arguments, and how a refused one is answered.
//! * [`handler`]: the tools (`execute_code`, `list_environments`), their
//!   descriptions and the server's `instructions`.
//! * [`result`]: shaping a run or a refusal into a tool result.
//! * [`session`]: `create_session`/`close_session` arguments and the
//!   optional implicit session of a connection.
//! * [`stdio`]: serving one client on standard input/output.
//! * [`shared`]: one warm server for a user's launches (`mcp --shared`).
//! * [`http`]: the streamable HTTP service the axum server nests at `/mcp`.

pub mod args;
pub mod handler;
pub mod http;
pub mod result;
pub mod session;
pub mod shared;
pub mod stdio;

pub use handler::McpHandler;
pub use http::http_service;
pub use shared::{SharedError, attach, serve_shared};
pub use stdio::{StdioError, serve_stdio};
