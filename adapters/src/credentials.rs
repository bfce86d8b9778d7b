//! Pool credentials by reference, resolved when a backend call is made rather than when the
//! adapter is built, so a rotated credential is used without a restart.
//!
//! A reference names an environment variable, a file, or a secret stored sealed in
//! Differently (`PUT /v1/admin/secrets/{name}`). Adapters do not depend on the store: a
//! process that has one passes a [`SecretSource`] in [`Credentials`] when it builds its
//! adapters. A resolved value is reused for [`DEFAULT_TTL`] (or until
//! [`Credentials::changed`]), so a stored secret costs one database read per pool every few
//! seconds, not one per call. Errors name the reference, never a value.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;

/// How long a resolved credential is reused before it is read again.
pub const DEFAULT_TTL: Duration = Duration::from_secs(2);

/// Where a pool credential comes from: never the value itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialRef {
    /// An environment variable of the server process (changes only with a restart).
    Env(String),
    /// A file, e.g. a mounted Kubernetes Secret; re-read, so rotating the file works.
    File(PathBuf),
    /// A secret stored sealed in Differently, by name.
    Secret(String),
}

impl CredentialRef {
    /// `env`, `file` or `secret`.
    pub fn kind(&self) -> &'static str {
        match self {
            CredentialRef::Env(_) => "env",
            CredentialRef::File(_) => "file",
            CredentialRef::Secret(_) => "secret",
        }
    }
}

impl std::fmt::Display for CredentialRef {
    /// `env:NAME`, `file:PATH` or `secret:NAME`: safe to log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialRef::Env(v) => write!(f, "env:{v}"),
            CredentialRef::File(p) => write!(f, "file:{}", p.display()),
            CredentialRef::Secret(n) => write!(f, "secret:{n}"),
        }
    }
}

/// A secret store failure as the source reports it; must not contain a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SecretSourceError(pub String);

/// Reads stored secrets by name. Implemented over the store by the processes that have one.
#[async_trait]
pub trait SecretSource: Send + Sync + 'static {
    /// The current value of `name`; `None` when no such secret is stored.
    async fn open(&self, name: &str) -> Result<Option<Vec<u8>>, SecretSourceError>;
}

/// Why a credential reference did not resolve. Names the reference, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("environment variable `{0}` is not set")]
    EnvMissing(String),
    #[error("cannot read credential file {path}: {message}")]
    File { path: String, message: String },
    #[error("no stored secret named `{0}` (store it with PUT /v1/admin/secrets/{0})")]
    SecretMissing(String),
    #[error("stored secret `{name}` cannot be read: {message}")]
    Secret { name: String, message: String },
    #[error("stored secret `{0}` is referenced, but this process has no secret store")]
    NoSecretStore(String),
    #[error("the credential in {0} is empty")]
    Empty(String),
}

/// What adapters need to resolve references at call time: the stored-secret source (if this
/// process has one) and how long a value is reused. Cheap to clone; clones share
/// [`Credentials::changed`].
#[derive(Clone)]
pub struct Credentials {
    secrets: Option<Arc<dyn SecretSource>>,
    ttl: Duration,
    generation: Arc<AtomicU64>,
}

impl Default for Credentials {
    fn default() -> Self {
        Credentials {
            secrets: None,
            ttl: DEFAULT_TTL,
            generation: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("secrets", &self.secrets.is_some())
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Credentials {
    /// Credentials backed by `secrets` for `secret:` references.
    pub fn new(secrets: Arc<dyn SecretSource>) -> Credentials {
        Credentials {
            secrets: Some(secrets),
            ..Credentials::default()
        }
    }

    /// The same, reusing a resolved value for `ttl` (zero: read at every call).
    pub fn with_ttl(mut self, ttl: Duration) -> Credentials {
        self.ttl = ttl;
        self
    }

    /// Says a credential changed (a secret was stored by this process): every resolver built
    /// from these credentials reads again on its next use instead of waiting out the TTL.
    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// A resolver of `reference` sharing these credentials' source, TTL and generation.
    pub fn resolver(&self, reference: CredentialRef) -> CredentialResolver {
        CredentialResolver {
            reference,
            credentials: self.clone(),
            cache: Mutex::new(None),
        }
    }
}

struct Cached {
    value: Arc<str>,
    at: Instant,
    generation: u64,
}

/// Resolves one reference when asked, reusing the value for a short while.
pub struct CredentialResolver {
    reference: CredentialRef,
    credentials: Credentials,
    cache: Mutex<Option<Cached>>,
}

impl std::fmt::Debug for CredentialResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CredentialResolver({})", self.reference)
    }
}

impl CredentialResolver {
    /// The reference (for reports and messages).
    pub fn reference(&self) -> &CredentialRef {
        &self.reference
    }

    fn cache(&self) -> MutexGuard<'_, Option<Cached>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `value` as if just read (an adapter that read the credential to validate it).
    pub fn seed(&self, value: &str) {
        *self.cache() = Some(Cached {
            value: Arc::from(value),
            at: Instant::now(),
            generation: self.credentials.generation.load(Ordering::Relaxed),
        });
    }

    /// Drops the reused value: the next [`get`](Self::get) reads again (e.g. after the
    /// backend refused the credential).
    pub fn forget(&self) {
        *self.cache() = None;
    }

    /// The value, trimmed of surrounding whitespace for env and file references (a trailing
    /// newline is not part of a key) and exact for stored secrets.
    pub async fn get(&self) -> Result<Arc<str>, CredentialError> {
        let generation = self.credentials.generation.load(Ordering::Relaxed);
        if let Some(c) = self.cache().as_ref() {
            if c.generation == generation && c.at.elapsed() < self.credentials.ttl {
                return Ok(c.value.clone());
            }
        }
        let value: Arc<str> = Arc::from(self.read().await?);
        *self.cache() = Some(Cached {
            value: value.clone(),
            at: Instant::now(),
            generation,
        });
        Ok(value)
    }

