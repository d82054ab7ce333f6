//! The config parser against good and bad files.

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "t.toml", Path::new("/base"))
}

#[test]
fn the_ledger_is_a_directory_by_default_or_a_postgres_url() {
    assert_eq!(parse("").unwrap().ledger, LedgerLocation::Dir(PathBuf::from("/base/.toolguard/ledger")));
    assert_eq!(parse("ledger = \"l\"").unwrap().ledger, LedgerLocation::Dir(PathBuf::from("/base/l")));
    let url = "postgres://tg:secret@db:5432/toolguard";
    assert_eq!(parse(&format!("ledger = \"{url}\"")).unwrap().ledger, LedgerLocation::Postgres(url.into()));
    let e = parse("ledger = \"mysql://tg:secret@db/x\"").unwrap_err();
    assert_eq!(e.field, "ledger");
    assert!(e.message.contains("postgres://") && !e.message.contains("secret"), "{e}");
    let e = parse("ledger = \"l\"\nledger_url_env = \"X\"").unwrap_err();
    assert_eq!(e.field, "ledger_url_env");
    let e = parse("ledger_url_env = \"TOOLGUARD_TEST_SURELY_UNSET\"").unwrap_err();
    assert!(e.message.contains("is not set"), "{e}");
}

#[test]
fn names_file_field_and_problem() {
    let e = parse("[plugins.a]\ncomponent = \"a.wasm\"\n[plugins.a.limits]\ncpu_ms = \"fast\"\n").unwrap_err();
    assert_eq!(e.file, "t.toml");
    assert_eq!(e.field, "plugins.a.limits.cpu_ms");
    assert!(e.message.contains("line 4"), "{e}");

    let e = parse("[plugins.a]\ncomponent = \"a.wasm\"\ncolour = 1\n").unwrap_err();
    assert!(e.message.contains("unknown field `colour`"), "{e}");

    let e = parse("[plugins.a]\ncomponent = \"a.wasm\"\n[policy.plugins.a]\nsha256 = \"abc\"\n").unwrap_err();
    assert_eq!(e.field, "policy.plugins.a.sha256");

    let e = parse("[policy.downstreams.d]\nurl = \"https://d.example\"\nkey_format = \"base64\"\n").unwrap_err();
    assert_eq!(e.field, "policy.downstreams.d.key_format");
    assert!(e.message.contains("`toolguard`, `uuid`") && e.message.contains("`hex`"), "the formats there are: {e}");

    let e = parse("[plugins.a]\ncomponent = \"builtin:nope\"\n").unwrap_err();
    assert!(e.message.contains("builtins are"), "{e}");

    let e = parse("[limits]\nmemory_mb = 4096\n").unwrap_err();
    assert_eq!(e.field, "limits.memory_mb");

    let e = parse("data_dir = [").unwrap_err();
    assert_eq!(e.field, ".");
}

#[test]
fn downstreams_and_grants_are_checked() {
    let base = "[plugins.a]\ncomponent = \"a.wasm\"\n[policy.downstreams.pay]\nurl = \"http://127.0.0.1:4242\"\n";
    let ok = parse(&format!("{base}[[policy.plugins.a.grants]]\ndownstream = \"pay\"\nmethods = [\"POST\"]\npath_prefix = \"/v1\"\n")).unwrap();
    assert_eq!(ok.plugins[0].policy.grants[0].downstream, "pay");
    assert!(ok.plugins[0].policy.reviewed);
    assert_eq!(ok.downstreams["pay"].timeout.as_millis(), 8000);
    let e = parse(&format!("{base}[[policy.plugins.a.grants]]\ndownstream = \"nope\"\n")).unwrap_err();
    assert_eq!(e.field, "policy.plugins.a.grants[0].downstream");
    let e = parse(&format!("{base}[[policy.plugins.a.grants]]\ndownstream = \"pay\"\nmethods = [\"post\"]\n")).unwrap_err();
    assert_eq!(e.field, "policy.plugins.a.grants[0].methods");
    let e = parse("[policy.downstreams.pay]\nurl = \"ftp://x\"\n").unwrap_err();
    assert_eq!(e.field, "policy.downstreams.pay.url");
    let e = parse("[policy.downstreams.pay]\nurl = \"https://x\"\nkey = [{ transport = \"smoke-signal\" }]\n").unwrap_err();
    assert!(e.field.starts_with("policy.downstreams.pay.key"), "{e}");
    let e = parse("[policy.plugins.ghost]\nsha256 = \"\"\n").unwrap_err();
    assert!(e.field.starts_with("policy.plugins.ghost"), "{e}");
    let e = parse("[policy.downstreams.pay]\nurl = \"https://x\"\ncredential = { env = \"A\", file = \"b\" }\n").unwrap_err();
    assert_eq!(e.field, "policy.downstreams.pay.credential");
}

