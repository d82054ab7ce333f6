//! Where a plugin's component comes from — embedded, a file, or an OCI
//! registry through the cache — and the one place that decides whether
//! those bytes may load: the reviewer's sha256 pin, and for a registry
//! component the publisher's signature over its manifest. Both are checked
//! before anything is parsed, compiled or instantiated.

use crate::config::{ComponentSource, Config, PluginConfig};
use crate::error::LoadError;
use crate::policy::{Registries, Registry, RegistryCredentials};
use crate::registry::{self, Cache, Client, Failure, Fetched, OciRef};
use sha2::{Digest as _, Sha256};

/// A component's bytes, their sha256, and where they came from.
#[derive(Debug, Clone)]
pub struct Component {
    /// The component.
    pub bytes: Vec<u8>,
    /// Lower-case hex sha256 of `bytes`.
    pub sha256: String,
    /// For a registry component: what was pulled and who signed it.
    pub provenance: Option<Provenance>,
}

/// What a registry component was pulled as, and what vouched for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// The reference as configured.
    pub reference: OciRef,
    /// The manifest digest (what a tag resolved to; what a signature signs).
    pub manifest_digest: String,
    /// When this host's cache first stored it (ms since the epoch).
    pub pulled_ms: u64,
    /// Why the cache stood in for the registry, if it did.
    pub offline: Option<String>,
    /// The manifest the tag resolved to before it moved, if it did.
    pub moved_from: Option<String>,
    /// The publisher key whose signature verified, if one was asked for.
    pub signer: Option<Signer>,
}

/// A publisher key that vouched for a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The key as the policy names it.
    pub key: String,
    /// `sha256:` of its SubjectPublicKeyInfo.
    pub fingerprint: String,
}

/// A component as found, before its pin and signature are checked.
#[derive(Debug, Clone)]
pub struct Unchecked {
    /// The component.
    pub bytes: Vec<u8>,
    /// Lower-case hex sha256 of `bytes`.
    pub sha256: String,
    /// For a registry component: the pull (its bytes moved to `bytes`).
    pub fetched: Option<Fetched>,
}

/// The component, if its pin and (for a registry component) a publisher's
/// signature admit it: the one place both are decided.
///
/// # Errors
/// [`LoadError::DigestMismatch`] or [`LoadError::Unverified`].
pub fn admit(plugin: &PluginConfig, found: Unchecked) -> Result<Component, LoadError> {
    let Unchecked { bytes, sha256, fetched } = found;
    if let Some(expected) = &plugin.policy.sha256
        && *expected != sha256
    {
        return Err(LoadError::DigestMismatch { plugin: plugin.name.clone(), expected: expected.clone(), actual: sha256 });
    }
    let provenance = fetched.map(|f| vouch(plugin, f)).transpose()?;
    Ok(Component { bytes, sha256, provenance })
}

/// Reads components for the plugins of one config: one load (a start, a
/// reload, an audit) makes one.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The registry cache; `None` where only embedded and file components load.
    cache: Option<Cache>,
    registries: Registries,
    /// One client per registry for this load: its connections and tokens
    /// are shared, and once it finds its registry unreachable the plugins
    /// after the first are served from the cache without waiting on it again
    /// ([`Client::gone`]), so a silent registry costs one load one timeout.
    clients: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, std::sync::Arc<Client>>>>,
}

impl Sources {
    /// The sources of `config`: its registries, its cache under the data directory.
    pub fn of(config: &Config) -> Self {
        Self { cache: Some(Cache::under(&config.data_dir)), registries: config.registries.clone(), clients: Default::default() }
    }

    /// Sources for embedded and file components only (no registry).
    pub fn local() -> Self {
        Self { cache: None, registries: Registries::new(), clients: Default::default() }
    }

    /// The plugin's component, once its pin and (for a registry component)
    /// its signature admit it.
    ///
    /// # Errors
    /// It cannot be read or pulled ([`LoadError::Unavailable`] when only the
    /// network is missing), or its pin or signature refuses it.
    pub async fn read(&self, plugin: &PluginConfig) -> Result<Component, LoadError> {
        admit(plugin, self.fetch(plugin).await?)
    }

    /// The plugin's component as found, nothing yet checked against the policy.
    ///
    /// # Errors
    /// It cannot be read or pulled ([`LoadError::Unavailable`] when only the network is missing).
    pub async fn fetch(&self, plugin: &PluginConfig) -> Result<Unchecked, LoadError> {
        let (bytes, fetched) = match &plugin.component {
            ComponentSource::Oci(r) => {
                let mut fetched = self.pull(plugin, r).await?;
                (std::mem::take(&mut fetched.component), Some(fetched))
            }
            _ => (read_local(plugin)?, None),
        };
        Ok(Unchecked { sha256: hex::encode(Sha256::digest(&bytes)), bytes, fetched })
    }

    async fn pull(&self, plugin: &PluginConfig, r: &OciRef) -> Result<Fetched, LoadError> {
        let settings = self.registries.get(&r.registry).map_or_else(|| Registry::default_for(&r.registry), |s| (**s).clone());
        let pull_error = |reason: String| LoadError::Pull { plugin: plugin.name.clone(), reference: r.to_string(), reason };
        let cache = self
            .cache
            .as_ref()
            .ok_or_else(|| pull_error("registry components load from a configuration (`Runtime::from_config`), which names the cache".into()))?;
        let client = self.client(&settings).map_err(pull_error)?;
        let signatures = plugin.policy.asks_signature();
        registry::fetch(&client, cache, r, signatures, settings.max_component_bytes).await.map_err(|e| match e.failure {
            Failure::Unreachable => LoadError::Unavailable { plugin: plugin.name.clone(), reason: e.message },
            _ => pull_error(e.message),
        })
    }
}

