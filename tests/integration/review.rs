//! Reviewing a change (`toolguard audit --against OLD`, `docs/audit.md`):
//! real before/after configurations, one per kind of change, each asserting
//! the exact finding; widenings fail the review until acknowledged by
//! fingerprint, narrowings are listed and pass.

use crate::common::{BIN, stdout_json, wasm};
use crate::payments::{Downstream, HEADER_ONLY, INTENT_AND_AMOUNT, config_text};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

/// The payments host's config for `d`, with `extra` TOML after it.
fn config(dir: &Path, name: &str, d: &Downstream, extra: &str) -> String {
    let text = format!("{}\n{extra}\n", config_text("http://127.0.0.1:9", &dir.join("data"), d));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `toolguard audit --config NEW --against OLD --json [--ack …]`: the review and whether it passed.
fn reviewed(new: &str, old: &str, acks: &[&str]) -> (Value, bool) {
    let mut args = vec!["audit", "--config", new, "--against", old, "--json"];
    for a in acks {
        args.extend(["--ack", a]);
    }
    let out = Command::new(BIN).args(&args).output().unwrap();
    (stdout_json(&out), out.status.success())
}

/// The findings of `review` of rule `rule`.
fn of<'a>(review: &'a Value, rule: &str) -> Vec<&'a Value> {
    review["findings"].as_array().unwrap().iter().filter(|f| f["rule"] == rule).collect()
}

