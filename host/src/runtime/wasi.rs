//! Least-privilege WASI: the linker gets `wasi:io`, `wasi:clocks`,
//! `wasi:random` and `wasi:cli` interface by interface, and an inert
//! `wasi:filesystem` with no preopens (see `inert_fs`) — nothing else. No
//! sockets, no HTTP: a component importing them cannot even be instantiated
//! (`toolguard seal` composes trapping stubs under such a component). The CLI context is empty: no environment, no arguments,
//! stdin closed; stdout and stderr become log lines tagged with the plugin.

use std::sync::{Arc, Mutex};
use wasmtime::component::{HasData, Linker, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream, WasiCli, WasiCliView as _};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView as _};
use wasmtime_wasi::p2::bindings::{cli, clocks, random};
use wasmtime_wasi::random::WasiRandom;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiView};
use wasmtime_wasi_io::bindings::wasi::io;

/// Bytes of stdout (and again of stderr) logged per invocation; the rest is counted and dropped.
pub const LOG_BUDGET: usize = 64 << 10;

struct HasTable;
impl HasData for HasTable {
    type Data<'a> = &'a mut ResourceTable;
}

/// Links the allowed WASI interfaces (see [`crate::imports::LINKED`]) into `l`.
///
/// # Errors
/// An interface is already defined in the linker.
pub fn add_to_linker<T: WasiView + 'static>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    io::error::add_to_linker::<T, HasTable>(l, |t| t.ctx().table)?;
    io::poll::add_to_linker::<T, HasTable>(l, |t| t.ctx().table)?;
    io::streams::add_to_linker::<T, HasTable>(l, |t| t.ctx().table)?;
    clocks::wall_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    clocks::monotonic_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    random::random::add_to_linker::<T, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    random::insecure::add_to_linker::<T, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    random::insecure_seed::add_to_linker::<T, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    cli::environment::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::exit::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_input::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_output::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    cli::terminal_stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    super::inert_fs::add_to_linker(l)?;
    Ok(())
}

/// A WASI context that grants nothing: empty environment, no arguments,
/// stdin closed, no preopens, network off; output goes to `stdout`/`stderr`.
pub fn context(stdout: PluginLog, stderr: PluginLog) -> WasiCtx {
    WasiCtxBuilder::new().stdout(stdout).stderr(stderr).build()
}

/// One output stream of one invocation, turned into host log lines tagged
/// with the plugin (stdout at INFO, stderr at WARN).
#[derive(Clone)]
pub struct PluginLog(Arc<Mutex<LogBuffer>>);

struct LogBuffer {
    plugin: Arc<str>,
    stderr: bool,
    partial: Vec<u8>,
    logged: usize,
    dropped: usize,
    /// The last few lines, for error messages (a panic spans several).
    tail: std::collections::VecDeque<String>,
}

/// Lines of stderr kept for error messages.
const TAIL_LINES: usize = 4;

impl PluginLog {
    /// A log for `plugin`'s stdout, or its stderr when `stderr` is true.
    pub fn new(plugin: Arc<str>, stderr: bool) -> Self {
        Self(Arc::new(Mutex::new(LogBuffer { plugin, stderr, partial: Vec::new(), logged: 0, dropped: 0, tail: std::collections::VecDeque::new() })))
    }

    /// The last few lines written, joined with ` | ` (e.g. a panic message),
    /// without Rust's hint about `RUST_BACKTRACE`, which cannot apply here.
    pub fn tail(&self) -> Option<String> {
        let b = self.lock();
        let lines: Vec<&str> = b.tail.iter().map(String::as_str).filter(|l| !l.trim().is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE")).collect();
        (!lines.is_empty()).then(|| lines.join(" | "))
    }

    /// Logs a trailing partial line and any dropped-bytes count.
    pub fn finish(&self) {
        let mut b = self.lock();
        if !b.partial.is_empty() {
            let line = std::mem::take(&mut b.partial);
            b.emit(&line);
        }
        if b.dropped > 0 {
            let (plugin, dropped) = (b.plugin.clone(), std::mem::take(&mut b.dropped));
            tracing::warn!(target: "toolguard::plugin", plugin = %plugin, "dropped {dropped} bytes of output over the log budget");
        }
    }

    fn write(&self, bytes: &[u8]) {
        let mut b = self.lock();
        let room = LOG_BUDGET.saturating_sub(b.logged);
        let (kept, over) = bytes.split_at(bytes.len().min(room));
        b.logged += kept.len();
        b.dropped += over.len();
        b.partial.extend_from_slice(kept);
        while let Some(end) = b.partial.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = b.partial.drain(..=end).collect();
            b.emit(&line[..end]);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogBuffer> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LogBuffer {
    fn emit(&mut self, line: &[u8]) {
        let line = String::from_utf8_lossy(line).trim_end_matches('\r').to_string();
        if self.stderr {
            tracing::warn!(target: "toolguard::plugin", plugin = %self.plugin, stream = "stderr", "{line}");
        } else {
            tracing::info!(target: "toolguard::plugin", plugin = %self.plugin, stream = "stdout", "{line}");
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }
}

impl IsTerminal for PluginLog {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for PluginLog {
    fn p2_stream(&self) -> Box<dyn wasmtime_wasi_io::streams::OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl wasmtime_wasi_io::streams::OutputStream for PluginLog {
    fn write(&mut self, bytes: wasmtime_wasi_io::bytes::Bytes) -> wasmtime_wasi_io::streams::StreamResult<()> {
        PluginLog::write(self, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> wasmtime_wasi_io::streams::StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> wasmtime_wasi_io::streams::StreamResult<usize> {
        Ok(LOG_BUDGET)
    }
}

#[wasmtime_wasi_io::async_trait]
impl wasmtime_wasi_io::poll::Pollable for PluginLog {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for PluginLog {
    fn poll_write(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>, buf: &[u8]) -> std::task::Poll<std::io::Result<usize>> {
        PluginLog::write(&self, buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
