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
use std::io::{BufRead, IsTerminal, Read, Write};
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
/// profile (the file created with mode 0600).
///
/// The key the user gives wins over the one the environment happens to hold: `--key`, else
/// a line on standard input (when it is not a terminal), else `DIFFERENTLY_API_KEY`, else a
/// prompt. Which one is used is said on stderr when more than one is present; the key itself
/// never is. A key the API refuses (401), or an API that cannot be asked, saves nothing,
/// unless `no_verify` says to save without asking.
pub async fn login(t: &Target, no_verify: bool) -> Result<(), CliError> {
    let name = t
        .config_profile
        .clone()
        .unwrap_or_else(|| DEFAULT_PROFILE.to_owned());
    let url = t.url.clone().unwrap_or_else(|| DEFAULT_URL.to_owned());
    let key = login_key(t)?;
    if no_verify {
        eprintln!("differently: --no-verify: the key is saved without being checked against {url}");
    } else {
        verify(&url, &key).await?;
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

/// The variable clap also reads into `--key`.
const KEY_VAR: &str = "DIFFERENTLY_API_KEY";

/// The key `login` stores, by the order of [`login`].
fn login_key(t: &Target) -> Result<String, CliError> {
    let from_env = std::env::var(KEY_VAR).ok().filter(|k| !k.is_empty());
    // clap fills `--key` from the variable too: a value equal to the variable's is the
    // variable's (and if both were given alike, it makes no difference).
    if let Some(k) = t
        .key
        .clone()
        .filter(|k| !k.is_empty() && Some(k) != from_env.as_ref())
    {
        if from_env.is_some() {
            eprintln!("differently: using the key from --key ({KEY_VAR} is ignored)");
        }
        return Ok(k);
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        if let Some(k) = read_line(&stdin)? {
            if from_env.as_ref().is_some_and(|e| e != &k) {
                eprintln!("differently: using the key from standard input ({KEY_VAR} is ignored)");
            }
            return Ok(k);
        }
    }
    if let Some(k) = from_env {
        eprintln!("differently: using the key in {KEY_VAR}");
        return Ok(k);
    }
    if stdin.is_terminal() {
        eprint!("API key: ");
        let _ = std::io::stderr().flush();
        if let Some(k) = read_line(&stdin)? {
            return Ok(k);
        }
    }
    Err(CliError::Usage(format!(
        "no API key: give it on standard input (`differently login <<< \"$KEY\"`), pass --key, or set {KEY_VAR}"
    )))
}

/// The first line of standard input, trimmed; `None` when it is empty.
fn read_line(stdin: &std::io::Stdin) -> Result<Option<String>, CliError> {
    let mut line = String::new();
    stdin
        .lock()
        .take(4096)
        .read_line(&mut line)
        .map_err(|e| CliError::io("reading the key from standard input", e))?;
    let key = line.trim();
    Ok((!key.is_empty()).then(|| key.to_owned()))
}

/// Asks the API whether it knows `key`: any read it may make proves it, and a 403 (a key
/// without that scope) still does. Anything else saves nothing.
async fn verify(url: &str, key: &str) -> Result<(), CliError> {
    let client = differently_client::Client::new(url, key)?;
    let asked = client
        .list_sandboxes_page(
            &SandboxFilter {
                limit: Some(1),
                ..SandboxFilter::default()
            },
            None,
        )
        .await;
    match asked {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(403) => Ok(()),
        Err(e) if e.status() == Some(401) => Err(CliError::Outcome(format!(
            "the API at {url} does not accept this key ({}); nothing was saved",
            super::client_message(&e)
        ))),
        Err(e) if e.api().is_none() => Err(CliError::Outcome(format!(
            "cannot check the key: {}; nothing was saved (--no-verify saves it unchecked)",
            super::client_message(&e)
        ))),
        Err(e) => Err(CliError::Outcome(format!(
            "the key could not be checked: {}; nothing was saved",
            super::client_message(&e)
        ))),
    }
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
