//! `toolguard.lock` (`docs/audit.md`): written by `toolguard audit --lock`
//! from what was reviewed; while it exists, a component or tool that
//! differs from it is refused at load and at reload, naming what changed.

use crate::common::{BIN, stdout_json, wasm};
use crate::payments::{Downstream, config_text};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn toolguard(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN).current_dir(dir).args(args).output().unwrap()
}

/// The payments host with an `extra` plugin from `component`.
fn write(dir: &Path, component: &Path) {
    let extra = format!(
        "[plugins.extra]\ncomponent = {:?}\n[policy.plugins.extra.tools]\ntext_stats = {{ effect = \"read-only\" }}\n",
        component.display().to_string()
    );
    std::fs::write(dir.join("toolguard.toml"), format!("{}\n{extra}", config_text("http://127.0.0.1:9", &dir.join("data"), &Downstream::default()))).unwrap();
}

/// A new build of `from`: the same code, new bytes (a custom section appended).
fn rebuilt(from: &Path, to: &Path) {
    let mut bytes = std::fs::read(from).unwrap();
    bytes.extend_from_slice(&[0, 6, 5, b'b', b'u', b'i', b'l', b'd']);
    std::fs::write(to, bytes).unwrap();
}

fn count_words(dir: &Path) -> Output {
    toolguard(dir, &["call", "--session", "s", "--call-id", "c", "text_stats", r#"{"text":"a b b"}"#])
}

#[test]
fn a_component_that_differs_from_the_lock_is_refused_until_locked_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (v1, v2) = (d.join("stats-v1.wasm"), d.join("stats-v2.wasm"));
    std::fs::copy(wasm("text-stats"), &v1).unwrap();
    rebuilt(&v1, &v2);
    write(d, &v1);
    let out = toolguard(d, &["audit", "--lock", "--json"]);
    let lock: Value = serde_json::from_slice(&std::fs::read(d.join("toolguard.lock")).unwrap()).unwrap();
    assert_eq!(lock["schema"], "toolguard-lock/1", "{}", String::from_utf8_lossy(&out.stderr));
    let extra = &lock["plugins"]["extra"];
    assert_eq!(extra["sha256"].as_str().map(str::len), Some(64));
    assert!(extra["imports"].as_array().unwrap().iter().any(|i| i == "toolguard:plugin/outbound"), "{lock:#}");
    assert!(extra["tools"]["text_stats"]["description"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(lock["plugins"]["payments"]["tools"]["refund"]["input_schema"].is_object());
    assert!(count_words(d).status.success(), "as locked, it loads");

    // A new build under the same name: refused at load, saying what changed and what to do.
    write(d, &v2);
    let out = count_words(d);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("differs from") && said.contains("toolguard.lock") && said.contains("its component is sha256"), "{said}");
    let audit = stdout_json(&toolguard(d, &["audit", "--json"]));
    assert_eq!(audit["verdict"], "FAIL", "the audit fails it too: {audit:#}");
    // Reviewed against the lock: the new bytes are the one change.
    let review = toolguard(d, &["audit", "--against", "toolguard.lock", "--json"]);
    let findings = stdout_json(&review)["findings"].clone();
    assert!(!review.status.success(), "{findings:#}");
    assert_eq!(findings.as_array().unwrap().len(), 1, "{findings:#}");
    assert_eq!((findings[0]["rule"].as_str(), findings[0]["plugin"].as_str()), (Some("component-changed"), Some("extra")));
    // Reviewed and locked again, it loads.
    assert!(toolguard(d, &["audit", "--lock"]).status.success() || d.join("toolguard.lock").exists());
    assert!(count_words(d).status.success(), "{}", String::from_utf8_lossy(&count_words(d).stdout));
}

#[test]
fn a_plugin_the_lock_does_not_name_is_refused_and_a_reload_is_held_to_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v1 = d.join("stats-v1.wasm");
    std::fs::copy(wasm("text-stats"), &v1).unwrap();
    write(d, &v1);
    toolguard(d, &["audit", "--lock"]);
    // A serving host, then a reload to a component the lock does not hold: refused, the old one serves.
    let server = crate::common::serve_http(&d.join("toolguard.toml"), &[]);
    let v2 = d.join("stats-v2.wasm");
    rebuilt(&v1, &v2);
    write(d, &v2);
    let out = toolguard(d, &["reload", "--config", "toolguard.toml"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("differs from") && said.contains("refused"), "{said}");
    drop(server);
    // A plugin the lock does not name at all.
    let text = std::fs::read_to_string(d.join("toolguard.toml")).unwrap();
    std::fs::write(d.join("toolguard.toml"), format!("{text}\n[plugins.more]\ncomponent = \"builtin:template\"\n")).unwrap();
    let out = toolguard(d, &["tools"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("does not name it"), "{said}");
}