/// A change case: the rule it must raise, the new downstream settings, the
/// plugin and tool it is found at, and the facts before and after (null: not checked).
type Case = (&'static str, Downstream, &'static str, Option<&'static str>, Value, Value);

/// Each change to the payments plugin's policy, against the same baseline:
/// the rule it must raise, where, and the fact before and after.
#[test]
fn each_kind_of_policy_change_is_found_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(
        d,
        "old.toml",
        &Downstream { refund_action: Some(INTENT_AND_AMOUNT), refund_policy: Some("approval = { always = true }"), ..Default::default() },
        "",
    );
    let base = || Downstream { refund_action: Some(INTENT_AND_AMOUNT), refund_policy: Some("approval = { always = true }"), ..Default::default() };
    let cases: Vec<Case> = vec![
        ("budget-raised", Downstream { refunds_per_session_hour: 5_000, ..base() }, "payments", None, json!(1000), json!(5000)),
        ("budget-lowered", Downstream { refunds_per_session_hour: 10, ..base() }, "payments", None, json!(1000), json!(10)),
        ("limits-raised", Downstream { wall_ms: 60_000, ..base() }, "payments", None, json!(30_000), json!(60_000)),
        (
            "credential-added",
            Downstream { extra: r#"credential = { env = "TG_REVIEW_KEY" }"#, ..base() },
            "payments",
            None,
            Value::Null,
            json!("payments Authorization (env:TG_REVIEW_KEY)"),
        ),
        ("key-transport-changed", Downstream { key: HEADER_ONLY, ..base() }, "payments", None, Value::Null, Value::Null),
        ("grant-loosened", Downstream { extra: "max_request_bytes = 9000000", ..base() }, "payments", None, Value::Null, Value::Null),
        ("action-changed", Downstream { refund_action: None, ..base() }, "payments", Some("refund"), json!(["/payment_intent", "/amount_cents"]), Value::Null),
        ("consent-removed", Downstream { refund_policy: None, ..base() }, "payments", Some("refund"), Value::Null, Value::Null),
    ];
    for (i, (rule, d_new, plugin, tool, before, after)) in cases.into_iter().enumerate() {
        let new = config(d, &format!("new{i}.toml"), &d_new, "");
        let (review, passed) = reviewed(&new, &old, &[]);
        // The rogue plugin's grant reaches the same downstream: a change to it shows there too.
        let found: Vec<&Value> = of(&review, rule).into_iter().filter(|f| f["plugin"] == plugin).collect();
        assert_eq!(found.len(), 1, "{rule}: {review:#}");
        let f = found[0];
        assert_eq!(f["tool"].as_str(), tool, "{rule}: {f:#}");
        if !before.is_null() || !after.is_null() {
            assert_eq!((&f["before"], &f["after"]), (&before, &after), "{rule}: {f:#}");
        }
        let widening = f["direction"] == "widening";
        assert_eq!(widening, !rule.ends_with("-lowered"), "{rule}: {f:#}");
        // Only this change: nothing else is reported.
        assert!(review["findings"].as_array().unwrap().iter().all(|f| f["rule"] == rule), "{rule}: {review:#}");
        assert_eq!(passed, !widening, "{rule}: a widening fails the review, a narrowing passes: {review:#}");
        if widening {
            let all: Vec<&str> = review["findings"].as_array().unwrap().iter().filter_map(|f| f["fingerprint"].as_str()).collect();
            let fingerprint = f["fingerprint"].as_str().unwrap();
            let (acked, passed) = reviewed(&new, &old, &all);
            assert!(passed, "{rule}: acknowledged, it passes: {acked:#}");
            assert_eq!(of(&acked, rule)[0]["acknowledged"], true);
            assert_eq!(of(&acked, rule)[0]["fingerprint"], fingerprint, "the same change, the same fingerprint");
        }
    }
}

/// An irreversible refund made idempotent (the guard would stop holding its
/// repeats), a grant opened wider, and a grant gone.
#[test]
fn an_effect_class_and_a_grant_widened_are_findings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(d, "old.toml", &Downstream::default(), "");
    let text = std::fs::read_to_string(&old).unwrap();
    let idempotent = text.replace(r#"refund = { effect = "irreversible""#, r#"refund = { effect = "idempotent""#);
    let wider = text.replacen(r#"path_prefix = "/v1/refunds""#, r#"path_prefix = "/v1""#, 1);
    for (name, new_text) in [("idempotent.toml", idempotent), ("wider.toml", wider)] {
        std::fs::write(d.join(name), new_text).unwrap();
    }
    let (review, passed) = reviewed(&d.join("idempotent.toml").display().to_string(), &old, &[]);
    let f = of(&review, "effect-widened");
    assert!(!passed && f.len() == 1 && f[0]["tool"] == "refund" && f[0]["before"] == "irreversible" && f[0]["after"] == "idempotent", "{review:#}");
    let (review, _) = reviewed(&d.join("wider.toml").display().to_string(), &old, &[]);
    let added: Vec<&str> = of(&review, "grant-added").iter().filter_map(|f| f["after"].as_str()).collect();
    let removed: Vec<&str> = of(&review, "grant-removed").iter().filter_map(|f| f["before"].as_str()).collect();
    assert!(added.iter().any(|g| g.starts_with("POST //") && g.ends_with("/v1")), "{review:#}");
    assert!(removed.iter().any(|g| g.starts_with("POST //") && g.ends_with("/v1/refunds")), "{review:#}");
}

/// A plugin added; its component swapped for another (new bytes, other
/// tools); one that imports more.
#[test]
fn new_plugins_components_tools_and_imports_are_findings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plugin = |component: &str| format!("[plugins.extra]\ncomponent = {component:?}\n");
    let old = config(d, "old.toml", &Downstream::default(), &plugin("builtin:text-stats"));
    let (review, passed) = reviewed(&config(d, "none.toml", &Downstream::default(), &plugin("builtin:text-stats")), &old, &[]);
    assert!(review["findings"].as_array().unwrap().is_empty(), "the same configuration changes nothing: {review:#}");
    assert!(passed, "{review:#}");
    assert_eq!(review["audit_verdict"], "FAIL", "shown: the unreviewed `extra` fails its own audit");

    let swapped = config(d, "swapped.toml", &Downstream::default(), &plugin("builtin:template"));
    let (review, _) = reviewed(&swapped, &old, &[]);
    assert_eq!(of(&review, "component-changed").len(), 1, "{review:#}");
    assert_eq!(of(&review, "tool-added")[0]["tool"], "greet");
    assert_eq!(of(&review, "tool-removed")[0]["tool"], "text_stats");

    let fs = config(d, "fs.toml", &Downstream::default(), &plugin(&wasm("import-filesystem").display().to_string()));
    let (review, _) = reviewed(&fs, &old, &[]);
    let imports: Vec<&str> = of(&review, "import-added").iter().filter_map(|f| f["after"].as_str()).collect();
    assert!(imports.contains(&"wasi:filesystem/types") && imports.contains(&"wasi:filesystem/preopens"), "{review:#}");

    let without = config(d, "without.toml", &Downstream::default(), "");
    let (review, passed) = reviewed(&old, &without, &[]);
    assert_eq!(of(&review, "plugin-added")[0]["plugin"], "extra", "{review:#}");
    assert!(!passed);
}

/// The text form names each finding, its fingerprint and the verdict.
#[test]
fn the_review_reads_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(d, "old.toml", &Downstream::default(), "");
    let new = config(d, "new.toml", &Downstream { refunds_per_session_hour: 5_000, ..Downstream::default() }, "");
    let out = Command::new(BIN).args(["audit", "--config", &new, "--against", &old]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        text.contains("WIDENS") && text.contains("budget-raised") && text.contains("[tg1:") && text.contains("FAIL: 1 widening(s) not acknowledged"),
        "{text}"
    );
}

