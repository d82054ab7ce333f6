//! Recovery through the runtime: the passes that resolve what a crash left
//! pending or unknown, each with its plugin's reconciler and grants.

use super::Runtime;
use super::reconcile;
use crate::guard::{Pace, Reconciler, RecoveryReport, ToolRules};
use std::sync::Arc;

impl Runtime {
    /// Resolves every attempt left pending or unknown (see
    /// [`crate::guard::recover`]). Safe alongside calls: it takes each call's lock.
    ///
    /// # Errors
    /// There is no guard, or the ledger cannot be read.
    pub async fn recover(&self) -> Result<RecoveryReport, String> {
        self.recover_at(Pace::All).await
    }

    /// A fleet's takeover pass: [`Runtime::recover`], but only for attempts
    /// no host has tried for a tenth of their age ([`Pace::Due`]).
    ///
    /// # Errors
    /// There is no guard, or the ledger cannot be read.
    pub async fn takeover_pass(&self) -> Result<RecoveryReport, String> {
        self.recover_at(Pace::Due).await
    }

    /// Resolves the unsettled attempts `pace` picks.
    async fn recover_at(&self, pace: Pace) -> Result<RecoveryReport, String> {
        let guard = self.guard().ok_or("no guard is set, so there is no ledger to recover")?;
        let rules_for = |tool: &str| -> Option<ToolRules> {
            let (index, _) = self.tools.get(tool)?;
            let plugin = &self.plugins[*index];
            let reconciler = reconcile::PluginReconciler::for_plugin(&self.core, plugin).map(|r| Arc::new(r) as Arc<dyn Reconciler>);
            Some(ToolRules { grants: plugin.ctx.grants.clone(), wires: plugin.ctx.wires.clone(), reconciler })
        };
        guard.recover(&rules_for, pace).await.map_err(|e| e.to_string())
    }

    /// What the start-up recovery pass of [`Runtime::from_config`] did.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.recovery.as_ref()
    }
}
