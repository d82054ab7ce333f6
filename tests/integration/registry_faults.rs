//! Registry components under attack and outage, through the binary: a
//! tampered layer, a manifest that is not the digest it was asked for, a
//! signature by another key, an unsigned artifact, a tag moved to new
//! bytes, the registry down with a warm cache and a cold one, a damaged
//! cache, and a hostile registry answering a huge or malformed manifest.

use crate::common::{stdout_json, wasm};
use crate::registry::{TestRegistry, count_words, ok, pushed_digest, toolguard, write_config};
use std::path::Path;

/// `bytes` (a component) with a custom section appended: the same program, other bytes.
fn with_custom_section(bytes: &[u8], note: &str) -> Vec<u8> {
    let mut payload = vec![u8::try_from(note.len()).unwrap()];
    payload.extend_from_slice(note.as_bytes());
    let mut out = bytes.to_vec();
    out.push(0);
    out.push(u8::try_from(payload.len()).unwrap());
    out.extend_from_slice(&payload);
    out
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// A registry holding text-stats (unsigned) at `tools/text-stats:1.0`, a
/// working directory, and the component's reference.
fn pushed_text_stats() -> (TestRegistry, tempfile::TempDir, String) {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let reference = registry.reference("tools/text-stats:1.0");
    ok(dir.path(), &["push", wasm("text-stats").to_str().unwrap(), &reference, "--plain-http"]);
    (registry, dir, reference)
}

/// What a failed command said, both streams.
fn said(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn a_tampered_layer_is_refused_and_nothing_loads() {
    let (registry, dir, reference) = pushed_text_stats();
    let d = dir.path();
    let component = wasm("text-stats");
    let layer = format!("sha256:{}", sha256_of(&component));
    let stored = registry.stored_blob(&layer);
    let mut bytes = std::fs::read(&stored).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&stored, bytes).unwrap();
    write_config(d, &registry, &reference, &format!("sha256 = \"{}\"", sha256_of(&component)), "");
    let out = toolguard(d, &["tools"]);
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    let text = said(&out);
    assert!(text.contains("stats") && text.contains(&layer) && text.contains("served other content"), "{text}");
    // Nothing of the damaged download stays in the cache.
    assert!(!d.join("data/registry/blobs").join(layer.replace(':', "/")).exists());
}

#[test]
fn a_manifest_that_is_not_the_digest_asked_for_is_refused() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let component = wasm("text-stats");
    let pushed = ok(d, &["push", component.to_str().unwrap(), &registry.reference("tools/text-stats:1.0"), "--plain-http"]);
    let digest = pushed_digest(&pushed);
    // The registry's stored manifest changes under its digest (a compromised or broken store).
    let stored = registry.stored_blob(&digest);
    let text = std::fs::read_to_string(&stored).unwrap().replace("\"schemaVersion\":2", "\"schemaVersion\": 2");
    std::fs::write(&stored, text).unwrap();
    let by_digest = format!("oci://{}/tools/text-stats@{digest}", registry.host);
    write_config(d, &registry, &by_digest, "", "");
    let out = toolguard(d, &["tools"]);
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    let text = said(&out);
    assert!(text.contains(&digest) && text.contains("changed them"), "{text}");
}

#[test]
fn unsigned_and_wrongly_signed_components_are_refused_naming_what_was_expected() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "publisher"]);
    ok(d, &["keygen", "--out", "stranger"]);
    let reference = registry.reference("tools/text-stats:1.0");
    let pushed = ok(d, &["push", wasm("text-stats").to_str().unwrap(), &reference, "--plain-http"]);
    let digest = pushed_digest(&pushed);
    write_config(d, &registry, &reference, "signed_by = { key = \"publisher.pub\" }", "[policy]\nrequire_signatures = true\n");
    let fingerprint = |name: &str| {
        let pem = std::fs::read(d.join(name)).unwrap();
        toolguard::registry::publishers::PublisherKey::from_pem(name, &pem).unwrap().fingerprint
    };
    let refused = |why: &str| {
        let out = toolguard(d, &["tools"]);
        assert_eq!(out.status.code(), Some(3), "{}", said(&out));
        let text = said(&out);
        for part in ["plugin `stats` is refused", reference.as_str(), digest.as_str(), "publisher.pub", &fingerprint("publisher.pub"), why] {
            assert!(text.contains(part), "missing `{part}` in: {text}");
        }
    };
    refused("unsigned");
    ok(d, &["sign", &format!("oci://{}/tools/text-stats@{digest}", registry.host), "--key", "stranger.key", "--plain-http"]);
    refused("a key the policy does not name");
    // The audit FAILs it and says why.
    let report = stdout_json(&toolguard(d, &["audit", "--json"]));
    assert_eq!(report["verdict"], "FAIL");
    assert_eq!(report["components"][0]["registry"]["signature"]["status"], "unverified");
    // Signed by the named publisher (beside the stranger's signature): it loads.
    ok(d, &["sign", &reference, "--key", "publisher.key", "--plain-http"]);
    let out = count_words(d, "c1");
    assert!(out.status.success(), "{}", said(&out));
    // A signature over another manifest of the same repository does not carry over.
    let other = ok(d, &["push", wasm("template").to_str().unwrap(), &registry.reference("tools/text-stats:2.0"), "--plain-http"]);
    let by_digest = format!("oci://{}/tools/text-stats@{}", registry.host, pushed_digest(&other));
    write_config(d, &registry, &by_digest, "signed_by = { key = \"publisher.pub\" }", "");
    assert!(said(&toolguard(d, &["tools"])).contains("unsigned"));
}

