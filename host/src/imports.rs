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
    /// Never linked; a component importing it is refused at load.
    Forbidden,
}

/// The interfaces the host links (package/interface, any version), with
/// their class. Rust std guests import the 13 `wasi:io`/`wasi:cli` ones even
/// when they use none of them.
pub const LINKED: &[(&str, ImportClass)] = &[
    ("toolguard:plugin/outbound", ImportClass::Granted),
    ("toolguard:plugin/types", ImportClass::Inert),
    ("wasi:io/error", ImportClass::Inert),
    ("wasi:io/poll", ImportClass::Inert),
    ("wasi:io/streams", ImportClass::Inert),
    ("wasi:clocks/wall-clock", ImportClass::Inert),
    ("wasi:clocks/monotonic-clock", ImportClass::Inert),
    ("wasi:random/random", ImportClass::Inert),
    ("wasi:random/insecure", ImportClass::Inert),
    ("wasi:random/insecure-seed", ImportClass::Inert),
    ("wasi:cli/environment", ImportClass::Inert),
    ("wasi:cli/exit", ImportClass::Inert),
    ("wasi:cli/stdin", ImportClass::Inert),
    ("wasi:cli/stdout", ImportClass::Inert),
    ("wasi:cli/stderr", ImportClass::Inert),
    ("wasi:cli/terminal-input", ImportClass::Inert),
    ("wasi:cli/terminal-output", ImportClass::Inert),
    ("wasi:cli/terminal-stdin", ImportClass::Inert),
    ("wasi:cli/terminal-stdout", ImportClass::Inert),
    ("wasi:cli/terminal-stderr", ImportClass::Inert),
];

/// Classifies one import name such as `wasi:io/poll@0.2.6`.
///
/// The version is ignored for WASI (the linker resolves semver-compatible
/// versions); `toolguard:plugin` must be a 0.1.x version.
pub fn classify(name: &str) -> ImportClass {
    let (unversioned, version) = name.split_once('@').unwrap_or((name, ""));
    if unversioned.starts_with("toolguard:") && !version.starts_with("0.1.") {
        return ImportClass::Forbidden;
    }
    LINKED
        .iter()
        .find(|(linked, _)| *linked == unversioned)
        .map_or(ImportClass::Forbidden, |(_, class)| *class)
}

/// The top-level imports of a component, in the order they appear.
///
/// # Errors
/// The bytes do not validate, or are a core module rather than a component.
pub fn component_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    use wasmparser::{Encoding, Parser, Payload, Validator, WasmFeatures};
    Validator::new_with_features(WasmFeatures::all())
        .validate_all(bytes)
        .map_err(|e| e.to_string())?;
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

/// The imports of `bytes` the host never links, or why the bytes are unusable.
///
/// # Errors
/// As [`component_imports`].
pub fn forbidden_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    Ok(component_imports(bytes)?.into_iter().filter(|name| classify(name) == ImportClass::Forbidden).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_interface_ignoring_wasi_versions() {
        assert_eq!(classify("wasi:io/poll@0.2.6"), ImportClass::Inert);
        assert_eq!(classify("wasi:cli/environment@0.2.12"), ImportClass::Inert);
        assert_eq!(classify("toolguard:plugin/outbound@0.1.0"), ImportClass::Granted);
        assert_eq!(classify("toolguard:plugin/outbound@0.2.0"), ImportClass::Forbidden);
        assert_eq!(classify("wasi:sockets/tcp@0.2.6"), ImportClass::Forbidden);
        assert_eq!(classify("wasi:filesystem/preopens@0.2.6"), ImportClass::Forbidden);
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
