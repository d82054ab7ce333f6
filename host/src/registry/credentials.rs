//! Registry credentials from the platform: a docker-style `config.json`
//! (`auths.<registry>.auth`, or `username`/`password`), or a user name and a
//! password in environment variables. Read by the host at start; never
//! logged, never visible to a plugin.

use base64::Engine as _;
use std::fmt;
use std::path::Path;

/// A user name and password (or token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or token.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials {{ username: {:?}, password: <redacted> }}", self.username)
    }
}

/// The entry for `registry` in the docker-style config file at `path`, if any.
///
/// # Errors
/// The file cannot be read or parsed, or its entry uses a credential helper
/// or identity token (not supported: give a user name and password).
pub fn from_docker_config(path: &Path, registry: &str) -> Result<Option<Credentials>, String> {
    let text = std::fs::read(path).map_err(|e| format!("cannot read the registry credentials {}: {e}", path.display()))?;
    let config: serde_json::Value = serde_json::from_slice(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let auths = &config["auths"];
    let entry = [registry.to_string(), format!("https://{registry}"), format!("http://{registry}")].iter().find_map(|k| auths.get(k).cloned());
    let Some(entry) = entry else {
        if config.get("credsStore").is_some() || config["credHelpers"].get(registry).is_some() {
            return Err(format!(
                "{}: credentials for `{registry}` are kept by a credential helper, which toolguard does not run: put them in `auths`",
                path.display()
            ));
        }
        return Ok(None);
    };
    if let Some(auth) = entry["auth"].as_str() {
        let decoded = base64::engine::general_purpose::STANDARD.decode(auth).map_err(|_| format!("{}: auths.{registry}.auth is not base64", path.display()))?;
        let text = String::from_utf8(decoded).map_err(|_| format!("{}: auths.{registry}.auth is not text", path.display()))?;
        let (username, password) = text.split_once(':').ok_or_else(|| format!("{}: auths.{registry}.auth is not `user:password`", path.display()))?;
        return Ok(Some(Credentials { username: username.into(), password: password.into() }));
    }
    match (entry["username"].as_str(), entry["password"].as_str()) {
        (Some(u), Some(p)) => Ok(Some(Credentials { username: u.into(), password: p.into() })),
        _ if entry.get("identitytoken").is_some() => {
            Err(format!("{}: auths.{registry} holds an identity token, which toolguard does not exchange: give `auth`", path.display()))
        }
        _ => Err(format!("{}: auths.{registry} holds neither `auth` nor `username` and `password`", path.display())),
    }
}

/// Credentials from the environment variables `username_env` and `password_env`.
///
/// # Errors
/// Either is not set.
pub fn from_env(username_env: &str, password_env: &str) -> Result<Credentials, String> {
    let get = |var: &str| std::env::var(var).map_err(|_| format!("environment variable `{var}` (registry credentials) is not set"));
    Ok(Credentials { username: get(username_env)?, password: get(password_env)? })
}

#[cfg(test)]
mod tests {
    #[test]
    fn docker_config_entries_are_read_and_helpers_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"auths":{"r.example":{"auth":"dXNlcjpwYTpzcw=="},"https://s.example":{"username":"u","password":"p"}},"credHelpers":{"h.example":"ecr-login"}}"#).unwrap();
        let c = super::from_docker_config(&path, "r.example").unwrap().unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("user", "pa:ss"));
        assert!(!format!("{c:?}").contains("pa:ss"));
        assert_eq!(super::from_docker_config(&path, "s.example").unwrap().unwrap().password, "p");
        assert_eq!(super::from_docker_config(&path, "none.example").unwrap(), None);
        assert!(super::from_docker_config(&path, "h.example").unwrap_err().contains("credential helper"));
    }
}
