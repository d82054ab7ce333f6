//! What a component imports, classified against the host's allowlist.
//!
//! This is the cheap, complete check made on the raw bytes before anything is
//! compiled: it reports *every* offending import, where the linker would stop
//! at the first. The linker stays the hard boundary: nothing it does not
//! define can be instantiated at all.

/// How the host treats one imported interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImportClass {
    /// Linked and able to reach the world under the guard (`outbound`).
    Granted,
    /// Linked but grants nothing: empty environment, closed stdin, captured
    /// stdout/stderr, clocks, randomness, I/O plumbing, shared types.
    Inert,
    /// Not imported at all: `toolguard seal` composed a stub whose every
    /// function traps under it (reported by the audit from the seal record).
    Sealed,
    /// Never linked; a component importing it is refused at load.
    Forbidden,
}

/// The interfaces the host links (package/interface, any version), with
/// their class and why that class. Rust std guests import the 13
/// `wasi:io`/`wasi:cli` ones even when they use none of them; Python and
/// JavaScript runtimes also import `wasi:filesystem`.
pub const LINKED: &[(&str, ImportClass, &str)] = &[
    ("toolguard:plugin/outbound", ImportClass::Granted, "the guard: sends and fetches inside the plugin's grants"),
    ("toolguard:plugin/types", ImportClass::Inert, "shared types only"),
    (CLIENT, ImportClass::Granted, "questions to the MCP client mid-call: only the kinds its policy's ask_client grants, and only if it grants one"),
    ("wasi:io/error", ImportClass::Inert, "I/O plumbing for the streams below"),
    ("wasi:io/poll", ImportClass::Inert, "I/O plumbing for the streams below"),
    ("wasi:io/streams", ImportClass::Inert, "I/O plumbing: only stdout/stderr (logged) and a closed stdin exist"),
    ("wasi:clocks/wall-clock", ImportClass::Inert, "reads the time"),
    ("wasi:clocks/monotonic-clock", ImportClass::Inert, "reads the time"),
    ("wasi:random/random", ImportClass::Inert, "random bytes"),
    ("wasi:random/insecure", ImportClass::Inert, "random bytes"),
    ("wasi:random/insecure-seed", ImportClass::Inert, "random bytes"),
    ("wasi:cli/environment", ImportClass::Inert, "empty: no variables, no arguments"),
    ("wasi:cli/exit", ImportClass::Inert, "ends the invocation"),
    ("wasi:cli/stdin", ImportClass::Inert, "closed"),
    ("wasi:cli/stdout", ImportClass::Inert, "captured into the host's log"),
    ("wasi:cli/stderr", ImportClass::Inert, "captured into the host's log"),
    ("wasi:cli/terminal-input", ImportClass::Inert, "no terminal"),
    ("wasi:cli/terminal-output", ImportClass::Inert, "no terminal"),
    ("wasi:cli/terminal-stdin", ImportClass::Inert, "no terminal"),
    ("wasi:cli/terminal-stdout", ImportClass::Inert, "no terminal"),
    ("wasi:cli/terminal-stderr", ImportClass::Inert, "no terminal"),
    ("wasi:filesystem/types", ImportClass::Inert, "inert, host-written: no descriptor can exist"),
    ("wasi:filesystem/preopens", ImportClass::Inert, "inert: no preopened directories, so no file can be named"),
];

/// The interface through which a plugin asks the MCP client questions.
pub const CLIENT: &str = "toolguard:plugin/client";

/// An import name without its version: `wasi:io/poll@0.2.6` → `wasi:io/poll`.
pub fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// Whether import `name` (any version) is `entry` — a package such as
/// `wasi:sockets` or an interface such as `wasi:sockets/tcp` — or lies in it.
pub fn falls_under(name: &str, entry: &str) -> bool {
    let name = unversioned(name);
    name == entry || name.strip_prefix(entry).is_some_and(|rest| rest.starts_with('/'))
}

