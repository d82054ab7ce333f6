//! Loading: a runtime built from a config (ledger, guard, downstreams), and
//! each plugin added — its bytes read and pinned, its imports checked, its
//! footprint fitted, compiled, linked, described and its schemas compiled.

use super::Runtime;
use super::bindings::{Plugin, PluginPre};
use super::context::PluginContext;
use super::outbound::Mode;
use super::plugin::LoadedPlugin;
use super::sandbox::Slot;
use super::{Allocator, Footprint, StartError, ToolInfo, compile, plugin, reconcile};
use crate::config::{Config, PluginConfig};
use crate::error::LoadError;
use crate::guard::Guard;
use crate::policy::EffectivePolicy;
use std::sync::Arc;

impl Runtime {
    /// A runtime with every plugin of `config` loaded, once a recovery pass
    /// has resolved every unsettled attempt it can: a one-shot command then
    /// acts on a settled ledger ([`Runtime::recovery`] says what it did).
    ///
    /// # Errors
    /// The engine cannot be set up, any plugin is refused (all refusals are
    /// listed), or the pass cannot read the ledger.
    pub async fn from_config(config: &Config) -> Result<Self, StartError> {
        let mut runtime = Self::from_config_recovering_later(config).await?;
        runtime.recovery = Some(runtime.recover().await.map_err(StartError::Guard)?);
        Ok(runtime)
    }

    /// [`Runtime::from_config`] without the recovery pass, for a server that
    /// answers at once and runs [`Runtime::recover`] alongside: the pass and
    /// every call take a call's lock, so a call the pass has not reached yet
    /// drives its own unsettled attempts with their keys, and a repeat under
    /// a new id is held by the hold rule as after any crash.
    ///
    /// # Errors
    /// The engine cannot be set up, or any plugin is refused (all refusals are listed).
    pub async fn from_config_recovering_later(config: &Config) -> Result<Self, StartError> {
        // Every component first, pins and signatures checked before any is
        // compiled; the pool is sized to those that will load.
        let sources = super::source::Sources::of(config);
        let mut components = Vec::with_capacity(config.plugins.len());
        for plugin in &config.plugins {
            components.push(sources.read(plugin).await);
        }
        let needs = components.iter().flatten().filter_map(|c| Footprint::of(&c.bytes).ok()).fold(Footprint::default(), Footprint::max);
        let engine = config.engine.fitted_to(needs);
        let mut runtime = Self::new(&engine, config.compile_cache.clone())?.with_downstreams(config.downstreams.clone());
        // Credentials are read now, once: a missing one stops the host at start.
        runtime.wires = Arc::new(crate::guard::Wires::new(&config.downstreams).map_err(StartError::Guard)?);
        let owned = config.clone();
        let ledger = tokio::task::spawn_blocking(move || owned.open_ledger(false))
            .await
            .map_err(|e| StartError::Guard(e.to_string()))?
            .map_err(|e| if e.is_busy() { StartError::LedgerBusy(e.to_string()) } else { StartError::Guard(e.to_string()) })?;
        runtime.set_guard(Guard::new(ledger));
        runtime.add_components(config, components, true).await?;
        runtime.record_grants().await.map_err(StartError::Guard)?;
        runtime.publish(config);
        runtime.receipts = config.ledger_dir().map(crate::receipts::Receipts::beside);
        Ok(runtime)
    }

    /// Adds each plugin of `config` from its component as read. One whose
    /// registry cannot be reached is left out (noted in `unavailable`) when
    /// `leave_out_unreachable` — at start: the host serves the others — and
    /// refused otherwise (a reload keeps the generation that has it).
    ///
    /// # Errors
    /// Every refusal, listed.
    pub(super) async fn add_components(
        &mut self,
        config: &Config,
        components: Vec<Result<super::source::Component, LoadError>>,
        leave_out_unreachable: bool,
    ) -> Result<(), StartError> {
        let mut refused = Vec::new();
        for (plugin, component) in config.plugins.iter().zip(components) {
            match component {
                Ok(component) => {
                    if let Err(e) = self.add_component(plugin, component).await {
                        refused.push(e);
                    }
                }
                Err(e @ LoadError::Unavailable { .. }) if leave_out_unreachable => {
                    tracing::error!("{e}");
                    self.unavailable.push(e.to_string());
                }
                Err(e) => refused.push(e),
            }
        }
        if refused.is_empty() { Ok(()) } else { Err(StartError::Plugins(refused)) }
    }

