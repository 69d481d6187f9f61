//! Integration tests: one binary, one module per behaviour.

mod common;

mod crashes;
mod execute;
mod isolation;
mod timeouts;
mod codec;
mod concurrency;
mod http_api;
mod shutdown;