/// `--format sarif`: valid SARIF 2.1.0 (checked against the OASIS schema), a
/// rule per kind of change with help, each result at the line of the
/// plugin's policy in the config, its fingerprint stable and the same as
/// the JSON's, an acknowledged widening suppressed.
#[test]
fn the_review_as_sarif_is_valid_and_points_into_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(d, "old.toml", &Downstream::default(), "");
    let new = config(d, "new.toml", &Downstream { refunds_per_session_hour: 5_000, key: HEADER_ONLY, ..Downstream::default() }, "");
    let sarif = |acks: &[&str]| {
        let mut args = vec!["audit", "--config", &new, "--against", &old, "--format", "sarif"];
        acks.iter().for_each(|a| args.extend(["--ack", a]));
        stdout_json(&Command::new(BIN).args(&args).output().unwrap())
    };
    let log = sarif(&[]);
    let path = d.join("review.sarif");
    std::fs::write(&path, log.to_string()).unwrap();
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sarif/sarif-schema-2.1.0.json");
    let check = "import json, sys, jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))); print('valid')";
    let valid = crate::registry::python(&["-c", check, path.to_str().unwrap(), schema.to_str().unwrap()]);
    assert_eq!(valid.trim(), "valid");
    let run = &log["runs"][0];
    assert_eq!(run["automationDetails"]["id"], "toolguard/review/");
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    let results = run["results"].as_array().unwrap();
    let budget = results.iter().find(|r| r["ruleId"] == "budget-raised" && r["properties"]["plugin"] == "payments").expect("the budget's result");
    assert_eq!(rules[budget["ruleIndex"].as_u64().unwrap() as usize]["id"], "budget-raised");
    assert!(rules.iter().all(|r| r["help"]["text"].as_str().is_some_and(|h| !h.is_empty())));
    assert_eq!(budget["level"], "error");
    let text = std::fs::read_to_string(&new).unwrap();
    let line = text.lines().position(|l| l.starts_with("[policy.plugins.payments]")).unwrap() + 1;
    let location = &budget["locations"][0]["physicalLocation"];
    assert_eq!((location["artifactLocation"]["uri"].as_str(), location["region"]["startLine"].as_u64()), (Some(new.as_str()), Some(line as u64)));
    // The same change, the same fingerprints as the JSON review's, run after run.
    let (json, _) = reviewed(&new, &old, &[]);
    let fingerprints = |v: &Vec<Value>, at: &str| v.iter().map(|r| r.pointer(at).unwrap().as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(fingerprints(results, "/partialFingerprints/toolguardFinding~1v1"), fingerprints(json["findings"].as_array().unwrap(), "/fingerprint"));
    assert_eq!(sarif(&[])["runs"][0]["results"], log["runs"][0]["results"]);
    let fingerprint = budget["partialFingerprints"]["toolguardFinding/v1"].as_str().unwrap();
    let acked = sarif(&[fingerprint]);
    let acked =
        acked["runs"][0]["results"].as_array().unwrap().iter().find(|r| r["partialFingerprints"]["toolguardFinding/v1"] == fingerprint).cloned().unwrap();
    assert_eq!((acked["level"].as_str(), acked["suppressions"][0]["kind"].as_str()), (Some("note"), Some("external")));
}

