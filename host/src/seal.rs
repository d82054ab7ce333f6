//! `toolguard seal`: makes a component that imports network interfaces the
//! host never links (`wasi:sockets`, `wasi:http`) loadable without granting
//! anything, by composing a stub under it.
//!
//! Standard toolchains import these whether a tool uses them or not
//! (componentize-py links Python's socket module; componentize-js links
//! `fetch`). The seal:
//! 1. decodes the component's WIT and writes a world that *exports* exactly
//!    the sealed interfaces it imports, at their versions;
//! 2. builds a stub component for that world whose every function traps
//!    (wit-component's dummy module: `unreachable` bodies);
//! 3. plugs the stub's exports into the component's imports with wac-graph,
//!    so the composed component no longer imports them at all;
//! 4. records what it sealed in a `toolguard-seal` custom section, for `audit`.
//!
//! The guarantee does not rest on the record or the stub: the host refuses
//! any component that still imports a network interface, and the composed
//! one can reach only what its remaining imports reach. A sealed socket or
//! HTTP call traps; the tool call fails and nothing leaves.

use serde::{Deserialize, Serialize};
use wac_graph::types::Package;
use wac_graph::{CompositionGraph, EncodeOptions};
use wit_component::{ComponentEncoder, DecodedWasm, StringEncoding};
use wit_parser::{LiftLowerAbi, ManglingAndAbi, WorldItem, WorldKey};

/// The custom section `seal` adds, naming what it sealed.
pub const SECTION: &str = "toolguard-seal";

/// Interface packages a seal stubs out: never linked by the host.
pub const SEALED_PACKAGES: &[&str] = &["wasi:sockets", "wasi:http"];

/// What a seal did, as recorded in the composed component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealRecord {
    /// The interfaces now served by the trapping stub, e.g. `wasi:sockets/tcp@0.2.9`.
    pub sealed: Vec<String>,
    /// sha256 of the component before sealing.
    pub original_sha256: String,
}

/// Why a component could not be sealed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The input is not a component whose WIT can be read.
    #[error("not a component toolguard can read: {0}")]
    NotAComponent(String),
    /// Building the stub or the composition failed.
    #[error("composing the seal failed: {0}")]
    Compose(String),
    /// After composing, a network import remains (a type the stub could not match).
    #[error("after sealing, the component still imports {0}; it cannot be made loadable this way")]
    StillImports(String),
}

/// Whether an import name (any version) belongs to a sealed package.
pub fn is_sealed_interface(name: &str) -> bool {
    SEALED_PACKAGES.iter().any(|p| crate::imports::falls_under(name, p))
}

/// Seals `bytes`: returns the composed component and what was sealed. A
/// component importing nothing sealable comes back unchanged with an empty record.
///
/// # Errors
/// See [`SealError`].
pub fn seal(bytes: &[u8]) -> Result<(Vec<u8>, SealRecord), SealError> {
    use sha2::Digest as _;
    let original_sha256 = hex::encode(sha2::Sha256::digest(bytes));
    let imports = crate::imports::component_imports(bytes).map_err(SealError::NotAComponent)?;
    let sealed: Vec<String> = imports.into_iter().filter(|i| is_sealed_interface(i)).collect();
    if sealed.is_empty() {
        return Ok((bytes.to_vec(), SealRecord { sealed, original_sha256 }));
    }
    let stub = stub_for(bytes)?;
    let mut composed = compose(bytes, stub)?;
    let left: Vec<String> = crate::imports::component_imports(&composed).map_err(SealError::Compose)?.into_iter().filter(|i| is_sealed_interface(i)).collect();
    if !left.is_empty() {
        return Err(SealError::StillImports(left.join(", ")));
    }
    let record = SealRecord { sealed, original_sha256 };
    let data = serde_json::to_vec(&record).map_err(|e| SealError::Compose(e.to_string()))?;
    append_custom_section(&mut composed, SECTION, &data);
    Ok((composed, record))
}

