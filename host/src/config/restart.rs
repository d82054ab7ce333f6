//! Which settings only a restart applies. Each config section says so of
//! itself ([`RestartOnly`], implemented beside its type: `engine.rs`,
//! `ledger.rs`, `mcp.rs`), and [`Config`] asks each of its fields by an
//! exhaustive destructuring: a new field does not compile until its author
//! says whether a reload may change it (`docs/operations.md`).

use super::Config;

/// A config section that knows which of its settings only a restart applies.
pub trait RestartOnly {
    /// What changed from `self` to `new` that only a restart applies, each
    /// in words (`` `[mcp] max_sessions` changed``); empty when a reload may
    /// apply all of it.
    fn restart_only_changes(&self, new: &Self) -> Vec<String>;
}

/// `what changed`, if `old` and `new` differ.
pub(super) fn differs<T: PartialEq + ?Sized>(what: &str, old: &T, new: &T) -> Option<String> {
    (old != new).then(|| format!("{what} changed"))
}

impl RestartOnly for Config {
    fn restart_only_changes(&self, new: &Self) -> Vec<String> {
        // Every field, named: a reload applies those bound to `_`.
        let Config {
            data_dir,
            ledger,
            ledger_cache_mib,
            ledger_pool,
            compile_cache,
            engine,
            mcp,
            downstreams: _,
            registries: _,
            require_signatures: _,
            policy_source: _,
            plugins: _,
            retention,
        } = self;
        let mut found: Vec<String> = [
            differs("`data_dir`", data_dir, &new.data_dir),
            differs("the ledger (`ledger`, `ledger_url_env`)", ledger, &new.ledger),
            differs("`ledger_cache_mib`", ledger_cache_mib, &new.ledger_cache_mib),
            differs("`ledger_pool`", ledger_pool, &new.ledger_pool),
            differs("`compile_cache`", compile_cache, &new.compile_cache),
            differs("[retention]", retention, &new.retention),
        ]
        .into_iter()
        .flatten()
        .collect();
        found.extend(engine.restart_only_changes(&new.engine));
        found.extend(mcp.restart_only_changes(&new.mcp));
        found
    }
}