/// The "rug pull": a new build whose tool describes itself otherwise under
/// the same name (the component's bytes patched where its description is).
/// The review names it with both texts; the lock refuses it at load.
#[test]
fn a_tool_describing_itself_otherwise_is_found_and_the_lock_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bytes = std::fs::read(wasm("text-stats")).unwrap();
    let (said, now) = (b"Counts the characters".as_slice(), b"Erases the characters".as_slice());
    let at = bytes.windows(said.len()).position(|w| w == said).expect("the description is in the component");
    let mut patched = bytes.clone();
    patched[at..at + said.len()].copy_from_slice(now);
    std::fs::write(d.join("v1.wasm"), &bytes).unwrap();
    std::fs::write(d.join("v2.wasm"), &patched).unwrap();
    let plugin = |file: &str| format!("[plugins.extra]\ncomponent = {:?}\n", d.join(file).display().to_string());
    let old = config(d, "old.toml", &Downstream::default(), &plugin("v1.wasm"));
    let new = config(d, "new.toml", &Downstream::default(), &plugin("v2.wasm"));
    let (review, passed) = reviewed(&new, &old, &[]);
    let f = of(&review, "description-changed");
    assert!(!passed && f.len() == 1 && f[0]["tool"] == "text_stats", "{review:#}");
    assert!(f[0]["before"].as_str().unwrap().starts_with("Counts") && f[0]["after"].as_str().unwrap().starts_with("Erases"), "{review:#}");
    assert_eq!(of(&review, "source-changed").len(), 1, "another file: {review:#}");
    // The arguments described otherwise: the input schema changed.
    let (said, now) = (b"The text to analyse.".as_slice(), b"The text to destroy.".as_slice());
    let at = bytes.windows(said.len()).position(|w| w == said).expect("the argument's description is in the component");
    let mut argued = bytes.clone();
    argued[at..at + said.len()].copy_from_slice(now);
    std::fs::write(d.join("v3.wasm"), &argued).unwrap();
    let (review, _) = reviewed(&config(d, "v3.toml", &Downstream::default(), &plugin("v3.wasm")), &old, &[]);
    let f = of(&review, "input-schema-changed");
    assert!(f.len() == 1 && f[0]["after"]["properties"]["text"]["description"] == "The text to destroy.", "{review:#}");
    // Locked as reviewed (v1), the new build is refused, naming the tool.
    std::fs::copy(&old, d.join("toolguard.toml")).unwrap();
    Command::new(BIN).current_dir(d).args(["audit", "--lock"]).output().unwrap();
    std::fs::copy(&new, d.join("toolguard.toml")).unwrap();
    let out = Command::new(BIN).current_dir(d).args(["tools"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("tool `text_stats` describes itself otherwise"), "{said}");
}