    /// Loads one plugin. A refused plugin leaves the runtime as it was.
    ///
    /// # Errors
    /// Why the plugin was refused; see [`LoadError`].
    pub async fn add_plugin(&mut self, config: &PluginConfig) -> Result<(), LoadError> {
        let component = super::source::Sources::local().read(config).await?;
        self.add_component(config, component).await
    }

    /// Loads one plugin from its component, which its pin and signature
    /// admitted ([`super::source::Sources::read`]). A refused plugin leaves
    /// the runtime as it was.
    ///
    /// # Errors
    /// Why the plugin was refused; see [`LoadError`].
    pub async fn add_component(&mut self, config: &PluginConfig, component: super::source::Component) -> Result<(), LoadError> {
        let name = config.name.clone();
        let super::source::Component { bytes, sha256: digest, provenance } = component;
        // One validating parse serves both checks (a Python component is ~18 MB).
        let imports = crate::imports::component_imports(&bytes).map_err(|reason| LoadError::NotAComponent { plugin: name.clone(), reason })?;
        let imported = crate::policy::lock::import_list(imports.iter().map(String::as_str));
        let forbidden = crate::imports::forbidden(&imports);
        if !forbidden.is_empty() {
            return Err(LoadError::ForbiddenImports { plugin: name, imports: forbidden });
        }
        if let Some(import) = imports.iter().find(|i| crate::imports::falls_under(i, crate::imports::CLIENT)).filter(|_| config.policy.ask_client.is_empty()) {
            return Err(LoadError::UngrantedQuestions { plugin: name, import: import.clone() });
        }
        let denied: Vec<String> = imports
            .into_iter()
            .chain(crate::seal::record_of(&bytes).map(|r| r.sealed).unwrap_or_default())
            .filter(|i| config.policy.denies_import(i).is_some())
            .collect();
        if !denied.is_empty() {
            return Err(LoadError::DeniedImports { plugin: name, imports: denied });
        }
        let footprint = Footprint::of(&bytes).map_err(|reason| LoadError::NotAComponent { plugin: name.clone(), reason })?;
        if self.core.allocator == Allocator::Pooling {
            check_room(&name, footprint, self.core.room)?;
        }
        let link_error = |e: String| LoadError::Link { plugin: config.name.clone(), reason: with_hint(e) };
        let (engine, cache, hash) = (self.core.engine.clone(), self.compile_cache.clone(), digest.clone());
        let component = tokio::task::spawn_blocking(move || compile::load(&engine, &bytes, &hash, &cache))
            .await
            .map_err(|e| link_error(e.to_string()))?
            .map_err(|e| link_error(format!("{e:#}")))?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| link_error(format!("{e:#}")))?;
        let pre = PluginPre::new(pre).map_err(|e| link_error(format!("{e:#}")))?;
        let reconcile = reconcile::find_export(&component);
        // Its tools' classes join the effective policy once `describe` has told them.
        let policy = EffectivePolicy::of(&config.policy, Vec::new(), &self.downstreams);
        let ctx = Arc::new(PluginContext {
            name: name.as_str().into(),
            tool_prefix: config.tool_prefix.as_str().into(),
            settings: config.settings.clone(),
            limits: config.limits,
            footprint,
            grants: policy.rules.clone(),
            wires: self.wires.clone(),
        });
        let mut loaded = LoadedPlugin { ctx, digest, provenance, pre, reconcile, policy: Arc::new(policy), policy_digest: String::new() };

