//! The host side of `toolguard:plugin/outbound`, the plugin's only way out.
//!
//! Every call counts against the invocation's outbound budget; going over it
//! stops the invocation (`limit-exceeded`). Until grants and the guard are
//! configured, `send` and `fetch` answer `denied` and nothing leaves the host.

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
        Ok(Err(OutboundError::Denied(format!(
            "{} {}: plugin `{}` has no outbound grant for side-effecting requests; nothing was sent",
            req.method, req.url, self.plugin.name
        ))))
    }

    async fn fetch(&mut self, req: Request) -> wasmtime::Result<Result<Response, OutboundError>> {
        self.count_outbound()?;
        Ok(Err(OutboundError::Denied(format!(
            "{} {}: plugin `{}` has no outbound grant for this URL; nothing was sent",
            req.method, req.url, self.plugin.name
        ))))
    }

    async fn config(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.plugin.settings.get(&name).cloned())
    }
}

impl types::Host for HostState {}
