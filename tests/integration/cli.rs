//! The real `toolguard` binary: `tools` and `call` round trips, exit
//! statuses, JSON errors, plugin output in the logs, config errors.

use crate::common::{BIN, shared_cache, stdout_json, wasm};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's example config, moved into `dir` with its own data dir
/// and the shared compile cache, plus the misbehave fixture.
fn example_config(dir: &Path) -> PathBuf {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../toolguard.toml");
    let text = std::fs::read_to_string(example).unwrap();
    let text = text.replacen("data_dir = \".toolguard\"", &format!("data_dir = \"data\"\ncompile_cache = {:?}", shared_cache().display().to_string()), 1);
    assert!(text.contains("compile_cache"), "the example config must set data_dir");
    let key_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/sandbox-api-key");
    let text = text.replacen("file = \"examples/sandbox-api-key\"", &format!("file = {:?}", key_file.display().to_string()), 1);
    let fixture = format!("\n[plugins.misbehave]\ncomponent = {:?}\n[plugins.misbehave.config]\ngreeting = \"hi\"\n", wasm("misbehave").display().to_string());
    let path = dir.join("toolguard.toml");
    std::fs::write(&path, text + &fixture).unwrap();
    path
}

fn toolguard(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("TOOLGUARD_HOST_SECRET", "s3cr3t-value").env_remove("TOOLGUARD_LOG").output().expect("run toolguard")
}

/// `toolguard call` with a fresh tool-call id each time.
fn call(config: &Path, tool: &str, args: &str) -> Output {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = format!("c{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    toolguard(&["call", "--config", config.to_str().unwrap(), "--session", "s1", "--call-id", &id, tool, args])
}

#[test]
fn call_round_trip_prints_the_result_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path());
    let out = call(&config, "text_stats", r#"{"text":"the cat and the hat","top":1}"#);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let result = stdout_json(&out);
    assert_eq!(result["words"], 5);
    assert_eq!(result["characters"], 19);
    assert_eq!(result["top_words"], serde_json::json!([{ "word": "the", "count": 2 }]));
}

#[test]
fn failed_calls_print_a_json_error_with_a_kind_and_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path());
    for (tool, args, kind) in [
        ("nope", "{}", "unknown-tool"),
        ("text_stats", "{\"text\":", "invalid-args"),
        ("text_stats", r#"{"text":1}"#, "invalid-args"),
        ("trap", "{}", "plugin-trap"),
    ] {
        let out = call(&config, tool, args);
        assert_eq!(out.status.code(), Some(1), "{tool} {args}");
        let error = stdout_json(&out);
        assert_eq!(error["kind"], kind, "{error}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{error}");
    }
}

#[test]
fn tools_lists_every_tool_with_its_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path());
    let out = toolguard(&["tools", "--config", config.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let tools = stdout_json(&out);
    let names: Vec<&str> = tools.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(names.starts_with(&["bad_json", "big_result", "bomb"]), "sorted: {names:?}");
    let stats = tools.as_array().unwrap().iter().find(|t| t["name"] == "text_stats").unwrap();
    assert_eq!(stats["plugin"], "text-stats");
    assert_eq!(stats["effect"], "read-only");
    assert_eq!(stats["input_schema"]["properties"]["text"]["type"], "string");
    assert_eq!(stats["output_schema"]["required"][0], "characters");

    let text = toolguard(&["tools", "--config", config.to_str().unwrap()]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("text_stats  (plugin text-stats, read-only)"), "{text}");
    assert!(text.contains("input schema:"), "{text}");
    assert!(text.contains("greet"), "{text}");
}

#[test]
fn plugin_output_becomes_tagged_log_lines_and_the_environment_stays_empty() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path());
    let out = call(&config, "print", r#"{"n":2}"#);
    assert!(out.status.success());
    let logs = String::from_utf8_lossy(&out.stderr);
    for line in ["line 0 from misbehave", "line 1 from misbehave", "a warning from misbehave"] {
        let tagged = logs.lines().find(|l| l.contains(line)).unwrap_or_else(|| panic!("`{line}` not logged: {logs}"));
        assert!(tagged.contains("plugin=misbehave"), "not tagged with the plugin: {tagged}");
    }
    assert_eq!(stdout_json(&out), serde_json::json!({ "printed": 2 }), "stdout carries only the result");

    let out = call(&config, "env", "{}");
    assert!(out.status.success());
    let seen = stdout_json(&out);
    assert_eq!(seen["vars"], serde_json::json!([]));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cr3t-value"));
    assert_eq!(seen["config_greeting"], "hi");
}

