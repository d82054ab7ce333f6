//! Keyless signatures (`docs/distribution.md`): a component signed by an
//! identity (OIDC issuer and subject) with a short-lived certificate and a
//! transparency log's timestamp, verified offline against a trusted root.
//! Against a private sigstore in a box (`tests/sigstore/keyless.py`: a CA
//! and a log, as a platform's own deployment would run) through the real
//! binary and a real registry; and against cosign's own keyless signature
//! from sigstore's public-good instance (sigstore-rs's test data) with
//! sigstore's published trusted root.

use crate::registry::{TestRegistry, ok, pushed_digest, toolguard};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use toolguard::registry::keyless::{Identity, verify};
use toolguard::registry::reference::OciRef;
use toolguard::registry::signature::{SignatureLayer, payload};
use toolguard::registry::trusted_root::TrustedRoot;

const ISSUER: &str = "https://token.actions.example";
const SUBJECT: &str = "https://github.example/acme/text-stats/.github/workflows/release.yml@refs/tags/v1.0";

/// Pushes text-stats to `repository` (a tag `1.0`), signs its manifest
/// keylessly with the box's CA and log (`flaw`: what to get wrong), writes
/// the box's `trusted_root.json` in `dir`; answers the reference.
fn push_signed_keylessly(dir: &Path, registry: &TestRegistry, repository: &str, flaw: &str) -> String {
    let reference = registry.reference(&format!("{repository}:1.0"));
    let digest = pushed_digest(&ok(dir, &["push", crate::common::wasm("text-stats").to_str().unwrap(), &reference, "--plain-http"]));
    let r = OciRef::parse(&reference).unwrap();
    let signed = payload(&r.name(), &digest);
    std::fs::write(dir.join("payload.json"), &signed).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sigstore/keyless.py");
    let out = crate::registry::python(&[script.to_str().unwrap(), dir.to_str().unwrap(), dir.join("payload.json").to_str().unwrap(), ISSUER, SUBJECT, flaw]);
    let annotations: BTreeMap<String, String> = serde_json::from_str(&out).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = toolguard::registry::Client::new(&registry.host, None, None, toolguard::net::deadlines::REGISTRY).unwrap();
        toolguard::registry::attach(&client, &r, &digest, &signed, annotations).await.unwrap();
    });
    reference
}

/// A config serving text-stats from `reference`, its publisher the keyless `identity`.
fn config(dir: &Path, registry: &TestRegistry, reference: &str, (issuer, subject): (&str, &str)) {
    let policy = format!("signed_by = {{ issuer = {issuer:?}, subject = {subject:?} }}");
    crate::registry::write_config(dir, registry, reference, &policy, "[policy]\nrequire_signatures = true\ntrusted_root = \"trusted_root.json\"\n");
}

#[test]
fn a_keyless_signature_by_the_named_identity_loads_and_the_audit_names_it() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reference = push_signed_keylessly(d, &registry, "tools/keyless", "");
    config(d, &registry, &reference, (ISSUER, SUBJECT));
    let out = crate::registry::count_words(d, "c1");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let audit = toolguard(d, &["audit", "--json"]);
    let report: Value = crate::common::stdout_json(&audit);
    crate::audit::assert_schema(&report);
    let signature = &report["components"][0]["registry"]["signature"];
    assert_eq!(report["verdict"], "PASS", "{report:#}");
    assert_eq!(signature["status"], "verified");
    assert_eq!(signature["signer"], format!("{SUBJECT} from {ISSUER} (keyless)"));
    assert!(signature["fingerprint"].as_str().unwrap().starts_with("sha256:"), "the signing certificate's digest");
}

