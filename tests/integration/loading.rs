//! Loading plugins: the import allowlist, pins, specs, the compile cache.

use crate::common::{self, plugin, shared_cache, wasm};
use sha2::{Digest, Sha256};
use toolguard::config::Limits;
use toolguard::{ErrorKind, LoadError, Runtime};

/// The imports of a component whose package is not one the host links,
/// computed with wit-parser (independently of the host's own parser).
fn foreign_imports(crate_name: &str) -> Vec<String> {
    let bytes = std::fs::read(wasm(crate_name)).unwrap();
    let wit_parser::decoding::DecodedWasm::Component(resolve, world) = wit_parser::decoding::decode(&bytes).unwrap() else {
        panic!("{crate_name} is not a component");
    };
    let allowed = ["wasi:io/", "wasi:cli/", "wasi:clocks/", "wasi:random/", "wasi:filesystem/", "toolguard:plugin/"];
    let mut names: Vec<String> =
        resolve.worlds[world].imports.keys().map(|k| resolve.name_world_key(k)).filter(|n| !allowed.iter().any(|a| n.starts_with(a))).collect();
    names.sort();
    names
}

#[tokio::test]
async fn refuses_forbidden_imports_naming_every_one() {
    for (fixture, family) in [("import-sockets", "wasi:sockets/"), ("import-http", "wasi:http/")] {
        let expected = foreign_imports(fixture);
        assert!(expected.iter().any(|n| n.starts_with(family)), "{fixture} should import {family}: {expected:?}");
        let mut rt = Runtime::new(&common::engine(), shared_cache()).unwrap();
        let err = rt.add_plugin(&plugin("hostile", fixture, Limits::default())).await.unwrap_err();
        let LoadError::ForbiddenImports { imports, .. } = &err else { panic!("{fixture}: wrong error {err}") };
        let mut got = imports.clone();
        got.sort();
        assert_eq!(got, expected, "{fixture}: every forbidden import, and only those");
        let message = err.to_string();
        for name in &expected {
            assert!(message.contains(name.as_str()), "{fixture}: message must name {name}: {message}");
        }
        assert_eq!(rt.tools().count(), 0, "a refused plugin adds no tools");
        assert_eq!(rt.sandboxes_created(), 0, "a refused plugin is never instantiated");
    }
}

#[tokio::test]
async fn the_filesystem_is_inert_a_plugin_importing_it_loads_and_opens_nothing() {
    assert!(foreign_imports("import-filesystem").is_empty(), "wasi:filesystem is linked (inert)");
    let rt = common::runtime(&[plugin("files", "import-filesystem", Limits::default()), plugin("text-stats", "text-stats", Limits::default())]).await;
    // Its one tool reads /etc/passwd with std::fs: there is no preopened directory to resolve it in.
    let err = common::call(&rt, "go", "{}").await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ToolFailed, "{err}");
    common::assert_good_tool_works(&rt).await;
}

#[tokio::test]
async fn refused_plugin_leaves_other_plugins_serving() {
    let mut rt = common::runtime(&[plugin("text-stats", "text-stats", Limits::default())]).await;
    assert!(rt.add_plugin(&plugin("hostile", "import-sockets", Limits::default())).await.is_err());
    common::assert_good_tool_works(&rt).await;
}

#[tokio::test]
async fn enforces_the_sha256_pin() {
    let bytes = std::fs::read(wasm("text-stats")).unwrap();
    let digest = hex::encode(Sha256::digest(&bytes));
    let mut wrong = plugin("text-stats", "text-stats", Limits::default());
    wrong.policy.sha256 = Some("0".repeat(64));
    let mut rt = Runtime::new(&common::engine(), shared_cache()).unwrap();
    match rt.add_plugin(&wrong).await.unwrap_err() {
        LoadError::DigestMismatch { actual, .. } => assert_eq!(actual, digest),
        other => panic!("wrong error: {other}"),
    }
    let mut right = wrong.clone();
    right.policy.sha256 = Some(digest.clone());
    rt.add_plugin(&right).await.unwrap();
    assert_eq!(rt.plugin_digests()["text-stats"], digest);
}

