//! Components from a real OCI registry (Debian's `docker-registry`, CNCF
//! Distribution, started per test on loopback with throwaway storage),
//! through the `toolguard` binary: push, sign, pull, verify, load, call;
//! credentials; HTTPS with a private CA and SPKI pins; and an independent
//! OCI client (oras) reading what toolguard pushed and pushing what
//! toolguard pulls. The faults are in `registry_faults.rs`.

use crate::common::{BIN, stdout_json, wasm};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A `docker-registry` on a free loopback port, storing under a temporary
/// directory; stopped on drop.
pub struct TestRegistry {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// `127.0.0.1:PORT`.
    pub host: String,
    config: PathBuf,
}

/// How a test registry is set up.
#[derive(Default)]
pub struct RegistryOptions<'a> {
    /// `user:password` required of every request (htpasswd, bcrypt).
    pub user: Option<(&'a str, &'a str)>,
    /// Serve HTTPS with this certificate chain and key.
    pub tls: Option<(&'a Path, &'a Path)>,
}

impl TestRegistry {
    pub fn start() -> Self {
        Self::with(RegistryOptions::default())
    }

    pub fn with(options: RegistryOptions<'_>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let host = format!("127.0.0.1:{port}");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
            dir.path().join("data").display()
        );
        if let Some((cert, key)) = options.tls {
            yaml.push_str(&format!("  tls:\n    certificate: {}\n    key: {}\n", cert.display(), key.display()));
        }
        if let Some((user, password)) = options.user {
            let htpasswd = dir.path().join("htpasswd");
            let line = python(&["-c", &format!("import bcrypt; print('{user}:' + bcrypt.hashpw(b'{password}', bcrypt.gensalt(4)).decode())")]);
            std::fs::write(&htpasswd, line).unwrap();
            yaml.push_str(&format!("auth:\n  htpasswd:\n    realm: toolguard-test\n    path: {}\n", htpasswd.display()));
        }
        let config = dir.path().join("registry.yml");
        std::fs::write(&config, yaml).unwrap();
        let mut registry = Self { child: None, dir, host, config };
        registry.resume();
        registry
    }

    /// Starts (again) on the same port and storage.
    pub fn resume(&mut self) {
        let bin =
            std::env::var("TOOLGUARD_REGISTRY_BIN").expect("TOOLGUARD_REGISTRY_BIN: run the tests with ./dev.sh test, which installs Debian's docker-registry");
        let child = Command::new(bin).arg("serve").arg(&self.config).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        self.child = Some(child);
        for _ in 0..200 {
            if std::net::TcpStream::connect(&self.host).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("the test registry did not start on {}", self.host);
    }

    /// Stops it (the storage stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `oci://HOST/REPOSITORY:TAG`.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("oci://{}/{repository_and_tag}", self.host)
    }

    /// The file holding blob `digest` in the registry's own storage (to damage it).
    pub fn stored_blob(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path().join(format!("data/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The tests' Python (with oras, bcrypt and cryptography).
pub fn python(args: &[&str]) -> String {
    let python = std::env::var("TOOLGUARD_PYTHON").expect("TOOLGUARD_PYTHON: run the tests with ./dev.sh test");
    let out = Command::new(python).args(args).output().unwrap();
    assert!(out.status.success(), "python {args:?} failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `toolguard ARGS` in `dir`.
pub fn toolguard(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN).current_dir(dir).args(args).env_remove("RUST_LOG").output().unwrap()
}

/// Runs `toolguard ARGS` in `dir` and expects success; answers stdout.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    let out = toolguard(dir, args);
    assert!(out.status.success(), "toolguard {args:?} failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The manifest digest a `toolguard push` printed.
pub fn pushed_digest(stdout: &str) -> String {
    let at = stdout.find("@sha256:").expect("push prints the manifest digest") + 1;
    stdout[at..at + 71].to_string()
}

/// A config serving `text-stats` from `reference` on `registry`, with
/// `policy` as the plugin's policy lines (pins, signed_by), `extra` TOML
/// appended (more plugins, registry settings).
pub fn write_config(dir: &Path, registry: &TestRegistry, reference: &str, policy: &str, extra: &str) -> PathBuf {
    let text = format!(
        "data_dir = \"data\"\n\n[plugins.stats]\ncomponent = \"{reference}\"\n\n[policy.registries.\"{host}\"]\nplain_http = true\n\n\
         [policy.plugins.stats]\n{policy}\n[policy.plugins.stats.tools.text_stats]\neffect = \"read-only\"\n{extra}",
        host = registry.host
    );
    let path = dir.join("toolguard.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A text_stats call through the binary; answers its JSON result.
pub fn count_words(dir: &Path, call_id: &str) -> Output {
    toolguard(dir, &["call", "--session", "s", "--call-id", call_id, "text_stats", r#"{"text":"one two two"}"#])
}

#[test]
fn push_sign_pull_verify_serve_and_call() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let component = wasm("text-stats");
    ok(d, &["keygen", "--out", "publisher"]);
    let reference = registry.reference("tools/text-stats:1.0");
    let pushed = ok(d, &["push", component.to_str().unwrap(), &reference, "--sign", "publisher.key", "--plain-http"]);
    let digest = pushed_digest(&pushed);
    write_config(d, &registry, &reference, "signed_by = { key = \"publisher.pub\" }", "[policy]\nrequire_signatures = true\n");

    let out = count_words(d, "c1");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out)["words"], 3);

    let audit = toolguard(d, &["audit", "--json"]);
    let report = stdout_json(&audit);
    crate::audit::assert_schema(&report);
    let c = &report["components"][0];
    assert_eq!(report["verdict"], "PASS", "{report:#}");
    assert_eq!(c["registry"]["manifest_digest"], digest.as_str());
    assert_eq!(c["registry"]["tag"], "1.0");
    assert_eq!(c["registry"]["signature"]["status"], "verified");
    assert_eq!(c["registry"]["signature"]["signer"], "publisher.pub");
    assert_eq!(c["pin"]["status"], "signed");
    use sha2::Digest as _;
    assert_eq!(c["sha256"], hex::encode(sha2::Sha256::digest(std::fs::read(&component).unwrap())));
    // What was recorded is the resolved digest: the grant history names the component's sha256.
    let history = String::from_utf8(toolguard(d, &["audit", "--history"]).stdout).unwrap();
    assert!(history.contains(&c["sha256"].as_str().unwrap()[..12]), "{history}");
    // A serving host exports what it loaded: the component, the manifest it resolved to, the signer.
    let server = crate::common::serve_http(&d.join("toolguard.toml"), &[]);
    let url = server.url.replace(toolguard::mcp::http::PATH, toolguard::mcp::http::METRICS_PATH);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let text = tokio::runtime::Runtime::new().unwrap().block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() });
    let line = text.lines().find(|l| l.starts_with("toolguard_component_info{")).unwrap_or_else(|| panic!("{text}"));
    for part in [
        "plugin=\"stats\"".to_string(),
        format!("manifest=\"{digest}\""),
        format!("source=\"{reference}\""),
        format!("signer=\"{}\"", c["registry"]["signature"]["fingerprint"].as_str().unwrap()),
        "policy=\"".to_string(),
    ] {
        assert!(line.contains(&part), "{part} in {line}");
    }
}

#[test]
fn an_artifact_another_client_pushed_loads_and_ours_reads_back_with_another_client() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let component = wasm("text-stats");
    // oras pushes the CNCF Wasm layout: a wasm config, one application/wasm layer.
    std::fs::copy(&component, d.join("component.wasm")).unwrap();
    std::fs::write(d.join("config.json"), br#"{"architecture":"wasm","os":"wasip2"}"#).unwrap();
    let script = format!(
        "import oras.client, os\nos.chdir({dir:?})\nc = oras.client.OrasClient(insecure=True)\n\
         c.push(target='{host}/other/text-stats:2.0', files=['component.wasm:application/wasm'], \
         manifest_config='config.json:application/vnd.wasm.config.v0+json', disable_path_validation=True)\n",
        dir = d.display().to_string(),
        host = registry.host
    );
    python(&["-c", &script]);
    use sha2::Digest as _;
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&component).unwrap()));
    write_config(d, &registry, &registry.reference("other/text-stats:2.0"), &format!("sha256 = \"{sha}\""), "");
    let out = count_words(d, "c1");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // And the other way: oras pulls what toolguard pushed, byte for byte.
    ok(d, &["push", component.to_str().unwrap(), &registry.reference("ours/text-stats:1.0"), "--plain-http"]);
    let out = d.join("pulled.wasm");
    let script = format!(
        "import oras.client\nc = oras.client.OrasClient(insecure=True)\n\
         m = c.get_manifest('{host}/ours/text-stats:1.0')\nprint(m['config']['mediaType'], [l['mediaType'] for l in m['layers']])\n\
         open({out:?}, 'wb').write(c.get_blob('{host}/ours/text-stats', m['layers'][0]['digest']).content)\n",
        host = registry.host,
        out = out.display().to_string()
    );
    let printed = python(&["-c", &script]);
    assert!(printed.contains("application/vnd.wasm.config.v0+json ['application/wasm']"), "{printed}");
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&component).unwrap());
}

