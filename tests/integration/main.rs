//! Integration tests: one binary, one module per behaviour.

mod common;

mod mcp;
mod mcp_python;


mod execute;
