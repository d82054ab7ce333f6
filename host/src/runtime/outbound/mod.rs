//! The `toolguard:plugin/outbound` capability — the plugin's only way out —
//! in one place: its per-invocation context ([`Outbound`]), its linking, and
//! (in [`wit`]) every conversion between the plugin contract's types and the
//! guard's.
//!
//! Deny by default. Every call counts against the invocation's outbound
//! budget (`max_outbound_calls`); going over it stops the invocation
//! (`limit-exceeded`). `send` goes through the tool call's guard
//! ([`crate::guard::CallGuard`]); without one — a read-only tool, `describe`,
//! a reconciler's sandbox, no ledger — it is `denied` and nothing is sent.
//! `fetch` needs only the plugin's grants. `config` serves the plugin's
//! non-secret settings.

pub mod wit;

use super::bindings::{outbound, types};
use super::context::PluginContext;
use crate::guard::{self, CallGuard, Guard, SendError};
use std::sync::Arc;
use wasmtime::component::{HasData, Linker};

/// What an invocation may do with `send`.
#[allow(clippy::large_enum_variant, reason = "one per invocation, moved once into its store")]
pub(crate) enum Mode {
    /// `describe`, or a reconciler's lookup: no tool call is in progress.
    NoCall,
    /// A call of a read-only tool (named): it may fetch, never send.
    ReadOnly(String),
    /// A call of a side-effecting tool, under its guard.
    Guarded(CallGuard),
    /// `toolguard bench`'s baseline only: sends go straight to HTTP
    /// (`Runtime::unguarded_for_bench`; no config reaches it). Compiled only
    /// with the `bench` feature: the shipped binary has no such mode.
    #[cfg(feature = "bench")]
    Unguarded,
}

/// The outbound capability's state for one invocation.
pub struct Outbound {
    plugin: Arc<PluginContext>,
    guard: Option<Arc<Guard>>,
    mode: Mode,
    /// Outbound calls made so far.
    calls: u32,
    /// Set when the outbound budget stopped the invocation.
    pub(crate) limit_hit: Option<String>,
}

impl Outbound {
    /// The capability for one invocation of `plugin` in `mode`; `guard`
    /// lends its HTTP clients to `fetch` (none: nothing can be fetched).
    pub(crate) fn new(plugin: Arc<PluginContext>, guard: Option<Arc<Guard>>, mode: Mode) -> Self {
        Self { plugin, guard, mode, calls: 0, limit_hit: None }
    }

    /// The call guard back, once the invocation is over (for `Guard::finish`).
    pub(crate) fn take_call(&mut self) -> Option<CallGuard> {
        match std::mem::replace(&mut self.mode, Mode::NoCall) {
            Mode::Guarded(call) => Some(call),
            _ => None,
        }
    }

    /// Counts one outbound call; stops the invocation once over budget.
    fn count(&mut self) -> wasmtime::Result<()> {
        self.calls += 1;
        let max = self.plugin.limits.max_outbound_calls;
        if self.calls <= max {
            return Ok(());
        }
        let limit = format!("plugin `{}` made more than {max} outbound calls in one invocation (max_outbound_calls)", self.plugin.name);
        self.limit_hit.get_or_insert(limit.clone());
        Err(wasmtime::Error::msg(limit))
    }

    /// `send`, in the guard's terms.
    async fn send(&mut self, req: guard::Request) -> Result<guard::Response, SendError> {
        match (&mut self.mode, &self.guard) {
            (Mode::Guarded(call), _) => call.send(req).await,
            #[cfg(feature = "bench")]
            (Mode::Unguarded, Some(_)) => guard::send_unguarded(&self.plugin.wires, &self.plugin.grants, req).await,
            #[cfg(feature = "bench")]
            (Mode::Unguarded, None) => Err(SendError::Denied("no guard to borrow a client from; nothing was sent".into())),
            (Mode::ReadOnly(tool), _) => Err(SendError::Denied(format!("`{tool}` is a read-only tool: it may fetch but not send; nothing was sent"))),
            (Mode::NoCall, _) => Err(SendError::Denied(format!(
                "{} {}: no guarded tool call is in progress (no ledger, or during describe); nothing was sent",
                req.method, req.url
            ))),
        }
    }

    /// `fetch`, in the guard's terms.
    async fn fetch(&mut self, req: guard::Request) -> Result<guard::Response, SendError> {
        match &self.guard {
            Some(_) => guard::fetch(&self.plugin.wires, &self.plugin.grants, req).await,
            None => Err(SendError::Denied(format!(
                "{} {}: plugin `{}` has no outbound grant for this URL; nothing was sent",
                req.method, req.url, self.plugin.name
            ))),
        }
    }
}

impl outbound::Host for Outbound {
    async fn send(&mut self, req: types::Request) -> wasmtime::Result<Result<types::Response, types::OutboundError>> {
        self.count()?;
        Ok(Outbound::send(self, wit::request(req)).await.map(wit::response).map_err(wit::send_error))
    }

    async fn fetch(&mut self, req: types::Request) -> wasmtime::Result<Result<types::Response, types::OutboundError>> {
        self.count()?;
        Ok(Outbound::fetch(self, wit::request(req)).await.map(wit::response).map_err(wit::send_error))
    }

    async fn config(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.plugin.settings.get(&name).cloned())
    }
}

impl types::Host for Outbound {}

/// A store's state that carries the outbound capability.
pub trait OutboundView: Send {
    /// The capability of the invocation this store runs.
    fn outbound(&mut self) -> &mut Outbound;
}

/// Projects a store's state onto its outbound capability.
struct HasOutbound;

impl HasData for HasOutbound {
    type Data<'a> = &'a mut Outbound;
}

/// Links `toolguard:plugin/outbound` (and its types) into `linker`, and
/// nothing else.
///
/// # Errors
/// The interface is already defined in the linker.
pub fn add_to_linker<T: OutboundView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    types::add_to_linker::<T, HasOutbound>(linker, T::outbound)?;
    outbound::add_to_linker::<T, HasOutbound>(linker, T::outbound)
}