#[test]
fn keyless_signatures_that_prove_less_are_refused_saying_why() {
    let registry = TestRegistry::start();
    let cases = [
        ("other-ca", "", "does not chain to a certificate authority"),
        ("expired", "", "does not chain"),
        ("forged-set", "", "not signed by the log"),
        ("other-payload", "", "log entry is over other bytes"),
        ("", "another-subject", "whom the policy does not name"),
    ];
    for (i, (flaw, subject, said)) in cases.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let reference = push_signed_keylessly(d, &registry, &format!("tools/refused{i}"), flaw);
        let subject = if subject.is_empty() { SUBJECT.to_string() } else { format!("{SUBJECT}-{subject}") };
        config(d, &registry, &reference, (ISSUER, &subject));
        let out = crate::registry::count_words(d, "c1");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(!out.status.success(), "{flaw} {subject}: loaded: {text}");
        assert!(
            text.contains(said) && text.contains("stats") && text.contains("sha256:"),
            "{flaw} {subject}: expected `{said}` naming the plugin and digest: {text}"
        );
        let audit: Value = crate::common::stdout_json(&toolguard(d, &["audit", "--json"]));
        assert_eq!(audit["verdict"], "FAIL", "{flaw}: {audit:#}");
    }
}

/// A keyless identity with no trusted root to check it against is a config error.
#[test]
fn a_keyless_identity_needs_a_trusted_root() {
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let policy = format!("signed_by = {{ issuer = {ISSUER:?}, subject = {SUBJECT:?} }}");
    crate::registry::write_config(dir.path(), &registry, &registry.reference("tools/x:1"), &policy, "");
    let out = toolguard(dir.path(), &["tools"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("trusted_root"), "{said}");
}

/// cosign's own keyless signature, made in 2021 against sigstore's public
/// instance (sigstore-rs's test data, `signature_layers.rs`): its log
/// timestamp, log entry, certificate chain and signature all verify against
/// sigstore's published trusted root — and then it is refused for its
/// identity, as Fulcio certificates of that time carry no OIDC issuer, which
/// a policy must name. Each check is seen to bite by breaking its input.
#[test]
fn cosigns_own_keyless_signature_verifies_against_sigstores_trusted_root() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sigstore");
    let root = TrustedRoot::parse("sigstore's trusted_root.json", &std::fs::read(fixtures.join("trusted_root.json")).unwrap()).unwrap();
    let identity =
        |root: TrustedRoot| Identity { issuer: "https://accounts.google.com".into(), subject: "flavio@castelli.me".into(), root: std::sync::Arc::new(root) };
    let layer: SignatureLayer = cosign_2021_layer();
    let digest = "sha256:5f481572d088dc4023afb35fced9530ced3d9b03bf7299c6f492163cb9f0452e";
    let why = verify(std::slice::from_ref(&layer), digest, &[identity(root.clone())]).unwrap_err().join("; ");
    assert!(why.contains("by flavio@castelli.me from no OIDC issuer") && why.contains("whom the policy does not name"), "{why}");
    // Each check, broken on purpose, is what refuses it.
    let broken = |layer: SignatureLayer| verify(&[layer], digest, &[identity(root.clone())]).unwrap_err().join("; ");
    let mut set = layer.clone();
    set.bundle = set.bundle.map(|b| b.replace("\"logIndex\":783607", "\"logIndex\":783608"));
    assert!(broken(set).contains("not signed by the log"));
    let mut signature = layer.clone();
    signature.signature = "MEUCIQD6q/COgzOyW0YH1Dk+CCYSt4uAhm3FDHUwvPI55zwnlwIgE0ZK58ZOWpZw8YVmBapJhBqCfdPekIknimuO0xH8Jh8=".into();
    assert!(broken(signature).contains("another signature or certificate"));
    assert!(verify(std::slice::from_ref(&layer), &digest.replace('5', "6"), &[identity(root.clone())]).unwrap_err().join("").contains("another manifest"));
    let mut later = root.clone();
    later.authorities.retain(|a| a.valid.end.is_none());
    assert!(verify(std::slice::from_ref(&layer), digest, &[identity(later)]).unwrap_err().join("").contains("no certificate authority"));
}