/// The seal record of a component, if `toolguard seal` made it.
pub fn record_of(bytes: &[u8]) -> Option<SealRecord> {
    use wasmparser::{Parser, Payload};
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.ok()? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::CustomSection(c) if depth == 0 && c.name() == SECTION => return serde_json::from_slice(c.data()).ok(),
            _ => {}
        }
    }
    None
}

/// A component exporting every sealed interface `plugin` imports, each
/// function trapping.
fn stub_for(plugin: &[u8]) -> Result<Vec<u8>, SealError> {
    let decoded = wit_component::decode(plugin).map_err(|e| SealError::NotAComponent(format!("{e:#}")))?;
    let DecodedWasm::Component(mut resolve, world) = decoded else {
        return Err(SealError::NotAComponent("a WIT package, not a component".into()));
    };
    let mut wit = String::from("package toolguard:seal;\nworld seal {\n");
    for (key, item) in &resolve.worlds[world].imports {
        if let (WorldKey::Interface(id), WorldItem::Interface { .. }) = (key, item)
            && let Some(name) = resolve.id_of(*id)
            && is_sealed_interface(&name)
        {
            wit.push_str(&format!("  export {name};\n"));
        }
    }
    wit.push_str("}\n");
    let compose_err = |e: anyhow::Error| SealError::Compose(format!("{e:#}"));
    let package = resolve.push_str("toolguard-seal.wit", &wit).map_err(compose_err)?;
    let stub_world = resolve.select_world(&[package], Some("seal")).map_err(compose_err)?;
    let mut module = wit_component::dummy_module(&resolve, stub_world, ManglingAndAbi::Legacy(LiftLowerAbi::Sync));
    wit_component::embed_component_metadata(&mut module, &resolve, stub_world, StringEncoding::UTF8).map_err(compose_err)?;
    ComponentEncoder::default().validate(true).module(&module).map_err(compose_err)?.encode().map_err(compose_err)
}

/// `plugin` with `stub`'s exports plugged into its imports.
fn compose(plugin: &[u8], stub: Vec<u8>) -> Result<Vec<u8>, SealError> {
    let err = |e: &dyn std::fmt::Display| SealError::Compose(e.to_string());
    let mut graph = CompositionGraph::new();
    let socket = Package::from_bytes("toolguard:plugin", None, plugin.to_vec(), graph.types_mut()).map_err(|e| err(&e))?;
    let socket = graph.register_package(socket).map_err(|e| err(&e))?;
    let plug = Package::from_bytes("toolguard:seal", None, stub, graph.types_mut()).map_err(|e| err(&e))?;
    let plug = graph.register_package(plug).map_err(|e| err(&e))?;
    wac_graph::plug(&mut graph, vec![plug], socket).map_err(|e| err(&e))?;
    graph.encode(EncodeOptions::default()).map_err(|e| err(&e))
}

/// Appends a custom section to a component's bytes (valid anywhere at the top level).
fn append_custom_section(bytes: &mut Vec<u8>, name: &str, data: &[u8]) {
    use wasm_encoder::Encode as _;
    bytes.push(wasm_encoder::ComponentSectionId::CoreCustom as u8);
    wasm_encoder::CustomSection { name: name.into(), data: data.into() }.encode(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_sealed_packages_only() {
        assert!(is_sealed_interface("wasi:sockets/tcp@0.2.9"));
        assert!(is_sealed_interface("wasi:http/outgoing-handler@0.2.10"));
        assert!(!is_sealed_interface("wasi:socketsx/tcp@0.2.9"));
        assert!(!is_sealed_interface("wasi:filesystem/types@0.2.9"));
        assert!(!is_sealed_interface("toolguard:plugin/outbound@0.1.0"));
    }

    #[test]
    fn a_component_with_nothing_to_seal_comes_back_unchanged() {
        let bytes = crate::builtin::component("text-stats").expect("builtin");
        let (out, record) = seal(bytes).expect("seals");
        assert_eq!(out, bytes);
        assert!(record.sealed.is_empty());
        assert_eq!(record_of(&out), None);
    }
}
