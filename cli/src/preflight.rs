//! `differently preflight`: checks, without changing anything, that this host's
//! configuration can run a server: the keys it needs, Postgres and its schema, NATS
//! JetStream ≥ 2.10, and every configured pool's adapter (its credentials resolve and its
//! backend answers a health check). One line per check; exit 1 if any fails.

use std::sync::Arc;

use differently_adapters::credentials::Credentials;
use differently_adapters::pools::PoolSet;
use differently_store::Store;

use crate::client::output;
use crate::config::Config;

/// The outcome of one check, printed as one line.
struct Check {
    what: String,
    ok: bool,
    detail: String,
}

impl Check {
    fn ok(what: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            what: what.into(),
            ok: true,
            detail: detail.into(),
        }
    }
    fn fail(what: impl Into<String>, detail: impl std::fmt::Display) -> Check {
        Check {
            what: what.into(),
            ok: false,
            detail: detail.to_string(),
        }
    }
}

/// Runs every check and prints them; whether all passed.
pub async fn run(config: &Config) -> bool {
    let mut checks = Vec::new();
    checks.push(match crate::audit_cmd::check_keys(&config.audit) {
        Ok(what) => Check::ok("keys", what),
        Err(e) => Check::fail("keys", e),
    });
    // Parsed as the api role will, so a key it would refuse fails here, not at start.
    checks.push(
        match config
            .require_bootstrap_key()
            .map_err(|e| e.to_string())
            .and_then(|k| differently_api::BootstrapKey::from_key(k).map(|_| ()))
        {
            Ok(()) => Check::ok(
                "bootstrap key",
                "set and well-formed (the api role needs it)",
            ),
            Err(e) => Check::fail(
                "bootstrap key",
                format!("{e} (only where the api role runs)"),
            ),
        },
    );
    let store = match config.require_database_url() {
        Err(e) => {
            checks.push(Check::fail("postgres", e));
            None
        }
        Ok(url) => match differently_store::postgres::PgStore::connect(url, 2).await {
            Err(e) => {
                checks.push(Check::fail("postgres", e));
                None
            }
            Ok(store) => {
                checks.push(match store.pending_migrations().await {
                    Ok(p) if p.is_empty() => Check::ok("postgres", "reachable, schema current"),
                    Ok(p) => Check::fail(
                        "postgres",
                        format!(
                            "{} migration(s) not applied ({}): run `differently migrate`",
                            p.len(),
                            p.join(", ")
                        ),
                    ),
                    Err(e) => Check::fail("postgres", e),
                });
                Some(Arc::new(store))
            }
        },
    };
    match config.require_nats_url() {
        Err(e) => checks.push(Check::fail("nats", e)),
        // Each server of a list on its own: a member that is down, old or refuses the
        // credentials is named, not hidden behind one that answers.
        Ok(url) => {
            let servers: Vec<&str> = url
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            for (i, server) in servers.iter().enumerate() {
                let what = if servers.len() == 1 {
                    "nats".to_owned()
                } else {
                    format!("nats server {}", i + 1)
                };
                let opts = config.bus_connect_options();
                checks.push(
                    match differently_bus::jetstream::connect_with(server, opts).await {
                        Ok(_) => Check::ok(what, "reachable, ≥ 2.10 with JetStream"),
                        Err(e) => Check::fail(what, e),
                    },
                );
            }
        }
    }
    checks.extend(pools(config, store).await);
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.what.as_str())
        .collect();
    // A reader that goes away (`| head`) must not turn a failed check into exit 0.
    if !failed.is_empty() {
        output::failed_if_reader_goes(format!("preflight failed: {}", failed.join(", ")));
    }
    for c in &checks {
        output::print_line(&format!(
            "{:<4}  {:<24}  {}",
            if c.ok { "ok" } else { "FAIL" },
            c.what,
            c.detail
        ));
    }
    failed.is_empty()
}

/// Each configured pool: its adapter builds and its backend answers a health check, with
/// stored credentials resolved through the database when it is reachable.
async fn pools(
    config: &Config,
    store: Option<Arc<differently_store::postgres::PgStore>>,
) -> Vec<Check> {
    let records = match crate::pools::config_records(config) {
        Ok(r) => r,
        Err(e) => return vec![Check::fail("pools", e)],
    };
    if records.is_empty() {
        return vec![Check::ok(
            "pools",
            "none configured (pools may be added through the API)",
        )];
    }
    let credentials = match store {
        Some(s) => {
            let s: Arc<dyn Store> = s;
            Credentials::new(Arc::new(crate::pools::StoreSecrets(s)))
        }
        None => Credentials::default(),
    };
    let (set, bad) = PoolSet::with_credentials(credentials, records.clone());
    let mut out: Vec<Check> = bad
        .into_iter()
        .map(|b| Check::fail(format!("pool {}", b.name), b.error))
        .collect();
    let who = format!("preflight:{}", std::process::id());
    for r in &records {
        let Some(pool) = set.get(&r.name) else {
            continue;
        };
        let h = pool.probe(&who).await;
        out.push(match h.error {
            None => Check::ok(
                format!("pool {}", r.name),
                format!(
                    "{} answers; capabilities: {}",
                    r.kind,
                    h.capabilities.join(", ")
                ),
            ),
            Some(e) => Check::fail(format!("pool {}", r.name), e),
        });
    }
    out
}