impl Sources {
    /// This load's client of the registry `settings` describe, made on first use.
    fn client(&self, settings: &Registry) -> Result<std::sync::Arc<Client>, String> {
        let mut clients = self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = clients.get(&settings.host) {
            return Ok(client.clone());
        }
        let client = std::sync::Arc::new(client_for(settings)?);
        clients.insert(settings.host.clone(), client.clone());
        Ok(client)
    }
}

/// The bytes of an embedded or file component (a registry component is
/// pulled by [`Sources::fetch`], never read here).
///
/// # Errors
/// No such builtin, the file cannot be read, or the component is in a registry.
pub fn read_local(plugin: &PluginConfig) -> Result<Vec<u8>, LoadError> {
    let read_error = |path: String, reason: String| LoadError::Read { plugin: plugin.name.clone(), path, reason };
    match &plugin.component {
        ComponentSource::Builtin(b) => {
            crate::builtin::component(b).map(<[u8]>::to_vec).ok_or_else(|| read_error(format!("builtin:{b}"), "no such builtin plugin".into()))
        }
        ComponentSource::File(path) => std::fs::read(path).map_err(|e| read_error(path.display().to_string(), e.to_string())),
        ComponentSource::Oci(r) => Err(read_error(r.to_string(), "pulled when a runtime loads its configuration".into())),
    }
}

/// A client of the registry `settings` describe.
///
/// # Errors
/// Its TLS settings or credentials cannot be used.
pub fn client_for(settings: &Registry) -> Result<Client, String> {
    let label = format!("registry `{}`", settings.host);
    let tls = if settings.plain_http { None } else { Some(crate::net::tls::rustls_config(&settings.tls, &label)?) };
    let credentials = match &settings.credentials {
        RegistryCredentials::Anonymous => None,
        RegistryCredentials::DockerConfig(path) => registry::credentials::from_docker_config(path, &settings.host)?,
        RegistryCredentials::Env(user, password) => Some(registry::credentials::from_env(user, password)?),
    };
    Client::new(&settings.host, tls, credentials, settings.timeout)
}

/// The publisher whose signature over the pulled manifest the policy
/// accepts: a key it names, or a keyless identity it names.
fn signer_of(plugin: &PluginConfig, fetched: &Fetched) -> Result<Signer, LoadError> {
    let (digest, policy) = (&fetched.manifest_digest, &plugin.policy);
    let keyed = if policy.signed_by.is_empty() { Err(None) } else { registry::signature::verify(&fetched.signatures, digest, &policy.signed_by).map_err(Some) };
    let keyed_why = match keyed {
        Ok(key) => return Ok(Signer { key: key.label.clone(), fingerprint: key.fingerprint.clone() }),
        Err(why) => why,
    };
    let keyless_why = match policy.signed_by_identity.is_empty() {
        true => Vec::new(),
        false => {
            let layers = registry::keyless::verify(&fetched.signatures, digest, &policy.signed_by_identity);
            let found =
                layers.or_else(|why| registry::bundle::verify(&fetched.bundles, digest, &policy.signed_by_identity).map_err(|more| [why, more].concat()));
            match found {
                Ok(found) => return Ok(Signer { key: found.label, fingerprint: found.fingerprint }),
                Err(why) => why,
            }
        }
    };
    let reason = match (keyed_why, fetched.signatures.is_empty() && fetched.bundles.is_empty()) {
        (_, true) => registry::signature::Unverified::Unsigned.to_string(),
        (Some(registry::signature::Unverified::NoneValid { found, mut why }), _) => {
            why.extend(keyless_why);
            registry::signature::Unverified::NoneValid { found, why }.to_string()
        }
        _ => registry::signature::Unverified::NoneValid { found: fetched.signatures.len() + fetched.bundles.len(), why: keyless_why }.to_string(),
    };
    Err(LoadError::Unverified {
        plugin: plugin.name.clone(),
        reference: fetched.reference.to_string(),
        digest: digest.clone(),
        reason,
        expected: policy.publishers().join(" or "),
    })
}

/// The provenance of a pulled component, once a publisher's signature
/// vouches for it where the policy asks for one (the pin is [`admit`]'s).
///
/// # Errors
/// [`LoadError::Unverified`]: no signature by a key the policy names.
pub fn vouch(plugin: &PluginConfig, fetched: Fetched) -> Result<Provenance, LoadError> {
    let signer = if plugin.policy.asks_signature() { Some(signer_of(plugin, &fetched)?) } else { None };
    if let Some(before) = &fetched.moved_from {
        let by = signer.as_ref().map_or_else(|| "its pin".to_string(), |s| format!("a signature by {}", s.key));
        tracing::warn!(plugin = %plugin.name, reference = %fetched.reference, from = %before, to = %fetched.manifest_digest, "the tag moved to a new manifest; accepted by {by}");
    }
    if let Some(why) = &fetched.offline {
        tracing::warn!(plugin = %plugin.name, reference = %fetched.reference, "serving the cached component: {why}");
    }
    Ok(Provenance {
        reference: fetched.reference,
        manifest_digest: fetched.manifest_digest,
        pulled_ms: fetched.pulled_ms,
        offline: fetched.offline,
        moved_from: fetched.moved_from,
        signer,
    })
}
