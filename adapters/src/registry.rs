//! The adapter kinds this build knows, as one table: per kind its trust rule, whether it is
//! the dev-only local runner, and how its settings become an adapter. The API, the workers
//! and the CLI construct adapters and decide trust through it, so they agree, and a new kind
//! is its module plus one row in [`KINDS`].

use differently_core::pool::{PoolRecord, Trust, TrustRule};
use differently_core::FieldError;

use crate::credentials::Credentials;
use crate::daytona::DaytonaAdapter;
use crate::devhost::DevhostAdapter;
use crate::e2b::E2bAdapter;
use crate::fake::FakeAdapter;
use crate::freestyle::FreestyleAdapter;
use crate::kit::build as from;
use crate::metered::Metered;
use crate::opensandbox::OpenSandboxAdapter;
use crate::remote::RemoteAdapter;
use crate::vercel::VercelAdapter;
use crate::SharedAdapter;

pub use crate::kit::AdapterConfigError;

/// Builds one kind's adapter from its `adapterSettings` (`null` means all defaults; errors
/// name the offending field): [`crate::kit::build`] for kinds implementing
/// [`crate::kit::FromSettings`].
pub type BuildFn =
    fn(&serde_json::Value, &Credentials) -> Result<SharedAdapter, AdapterConfigError>;

/// One adapter kind.
pub struct Kind {
    /// The `adapter` name pools use.
    pub name: &'static str,
    /// How a pool of this kind gets its trust.
    pub trust: TrustRule,
    /// The dev-only local runner (`differently dev`): it runs host processes, so it has no
    /// declared isolation; what isolates it is its own `isolation` setting.
    pub dev_only: bool,
    /// How to build it; `None` for a kind whose rules are fixed (its trust) but which this
    /// build has no adapter for yet, so pools naming it are refused as unknown.
    pub build: Option<BuildFn>,
}

/// A row of a kind this build constructs.
const fn row(name: &'static str, trust: TrustRule, build: BuildFn) -> Kind {
    Kind {
        name,
        trust,
        dev_only: false,
        build: Some(build),
    }
}

/// Every adapter kind, built or reserved.
pub const KINDS: &[Kind] = &[
    row("fake", TrustRule::PrivateByDefault, from::<FakeAdapter>),
    Kind {
        dev_only: true,
        ..row(
            "devhost",
            TrustRule::PrivateByDefault,
            from::<DevhostAdapter>,
        )
    },
    row(
        "opensandbox",
        TrustRule::MustDeclare,
        from::<OpenSandboxAdapter>,
    ),
    // A plugin speaking `/adapter/v1`: who runs it is the operator's to say, as for
    // opensandbox.
    row("remote", TrustRule::MustDeclare, from::<RemoteAdapter>),
    // Providers: always third-party infrastructure.
    row("daytona", TrustRule::ForcedExternal, from::<DaytonaAdapter>),
    // E2B's protocol is also spoken by servers an operator runs (self-hosted infra, E2B
    // Embed, CubeSandbox): external unless declared private.
    row("e2b", TrustRule::ExternalByDefault, from::<E2bAdapter>),
    row(
        "freestyle",
        TrustRule::ForcedExternal,
        from::<FreestyleAdapter>,
    ),
    row("vercel", TrustRule::ForcedExternal, from::<VercelAdapter>),
    row(
        "runloop",
        TrustRule::ForcedExternal,
        from::<crate::runloop::RunloopAdapter>,
    ),
    // A Kubernetes cluster the operator runs: who runs it is the operator's to say.
    row(
        "agent_sandbox",
        TrustRule::MustDeclare,
        from::<crate::agent_sandbox::AgentSandboxAdapter>,
    ),
    row(
        "azure_sessions",
        TrustRule::ForcedExternal,
        from::<crate::azure_sessions::AzureSessionsAdapter>,
    ),
    row(
        "cloudflare",
        TrustRule::ForcedExternal,
        from::<crate::cloudflare::CloudflareAdapter>,
    ),
];

/// The row of `name`, built or reserved.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// Adapter kinds this build can construct, in table order.
pub fn known_kinds() -> impl Iterator<Item = &'static str> {
    KINDS.iter().filter(|k| k.build.is_some()).map(|k| k.name)
}

/// The trust rule of `kind`; a kind not in the table (a plugin, a typo caught later by
/// [`build`]) defaults to private.
pub fn trust_rule(kind: &str) -> TrustRule {
    self::kind(kind).map_or(TrustRule::PrivateByDefault, |k| k.trust)
}

/// The trust a pool of `kind` gets given what the operator declared (seeds' rules:
/// providers are forced external, opensandbox must declare, others default private).
pub fn resolve_trust(kind: &str, declared: Option<Trust>) -> Result<Trust, FieldError> {
    differently_core::pool::resolve_trust(kind, trust_rule(kind), declared)
}