/// An independent verifier (Python's `cryptography`, with oras as the OCI
/// client) checks a signature `toolguard push --sign` stored: the cosign
/// tag layout, the simple-signing payload naming the manifest digest, and
/// the ECDSA signature under the publisher's public key.
#[test]
fn a_signature_toolguard_makes_verifies_with_an_independent_verifier() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "publisher"]);
    let pushed = ok(d, &["push", wasm("text-stats").to_str().unwrap(), &registry.reference("tools/text-stats:1.0"), "--sign", "publisher.key", "--plain-http"]);
    let digest = pushed_digest(&pushed);
    let script = format!(
        r#"
import base64, json, sys, oras.client
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
c = oras.client.OrasClient(insecure=True)
target = "{host}/tools/text-stats:" + "{digest}".replace(":", "-") + ".sig"
m = c.get_manifest(target)
key = serialization.load_pem_public_key(open({key:?}, "rb").read())
ok = 0
for layer in m["layers"]:
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json", layer
    payload = c.get_blob("{host}/tools/text-stats", layer["digest"]).content
    body = json.loads(payload)
    assert body["critical"]["image"]["docker-manifest-digest"] == "{digest}", body
    assert body["critical"]["type"] == "cosign container image signature", body
    key.verify(base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"]), payload, ec.ECDSA(hashes.SHA256()))
    ok += 1
print("verified", ok)
"#,
        host = registry.host,
        key = d.join("publisher.pub").display().to_string()
    );
    assert_eq!(python(&["-c", &script]).trim(), "verified 1");
}

