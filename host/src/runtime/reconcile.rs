//! A plugin's optional `reconciler` export, run in a sandbox of its own (with
//! the plugin's grants: `fetch` works, `send` is denied) while the
//! invocation that needs it waits in a send, or during recovery.

use super::bindings::types;
use super::outbound::{Mode, wit};
use super::plugin::LoadedPlugin;
use super::sandbox::{Core, Slot};
use crate::guard::{Reconciled, Reconciler};
use crate::keys;
use crate::ledger::AttemptRecord;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use wasmtime::component::ComponentExportIndex;

/// The exported interface a reconciling plugin provides.
pub const RECONCILER_INTERFACE: &str = "toolguard:plugin/reconciler@0.1.0";

/// Runs one plugin's `reconcile`.
pub(crate) struct PluginReconciler {
    core: Arc<Core>,
    plugin: Arc<LoadedPlugin>,
    func: ComponentExportIndex,
}

/// The `reconcile` function's index, if the component exports the interface.
pub(crate) fn find_export(component: &wasmtime::component::Component) -> Option<ComponentExportIndex> {
    let interface = component.get_export_index(None, RECONCILER_INTERFACE)?;
    component.get_export_index(Some(&interface), "reconcile")
}

/// The typed `reconcile` function of `instance`.
pub(crate) fn typed(
    store: &mut wasmtime::Store<super::state::HostState>,
    instance: &wasmtime::component::Instance,
    func: &ComponentExportIndex,
) -> wasmtime::Result<wasmtime::component::TypedFunc<(String, String, types::Attempt), (types::Reconciliation,)>> {
    instance.get_typed_func::<(String, String, types::Attempt), (types::Reconciliation,)>(store, func)
}

impl PluginReconciler {
    /// The reconciler of `plugin`, if it exports one.
    pub(crate) fn for_plugin(core: &Arc<Core>, plugin: &Arc<LoadedPlugin>) -> Option<Self> {
        plugin.reconcile.map(|func| Self { core: core.clone(), plugin: plugin.clone(), func })
    }
}

impl Reconciler for PluginReconciler {
    fn reconcile<'a>(&'a self, tool: &'a str, args: &'a Value, attempt: &'a AttemptRecord) -> Pin<Box<dyn Future<Output = Reconciled> + Send + 'a>> {
        Box::pin(async move {
            let Ok(args) = keys::canonical_args(args) else {
                return Reconciled::StillUnknown("the recorded arguments cannot be canonicalised".into());
            };
            let attempt = wit::attempt(attempt);
            // The plugin knows its tools without the host's prefix.
            let own = tool.strip_prefix(&*self.plugin.ctx.tool_prefix).unwrap_or(tool);
            let (func, tool) = (self.func, own.to_string());
            let (found, _) = self
                .core
                .sandboxed(&self.plugin, (Mode::NoCall, super::questions::Asking::default()), Slot::Reconcile, move |store, instance| {
                    Box::pin(async move {
                        let f = typed(store, &instance, &func)?;
                        Ok(f.call_async(&mut *store, (tool, args, attempt)).await?.0)
                    })
                })
                .await;
            match found {
                Ok(found) => wit::reconciliation(found),
                Err(fault) => Reconciled::StillUnknown(format!("reconcile failed: {fault}")),
            }
        })
    }
}