#[test]
fn the_policy_may_live_in_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.toml"), "[downstreams.pay]\nurl = \"https://x\"\n[plugins.a]\nmax_sends_per_call = 2\n").unwrap();
    let text = "policy_file = \"policy.toml\"\n[plugins.a]\ncomponent = \"a.wasm\"\n";
    let c = Config::parse(text, "t.toml", dir.path()).unwrap();
    assert_eq!(c.plugins[0].policy.max_sends_per_call, 2);
    assert!(c.policy_source.ends_with("policy.toml"));
    std::fs::write(dir.path().join("policy.toml"), "[plugins.a]\nsha256 = \"x\"\n").unwrap();
    let e = Config::parse(text, "t.toml", dir.path()).unwrap_err();
    assert!(e.file.ends_with("policy.toml") && e.field == "plugins.a.sha256", "{e}");
}

#[test]
fn resolves_paths_and_layers_limits() {
    let c = parse("data_dir = \"d\"\n[limits]\ncpu_ms = 200\n[plugins.a]\ncomponent = \"x/a.wasm\"\n[plugins.a.limits]\nwall_ms = 5\n").unwrap();
    assert_eq!(c.data_dir, Path::new("/base/d"));
    assert_eq!(c.compile_cache, Path::new("/base/d/compiled"));
    let a = &c.plugins[0];
    assert_eq!(a.component, ComponentSource::File("/base/x/a.wasm".into()));
    assert_eq!((a.limits.cpu_ms, a.limits.wall_ms), (200, 5));
    assert_eq!(a.limits.memory_mb, super::limits::DEFAULT_MEMORY_MB);
}

#[test]
fn the_ledger_cache_is_sized_for_rocksdb_only_and_within_bounds() {
    assert_eq!(parse("").unwrap().ledger_cache_mib, crate::ledger::DEFAULT_BLOCK_CACHE_MIB);
    assert_eq!(parse("ledger_cache_mib = 256").unwrap().ledger_cache_mib, 256);
    for bad in ["ledger_cache_mib = 0", "ledger_cache_mib = 65537"] {
        let e = parse(bad).unwrap_err();
        assert_eq!(e.field, "ledger_cache_mib", "{bad}");
        assert!(e.message.contains("1 to 65536"), "{e}");
    }
    let e = parse("ledger = \"postgres://db/x\"\nledger_cache_mib = 64").unwrap_err();
    assert_eq!(e.field, "ledger_cache_mib");
    assert!(e.message.contains("shared_buffers"), "{e}");
}

#[test]
fn the_ledger_pool_is_sized_for_postgresql_only_and_within_bounds() {
    let pg = "ledger = \"postgres://db/x\"\n";
    assert_eq!(parse(pg).unwrap().ledger_pool, crate::ledger::DEFAULT_POOL_SIZE);
    assert_eq!(parse(&format!("{pg}ledger_pool = 4")).unwrap().ledger_pool, 4);
    for bad in ["ledger_pool = 0", "ledger_pool = 1001"] {
        let e = parse(&format!("{pg}{bad}")).unwrap_err();
        assert_eq!((e.field.as_str(), e.message.contains("1 to 1000")), ("ledger_pool", true), "{e}");
    }
    let e = parse("ledger_pool = 4").unwrap_err();
    assert!(e.field == "ledger_pool" && e.message.contains("RocksDB ledger has none"), "{e}");
}

