//! The client config file: named profiles of URL and key, written by `differently login`
//! (mode 0600: it holds keys) and read by every client command. Flags and `DIFFERENTLY_*`
//! variables override it.
//!
//! Where: `DIFFERENTLY_CLIENT_CONFIG`, else `$XDG_CONFIG_HOME/differently/client.toml`, else
//! `~/.config/differently/client.toml`.
//!
//! ```toml
//! [profiles.default]
//! url = "http://127.0.0.1:7070"
//! key = "dly_key_…"
//! ```

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use differently_client::{SandboxFilter, DEFAULT_URL};
use serde::{Deserialize, Serialize};

use super::{CliError, Target};

/// The profile used when none is named.
pub const DEFAULT_PROFILE: &str = "default";

#[derive(Debug, Default, Serialize, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Profile {
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

/// The URL and key a command uses.
pub struct Resolved {
    pub url: String,
    pub key: Option<String>,
}

/// The config file's path.
pub fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DIFFERENTLY_CLIENT_CONFIG").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("differently").join("client.toml"))
}

fn load(path: &Path) -> Result<ConfigFile, CliError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ConfigFile::default()),
        Err(e) => return Err(CliError::io(format!("reading {}", path.display()), e)),
    };
    toml::from_str(&text).map_err(|e| {
        CliError::Usage(format!(
            "{} is not a valid client config: {}",
            path.display(),
            e.message()
        ))
    })
}

/// Flags and variables first, then the profile, then the defaults. A profile named with
/// `--config-profile` must exist.
pub fn resolve(t: &Target) -> Result<Resolved, CliError> {
    let file = match path() {
        Some(p) if t.url.is_none() || t.key.is_none() || t.config_profile.is_some() => load(&p)?,
        _ => ConfigFile::default(),
    };
    let name = t.config_profile.as_deref().unwrap_or(DEFAULT_PROFILE);
    let profile = match file.profiles.get(name) {
        Some(p) => p.clone(),
        None if t.config_profile.is_some() => {
            return Err(CliError::Usage(format!(
                "no profile {name:?} in {} (create it with `differently login --config-profile {name}`)",
                path().map(|p| p.display().to_string()).unwrap_or_default()
            )))
        }
        None => Profile::default(),
    };
    Ok(Resolved {
        url: t
            .url
            .clone()
            .or(profile.url)
            .unwrap_or_else(|| DEFAULT_URL.to_owned()),
        key: t.key.clone().or(profile.key).filter(|k| !k.is_empty()),
    })
}

/// `differently login`: checks the key against the API, then stores URL and key in the
/// profile (the file created with mode 0600). The key comes from `--key`,
/// `DIFFERENTLY_API_KEY`, or a line on standard input.
pub async fn login(t: &Target) -> Result<(), CliError> {
    let name = t
        .config_profile
        .clone()
        .unwrap_or_else(|| DEFAULT_PROFILE.to_owned());
    let url = t.url.clone().unwrap_or_else(|| DEFAULT_URL.to_owned());
    let key = match t.key.clone().filter(|k| !k.is_empty()) {
        Some(k) => k,
        None => read_key()?,
    };
    let client = differently_client::Client::new(&url, &key)?;
    // Any read the key may make proves it is known; 403 (a key without that scope) still is.
    match client
        .list_sandboxes_page(
            &SandboxFilter {
                limit: Some(1),
                ..SandboxFilter::default()
            },
            None,
        )
        .await
    {
        Ok(_) => {}
        Err(e) if e.status() == Some(403) => {}
        Err(e) => return Err(e.into()),
    }
    let path = path().ok_or_else(|| {
        CliError::Usage("no place for the config: set HOME or DIFFERENTLY_CLIENT_CONFIG".into())
    })?;
    let mut file = load(&path)?;
    file.profiles.insert(
        name.clone(),
        Profile {
            url: Some(url.clone()),
            key: Some(key),
        },
    );
    store(&path, &file)?;
    eprintln!(
        "differently: profile {name:?} ({url}) saved in {}",
        path.display()
    );
    Ok(())
}

fn read_key() -> Result<String, CliError> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("API key: ");
        let _ = std::io::stderr().flush();
    }
    let mut line = String::new();
    stdin
        .lock()
        .take(4096)
        .read_to_string(&mut line)
        .map_err(|e| CliError::io("reading the key from standard input", e))?;
    let key = line.lines().next().unwrap_or("").trim().to_owned();
    if key.is_empty() {
        return Err(CliError::Usage(
            "no API key: pass --key, set DIFFERENTLY_API_KEY, or give it on standard input".into(),
        ));
    }
    Ok(key)
}

/// Writes the file with mode 0600 (its directory 0700), replacing it whole.
fn store(path: &Path, file: &ConfigFile) -> Result<(), CliError> {
    let text = toml::to_string(file)
        .map_err(|e| CliError::Outcome(format!("cannot write the config: {e}")))?;
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    let tmp = path.with_extension("toml.tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(&tmp)
        .map_err(|e| CliError::io(format!("writing {}", tmp.display()), e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // A file left by an earlier run keeps its old mode through `open`: set it.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| CliError::io(format!("chmod {}", tmp.display()), e))?;
    }
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| CliError::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| CliError::io(format!("replacing {}", path.display()), e))
}

fn create_private_dir(dir: &Path) -> Result<(), CliError> {
    if dir.as_os_str().is_empty() || dir.exists() {
        return Ok(());
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
        .map_err(|e| CliError::io(format!("creating {}", dir.display()), e))
}
