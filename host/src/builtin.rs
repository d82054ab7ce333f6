//! The example plugins embedded in the binary, so the demo and the example
//! config run without any file but the binary. Config refers to them as
//! `component = "builtin:NAME"`.

/// (name, component bytes) of every embedded plugin.
const BUILTINS: &[(&str, &[u8])] = &[
    ("text-stats", include_bytes!(concat!(env!("TOOLGUARD_WASM_DIR"), "/text_stats.wasm"))),
    ("template", include_bytes!(concat!(env!("TOOLGUARD_WASM_DIR"), "/template.wasm"))),
    ("payments", include_bytes!(concat!(env!("TOOLGUARD_WASM_DIR"), "/payments.wasm"))),
];

/// The bytes of the embedded plugin `name`, if there is one.
pub fn component(name: &str) -> Option<&'static [u8]> {
    BUILTINS.iter().find(|(n, _)| *n == name).map(|(_, bytes)| *bytes)
}

/// The names of all embedded plugins.
pub fn names() -> Vec<&'static str> {
    BUILTINS.iter().map(|(n, _)| *n).collect()
}