/// cosign 3's default: a sigstore bundle referring to the image, made in
/// April 2026 by kubewarden-controller's release workflow on GitHub Actions
/// (sigstore-rs's test data) — verified against sigstore's published trusted
/// root for that exact identity, and refused for anything else.
#[test]
fn cosign_3s_sigstore_bundle_verifies_for_its_workflow_identity() {
    use toolguard::registry::bundle;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sigstore");
    let root = std::sync::Arc::new(TrustedRoot::parse("sigstore's trusted_root.json", &std::fs::read(fixtures.join("trusted_root.json")).unwrap()).unwrap());
    let json = std::fs::read(fixtures.join("cosign-3-bundle.json")).unwrap();
    let issuer = "https://token.actions.githubusercontent.com";
    let subject = "https://github.com/kubewarden/kubewarden-controller/.github/workflows/release.yml@refs/tags/v1.34.0";
    let identity = |subject: &str| Identity { issuer: issuer.into(), subject: subject.into(), root: root.clone() };
    let digest = "sha256:c811d58de79c92f03214e63aa339484e488d694ae8a6283b5f3f17a9faf50172";
    let found = bundle::verify(std::slice::from_ref(&json), digest, &[identity(subject)]).unwrap();
    assert_eq!(found.label, format!("{subject} from {issuer} (keyless)"));
    let refused = |json: Vec<u8>, digest: &str, subject: &str| bundle::verify(&[json], digest, &[identity(subject)]).unwrap_err().join("; ");
    assert!(refused(json.clone(), &digest.replace('c', "d"), subject).contains("names another manifest"));
    assert!(refused(json.clone(), digest, &format!("{subject}-other")).contains("whom the policy does not name"));
    let text = String::from_utf8(json.clone()).unwrap();
    let later = text.replace("\"integratedTime\": \"1775719409\"", "\"integratedTime\": \"1775719410\"");
    assert_ne!(later, text, "the fixture's log time is where the test expects it");
    assert!(refused(later.into_bytes(), digest, subject).contains("not signed by the log"));
}

/// cosign 3's layout through the binary: the bundle stored as a referrer of
/// the manifest (the referrers tag schema, as on Distribution 2.8) loads the
/// component for the named identity, and again from the cache with the
/// registry down; a forged log timestamp does not.
#[test]
fn a_sigstore_bundle_stored_as_a_referrer_admits_the_component() {
    let mut registry = TestRegistry::start();
    for (i, (flaw, loads)) in [("forged-set", false), ("", true)].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let reference = registry.reference(&format!("tools/bundled{i}:1.0"));
        let digest = pushed_digest(&ok(d, &["push", crate::common::wasm("text-stats").to_str().unwrap(), &reference, "--plain-http"]));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sigstore/keyless.py");
        let out = crate::registry::python(&[script.to_str().unwrap(), d.to_str().unwrap(), &format!("bundle:{digest}"), ISSUER, SUBJECT, flaw]);
        let bundle = serde_json::from_str::<Value>(&out).unwrap()["bundle"].as_str().unwrap().to_string();
        let r = OciRef::parse(&reference).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let client = toolguard::registry::Client::new(&registry.host, None, None, toolguard::net::deadlines::REGISTRY).unwrap();
            toolguard::registry::attach_bundle(&client, &r, &digest, bundle.as_bytes()).await.unwrap();
        });
        config(d, &registry, &reference, (ISSUER, SUBJECT));
        let out = crate::registry::count_words(d, "c1");
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(out.status.success(), loads, "{flaw}: {said}");
        if !loads {
            assert!(said.contains("a sigstore bundle whose log timestamp is not signed by the log"), "{said}");
            continue;
        }
        // Offline: the referrers index, the bundle and the component come from the cache.
        registry.stop();
        let out = crate::registry::count_words(d, "c2");
        assert!(out.status.success(), "from the cache: {}", String::from_utf8_lossy(&out.stdout));
    }
}

