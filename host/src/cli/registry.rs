//! The publisher's side and the cache: `toolguard keygen` (a signing key
//! pair), `toolguard push` (a component as a Wasm OCI artifact, signed with
//! `--sign`), `toolguard sign` (a pushed manifest), and `toolguard pull`
//! (the configured registry components into the cache, checked as a start
//! would check them), and `toolguard prune-cache` (what the configuration
//! no longer needs, out of the cache).

use crate::policy::{Registry, RegistryCredentials};
use crate::registry::publishers::SigningKey;
use crate::registry::{self, OciRef};
use std::path::{Path, PathBuf};

/// How to reach a registry from the command line.
#[derive(Debug, clap::Args)]
pub struct RegistryArgs {
    /// Take the registry's settings (TLS, credentials) from this config's `[policy.registries]`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A docker-style config.json with the registry's credentials.
    #[arg(long)]
    docker_config: Option<PathBuf>,
    /// Plain HTTP (a loopback registry only).
    #[arg(long)]
    plain_http: bool,
}

impl RegistryArgs {
    /// The client for `r`'s registry.
    fn client(&self, r: &OciRef) -> Result<registry::Client, String> {
        let mut settings = match &self.config {
            Some(path) => {
                let config = crate::Config::load(path).map_err(|e| e.to_string())?;
                config.registries.get(&r.registry).map_or_else(|| Registry::default_for(&r.registry), |s| (**s).clone())
            }
            None => Registry::default_for(&r.registry),
        };
        if self.plain_http {
            if !r.is_loopback() {
                return Err(format!("--plain-http only to a loopback registry; `{}` is not loopback", r.registry));
            }
            settings.plain_http = true;
        }
        if let Some(path) = &self.docker_config {
            settings.credentials = RegistryCredentials::DockerConfig(path.clone());
        }
        crate::runtime::source::client_for(&settings)
    }
}

/// Writes `OUT.key` (private, mode 0600) and `OUT.pub`.
pub fn keygen(out: &Path) -> u8 {
    let (private, public) = match SigningKey::generate() {
        Ok(pair) => pair,
        Err(e) => return fail("keygen", &e),
    };
    let (key_path, pub_path) = (out.with_extension("key"), out.with_extension("pub"));
    if key_path.exists() {
        return fail("keygen", &format!("{} exists; not overwritten", key_path.display()));
    }
    if let Err(e) = write_private(&key_path, private.as_bytes()).and_then(|()| std::fs::write(&pub_path, &public)) {
        return fail("keygen", &format!("cannot write the key pair: {e}"));
    }
    let fingerprint = SigningKey::from_pem("new key", private.as_bytes()).map(|k| k.fingerprint()).unwrap_or_default();
    outln!("wrote {} (keep it secret) and {} ({fingerprint})", key_path.display(), pub_path.display());
    outln!("a reviewer names the publisher: [policy.plugins.NAME] signed_by = {{ key = \"{}\" }}", pub_path.display());
    0
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(bytes)
}

/// Pushes `component` to `target`, signing it with `sign` if given.
pub async fn push(component: &Path, target: &str, sign: Option<&Path>, args: &RegistryArgs) -> u8 {
    let result = async {
        let r = OciRef::parse(target)?;
        if r.tag.is_none() || r.digest.is_some() {
            return Err("push to a tag: oci://REGISTRY/REPOSITORY:TAG".to_string());
        }
        let bytes = std::fs::read(component).map_err(|e| format!("cannot read {}: {e}", component.display()))?;
        let imports = crate::imports::component_imports(&bytes).map_err(|e| format!("{} is not a WebAssembly component: {e}", component.display()))?;
        let key = sign.map(read_signing_key).transpose()?;
        let client = args.client(&r)?;
        let digest = registry::push(&client, &r, &bytes, &imports, &[]).await.map_err(|e| e.to_string())?;
        use sha2::Digest as _;
        let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
        outln!("pushed {r}@{digest} (component sha256 {sha256})");
        match key {
            Some(key) => {
                registry::sign(&client, &r, &digest, &key).await.map_err(|e| e.to_string())?;
                outln!("signed {digest} as {}", key.fingerprint());
            }
            None => outln!("pin it: [policy.plugins.NAME] sha256 = \"{sha256}\", or sign it: toolguard sign {}@{digest} --key KEY", r.name()),
        }
        Ok(())
    }
    .await;
    result.map_or_else(|e| fail("push", &e), |()| 0)
}