    async fn read(&self) -> Result<String, CredentialError> {
        let value = match &self.reference {
            CredentialRef::Env(var) => std::env::var(var)
                .map_err(|_| CredentialError::EnvMissing(var.clone()))?
                .trim()
                .to_owned(),
            CredentialRef::File(path) => {
                let bytes = tokio::fs::read(path)
                    .await
                    .map_err(|e| CredentialError::File {
                        path: path.display().to_string(),
                        message: e.kind().to_string(),
                    })?;
                String::from_utf8(bytes)
                    .map_err(|_| CredentialError::File {
                        path: path.display().to_string(),
                        message: "not UTF-8 text".to_owned(),
                    })?
                    .trim()
                    .to_owned()
            }
            CredentialRef::Secret(name) => {
                let Some(source) = &self.credentials.secrets else {
                    return Err(CredentialError::NoSecretStore(name.clone()));
                };
                let bytes = source
                    .open(name)
                    .await
                    .map_err(|e| CredentialError::Secret {
                        name: name.clone(),
                        message: e.0,
                    })?
                    .ok_or_else(|| CredentialError::SecretMissing(name.clone()))?;
                String::from_utf8(bytes).map_err(|_| CredentialError::Secret {
                    name: name.clone(),
                    message: "not UTF-8 text".to_owned(),
                })?
            }
        };
        if value.is_empty() {
            return Err(CredentialError::Empty(self.reference.to_string()));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;

    use super::*;

    /// An in-memory secret store.
    #[derive(Default)]
    struct Map(Mutex<HashMap<String, String>>, AtomicU64);

    impl Map {
        fn put(&self, name: &str, value: &str) {
            self.0
                .lock()
                .unwrap()
                .insert(name.to_owned(), value.to_owned());
        }
        fn reads(&self) -> u64 {
            self.1.load(Ordering::Relaxed)
        }
    }

    #[async_trait]
    impl SecretSource for Map {
        async fn open(&self, name: &str) -> Result<Option<Vec<u8>>, SecretSourceError> {
            self.1.fetch_add(1, Ordering::Relaxed);
            if name == "broken" {
                return Err(SecretSourceError("database unreachable".to_owned()));
            }
            Ok(self.0.lock().unwrap().get(name).map(|v| v.clone().into()))
        }
    }

    #[tokio::test]
    async fn a_replaced_secret_is_used_once_the_ttl_passes_or_at_once_when_told() {
        let map = Arc::new(Map::default());
        map.put("os", "key-one");
        let creds = Credentials::new(map.clone()).with_ttl(Duration::from_millis(200));
        let r = creds.resolver(CredentialRef::Secret("os".into()));
        assert_eq!(&*r.get().await.unwrap(), "key-one");
        map.put("os", "key-two");
        // Within the TTL the value is reused: no second read.
        assert_eq!(&*r.get().await.unwrap(), "key-one");
        assert_eq!(map.reads(), 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(&*r.get().await.unwrap(), "key-two");
        // A change announced in this process is seen by the next call.
        map.put("os", "key-three");
        creds.changed();
        assert_eq!(&*r.get().await.unwrap(), "key-three");
        // So is one after the backend refused the value.
        map.put("os", "key-four");
        r.forget();
        assert_eq!(&*r.get().await.unwrap(), "key-four");
    }

    #[tokio::test]
    async fn errors_name_the_reference_never_a_value() {
        let map = Arc::new(Map::default());
        map.put("empty", "");
        let creds = Credentials::new(map);
        let err = |r: CredentialRef| {
            let creds = creds.clone();
            async move { creds.resolver(r).get().await.unwrap_err() }
        };
        let e = err(CredentialRef::Secret("absent".into())).await;
        assert_eq!(e, CredentialError::SecretMissing("absent".into()));
        assert!(e.to_string().contains("`absent`"), "{e}");
        let e = err(CredentialRef::Secret("broken".into())).await;
        assert!(e.to_string().contains("`broken`"), "{e}");
        let e = err(CredentialRef::Secret("empty".into())).await;
        assert_eq!(e.to_string(), "the credential in secret:empty is empty");
        let e = err(CredentialRef::Env(
            "DIFFERENTLY_TEST_SURELY_UNSET_VAR".into(),
        ))
        .await;
        assert!(e.to_string().contains("DIFFERENTLY_TEST_SURELY_UNSET_VAR"));
        let e = err(CredentialRef::File("/nonexistent/key".into())).await;
        assert!(e.to_string().contains("/nonexistent/key"), "{e}");
        // No secret store in this process.
        let e = Credentials::default()
            .resolver(CredentialRef::Secret("os".into()))
            .get()
            .await
            .unwrap_err();
        assert_eq!(e, CredentialError::NoSecretStore("os".into()));
    }

    #[tokio::test]
    async fn a_rotated_file_is_read_again() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "  file-key-1").unwrap();
        let creds = Credentials::default().with_ttl(Duration::ZERO);
        let r = creds.resolver(CredentialRef::File(f.path().to_owned()));
        assert_eq!(&*r.get().await.unwrap(), "file-key-1");
        std::fs::write(f.path(), "file-key-2\n").unwrap();
        assert_eq!(&*r.get().await.unwrap(), "file-key-2");
        assert_eq!(
            r.reference().to_string(),
            format!("file:{}", f.path().display())
        );
    }
}
