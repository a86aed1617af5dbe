//! The `sked` binary: parses the command line and wires the crates together. It holds no
//! scheduling logic: `serve` runs the server (and, for `sked dev`, an in-process worker), and
//! the client commands are thin calls to the HTTP API.

mod apply;
mod cli;
mod client;
mod config;
mod graph;
mod import;
mod manual;
mod serve;
mod service;
mod sim;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // A shell attempt's supervisor is this binary again: before anything else starts.
    if let Some(code) = sked_worker::executor::supervisor::run_if_requested() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Settings from a config file join the command line below the flags and variables set.
    let argv = match config::apply(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = cli::Cli::parse_from(argv);
    if !cli.is_long_running() {
        quiet_on_closed_pipe();
    }
    let log = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never into a file or a journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cli.log_format() {
        cli::LogFormat::Text => log.init(),
        // A line's own fields sit beside `message`; the span it happened in (an attempt)
        // under `span`.
        cli::LogFormat::Json => log
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = cli.log_format() == cli::LogFormat::Json;
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // Written, with what it left out already on standard error.
        Err(e) if e.is::<import::Partial>() => ExitCode::from(import::EXIT_PARTIAL),
        // In JSON mode every line is a log record, the last one too.
        Err(e) if json => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A client command piped into `head` ends, like any Unix tool, by SIGPIPE once the reader has
/// gone, rather than panicking in `println!`. Rust ignores SIGPIPE by default; the server,
/// worker and `sked dev` keep that (their sockets' writes report a closed peer as an error),
/// and sockets never raise it here either, since Rust sends with `MSG_NOSIGNAL`.
fn quiet_on_closed_pipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: no other thread exists yet, and the default action installs no handler code.
    if let Err(e) = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
        eprintln!("warning: cannot restore SIGPIPE's default action: {e}");
    }
}
