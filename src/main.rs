use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use code_executor::config::{Cli, Command, Config, LogFormat};
use code_executor::{Executor, server};
use tracing_subscriber::EnvFilter;

fn main() {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "sandbox-exec")
    {
        // The launcher, before every worker: no runtime, no threads, and no
        // parsing of the whole command line (half a millisecond); it execs
        // the worker.
        code_executor::sandbox_exec(code_executor::config::LaunchArgs::from_command_line());
    }
    let cli = Cli::parse();
    if let Command::HashToken(args) = &cli.command {
        hash_token(args.token.clone());
    }
    if let Err(err) = server::harden_process() {
        eprintln!("error: cannot harden the server process: {err}");
        std::process::exit(1);
    }
    if let Command::Mcp(mcp) = &cli.command
        && mcp.is_shared()
        && mcp.serve_shared.is_none()
    {
        // A relay to the shared server: no runtime, no executor.
        if mcp.idle() < std::time::Duration::from_secs(1) {
            eprintln!("error: --shared-idle must be at least 1 second");
            std::process::exit(2);
        }
        if let Err(err) = code_executor::mcp::attach(&mcp.options) {
            eprintln!("error: {:#}", anyhow::Error::from(err));
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let starts_executor = match &cli.command {
        Command::Serve(serve) => !serve.check_config,
        Command::Mcp(_) => true,
        _ => false,
    };
    if starts_executor {
        // While this process has one thread: see `probe_early`.
        code_executor::probe_sandbox_early();
    }
    serve(cli);
}

#[tokio::main]
async fn serve(cli: Cli) {
    if let Err(err) = run(cli).await {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(serve) => {
            let config = Config::load(&serve.options)?;
            if serve.check_config {
                let envs = config.describe_envs().await?;
                println!("configuration is valid");
                print!("{envs}");
                return Ok(());
            }
            init_logging(config.log_format);
            let listener = tokio::net::TcpListener::bind((config.host, config.port))
                .await
                .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
            let executor = Arc::new(Executor::start(&config).await?);
            tracing::info!(
                address = %listener.local_addr()?,
                env = executor.default_env(),
                "code-executor ready"
            );
            if config.token_generated
                && let Some(token) = &config.token
            {
                // Printed once, as Jupyter does; the token lives as long as this process.
                let port = listener.local_addr()?.port();
                tracing::warn!(
                    "no token was configured, so this one was generated for this run (set CODE_EXECUTOR_TOKEN to choose one); try: curl -H \"Authorization: Bearer {token}\" -d '{{\"code\":\"print(2+2)\"}}' http://127.0.0.1:{port}/execute"
                );
            }
            server::run(listener, executor, &config, server::drain_signal()).await?;
            tracing::info!("code-executor stopped");
            Ok(())
        }
        Command::Mcp(mcp) => {
            let config = Config::load(&mcp.options)?;
            init_logging(config.log_format);
            let executor = Arc::new(Executor::start_warming(&config).await?);
            if let Some(name) = &config.mcp_client
                && executor.clients().by_name(name).is_none()
            {
                anyhow::bail!("mcp_client {name:?} names no client of the clients file");
            }
            let reload = tokio::spawn(server::reload_on_sighup(executor.clone()));
            let shutdown = server::shutdown_signal();
            match &mcp.serve_shared {
                Some(socket) => {
                    code_executor::mcp::serve_shared(
                        executor,
                        &config,
                        socket,
                        mcp.idle(),
                        shutdown,
                    )
                    .await?
                }
                None => code_executor::mcp::serve_stdio(executor, &config, shutdown).await?,
            }
            reload.abort();
            Ok(())
        }
        Command::Envs(args) => {
            let config = Config::load(&args)?;
            init_logging(config.log_format);
            print!("{}", config.describe_envs().await?);
            Ok(())
        }
        Command::SandboxExec(_) | Command::HashToken(_) => {
            unreachable!("handled before the runtime starts")
        }
    }
}

/// `code-executor hash-token [TOKEN]`: print the token's SHA-256 (the
/// token from stdin when not given) and exit.
fn hash_token(token: Option<String>) -> ! {
    let token = token.unwrap_or_else(|| {
        let mut line = String::new();
        if let Err(err) = std::io::stdin().read_line(&mut line) {
            eprintln!("error: cannot read the token from stdin: {err}");
            std::process::exit(1);
        }
        line.trim_end_matches(['\r', '\n']).to_string()
    });
    if token.is_empty() {
        eprintln!("error: the token is empty");
        std::process::exit(1);
    }
    println!("{}", code_executor::auth::hash_token(&token));
    std::process::exit(0);
}

/// Log to stderr, filtered by `CODE_EXECUTOR_LOG` (default `info`), as text
/// or one JSON object per line.
fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("CODE_EXECUTOR_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .init(),
    }
}