#[test]
fn a_tag_moved_to_new_bytes_is_a_new_component() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "publisher"]);
    let reference = registry.reference("tools/text-stats:stable");
    let first = pushed_digest(&ok(d, &["push", wasm("text-stats").to_str().unwrap(), &reference, "--plain-http", "--sign", "publisher.key"]));
    let pinned = sha256_of(&wasm("text-stats"));
    write_config(d, &registry, &reference, &format!("sha256 = \"{pinned}\""), "");
    assert!(count_words(d, "c1").status.success());
    // The publisher moves the tag to other bytes: the pin refuses them.
    std::fs::write(d.join("v2.wasm"), with_custom_section(&std::fs::read(wasm("text-stats")).unwrap(), "v2")).unwrap();
    let moved = pushed_digest(&ok(d, &["push", "v2.wasm", &reference, "--plain-http", "--sign", "publisher.key"]));
    assert_ne!(first, moved);
    let out = toolguard(d, &["tools"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(said(&out).contains(&format!("config pins {pinned}")), "{}", said(&out));
    // Under a signature rule the new bytes load — and the audit says the tag moved, and what admitted it.
    write_config(d, &registry, &reference, "signed_by = { key = \"publisher.pub\" }", "");
    assert!(count_words(d, "c2").status.success());
    let report = stdout_json(&toolguard(d, &["audit", "--json"]));
    let r = &report["components"][0]["registry"];
    assert_eq!(r["manifest_digest"], moved.as_str());
    assert_eq!(r["moved_from"], first.as_str());
    assert_eq!(r["signature"]["status"], "verified");
    // A tag nothing vouches for is refused in the config itself.
    write_config(d, &registry, &reference, "", "");
    let text = said(&toolguard(d, &["tools"]));
    assert!(text.contains("can move to other bytes"), "{text}");
}

#[test]
fn the_registry_down_a_warm_cache_serves_and_a_cold_one_leaves_only_that_plugin_out() {
    let mut registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "publisher"]);
    let reference = registry.reference("tools/text-stats:1.0");
    ok(d, &["push", wasm("text-stats").to_str().unwrap(), &reference, "--plain-http", "--sign", "publisher.key"]);
    let template = format!(
        "\n[plugins.words]\ncomponent = {:?}\n[policy.plugins.words]\nsha256 = \"{}\"\n",
        wasm("template").display().to_string(),
        sha256_of(&wasm("template"))
    );
    write_config(d, &registry, &reference, "signed_by = { key = \"publisher.pub\" }", &template);
    let pulled = ok(d, &["pull"]);
    assert!(pulled.contains("signed by publisher.pub"), "{pulled}");
    registry.stop();

    // Warm: the tag, the component and its signature come from the cache, checked again.
    let out = count_words(d, "c1");
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(stdout_json(&out)["words"], 3);
    let report = stdout_json(&toolguard(d, &["audit", "--json"]));
    let r = &report["components"][0]["registry"];
    assert!(r["from_cache"].as_str().is_some_and(|why| why.contains("cannot reach")), "{r:#}");
    assert_eq!(r["signature"]["status"], "verified");

    // Cold: that plugin is left out with a clear reason; the other one serves.
    std::fs::remove_dir_all(d.join("data")).unwrap();
    let out = toolguard(d, &["tools", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    let tools = stdout_json(&out);
    assert!(tools.as_array().unwrap().iter().all(|t| t["plugin"] == "words"), "{tools:#}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("plugin `stats` is unavailable") && text.contains(&reference) && text.contains("not in this host's cache"), "{text}");
    let out = count_words(d, "c2");
    let text = said(&out);
    assert!(!out.status.success() && text.contains("unknown-tool") && text.contains("plugin `stats` is unavailable"), "{text}");

    // The registry back: the next start loads it again.
    registry.resume();
    assert!(count_words(d, "c3").status.success());
}

#[test]
fn a_damaged_cache_is_fetched_again_not_trusted() {
    let (registry, dir, reference) = pushed_text_stats();
    let d = dir.path();
    let component = wasm("text-stats");
    write_config(d, &registry, &reference, &format!("sha256 = \"{}\"", sha256_of(&component)), "");
    assert!(count_words(d, "c1").status.success());
    let cached = d.join("data/registry/blobs/sha256").join(sha256_of(&component));
    std::fs::write(&cached, b"not the component").unwrap();
    assert!(count_words(d, "c2").status.success());
    assert_eq!(sha256_of(&cached), sha256_of(&component));
}

/// What a hostile registry answers: the `Content-Length` it names (if any) and the body's chunks.
type Answer = (Option<u64>, Box<dyn Iterator<Item = Vec<u8>> + Send>);

/// A registry that answers every manifest request with `body`, counting
/// the bytes it managed to send.
fn hostile_registry(body: fn() -> Answer) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                let (length, chunks) = body();
                let header = match length {
                    Some(n) => format!("HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.manifest.v1+json\r\ncontent-length: {n}\r\n\r\n"),
                    None => "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.manifest.v1+json\r\nconnection: close\r\n\r\n".into(),
                };
                let _ = stream.write_all(header.as_bytes());
                for chunk in chunks {
                    if stream.write_all(&chunk).is_err() {
                        break;
                    }
                    counter.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    (host, sent)
}

#[test]
fn a_registry_answering_a_huge_or_malformed_manifest_is_bounded_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let serve = |host: &str| {
        let text = format!(
            "data_dir = \"data\"\n[plugins.stats]\ncomponent = \"oci://{host}/tools/x:1\"\n[policy.registries.\"{host}\"]\nplain_http = true\n\
             [policy.plugins.stats]\nsha256 = \"{}\"\n",
            "0".repeat(64)
        );
        std::fs::write(d.join("toolguard.toml"), text).unwrap();
        toolguard(d, &["tools"])
    };
    // 64 MiB announced.
    let (host, _) = hostile_registry(|| (Some(64 << 20), Box::new(std::iter::repeat_n(vec![b' '; 1 << 16], 1024))));
    let text = said(&serve(&host));
    assert!(text.contains("larger than the 4194304 bytes"), "{text}");
    // Endless, no length announced: cut off at the bound, not read to the end.
    let (host, sent) = hostile_registry(|| (None, Box::new(std::iter::repeat(vec![b' '; 1 << 16]))));
    let out = serve(&host);
    assert_eq!(out.status.code(), Some(3));
    assert!(said(&out).contains("larger than the 4194304 bytes"), "{}", said(&out));
    assert!(sent.load(std::sync::atomic::Ordering::Relaxed) < 64 << 20);
    // Not JSON, and JSON that is not a Wasm component artifact.
    let (host, _) = hostile_registry(|| (Some(9), Box::new(std::iter::once(b"{not json".to_vec()))));
    assert!(said(&serve(&host)).contains("the manifest is not JSON"));
    const INDEX: &[u8] = br#"{"schemaVersion":2,"manifests":[]}"#;
    let (host, _) = hostile_registry(|| (Some(INDEX.len() as u64), Box::new(std::iter::once(INDEX.to_vec()))));
    assert!(said(&serve(&host)).contains("image index"));
    // A manifest whose layer "digest" is a path, and a redirect to plain HTTP beyond loopback.
    let traversal = r#"{"schemaVersion":2,"config":{"mediaType":"application/vnd.wasm.config.v0+json","digest":"sha256:00","size":2},"layers":[{"mediaType":"application/wasm","digest":"sha256:../../../../tmp/x","size":4}]}"#;
    let host = fixed_registry(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.oci.image.manifest.v1+json\r\ncontent-length: {}\r\n\r\n{traversal}",
        traversal.len()
    ));
    assert!(said(&serve(&host)).contains("not a sha256 digest"), "{}", said(&serve(&host)));
    let host = fixed_registry("HTTP/1.1 302 Found\r\nlocation: http://192.0.2.1/v2/x\r\ncontent-length: 0\r\n\r\n".into());
    assert!(said(&serve(&host)).contains("neither https nor loopback"), "{}", said(&serve(&host)));
}

