//! `toolguard.lock`: what a reviewer approved of each component — its
//! digest, manifest and signer, its imports, and each tool's name,
//! description and schemas — written by `toolguard audit --lock` beside the
//! config. While it exists, a component or tool whose facts differ from it
//! is refused at load and at reload, naming what changed: a tool cannot
//! change what it tells the model without a review (`docs/audit.md`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// The lock file's name, beside the config.
pub const FILE_NAME: &str = "toolguard.lock";
/// The lock format's identifier.
pub const SCHEMA: &str = "toolguard-lock/1";

/// The whole lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// [`SCHEMA`].
    pub schema: String,
    /// Each plugin as reviewed, by name.
    pub plugins: BTreeMap<String, LockedPlugin>,
}

/// One plugin as reviewed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPlugin {
    /// Lower-case hex sha256 of the component.
    pub sha256: String,
    /// For a registry component, the manifest digest.
    #[serde(default)]
    pub manifest_digest: Option<String>,
    /// For a signed component, the signer's fingerprint.
    #[serde(default)]
    pub signer: Option<String>,
    /// Its imports, without versions, sorted.
    pub imports: Vec<String>,
    /// Each tool as served, by name.
    pub tools: BTreeMap<String, LockedTool>,
}

/// One tool as reviewed: what it tells the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedTool {
    /// Its description.
    pub description: String,
    /// Its input schema.
    pub input_schema: Value,
    /// Its output schema, if it promises one.
    #[serde(default)]
    pub output_schema: Option<Value>,
}

/// What the lock says of one plugin: its entry, or that it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locked {
    /// The lock file (for messages).
    pub file: String,
    /// The plugin's entry; `None`: the lock does not name it.
    pub entry: Option<LockedPlugin>,
}

impl Lock {
    /// Reads the lock at `path`.
    ///
    /// # Errors
    /// It cannot be read, or is not a lock of this format.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let lock: Self = serde_json::from_slice(&text).map_err(|e| format!("{} is not a toolguard lock: {e}", path.display()))?;
        if lock.schema != SCHEMA {
            return Err(format!("{}: lock format `{}`, expected `{SCHEMA}`", path.display(), lock.schema));
        }
        Ok(lock)
    }

    /// The lock as written: pretty JSON, stable order, a newline at the end.
    pub fn to_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// An import's name without its version.
pub fn unversioned(name: &str) -> String {
    name.split('@').next().unwrap_or(name).to_string()
}

/// Import names as a lock lists them: without versions, sorted, once each.
pub fn import_list<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let set: std::collections::BTreeSet<String> = names.into_iter().map(unversioned).collect();
    set.into_iter().collect()
}

impl Locked {
    /// Checks a loaded plugin's facts against the lock.
    ///
    /// # Errors
    /// What differs, in words, each naming the lock's fact and the component's.
    pub fn check(&self, facts: &LockedPlugin) -> Result<(), String> {
        let Some(entry) = &self.entry else {
            return Err(format!("{} does not name it: review it (toolguard audit), then lock it (toolguard audit --lock)", self.file));
        };
        let mut what = Vec::new();
        if entry.sha256 != facts.sha256 {
            what.push(format!("its component is sha256 {} (locked: {})", facts.sha256, entry.sha256));
        }
        if entry.manifest_digest != facts.manifest_digest {
            what.push(format!("its manifest is {:?} (locked: {:?})", facts.manifest_digest, entry.manifest_digest));
        }
        if entry.signer != facts.signer {
            what.push(format!("its signer is {:?} (locked: {:?})", facts.signer, entry.signer));
        }
        let added: Vec<&String> = facts.imports.iter().filter(|i| !entry.imports.contains(i)).collect();
        if !added.is_empty() {
            what.push(format!("it imports what the lock does not list: {added:?}"));
        }
        for (name, tool) in &facts.tools {
            match entry.tools.get(name) {
                None => what.push(format!("tool `{name}` is not in the lock")),
                Some(locked) if locked.description != tool.description => {
                    what.push(format!("tool `{name}` describes itself otherwise: {:?}", tool.description))
                }
                Some(locked) if locked.input_schema != tool.input_schema || locked.output_schema != tool.output_schema => {
                    what.push(format!("tool `{name}` has other input or output schemas"));
                }
                Some(_) => {}
            }
        }
        for name in entry.tools.keys().filter(|n| !facts.tools.contains_key(*n)) {
            what.push(format!("locked tool `{name}` is gone"));
        }
        if what.is_empty() {
            return Ok(());
        }
        Err(format!(
            "it differs from {}: {}. Review the change (toolguard audit --against), then lock it again (toolguard audit --lock)",
            self.file,
            what.join("; ")
        ))
    }
}