/// The row of [`LINKED`] for `name` (any version), if the host links it.
fn linked(name: &str) -> Option<&'static (&'static str, ImportClass, &'static str)> {
    let name = unversioned(name);
    LINKED.iter().find(|(linked, _, _)| *linked == name)
}

/// Why an import has the class it has (for the audit).
pub fn why(name: &str) -> &'static str {
    linked(name).map_or("never linked: a component importing it is refused (`toolguard seal` composes a trapping stub under it)", |(_, _, why)| why)
}

/// Classifies one import name such as `wasi:io/poll@0.2.6`.
///
/// The version is ignored for WASI (the linker resolves semver-compatible
/// versions); `toolguard:plugin` must be a 0.1.x version.
pub fn classify(name: &str) -> ImportClass {
    let version = name.split_once('@').map_or("", |(_, v)| v);
    if name.starts_with("toolguard:") && !version.starts_with("0.1.") {
        return ImportClass::Forbidden;
    }
    linked(name).map_or(ImportClass::Forbidden, |(_, class, _)| *class)
}

/// The top-level imports of a component, in the order they appear.
///
/// # Errors
/// The bytes do not validate, or are a core module rather than a component.
pub fn component_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    use wasmparser::{Encoding, Parser, Payload, Validator, WasmFeatures};
    Validator::new_with_features(WasmFeatures::all()).validate_all(bytes).map_err(|e| e.to_string())?;
    let mut imports = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| e.to_string())? {
            Payload::Version { encoding: Encoding::Module, .. } if depth == 0 => {
                return Err("this is a core WebAssembly module; build a component (target wasm32-wasip2)".into());
            }
            // Nested modules and components have imports of their own, satisfied inside.
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    imports.push(import.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(imports)
}

/// Those of `imports` (from [`component_imports`]) the host never links.
pub fn forbidden(imports: &[String]) -> Vec<String> {
    imports.iter().filter(|name| classify(name) == ImportClass::Forbidden).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_falls_under_its_package_and_interface_only() {
        assert!(falls_under("wasi:sockets/tcp@0.2.9", "wasi:sockets"));
        assert!(falls_under("wasi:sockets/tcp@0.2.9", "wasi:sockets/tcp"));
        assert!(!falls_under("wasi:sockets/tcp-create-socket@0.2.9", "wasi:sockets/tcp"));
        assert!(!falls_under("wasi:socketsx/tcp@0.2.9", "wasi:sockets"));
        assert!(!falls_under("wasi:filesystem/types@0.2.9", "wasi:sockets"));
    }

    #[test]
    fn classifies_by_interface_ignoring_wasi_versions() {
        assert_eq!(classify("wasi:io/poll@0.2.6"), ImportClass::Inert);
        assert_eq!(classify("wasi:cli/environment@0.2.12"), ImportClass::Inert);
        assert_eq!(classify("toolguard:plugin/outbound@0.1.0"), ImportClass::Granted);
        assert_eq!(classify("toolguard:plugin/outbound@0.2.0"), ImportClass::Forbidden);
        assert_eq!(classify("wasi:sockets/tcp@0.2.6"), ImportClass::Forbidden);
        assert_eq!(classify("wasi:filesystem/preopens@0.2.6"), ImportClass::Inert);
        assert_eq!(classify("wasi:filesystem/types@0.2.12"), ImportClass::Inert);
        assert_eq!(classify("wasi:sockets/tcp-create-socket@0.2.9"), ImportClass::Forbidden);
        assert_eq!(classify("wasi:http/outgoing-handler@0.2.6"), ImportClass::Forbidden);
        assert_eq!(classify("wasi:io/pollx@0.2.6"), ImportClass::Forbidden);
    }

    #[test]
    fn rejects_core_modules_and_garbage() {
        // The smallest valid core module: magic + version 1.
        let core = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
        assert!(component_imports(&core).unwrap_err().contains("core WebAssembly module"));
        assert!(component_imports(b"not wasm").is_err());
    }
}