#[test]
fn mcp_counts_are_at_least_one() {
    for field in [
        "max_sessions",
        "max_sessions_per_principal",
        "max_calls_per_principal",
        "max_requests_per_principal",
        "max_tasks_per_principal",
        "max_approval_requests_per_principal_hour",
        "max_connections",
        "task_poll_ms",
        "task_ttl_ms",
    ] {
        let e = parse(&format!("[mcp]\n{field} = 0\n")).unwrap_err();
        assert_eq!((e.field.as_str(), e.message.as_str()), (format!("mcp.{field}").as_str(), "must be at least 1"));
    }
    assert_eq!(parse("").unwrap().mcp.max_sessions_per_principal, 100);
    assert_eq!(parse("").unwrap().mcp.max_calls_per_principal, 64);
}

#[test]
fn registry_components_need_something_to_vouch_for_them() {
    let pin = format!("sha256 = \"{}\"", "a".repeat(64));
    let with =
        |component: &str, policy: &str, top: &str| parse(&format!("[plugins.a]\ncomponent = \"{component}\"\n[policy]\n{top}\n[policy.plugins.a]\n{policy}\n"));
    let c = with("oci://r.example/t/a:1", &pin, "").unwrap();
    assert_eq!(c.plugins[0].component.to_string(), "oci://r.example/t/a:1");
    // A tag can move: a pin or a publisher must vouch for it; a digest needs neither.
    let e = with("oci://r.example/t/a:1", "", "").unwrap_err();
    assert!(e.message.contains("can move") && e.field == "policy.plugins.a.sha256", "{e}");
    with(&format!("oci://r.example/t/a@sha256:{}", "b".repeat(64)), "", "").unwrap();
    // require_signatures: registry components name publishers, files are pinned.
    let e = with("oci://r.example/t/a:1", &pin, "require_signatures = true").unwrap_err();
    assert!(e.field.ends_with("signed_by") && e.message.contains("require_signatures"), "{e}");
    let e = with("a.wasm", "", "require_signatures = true").unwrap_err();
    assert!(e.message.contains("pin"), "{e}");
    with("a.wasm", &pin, "require_signatures = true").unwrap();
    // A keyless identity needs a trusted root to be checked against; a malformed reference names itself.
    let e = with("oci://r.example/t/a:1", "signed_by = { issuer = \"https://id.example\", subject = \"ci@example\" }", "").unwrap_err();
    assert!(e.message.contains("keyless") && e.message.contains("trusted_root") && e.field == "policy.plugins.a.signed_by[0]", "{e}");
    let e = with("oci://r.example/t/A", &pin, "").unwrap_err();
    assert_eq!(e.field, "plugins.a.component");
}

#[test]
fn plain_http_is_for_loopback_registries_only() {
    let e = parse("[policy.registries.\"r.example\"]\nplain_http = true\n").unwrap_err();
    assert!(e.field.contains("plain_http") && e.message.contains("loopback"), "{e}");
    let c = parse("[policy.registries.\"127.0.0.1:5000\"]\nplain_http = true\n").unwrap();
    assert!(c.registries["127.0.0.1:5000"].plain_http);
    let e = parse("[policy.registries.\"r.example\"]\nusername_env = \"U\"\n").unwrap_err();
    assert!(e.message.contains("password_env"), "{e}");
}

