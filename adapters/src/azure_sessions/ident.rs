//! Session identifiers: Azure addresses a session only by the `identifier` its caller chose,
//! and a session carries no tags or metadata, so the identifier is where Differently's ids
//! live: `dly-<installation ulid>-<sandbox ulid>` (57 characters, of the characters Azure's
//! documentation allows). `list` finds an installation's sessions by the prefix, `find` a
//! sandbox's by the suffix.

use differently_core::ids::InstallationId;
use differently_core::SandboxId;

const PREFIX: &str = "dly-";

/// The identifier of `sandbox`'s session in `installation`.
pub(crate) fn identifier(installation: &InstallationId, sandbox: &SandboxId) -> String {
    let ulid = |s: &str| s.split_once('_').map_or(s, |(_, u)| u).to_owned();
    format!(
        "{PREFIX}{}-{}",
        ulid(installation.as_str()),
        ulid(sandbox.as_str())
    )
}

/// The installation and sandbox an identifier of ours names; `None` for any other.
pub(crate) fn parse(identifier: &str) -> Option<(InstallationId, SandboxId)> {
    let rest = identifier.strip_prefix(PREFIX)?;
    let (inst, sbx) = rest.split_once('-')?;
    let installation = InstallationId::parse(&format!("{}_{inst}", InstallationId::PREFIX)).ok()?;
    let sandbox = SandboxId::parse(&format!("{}_{sbx}", SandboxId::PREFIX)).ok()?;
    Some((installation, sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_strangers() {
        let (i, s) = (InstallationId::new(), SandboxId::new());
        let id = identifier(&i, &s);
        assert!(
            id.starts_with("dly-") && (4..=128).contains(&id.len()),
            "{id}"
        );
        assert_eq!(parse(&id), Some((i, s)));
        for other in ["conformance-no-such-instance", "dly-x-y", "testid1", "dly-"] {
            assert_eq!(parse(other), None, "{other}");
        }
    }
}
