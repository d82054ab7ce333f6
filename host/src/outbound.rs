//! The host side of `toolguard:plugin/outbound`, the plugin's only way out.
//!
//! Every call counts against the invocation's outbound budget; going over it
//! stops the invocation (`limit-exceeded`). `send` goes through the tool
//! call's guard (see [`crate::guard`]); without one (no ledger configured, or
//! during `describe`) it is `denied`. `fetch` needs only the grants.

use crate::runtime::bindings::{outbound, types};
use crate::runtime::state::HostState;
use types::{OutboundError, Request, Response};

impl HostState {
    /// Counts one outbound call; stops the invocation once over budget.
    fn count_outbound(&mut self) -> wasmtime::Result<()> {
        self.outbound_calls += 1;
        let max = self.plugin.limits.max_outbound_calls;
        if self.outbound_calls > max {
            return Err(self.stop(format!(
                "plugin `{}` made more than {max} outbound calls in one invocation (max_outbound_calls)",
                self.plugin.name
            )));
        }
        Ok(())
    }
}

impl outbound::Host for HostState {
    async fn send(&mut self, req: Request) -> wasmtime::Result<Result<Response, OutboundError>> {
        self.count_outbound()?;
        match self.call_guard.as_mut() {
            Some(call) => Ok(call.send(req).await),
            None if self.call.unguarded => match &self.guard {
                Some(guard) => Ok(crate::guard::send_unguarded(guard, &self.plugin.grants, req).await),
                None => Ok(Err(OutboundError::Denied("no guard to borrow a client from; nothing was sent".into()))),
            },
            None if self.call.read_only => Ok(Err(OutboundError::Denied(format!(
                "`{}` is a read-only tool: it may fetch but not send; nothing was sent",
                self.call.tool
            )))),
            None => Ok(Err(OutboundError::Denied(format!(
                "{} {}: no guarded tool call is in progress (no ledger, or during describe); nothing was sent",
                req.method, req.url
            )))),
        }
    }

    async fn fetch(&mut self, req: Request) -> wasmtime::Result<Result<Response, OutboundError>> {
        self.count_outbound()?;
        match &self.guard {
            Some(guard) => Ok(crate::guard::fetch(guard, &self.plugin.grants, req).await),
            None => Ok(Err(OutboundError::Denied(format!(
                "{} {}: plugin `{}` has no outbound grant for this URL; nothing was sent",
                req.method, req.url, self.plugin.name
            )))),
        }
    }

    async fn config(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.plugin.settings.get(&name).cloned())
    }
}

impl types::Host for HostState {}