/// cosign's own signature (sigstore-rs's test data: a layer cosign made
/// over an image manifest, with the public key it was made with) verifies
/// with toolguard's verifier, and fails once any of its parts changes.
#[test]
fn a_signature_cosign_made_verifies() {
    use toolguard::registry::publishers::PublisherKey;
    use toolguard::registry::signature::{SignatureLayer, verify};
    let key = PublisherKey::from_pem(
        "cosign.pub",
        b"-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAENptdY/l3nB0yqkXLBWkZWQwo6+cu\nOSWS1X9vPavpiQOoTTGC0xX57OojUadxF1cdQmrsiReWg2Wn4FneJfa8xw==\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let digest = "sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b";
    let payload = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"registry-testing.svc.lan/busybox"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
    );
    let layer = SignatureLayer {
        payload: payload.clone().into_bytes(),
        signature: "MEUCIQD6q/COgzOyW0YH1Dk+CCYSt4uAhm3FDHUwvPI55zwnlwIgE0ZK58ZOWpZw8YVmBapJhBqCfdPekIknimuO0xH8Jh8=".into(),
        ..Default::default()
    };
    let keys = [key];
    assert_eq!(verify(std::slice::from_ref(&layer), digest, &keys).unwrap().label, "cosign.pub");
    // Another manifest, a changed payload, a changed signature: refused.
    assert!(verify(std::slice::from_ref(&layer), &digest.replace("f3", "f4"), &keys).is_err());
    let changed = SignatureLayer { payload: payload.replace("busybox", "busyb0x").into_bytes(), ..layer.clone() };
    assert!(verify(&[changed], digest, &keys).is_err());
    let forged = SignatureLayer { signature: layer.signature.replace("MEUCIQD6", "MEUCIQD7"), ..layer };
    assert!(verify(&[forged], digest, &keys).is_err());
}

