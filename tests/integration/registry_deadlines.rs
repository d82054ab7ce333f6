//! Registries that answer slowly or not at all, through the binary and a
//! proxy in front of a real registry (`docs/distribution.md`, "Deadlines"):
//! a blob trickled at two bytes a second ends, within its deadline, in a
//! left-out plugin and nothing half-written in the cache; a registry that
//! accepts connections and never answers is asked once per start (the
//! cache then answers for every later lookup and every other plugin of it);
//! a warm `oci://…@sha256:D` with `signed_by` starts offline on a registry
//! without the referrers API; and the audit agrees with the start about a
//! component referenced by digest.

use crate::common::{stdout_json, wasm};
use crate::registry::{TestRegistry, count_words, ok, pushed_digest, toolguard, write_config};
use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the proxy does with a request.
const PASS: u8 = 0;
/// Trickle every blob's answer at two bytes a second.
const TRICKLE_BLOBS: u8 = 1;
/// Accept the connection, read the request, never answer.
const SILENT: u8 = 2;

/// A proxy in front of `upstream` (`host:port`), one request per
/// connection, doing what `mode` says; counts the requests it took.
struct Proxy {
    host: String,
    mode: Arc<AtomicU8>,
    requests: Arc<AtomicU64>,
}

impl Proxy {
    fn start(upstream: &str) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let (mode, requests) = (Arc::new(AtomicU8::new(PASS)), Arc::new(AtomicU64::new(0)));
        let (m, n, upstream) = (mode.clone(), requests.clone(), upstream.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (m, n, upstream) = (m.clone(), n.clone(), upstream.clone());
                std::thread::spawn(move || serve_one(client, &upstream, m.load(Ordering::SeqCst), &n));
            }
        });
        Self { host, mode, requests }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

/// The head of a request on `stream` (through the blank line), and what of its body came with it.
fn read_head(stream: &mut std::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffer.split_off(end + 4);
            return Some((String::from_utf8_lossy(&buffer).into_owned(), rest));
        }
    }
}

fn serve_one(mut client: std::net::TcpStream, upstream: &str, mode: u8, requests: &AtomicU64) {
    let Some((head, mut body)) = read_head(&mut client) else { return };
    requests.fetch_add(1, Ordering::SeqCst);
    if mode == SILENT {
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let length = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)));
    while body.len() < length.unwrap_or(0) {
        let mut more = [0u8; 65536];
        match client.read(&mut more) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&more[..n]),
        }
    }
    // One request per connection: upstream closes after answering it.
    let head: String = head.lines().filter(|l| !l.to_ascii_lowercase().starts_with("connection:")).map(|l| format!("{l}\r\n")).collect();
    let head = head.trim_end().to_string() + "\r\nConnection: close\r\n\r\n";
    let Ok(mut up) = std::net::TcpStream::connect(upstream) else { return };
    if up.write_all(head.as_bytes()).and_then(|()| up.write_all(&body)).is_err() {
        return;
    }
    let mut answer = Vec::new();
    let _ = up.read_to_end(&mut answer);
    let blob = head.starts_with("GET ") && head.contains("/blobs/sha256:");
    if mode == TRICKLE_BLOBS && blob {
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").map_or(0, |p| p + 4);
        let _ = client.write_all(&answer[..split]);
        for pair in answer[split..].chunks(2) {
            if client.write_all(pair).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    } else {
        let _ = client.write_all(&answer);
    }
}

/// Runs `toolguard ARGS` in `dir`, failing the test if it has not ended
/// after `within` — a liveness check (the command must end), not a timing.
fn ends(dir: &std::path::Path, args: &[&str], within: Duration) -> std::process::Output {
    let mut child = std::process::Command::new(crate::common::BIN)
        .current_dir(dir)
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("toolguard {args:?} never ended: a stalled download holds it");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

fn said(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A config serving `text-stats` from `reference` through the proxy at
/// `proxy` (the registry's host swapped for it), with `policy` and the
/// registry's `timeout_seconds`, plus the embedded `template` as a second plugin.
fn through(dir: &std::path::Path, registry: &TestRegistry, proxy: &Proxy, (reference, policy): (&str, &str)) {
    let other = "\n[plugins.words]\ncomponent = \"builtin:template\"\n";
    let via = reference.replace(&registry.host, &proxy.host);
    let settings = format!("\n[policy.registries.\"{}\"]\nplain_http = true\ntimeout_seconds = 2\n", proxy.host);
    write_config(dir, registry, &via, policy, &format!("{other}{settings}"));
}

#[test]
fn a_trickled_blob_ends_in_a_left_out_plugin_within_its_deadline_and_nothing_half_written() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reference = registry.reference("tools/text-stats:1.0");
    ok(d, &["push", wasm("text-stats").to_str().unwrap(), &reference, "--plain-http"]);
    let proxy = Proxy::start(&registry.host);
    use sha2::Digest as _;
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(wasm("text-stats")).unwrap()));
    through(d, &registry, &proxy, (&reference, &format!("sha256 = \"{sha}\"")));
    proxy.set(TRICKLE_BLOBS);
    // The deadline is 2 s plus a second per 256 KiB of the component: the command ends well before the guard's two minutes.
    let out = ends(d, &["tools", "--json"], Duration::from_secs(120));
    assert!(out.status.success(), "the other plugin serves: {}", said(&out));
    let tools = stdout_json(&out);
    assert!(tools.as_array().unwrap().iter().all(|t| t["plugin"] == "words"), "{tools:#}");
    let text = said(&out);
    assert!(text.contains("plugin `stats` is unavailable") && text.contains("blob"), "the plugin is left out, naming the download: {text}");
    let blobs = d.join("data/registry/blobs/sha256");
    assert!(!blobs.join(&sha).exists(), "nothing half-written is in the cache");
    // At full speed again, the same start loads it.
    proxy.set(PASS);
    assert!(count_words(d, "c1").status.success());
    assert!(blobs.join(&sha).exists());
}