        // One sandbox: describe, and check the reconcile export's type if there is one.
        let (specs, _) = self
            .core
            .sandboxed(&loaded, (Mode::NoCall, super::questions::Asking::default()), Slot::Invoke, move |store, instance| {
                Box::pin(async move {
                    if let Some(func) = &reconcile {
                        reconcile::typed(store, &instance, func)
                            .map_err(|e| wasmtime::Error::msg(format!("its {} export has the wrong type: {e}", reconcile::RECONCILER_INTERFACE)))?;
                    }
                    Plugin::new(&mut *store, &instance)?.toolguard_plugin_tool().call_describe(store).await
                })
            })
            .await;
        let specs = specs.map_err(|f| LoadError::Describe { plugin: name.clone(), reason: f.to_string() })?;
        let tools = plugin::check_specs(&name, &config.tool_prefix, specs, &config.policy)?;
        for tool in &tools {
            if let Some((other, _)) = self.tools.get(&tool.name) {
                let first = self.plugins[*other].ctx.name.to_string();
                return Err(LoadError::DuplicateTool { tool: tool.name.clone(), first, second: name });
            }
        }
        if let Some(locked) = &config.policy.locked {
            let facts = lock_facts(&loaded, imported, &tools);
            locked.check(&facts).map_err(|what| LoadError::Unlocked { plugin: name.clone(), what })?;
        }
        Arc::make_mut(&mut loaded.policy).tools = tools.iter().map(ToolInfo::class).collect();
        loaded.policy_digest = loaded.policy.digest();
        let index = self.plugins.len();
        self.plugins.push(Arc::new(loaded));
        self.tools.extend(tools.into_iter().map(|t| (t.name.clone(), (index, t))));
        tracing::debug!(plugin = %name, "loaded");
        Ok(())
    }
}

/// What `toolguard.lock` holds of a plugin, as loaded: its digests, signer,
/// imports and what each tool tells the model.
fn lock_facts(loaded: &LoadedPlugin, imports: Vec<String>, tools: &[ToolInfo]) -> crate::policy::lock::LockedPlugin {
    let provenance = loaded.provenance.as_ref();
    crate::policy::lock::LockedPlugin {
        sha256: loaded.digest.clone(),
        manifest_digest: provenance.map(|p| p.manifest_digest.clone()),
        signer: provenance.and_then(|p| p.signer.as_ref()).map(|s| s.fingerprint.clone()),
        imports,
        tools: tools
            .iter()
            .map(|t| {
                let tool = crate::policy::lock::LockedTool {
                    description: t.description.clone(),
                    input_schema: t.input_schema.json().clone(),
                    output_schema: t.output_schema.as_ref().map(|s| s.json().clone()),
                };
                (t.name.clone(), tool)
            })
            .collect(),
    }
}

/// A link or compile error, with what to do when the cause is a known toolchain setting.
fn with_hint(reason: String) -> String {
    if reason.contains("component model async") {
        // wasmtime is built without component-model-async (README: crates).
        format!(
            "{reason}. The component uses the component model's async ABI, which toolguard does not enable: build it synchronous (componentize-qjs --sync; wit-bindgen without async exports)"
        )
    } else {
        reason
    }
}

/// The most any of `plugins` takes from the pool (unreadable ones, and
/// registry components, count as nothing here; loading them reports why).
pub fn footprint_of(plugins: &[PluginConfig]) -> Footprint {
    plugins.iter().filter_map(|p| super::source::read_local(p).ok()).filter_map(|bytes| Footprint::of(&bytes).ok()).fold(Footprint::default(), Footprint::max)
}

/// Refuses a component the pool has no room for, naming the setting to raise.
fn check_room(plugin: &str, need: Footprint, room: Footprint) -> Result<(), LoadError> {
    let over = [
        (need.core_instances, room.core_instances, "core instances", "component_core_instances"),
        (need.memories, room.memories, "linear memories", "component_memories"),
        (need.tables, room.tables, "tables", "component_tables"),
    ];
    match over.into_iter().find(|(need, room, _, _)| need > room) {
        None => Ok(()),
        Some((need, room, what, setting)) => Err(LoadError::TooBig {
            plugin: plugin.into(),
            reason: format!(
                "it needs {need} {what} per instance and the instance pool holds {room} per component; \
                 set [engine] {setting} = {need} (a host started from its config sizes the pool to its plugins)"
            ),
        }),
    }
}