#[test]
fn credentials_come_from_a_docker_config_and_never_show() {
    let registry = TestRegistry::with(RegistryOptions { user: Some(("alice", "s3cret-pass")), ..Default::default() });
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reference = registry.reference("tools/text-stats:1.0");
    let component = wasm("text-stats");
    // Without credentials: a clear refusal.
    let out = toolguard(d, &["push", component.to_str().unwrap(), &reference, "--plain-http"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("asks for credentials"), "{}", String::from_utf8_lossy(&out.stderr));
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret-pass");
    std::fs::write(d.join("docker.json"), format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, registry.host)).unwrap();
    let pushed = ok(d, &["push", component.to_str().unwrap(), &reference, "--plain-http", "--docker-config", "docker.json"]);
    assert!(!pushed.contains("s3cret"));
    use sha2::Digest as _;
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&component).unwrap()));
    let config = write_config(d, &registry, &reference, &format!("sha256 = \"{sha}\""), "");
    let text = std::fs::read_to_string(&config).unwrap().replace("plain_http = true\n", "plain_http = true\ndocker_config = \"docker.json\"\n");
    std::fs::write(&config, text).unwrap();
    let out = count_words(d, "c1");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let audit = toolguard(d, &["audit", "--json"]);
    assert!(!String::from_utf8_lossy(&audit.stdout).contains("s3cret") && !String::from_utf8_lossy(&audit.stderr).contains("s3cret"));
    // A wrong password is refused as such.
    std::fs::write(d.join("docker.json"), format!(r#"{{"auths":{{"{}":{{"username":"alice","password":"wrong"}}}}}}"#, registry.host)).unwrap();
    std::fs::remove_dir_all(d.join("data")).unwrap();
    let out = toolguard(d, &["tools"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("refused the credentials") && !said.contains("wrong"), "{said}");
}

#[test]
fn https_with_a_private_ca_and_spki_pins() {
    let pki = crate::tls::Pki::new();
    let registry = TestRegistry::with(RegistryOptions { tls: Some((&pki.server_cert_file, &pki.server_key_file)), ..Default::default() });
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reference = registry.reference("tools/text-stats:1.0");
    let component = wasm("text-stats");
    let settings = |tls: &str| format!("[policy.registries.\"{}\"]\ntls = {{ {tls} }}\n", registry.host);
    // Push through a config naming the private CA.
    std::fs::write(d.join("push.toml"), settings(&format!("ca_file = {:?}, platform_roots = false", pki.ca_file.display().to_string()))).unwrap();
    ok(d, &["push", component.to_str().unwrap(), &reference, "--config", "push.toml"]);
    use sha2::Digest as _;
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&component).unwrap()));
    let serve = |tls: String| {
        let text = format!(
            "data_dir = \"data\"\n[plugins.stats]\ncomponent = \"{reference}\"\n{}[policy.plugins.stats]\nsha256 = \"{sha}\"\n[policy.plugins.stats.tools.text_stats]\neffect = \"read-only\"\n",
            settings(&tls)
        );
        std::fs::write(d.join("toolguard.toml"), text).unwrap();
        let _ = std::fs::remove_dir_all(d.join("data"));
        count_words(d, "c1")
    };
    let ca = format!("ca_file = {:?}, platform_roots = false", pki.ca_file.display().to_string());
    let out = serve(format!("{ca}, spki_sha256 = [{:?}]", pki.server_pin()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    // A pin the server's key does not match, and a CA that did not sign it: refused.
    let other_pin = "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    for tls in [format!("{ca}, spki_sha256 = [{other_pin:?}]"), format!("ca_file = {:?}, platform_roots = false", pki.wrong_ca_file.display().to_string())] {
        let out = serve(tls.clone());
        assert!(!out.status.success(), "{tls}");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("stats") && said.contains("unavailable") && said.contains("cannot reach the registry"), "{tls}: {said}");
    }
}