#[test]
fn a_silent_registry_is_asked_once_per_start_and_the_warm_cache_answers_the_rest() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "publisher"]);
    let reference = registry.reference("tools/text-stats:1.0");
    ok(d, &["push", wasm("text-stats").to_str().unwrap(), &reference, "--plain-http", "--sign", "publisher.key"]);
    let proxy = Proxy::start(&registry.host);
    // Two plugins from the same silent registry: the tag, the signature and its referrers of each.
    through(d, &registry, &proxy, (&reference, "signed_by = { key = \"publisher.pub\" }"));
    let text = std::fs::read_to_string(d.join("toolguard.toml")).unwrap();
    let second = format!(
        "\n[plugins.stats2]\ncomponent = \"{}\"\n[policy.plugins.stats2]\nsigned_by = {{ key = \"publisher.pub\" }}\n[policy.plugins.stats2.tools.text_stats]\neffect = \"read-only\"\n",
        reference.replace(&registry.host, &proxy.host)
    );
    std::fs::write(d.join("toolguard.toml"), format!("{text}{second}").replace("[plugins.stats]", "[plugins.stats]\ntool_prefix = \"a_\"")).unwrap();
    ok(d, &["pull"]);
    proxy.set(SILENT);
    let before = proxy.requests.load(Ordering::SeqCst);
    let out = ends(d, &["call", "--session", "s", "--call-id", "c1", "a_text_stats", r#"{"text":"one two two"}"#], Duration::from_secs(120));
    assert!(out.status.success(), "the warm cache serves: {}", said(&out));
    assert_eq!(stdout_json(&out)["words"], 3);
    let asked = proxy.requests.load(Ordering::SeqCst) - before;
    assert_eq!(asked, 1, "one start asked the silent registry once, not once per lookup or per plugin");
    let report = stdout_json(&toolguard(d, &["audit", "--json"]));
    for c in report["components"].as_array().unwrap().iter().filter(|c| c["registry"].is_object()) {
        assert!(c["registry"]["from_cache"].as_str().is_some_and(|why| !why.is_empty()), "{c:#}");
        assert_eq!(c["registry"]["signature"]["status"], "verified", "{c:#}");
    }
}

#[test]
fn a_warm_digest_reference_with_a_publisher_starts_offline_and_the_audit_agrees_with_the_start() {
    let mut registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "publisher"]);
    let reference = registry.reference("tools/text-stats:1.0");
    let pushed = ok(d, &["push", wasm("text-stats").to_str().unwrap(), &reference, "--plain-http", "--sign", "publisher.key"]);
    let by_digest = format!("{}@{}", reference.rsplit_once(':').unwrap().0, pushed_digest(&pushed));
    write_config(d, &registry, &by_digest, "signed_by = { key = \"publisher.pub\" }", "");
    assert!(count_words(d, "c1").status.success(), "cold, online");
    // Distribution 2.8 has no referrers API: nothing of referrers was cached, and none is needed offline.
    registry.stop();
    let out = count_words(d, "c2");
    assert!(out.status.success(), "warm, offline: {}", said(&out));
    assert_eq!(stdout_json(&out)["words"], 3);
    // By digest alone — no pin, no publisher — the start admits it, and the audit passes it as pinned by its digest.
    write_config(d, &registry, &by_digest, "", "");
    assert!(count_words(d, "c3").status.success());
    let report = stdout_json(&toolguard(d, &["audit", "--json"]));
    crate::audit::assert_schema(&report);
    assert_eq!(report["verdict"], "PASS", "{report:#}");
    assert_eq!(report["components"][0]["pin"]["status"], "digest", "{report:#}");
}
