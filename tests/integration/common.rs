//! Helpers shared by the integration tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use toolguard::config::Limits;
use toolguard::config::{ComponentSource, EngineConfig, PluginConfig};
use toolguard::{CallError, CallRequest, Runtime};

/// The `toolguard` binary the tests build (with its test hooks).
pub const BIN: &str = env!("CARGO_BIN_EXE_toolguard");

/// What a `toolguard` command printed on stdout, as JSON. Output that is
/// not JSON fails the test, showing what the command printed on both
/// streams. (A process killed mid-answer may have printed part of one:
/// read such output with `serde_json::from_slice` and expect nothing.)
pub fn stdout_json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Where the build script put the plugin components.
pub const WASM_DIR: &str = env!("TOOLGUARD_WASM_DIR");

/// The component built from plugin crate `crate_name` (dashes become underscores).
pub fn wasm(crate_name: &str) -> PathBuf {
    Path::new(WASM_DIR).join(format!("{}.wasm", crate_name.replace('-', "_")))
}

/// A compiled-component cache shared by all tests, so each component compiles once.
pub fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("toolguard-compiled")
}

/// A plugin named `name` from the fixture/example crate `crate_name`.
pub fn plugin(name: &str, crate_name: &str, limits: Limits) -> PluginConfig {
    PluginConfig {
        name: name.into(),
        component: ComponentSource::File(wasm(crate_name)),
        limits,
        settings: Default::default(),
        tool_prefix: String::new(),
        policy: Default::default(),
    }
}

/// A small engine: tests never need many instances at once.
pub fn engine() -> EngineConfig {
    EngineConfig { pool_instances: 32, ..EngineConfig::default() }
}

/// A runtime with `plugins` loaded; panics if any is refused.
pub async fn runtime(plugins: &[PluginConfig]) -> Runtime {
    let mut rt = Runtime::new(&engine(), shared_cache()).expect("engine");
    for p in plugins {
        rt.add_plugin(p).await.unwrap_or_else(|e| panic!("loading {}: {e}", p.name));
    }
    rt
}

/// Calls `tool` with `args` under a fixed session and call id.
pub async fn call(rt: &Runtime, tool: &str, args: &str) -> Result<serde_json::Value, CallError> {
    rt.call(&CallRequest { session: "s-test".into(), call_id: "c-test".into(), tool: tool.into(), args_json: args.into(), principal: None, tenant: None })
        .await
        .map(|out| out.value)
}

/// Checks the host still serves a good tool correctly.
pub async fn assert_good_tool_works(rt: &Runtime) {
    let out = call(rt, "text_stats", r#"{"text":"to be or not to be"}"#).await.expect("text_stats must succeed");
    assert_eq!(out["words"], 6);
    assert_eq!(out["top_words"][0], serde_json::json!({"word": "be", "count": 2}));
}

/// The URL of a new, empty database on the test PostgreSQL server
/// (`TOOLGUARD_TEST_POSTGRES`, which `./dev.sh test` starts).
pub fn fresh_postgres_database() -> String {
    use r2d2_postgres::postgres::{Client, NoTls};
    let admin = std::env::var("TOOLGUARD_TEST_POSTGRES")
        .expect("TOOLGUARD_TEST_POSTGRES is not set: run the tests with ./dev.sh test, which starts a throwaway PostgreSQL");
    // Unique among the tests running at once: the clock alone is not (two
    // tests read the same nanosecond on a coarse clock), a counter is.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("tg_it_{now:x}_{}_{n}", std::process::id());
    // rust-postgres's blocking client runs its own runtime: not on this one's threads.
    let create = format!("CREATE DATABASE {name}");
    let admin_url = admin.clone();
    std::thread::spawn(move || Client::connect(&admin_url, NoTls).and_then(|mut c| c.batch_execute(&create)))
        .join()
        .unwrap()
        .expect("creating a test database");
    let mut url = url::Url::parse(&admin).expect("TOOLGUARD_TEST_POSTGRES is a URL");
    url.set_path(&format!("/{name}"));
    // `./dev.sh test` runs the fleet tests a second time over TLS, verified in full.
    if std::env::var_os("TOOLGUARD_TEST_POSTGRES_TLS").is_some() {
        let ca = std::env::var("TOOLGUARD_TEST_POSTGRES_CA").expect("TOOLGUARD_TEST_POSTGRES_CA names the test server's CA (./dev.sh test sets it)");
        url.query_pairs_mut().append_pair("sslmode", "verify-full").append_pair("sslrootcert", &ca);
    }
    url.to_string()
}

/// A running `toolguard serve --http`, killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `toolguard serve --http 127.0.0.1:0` on `config` and waits for its URL.
pub fn serve_http(config: &Path, env: &[(&str, &str)]) -> Server {
    serve_http_logged(config, env).0
}

/// [`serve_http`], keeping what the host logs from then on.
pub fn serve_http_logged(config: &Path, env: &[(&str, &str)]) -> (Server, std::sync::Arc<std::sync::Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolguard"))
        .args(["serve", "--config", config.to_str().unwrap(), "--http", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("serve exited before listening").unwrap();
        if let Some(url) = line.strip_prefix("toolguard: MCP on ") {
            break url.trim().to_string();
        }
    };
    // Keep draining its logs so it never blocks on a full pipe.
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = log.clone();
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| sink.lock().unwrap().push_str(&format!("{l}\n"))));
    (Server { child, url }, log)
}

/// An MCP client making `tools/call` requests with the tool-call id and
/// session in `_meta`.
pub struct Mcp(toolguard::mcp::client::McpClient);

impl Mcp {
    pub async fn connect(url: &str) -> Mcp {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Mcp(toolguard::mcp::client::McpClient::connect(url).await.unwrap())
    }

    /// `refund` under tool-call id `call_id`: the JSON-RPC result, or the transport error.
    pub async fn refund(&self, call_id: &str, amount: u64) -> Result<serde_json::Value, String> {
        let args: serde_json::Value = serde_json::from_str(&crate::payments::refund_args(amount)).unwrap();
        self.call("refund", call_id, args).await
    }

    /// `tools/call` of `tool` with `args` under tool-call id `call_id` in
    /// session `s1`: the JSON-RPC result, or the transport error.
    pub async fn call(&self, tool: &str, call_id: &str, args: serde_json::Value) -> Result<serde_json::Value, String> {
        // Each request its own JSON-RPC id: a client may have several in flight.
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let params = serde_json::json!({ "name": tool, "arguments": args, "_meta": { "toolguard/toolCallId": call_id, "toolguard/sessionId": "s1" } });
        let message = self.0.request(id, "tools/call", params).await.map_err(|e| e.to_string())?;
        Ok(message["result"].clone())
    }
}