/// How a granted downstream is reached: its TLS pins dropped, plain HTTP
/// beyond loopback (`insecure_http`), a proxy — each a loosened grant.
#[test]
fn weaker_tls_plain_http_and_a_proxy_are_loosened_grants() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bank = |settings: &str| {
        format!(
            "[policy.downstreams.bank]\n{settings}\nkey = [{{ transport = \"header\", name = \"Idempotency-Key\" }}]\n\
             [[policy.plugins.rogue.grants]]\ndownstream = \"bank\"\nmethods = [\"POST\"]\npath_prefix = \"/transfers\"\n"
        )
    };
    let pinned = "url = \"https://bank.example\"\ntls = { spki_sha256 = [\"47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\"] }";
    let old = config(d, "old.toml", &Downstream::default(), &bank(pinned));
    let cases = [
        ("unpinned.toml", "url = \"https://bank.example\""),
        ("plain.toml", "url = \"http://bank.example\"\ninsecure_http = true"),
        ("proxied.toml", &*format!("{pinned}\nproxy = \"http://proxy.example:3128\"")),
    ];
    for (name, settings) in cases {
        let (review, passed) = reviewed(&config(d, name, &Downstream::default(), &bank(settings)), &old, &[]);
        let f = of(&review, "grant-loosened");
        assert!(!passed && f.len() == 1 && f[0]["plugin"] == "rogue", "{name}: {review:#}");
        let (before, after) = (&f[0]["before"], &f[0]["after"]);
        match name {
            "unpinned.toml" => assert_ne!(before["tls"], after["tls"], "{review:#}"),
            "plain.toml" => assert_eq!((before["transport"].as_str(), after["transport"].as_str()), (Some("https"), Some("http (insecure_http)"))),
            _ => assert_eq!(after["proxy"], "http://proxy.example:3128/", "{review:#}"),
        }
    }
}

/// Sealing a component's network imports narrows them (forbidden → sealed);
/// undoing it widens them back.
#[test]
fn sealed_imports_are_narrowed_and_unsealed_ones_widened() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sealed = d.join("sealed.wasm");
    let out = Command::new(BIN).args(["seal", wasm("import-sockets").to_str().unwrap(), "-o", sealed.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plugin = |file: &Path| format!("[plugins.extra]\ncomponent = {:?}\n", file.display().to_string());
    let plain = config(d, "plain.toml", &Downstream::default(), &plugin(&wasm("import-sockets")));
    let sealed = config(d, "sealed.toml", &Downstream::default(), &plugin(&sealed));
    let (review, passed) = reviewed(&sealed, &plain, &[]);
    let narrowed = of(&review, "import-class-narrowed");
    assert!(narrowed.iter().any(|f| f["before"] == "forbidden" && f["after"] == "sealed"), "{review:#}");
    assert!(of(&review, "import-class-widened").is_empty(), "{review:#}");
    let _ = passed;
    let (review, passed) = reviewed(&plain, &sealed, &[]);
    assert!(!passed && of(&review, "import-class-widened").iter().any(|f| f["before"] == "sealed" && f["after"] == "forbidden"), "{review:#}");
}

/// Another publisher's signature vouching for the same registry component.
#[test]
fn another_signer_is_a_widening() {
    use crate::registry::{TestRegistry, ok, pushed_digest, write_config};
    let registry = TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(d, &["keygen", "--out", "alice"]);
    ok(d, &["keygen", "--out", "bob"]);
    let reference = registry.reference("tools/text-stats:1.0");
    let digest = pushed_digest(&ok(d, &["push", wasm("text-stats").to_str().unwrap(), &reference, "--sign", "alice.key", "--plain-http"]));
    ok(d, &["sign", &format!("oci://{}/tools/text-stats@{digest}", registry.host), "--key", "bob.key", "--plain-http"]);
    let by = |who: &str, name: &str| {
        let path = write_config(d, &registry, &reference, &format!("signed_by = {{ key = \"{who}.pub\" }}"), "");
        let to = d.join(name);
        std::fs::rename(path, &to).unwrap();
        to.display().to_string()
    };
    let (alice, bob) = (by("alice", "alice.toml"), by("bob", "bob.toml"));
    let (review, passed) = reviewed(&bob, &alice, &[]);
    let f = of(&review, "signer-changed");
    assert!(!passed && f.len() == 1 && f[0]["plugin"] == "stats" && f[0]["before"] != f[0]["after"], "{review:#}");
}