/// Whether `kind` is the dev-only local runner (see [`Kind::dev_only`]).
pub fn is_dev_only(kind: &str) -> bool {
    self::kind(kind).is_some_and(|k| k.dev_only)
}

/// Constructs the adapter of `kind` from `settings` (`null` means all defaults), with no
/// stored-secret source: enough to validate settings; a `secret:` credential of an adapter
/// built this way fails at call time. Not metered (see [`build_pool`]).
pub fn build(
    kind: &str,
    settings: &serde_json::Value,
) -> Result<SharedAdapter, AdapterConfigError> {
    build_with(kind, settings, &Credentials::default())
}

/// Constructs the adapter of `kind`, resolving credential references through `credentials`
/// at call time (so a replaced secret is used without rebuilding the adapter). Not metered:
/// it has no pool to label its calls with (see [`build_pool`]).
pub fn build_with(
    kind: &str,
    settings: &serde_json::Value,
    credentials: &Credentials,
) -> Result<SharedAdapter, AdapterConfigError> {
    match self::kind(kind).and_then(|k| k.build) {
        Some(build) => build(settings, credentials),
        None => Err(AdapterConfigError::UnknownKind {
            kind: kind.to_owned(),
            known: known_kinds().collect::<Vec<_>>().join(", "),
        }),
    }
}

/// Constructs the adapter of a registered pool, every call of it metered under the pool's
/// name: the one way a serving process gets an adapter, so no caller meters by hand.
pub fn build_pool(
    record: &PoolRecord,
    credentials: &Credentials,
) -> Result<SharedAdapter, AdapterConfigError> {
    let inner = build_with(&record.kind, &record.settings, credentials)?;
    Ok(std::sync::Arc::new(Metered::new(
        record.name.clone(),
        inner,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_known_kinds_with_defaults() {
        let a = build("fake", &serde_json::Value::Null).expect("fake");
        assert_eq!(a.kind(), "fake");
        let a = build("devhost", &serde_json::json!({"root": "/tmp/x"})).expect("devhost");
        assert_eq!(a.kind(), "devhost");
    }

    #[test]
    fn errors_name_the_kind_or_field() {
        let e = build("opensandboxx", &serde_json::Value::Null)
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("opensandboxx")));

        let e = build(
            "fake",
            &serde_json::json!({"latencyMs": "slow", "unavailable": true}),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("`latencyMs`"), "{e}");

        let e = build("devhost", &serde_json::json!({"rooot": "/tmp"}))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("rooot"), "{e}");

        assert!(build("fake", &serde_json::json!([1])).is_err());
    }

    #[test]
    fn unknown_kind_lists_the_built_kinds() {
        let e = build("nosuch", &serde_json::Value::Null)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let known = known_kinds().collect::<Vec<_>>();
        assert_eq!(
            e,
            format!(
                "unknown adapter kind `nosuch` (known: {})",
                known.join(", ")
            )
        );
        assert_eq!(known[..3], ["fake", "devhost", "opensandbox"]);
        assert!(
            known.contains(&"daytona") && known.contains(&"freestyle"),
            "{known:?}"
        );
        // A reserved kind without an adapter yet is refused the same way.
        for reserved in KINDS.iter().filter(|k| k.build.is_none()) {
            assert!(matches!(
                build(reserved.name, &serde_json::Value::Null).err(),
                Some(AdapterConfigError::UnknownKind { kind, .. }) if kind == reserved.name
            ));
        }
    }

    #[test]
    fn trust_rules_per_kind_follow_the_seeds() {
        for provider in ["daytona", "freestyle", "vercel"] {
            assert_eq!(trust_rule(provider), TrustRule::ForcedExternal);
            assert!(resolve_trust(provider, Some(Trust::Private)).is_err());
        }
        assert_eq!(resolve_trust("e2b", None), Ok(Trust::External));
        assert_eq!(
            resolve_trust("e2b", Some(Trust::Private)),
            Ok(Trust::Private)
        );
        assert_eq!(resolve_trust("daytona", None), Ok(Trust::External));
        assert_eq!(
            resolve_trust("opensandbox", Some(Trust::Private)),
            Ok(Trust::Private)
        );
        assert_eq!(
            resolve_trust("opensandbox", None).map_err(|e| e.field),
            Err("trust".to_owned())
        );
        assert_eq!(resolve_trust("fake", None), Ok(Trust::Private));
        assert_eq!(
            resolve_trust("remote", Some(Trust::External)),
            Ok(Trust::External)
        );
        assert_eq!(
            resolve_trust("remote", None).map_err(|e| e.field),
            Err("trust".to_owned())
        );
        assert!(is_dev_only("devhost"));
        assert!(!is_dev_only("fake") && !is_dev_only("opensandbox") && !is_dev_only("x"));
    }
}