#[tokio::test]
async fn refuses_core_modules_garbage_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]).unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"definitely not wasm").unwrap();
    let mut rt = Runtime::new(&common::engine(), shared_cache()).unwrap();
    for (path, want) in [(core, "core WebAssembly module"), (garbage.clone(), "")] {
        let mut p = plugin("bad", "text-stats", Limits::default());
        p.component = toolguard::config::ComponentSource::File(path);
        let err = rt.add_plugin(&p).await.unwrap_err();
        assert!(matches!(err, LoadError::NotAComponent { .. }), "{err}");
        assert!(err.to_string().contains(want), "{err}");
    }
    let mut missing = plugin("gone", "text-stats", Limits::default());
    missing.component = toolguard::config::ComponentSource::File(dir.path().join("nope.wasm"));
    assert!(matches!(rt.add_plugin(&missing).await.unwrap_err(), LoadError::Read { .. }));
}

#[tokio::test]
async fn tool_names_are_unique_across_plugins() {
    let mut rt = common::runtime(&[plugin("a", "text-stats", Limits::default())]).await;
    let err = rt.add_plugin(&plugin("b", "text-stats", Limits::default())).await.unwrap_err();
    assert!(matches!(&err, LoadError::DuplicateTool { tool, .. } if tool == "text_stats"), "{err}");
    assert_eq!(rt.tools().count(), 1);
}

#[tokio::test]
async fn compiled_components_are_cached_and_corruption_is_survived() {
    let cache = tempfile::tempdir().unwrap();
    let p = plugin("text-stats", "text-stats", Limits::default());
    let load = || async {
        let mut rt = Runtime::new(&common::engine(), cache.path().to_path_buf()).unwrap();
        rt.add_plugin(&p).await.unwrap();
        rt
    };
    let rt = load().await;
    let digest = rt.plugin_digests()["text-stats"].clone();
    let entries: Vec<_> = std::fs::read_dir(cache.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(entries.len(), 1, "one artifact per component: {entries:?}");
    let entry = &entries[0];
    assert!(entry.file_name().unwrap().to_str().unwrap().starts_with(&digest), "keyed by digest: {entry:?}");
    let good = std::fs::read(entry).unwrap();

    // A corrupt entry is detected and replaced, not deserialised.
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(entry, &bad).unwrap();
    let rt = load().await;
    common::assert_good_tool_works(&rt).await;
    assert_eq!(std::fs::read(entry).unwrap(), good, "the corrupt entry was rewritten");

    // A truncated one too.
    std::fs::write(entry, &good[..10]).unwrap();
    common::assert_good_tool_works(&load().await).await;
}

#[tokio::test]
async fn describe_yields_checked_tools_with_schemas() {
    let rt = common::runtime(&[plugin("text-stats", "text-stats", Limits::default()), plugin("template", "template", Limits::default())]).await;
    let names: Vec<&str> = rt.tools().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["greet", "text_stats"], "name order");
    let stats = rt.tools().find(|t| t.name == "text_stats").unwrap();
    assert_eq!(stats.plugin, "text-stats");
    assert_eq!(stats.effect, toolguard::runtime::Effect::ReadOnly);
    assert_eq!(stats.input_schema.json()["required"], serde_json::json!(["text"]));
    assert!(stats.output_schema.is_some());
    let greeting = common::call(&rt, "greet", r#"{"name":"Ada"}"#).await.unwrap();
    assert_eq!(greeting["greeting"], "Hello, Ada!");
}

#[tokio::test]
async fn a_tool_prefix_serves_one_component_twice_under_distinct_names() {
    let mut a = plugin("stats-a", "text-stats", Limits::default());
    a.tool_prefix = "a_".into();
    let mut b = plugin("stats-b", "text-stats", Limits::default());
    b.tool_prefix = "b_".into();
    let rt = common::runtime(&[a, b]).await;
    let names: Vec<&str> = rt.tools().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a_text_stats", "b_text_stats"]);
    for tool in names {
        let out = common::call(&rt, tool, r#"{"text":"x y"}"#).await.unwrap();
        assert_eq!(out["words"], 2, "{tool}: the plugin is invoked under its own name");
    }
}