/// The signature layer of sigstore-rs's `build_correct_signature_layer_with_certificate`.
fn cosign_2021_layer() -> SignatureLayer {
    let payload = serde_json::json!({
        "critical": {
            "identity": { "docker-reference": "registry-testing.svc.lan/kubewarden/disallow-service-nodeport" },
            "image": { "docker-manifest-digest": "sha256:5f481572d088dc4023afb35fced9530ced3d9b03bf7299c6f492163cb9f0452e" },
            "type": "cosign container image signature"
        },
        "optional": null
    });
    let bundle = serde_json::json!({
        "SignedEntryTimestamp": "MEUCIDBGJijj2FqU25yRWzlEWHqE64XKwUvychBs1bSM1PaKAiEAwcR2u81c42TLBk3lWJqhtB7SnM7Lh0OYEl6Bfa7ZA4s=",
        "Payload": {
            "body": COSIGN_2021_BODY,
            "integratedTime": 1634714717,
            "logIndex": 783607,
            "logID": "c0d23d6ad406973f9559f3ba2d1ca01f84147d8ffc5b8445c224f98b9591801d"
        }
    });
    SignatureLayer {
        payload: serde_json::to_vec(&payload).unwrap(),
        signature: "MEUCIGqWScz7s9aP2sGXNFKeqivw3B6kPRs56AITIHnvd5igAiEA1kzbaV2Y5yPE81EN92NUFOl31LLJSvwsjFQ07m2XqaA=".into(),
        certificate: Some(COSIGN_2021_CERT.into()),
        bundle: Some(bundle.to_string()),
    }
}

const COSIGN_2021_CERT: &str = "-----BEGIN CERTIFICATE-----
MIICdzCCAfygAwIBAgITA+PsaKjaEZqn7IY94b1e/jJnizAKBggqhkjOPQQDAzAq
MRUwEwYDVQQKEwxzaWdzdG9yZS5kZXYxETAPBgNVBAMTCHNpZ3N0b3JlMB4XDTIx
MTAyMDA3MjUxNloXDTIxMTAyMDA3NDUxNVowADBZMBMGByqGSM49AgEGCCqGSM49
AwEHA0IABINewQBS1f4AmNIENdL+U/HJotMSM7ZNnkTnYefxwV9TErpvnAZ0+DzL
yfAAVaeJtKjFvbOTb8F1yhJFU0XY+RijggEpMIIBJTAOBgNVHQ8BAf8EBAMCB4Aw
EwYDVR0lBAwwCgYIKwYBBQUHAwMwDAYDVR0TAQH/BAIwADAdBgNVHQ4EFgQUMf1R
MMsqNFBrWbx8mRNdxOkEEYswHwYDVR0jBBgwFoAUyMUdAEGaJCkyUSTrDa5K7UoG
0+wwgY0GCCsGAQUFBwEBBIGAMH4wfAYIKwYBBQUHMAKGcGh0dHA6Ly9wcml2YXRl
Y2EtY29udGVudC02MDNmZTdlNy0wMDAwLTIyMjctYmY3NS1mNGY1ZTgwZDI5NTQu
c3RvcmFnZS5nb29nbGVhcGlzLmNvbS9jYTM2YTFlOTYyNDJiOWZjYjE0Ni9jYS5j
cnQwIAYDVR0RAQH/BBYwFIESZmxhdmlvQGNhc3RlbGxpLm1lMAoGCCqGSM49BAMD
A2kAMGYCMQC3Y2ulPTsPmNS4czaKeje0BnOQHz5e6NBX0Bqx9Xca+t2kOi17sopc
/v/xH1xLuPoCMQDKND4WjHfKqXXOeUvZ9A96DqrEwGaqGMtnIuN4JzZYaULZrx9g
oXqqo/C9QnOHTto=
-----END CERTIFICATE-----
";

const COSIGN_2021_BODY: &str = include_str!("../fixtures/sigstore/cosign-2021-body.b64");