#[test]
fn a_bad_config_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.toml");
    std::fs::write(&path, "[plugins.x]\ncomponent = \"builtin:text-stats\"\n[plugins.x.limits]\nwall_ms = -5\n").unwrap();
    let out = toolguard(&["tools", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    let error = stdout_json(&out);
    assert_eq!(error["kind"], "config-error");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("broken.toml") && message.contains("plugins.x.limits.wall_ms"), "{message}");

    let out = toolguard(&["tools", "--config", dir.path().join("missing.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stdout_json(&out)["message"].as_str().unwrap().contains("missing.toml"));
}

#[test]
fn a_refused_plugin_fails_start_up_with_every_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.toml");
    let text = format!(
        "data_dir = \"d\"\ncompile_cache = {:?}\n[plugins.sockets]\ncomponent = {:?}\n[plugins.web]\ncomponent = {:?}\n",
        shared_cache().display().to_string(),
        wasm("import-sockets").display().to_string(),
        wasm("import-http").display().to_string()
    );
    std::fs::write(&path, text).unwrap();
    let out = toolguard(&["tools", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    let message = stdout_json(&out)["message"].as_str().unwrap().to_string();
    assert!(message.contains("2 plugin(s) refused"), "{message}");
    assert!(message.contains("wasi:sockets/tcp") && message.contains("wasi:http/outgoing-handler"), "{message}");
}

#[test]
fn without_room_for_the_pool_the_host_falls_back_to_on_demand_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path());
    // 15 GiB of address space: enough for on-demand instances, far too little
    // for a pool that reserves address space for hundreds of memories.
    let script = format!("ulimit -v 15000000 && exec {BIN} call --config {} --session s --call-id c text_stats '{{\"text\":\"a b\"}}'", config.display());
    let out = Command::new("bash").args(["-c", &script]).env_remove("TOOLGUARD_LOG").output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("WARN") && logs.contains("falling back to on-demand"), "{logs}");
    assert_eq!(stdout_json(&out)["words"], 2);
}

/// A host started with a low soft limit on open files (often 1,024) raises
/// it to the hard limit: RocksDB's table files and every connection share it.
#[test]
fn the_open_file_limit_is_raised_to_the_hard_limit() {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    let (_, hard) = toolguard::open_files::limits().expect("the open-file limits");
    let soft = hard.min(256);
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path());
    let mut command = Command::new(BIN);
    command.args(["serve", "--config", config.to_str().unwrap(), "--http", "127.0.0.1:0"]).stderr(std::process::Stdio::piped());
    // SAFETY: only setrlimit, which is async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        });
    }
    let mut child = command.spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().starts_with("toolguard: MCP on")), "serve did not start");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let soft_now: u64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(soft_now, hard, "started with a soft limit of {soft}: {line}");
}

/// A command whose reader goes away ends quietly: `toolguard ledger export
/// | head -1` prints its first line and exits 0, no panic.
#[test]
fn a_command_whose_reader_goes_away_ends_quietly() {
    use std::io::BufRead as _;
    let w = crate::world::World::new();
    for n in 0..6 {
        assert!(w.refund(&format!("e{n}"), 100 + n).0);
    }
    let mut child = Command::new(BIN)
        .args(["ledger", "export", "--config", w.config.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A pipe of one page, so the export cannot all fit in it before the reader goes.
    let fd = std::os::fd::AsRawFd::as_raw_fd(child.stdout.as_ref().unwrap());
    // SAFETY: F_SETPIPE_SZ on a pipe this process owns; no memory is passed.
    assert!(unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, 4096) } >= 0, "{}", std::io::Error::last_os_error());
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains("\"type\""), "{first}");
    // The pipe is closed here (`head -1` exits); the rest of the export meets it.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status.code());
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `toolguard reload` with a configuration it cannot read says so, and
/// claims nothing about a serve it could not even look for.
#[test]
fn reload_with_an_unreadable_config_says_no_serve_was_asked() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broken.toml");
    std::fs::write(&config, "this is [not toml").unwrap();
    let out = toolguard(&["reload", "--config", config.to_str().unwrap()]);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("no serve was asked"), "{said}");
    assert!(!said.contains("keeps serving"), "{said}");
}