#[test]
fn oauth_refuses_what_would_fail_open() {
    let oauth = |extra: &str| {
        parse(&format!("[mcp.oauth]\nresource = \"https://tools.example/mcp\"\n{extra}\n[[mcp.oauth.issuers]]\nissuer = \"https://idp.example\"\n"))
    };
    assert!(oauth("").unwrap().mcp.oauth.is_some());
    for alg in ["none", "HS256"] {
        let e = oauth(&format!("algorithms = [\"{alg}\"]")).unwrap_err();
        assert!(e.field == "mcp.oauth.algorithms" && e.message.contains("never HMAC"), "{e}");
    }
    let e = parse("[mcp]\ntoken_env = \"T\"\n[mcp.oauth]\nresource = \"https://t.example/mcp\"\n[[mcp.oauth.issuers]]\nissuer = \"https://idp.example\"\n")
        .unwrap_err();
    assert!(e.message.contains("static tokens"), "{e}");
    let e = parse("[mcp.oauth]\nresource = \"https://t.example/mcp\"\n[[mcp.oauth.issuers]]\nissuer = \"http://idp.example\"\n").unwrap_err();
    assert!(e.field.ends_with("issuer") && e.message.contains("https"), "{e}");
    let e = oauth("[mcp.oauth.scopes]\neffects = { destructive = \"x\" }").unwrap_err();
    assert!(e.field.contains("scopes.effects"), "{e}");
}

#[test]
fn allowed_origins_are_origins() {
    for good in ["https://app.example.com", "https://app.example.com:8443", "http://localhost:*", "http://[::1]:8080", "null"] {
        assert!(parse(&format!("[mcp]\nallowed_origins = [{good:?}]\n")).is_ok(), "{good}");
    }
    for bad in ["app.example.com", "https://", "https://a.example/path", "ftp://a.example", "https://a.example:99999x", "*"] {
        let e = parse(&format!("[mcp]\nallowed_origins = [{bad:?}]\n")).unwrap_err();
        assert_eq!(e.field, "mcp.allowed_origins", "{bad}");
    }
}

#[test]
fn each_section_names_what_only_a_restart_applies_and_leaves_the_rest_to_a_reload() {
    let changes = |old: &str, new: &str| parse(old).unwrap().restart_only_changes(&parse(new).unwrap());
    let oauth = |resource: &str, issuer: &str| {
        format!("[mcp.oauth]\nresource = \"https://{resource}/mcp\"\n[[mcp.oauth.issuers]]\nissuer = \"https://{issuer}\"\njwks_file = \"k.json\"\n")
    };
    // Who may come in is reloaded: the tokens, an issuer.
    assert_eq!(changes("", "[mcp]\ntokens = [{ token_env = \"T\", principal = \"p\" }]\n"), Vec::<String>::new());
    assert_eq!(changes(&oauth("tools.example", "a.example"), &oauth("tools.example", "b.example")), Vec::<String>::new());
    // Each restart-only setting is named by its own section.
    assert_eq!(changes("", "[mcp]\nmax_sessions = 7\n"), ["`[mcp] max_sessions` changed"]);
    assert_eq!(changes("", "[mcp]\nmax_sessions = 7\ntask_ttl_ms = 5\n"), ["`[mcp] max_sessions` changed", "`[mcp] task_ttl_ms` changed"]);
    assert_eq!(changes(&oauth("tools.example", "a.example"), &oauth("other.example", "a.example")), ["`[mcp.oauth]` (on or off, or its `resource`) changed"]);
    assert_eq!(changes("", &oauth("tools.example", "a.example")), ["`[mcp.oauth]` (on or off, or its `resource`) changed"]);
    assert_eq!(changes("", "[engine]\npooling = false\n"), ["[engine] changed"]);
    assert_eq!(changes("", "ledger_cache_mib = 64\n"), ["`ledger_cache_mib` changed"]);
    assert_eq!(changes("", "[retention]\nhours = 48\n"), ["[retention] changed"]);
    // Policy is what a reload is for.
    assert_eq!(changes("", "[policy.downstreams.d]\nurl = \"https://d.example\"\n"), Vec::<String>::new());
}