/// A registry that answers every request with `response`, as raw HTTP.
fn fixed_registry(response: String) -> String {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(response.as_bytes());
        }
    });
    host
}

#[test]
fn a_pruned_cache_keeps_what_the_config_loads_offline_and_the_version_before() {
    let mut registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "publisher"]);
    let reference = registry.reference("tools/text-stats:stable");
    write_config(d, &registry, &reference, "signed_by = { key = \"publisher.pub\" }", "");
    // Three versions pushed to one tag, each pulled by a call: the cache holds all three.
    let mut manifests = Vec::new();
    let mut layers = Vec::new();
    for v in ["v1", "v2", "v3"] {
        let file = d.join(format!("{v}.wasm"));
        std::fs::write(&file, with_custom_section(&std::fs::read(wasm("text-stats")).unwrap(), v)).unwrap();
        manifests.push(pushed_digest(&ok(d, &["push", file.to_str().unwrap(), &reference, "--plain-http", "--sign", "publisher.key"])));
        layers.push(format!("sha256:{}", sha256_of(&file)));
        assert!(count_words(d, &format!("c-{v}")).status.success());
    }
    let blob = |digest: &str| d.join("data/registry/blobs/sha256").join(&digest[7..]);
    let signature = |digest: &str| format!("{}.sig.json", digest.replacen(':', "-", 1));
    assert!(manifests.iter().chain(&layers).all(|b| blob(b).exists()));
    // Within the grace period (7 days by default) nothing goes.
    let young = stdout_json(&toolguard(d, &["prune-cache"]));
    assert_eq!(young["registry"]["removed"], serde_json::json!([]), "{young}");
    assert!(young["registry"]["young"].as_u64().unwrap() > 0, "{young}");
    assert_eq!((young["compiled"]["removed"].clone(), young["compiled"]["kept"].as_u64()), (serde_json::json!([]), Some(3)), "{young}");
    // A dry run past it lists v1 — its manifest, layer and signature — and removes nothing.
    let dry = stdout_json(&toolguard(d, &["prune-cache", "--older-than-days", "0", "--dry-run"]));
    let listed: Vec<String> = dry["registry"]["removed"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
    for gone in [&manifests[0][7..], &layers[0][7..], signature(&manifests[0]).as_str()] {
        assert!(listed.iter().any(|p| p.ends_with(gone)), "{gone} not in {listed:?}");
    }
    assert!(blob(&manifests[0]).exists(), "a dry run removes nothing");
    let pruned = stdout_json(&toolguard(d, &["prune-cache", "--older-than-days", "0"]));
    assert_eq!(pruned["registry"]["removed"], dry["registry"]["removed"], "{pruned}");
    assert!(pruned["registry"]["bytes"].as_u64().unwrap() > 0);
    assert_eq!(pruned["compiled"]["removed"].as_array().map(Vec::len), Some(3), "past the grace every compiled entry goes: {pruned}");
    assert!(!blob(&manifests[0]).exists() && !blob(&layers[0]).exists(), "v1 is gone");
    for kept in [&manifests[1], &manifests[2], &layers[1], &layers[2]] {
        assert!(blob(kept).exists(), "{kept}: the tag's version and the one before stay");
    }
    // With the registry down, the config loads from what is left: v3, signature checked.
    registry.stop();
    let out = count_words(d, "c-offline");
    assert!(out.status.success(), "{}", said(&out));
    let report = stdout_json(&toolguard(d, &["audit", "--json"]));
    assert_eq!(report["components"][0]["registry"]["manifest_digest"], manifests[2].as_str());
    assert_eq!(report["components"][0]["registry"]["signature"]["status"], "verified", "{report}");
    // A compiled entry written long ago but loaded now counts as used: a prune keeps it.
    let compiled =
        std::fs::read_dir(d.join("data/compiled")).unwrap().flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "cwasm")).unwrap();
    let month_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(30 * 24 * 3600);
    std::fs::File::options().append(true).open(&compiled).unwrap().set_modified(month_ago).unwrap();
    assert!(count_words(d, "c-loaded").status.success());
    let after = stdout_json(&toolguard(d, &["prune-cache"]));
    assert_eq!(after["compiled"]["removed"], serde_json::json!([]), "loaded just now: {after}");
    assert!(compiled.exists());
}
