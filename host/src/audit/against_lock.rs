//! `toolguard audit --against toolguard.lock`: the review against what the
//! lock says was reviewed — components, signers, imports, tools and what
//! each tells the model (the lock records no more, so no more is compared).

use super::diff::{Finding, Findings, sets, told};
use super::report::Report;
use crate::imports::ImportClass;
use crate::policy::lock::{Lock, import_list};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Every difference from what `lock` holds to what `new` found.
pub fn diff_lock(lock: &Lock, new: &Report) -> Vec<Finding> {
    let mut f = Findings(Vec::new());
    for c in &new.components {
        let p = c.plugin.as_str();
        let Some(locked) = lock.plugins.get(p) else {
            f.add("plugin-added", (p, None), format!("plugin `{p}` is not in the lock ({})", c.source), (Value::Null, json!(c.source)));
            continue;
        };
        if c.sha256.as_deref() != Some(locked.sha256.as_str()) {
            f.add("component-changed", (p, None), format!("`{p}`'s component has new bytes"), (json!(locked.sha256), json!(c.sha256)));
        }
        let signer = c.registry.as_ref().and_then(|r| r.signature.fingerprint.clone());
        if signer != locked.signer {
            f.add("signer-changed", (p, None), format!("`{p}`'s signer changed"), (json!(locked.signer), json!(signer)));
        }
        let imports = import_list(c.imports.iter().filter(|i| i.class != Some(ImportClass::Sealed)).map(|i| i.name.as_str()));
        let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<_>>();
        sets(&mut f, (p, None), (&set(&locked.imports), &set(&imports)), ("import-added", "import-removed"), "import");
        for t in &c.tools {
            let Some(was) = locked.tools.get(&t.name) else {
                f.add("tool-added", (p, Some(&t.name)), format!("tool `{}` is not in the lock", t.name), (Value::Null, json!(t.granted)));
                continue;
            };
            let (before, after) = ((&was.description, &was.input_schema, &was.output_schema), (&t.description, &t.input_schema, &t.output_schema));
            told(&mut f, (p, &t.name), before, after);
        }
        for name in locked.tools.keys().filter(|n| !c.tools.iter().any(|t| &t.name == *n)) {
            f.add("tool-removed", (p, Some(name)), format!("locked tool `{name}` is gone"), (json!(name), Value::Null));
        }
    }
    for name in lock.plugins.keys().filter(|n| !new.components.iter().any(|c| &c.plugin == *n)) {
        f.add("plugin-removed", (name, None), format!("locked plugin `{name}` is gone"), (json!(lock.plugins[name].sha256), Value::Null));
    }
    f.0
}