/// Signs the manifest `target` names (a tag is resolved to its digest first).
pub async fn sign(target: &str, key: &Path, args: &RegistryArgs) -> u8 {
    let result = async {
        let r = OciRef::parse(target)?;
        let key = read_signing_key(key)?;
        let client = args.client(&r)?;
        let digest = match &r.digest {
            Some(d) => d.clone(),
            None => {
                let (_, digest) =
                    client.manifest(&r.repository, r.manifest_reference()).await.map_err(|e| e.to_string())?.ok_or_else(|| format!("{r}: no such tag"))?;
                outln!("{r} is {digest} now; signing that digest");
                digest
            }
        };
        registry::sign(&client, &r, &digest, &key).await.map_err(|e| e.to_string())?;
        outln!("signed {}@{digest} as {}", r.name(), key.fingerprint());
        Ok::<(), String>(())
    }
    .await;
    result.map_or_else(|e| fail("sign", &e), |()| 0)
}

/// Pulls every registry component of the config (or the named plugins) into the cache.
pub async fn pull(config: &Path, plugins: &[String]) -> u8 {
    let config = match crate::Config::load(config) {
        Ok(c) => c,
        Err(e) => return fail("pull", &e.to_string()),
    };
    let sources = crate::runtime::source::Sources::of(&config);
    let mut code = 0;
    for plugin in config.plugins.iter().filter(|p| matches!(p.component, crate::config::ComponentSource::Oci(_))) {
        if !plugins.is_empty() && !plugins.contains(&plugin.name) {
            continue;
        }
        match sources.read(plugin).await {
            Ok(crate::runtime::source::Component { sha256, provenance: Some(p), .. }) => {
                let signer = p.signer.map_or_else(|| "no signature asked for".into(), |s| format!("signed by {} ({})", s.key, s.fingerprint));
                let cached = p.offline.map(|why| format!("; from the cache: {why}")).unwrap_or_default();
                outln!("{}: {} is {} (component sha256 {}); {signer}{cached}", plugin.name, p.reference, p.manifest_digest, sha256);
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("toolguard pull: {e}");
                code = super::EXIT_CONFIG;
            }
        }
    }
    code
}

/// Prunes `config`'s caches: the registry cache keeps what its `oci://`
/// components need offline and loses the rest older than `days`; the
/// compile cache loses what was not loaded within `days`.
pub fn prune(config: &Path, days: u64, dry_run: bool) -> u8 {
    let config = match crate::Config::load(config) {
        Ok(c) => c,
        Err(e) => return fail("prune-cache", &e.to_string()),
    };
    let refs: Vec<OciRef> = config
        .plugins
        .iter()
        .filter_map(|p| match &p.component {
            crate::config::ComponentSource::Oci(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    let (grace_ms, now_ms) = (days.saturating_mul(24 * 3_600_000), crate::ledger::records::now_ms());
    let registry = registry::Cache::under(&config.data_dir).prune(&refs, grace_ms, now_ms, dry_run);
    let compiled = crate::runtime::compile::prune(&config.compile_cache, grace_ms, now_ms, dry_run);
    outln!("{}", serde_json::to_string_pretty(&serde_json::json!({ "registry": registry, "compiled": compiled })).unwrap_or_default());
    0
}

fn read_signing_key(path: &Path) -> Result<SigningKey, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read the signing key {}: {e}", path.display()))?;
    SigningKey::from_pem(&path.display().to_string(), &pem)
}

fn fail(command: &str, message: &str) -> u8 {
    eprintln!("toolguard {command}: {message}");
    super::EXIT_CONFIG
}
