//! Which OpenSandbox server the pool talks to, and what that changes.
//!
//! The server says its version at `GET /version` (no key needed; `{"version":"1.1.1"}` on
//! 1.1.1, recorded), beside `/v1`, not under it. The adapter asks once per pool, keeps the
//! answer, and asks again after the server could not be reached (it may have been upgraded
//! in the outage) or refused a body field (the answer was stale). Each version's differences
//! that touch the adapter are one [`Behaviour`] row; `docs/opensandbox.md` gives the sources.

use std::sync::Mutex;

use reqwest::Method;
use serde::Deserialize;

use super::client::Client;
use crate::{AdapterError, Verification, VerifiedStatus};

/// The versions whose behaviour the adapter knows. Older servers (0.1.x, 1.0.x) behave like
/// 1.1 for everything the adapter sends; newer ones are taken for the newest known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ServerVersion {
    /// 1.1.x and older, or a server that does not say (verified live on 1.1.1).
    V1_1,
    /// 1.2.0 and 1.2.1: request objects reject unknown fields (1.2.1), the server proxy is
    /// in maintenance mode.
    V1_2,
    /// 1.3.0 and later: execd is PID 1 by default, direct endpoints with a per-sandbox
    /// access token, `rootfsOnly` snapshots, some routes removed.
    V1_3,
}

impl ServerVersion {
    /// Reads a version string (`1.3.0`, `1.3.0rc4`, `1.2.1-rc.2`, `v1.2.0`).
    pub(crate) fn parse(s: &str) -> Option<ServerVersion> {
        let s = s.trim().trim_start_matches('v');
        let mut parts = s.split(|c: char| !c.is_ascii_digit());
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
        Some(match (major, minor) {
            (0, _) | (1, 0..=1) => ServerVersion::V1_1,
            (1, 2) => ServerVersion::V1_2,
            _ => ServerVersion::V1_3,
        })
    }

    /// What the adapter does differently on this version.
    pub(crate) fn behaviour(self) -> Behaviour {
        match self {
            ServerVersion::V1_1 => Behaviour {
                version: self,
                create_fields: CREATE_FIELDS,
                snapshot_fields: &["name"],
                direct_execd_by_default: false,
                rootfs_only_snapshots: false,
            },
            ServerVersion::V1_2 => Behaviour {
                version: self,
                create_fields: CREATE_FIELDS,
                snapshot_fields: &["name"],
                direct_execd_by_default: false,
                rootfs_only_snapshots: false,
            },
            ServerVersion::V1_3 => Behaviour {
                version: self,
                create_fields: CREATE_FIELDS,
                snapshot_fields: &["name", "mode"],
                direct_execd_by_default: true,
                rootfs_only_snapshots: true,
            },
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            ServerVersion::V1_1 => "1.1",
            ServerVersion::V1_2 => "1.2",
            ServerVersion::V1_3 => "1.3",
        }
    }
}

/// `CreateSandboxRequest`'s fields in server 1.1.1's own OpenAPI document; the 1.2 and 1.3
/// release notes add fields the adapter does not send and remove none.
const CREATE_FIELDS: &[&str] = &[
    "image",
    "snapshotId",
    "templateId",
    "platform",
    "timeout",
    "resourceLimits",
    "resourceRequests",
    "env",
    "metadata",
    "lifecycle",
    "entrypoint",
    "networkPolicy",
    "credentialProxy",
    "secureAccess",
    "volumes",
    "extensions",
];

/// One row of the version table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behaviour {
    pub version: ServerVersion,
    /// Top-level fields `POST /sandboxes` accepts (1.2+ refuse any other with 422).
    pub create_fields: &'static [&'static str],
    /// Fields `POST /sandboxes/{id}/snapshots` accepts.
    pub snapshot_fields: &'static [&'static str],
    /// Without `useServerProxy`, reach execd directly (1.3: the proxy is in maintenance mode
    /// and the direct endpoint carries the sandbox's own access token).
    pub direct_execd_by_default: bool,
    /// `mode: "rootfsOnly"` snapshots (Fast Sandbox runtimes).
    pub rootfs_only_snapshots: bool,
}

/// Checks that `body` (a JSON object) has only fields in `known`, so a server that refuses
/// unknown fields is never sent one: a field the version lacks is a permanent error naming
/// it, raised before anything is sent.
pub(crate) fn audit(
    body: &serde_json::Value,
    known: &[&str],
    what: &str,
    version: ServerVersion,
) -> Result<(), AdapterError> {
    let Some(map) = body.as_object() else {
        return Ok(());
    };
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(field) => Err(AdapterError::permanent(format!(
            "{what}: OpenSandbox {} does not know the field `{field}`; not sent",
            version.label()
        ))),
    }
}

#[derive(Debug, Deserialize)]
struct VersionAnswer {
    version: String,
}

/// The version, asked once and kept until [`Detector::forget`].
#[derive(Debug, Default)]
pub(crate) struct Detector {
    known: Mutex<Option<ServerVersion>>,
    /// The version string the server last gave, for operators (kept across `forget`: it is
    /// still the last one seen); `None` before the first answer or when it gave none.
    said: Mutex<Option<String>>,
}

impl Detector {
    /// The server's version: the kept answer, or `GET /version` now. A server that answers
    /// without a version (an older one, a proxy in front) is taken for 1.1; one that cannot
    /// be asked (down, timing out) too, but is asked again on the next call.
    pub(crate) async fn get(&self, c: &Client, api_url: &str) -> ServerVersion {
        if let Some(v) = *self.known.lock().unwrap_or_else(|p| p.into_inner()) {
            return v;
        }
        match ask(c, api_url).await {
            Ok((v, said)) => {
                tracing::debug!(version = v.label(), "OpenSandbox server version");
                *self.known.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
                *self.said.lock().unwrap_or_else(|p| p.into_inner()) = Some(said);
                v
            }
            Err(e) => {
                tracing::debug!(error = %e, "OpenSandbox /version unanswered; assuming 1.1");
                if !e.is_retryable() {
                    *self.said.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    *self.known.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(ServerVersion::V1_1);
                }
                ServerVersion::V1_1
            }
        }
    }

    /// The version string the server last gave (`1.1.1`), if it gave one.
    pub(crate) fn said(&self) -> Option<String> {
        self.said.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Drops the kept answer, so the next call asks again.
    pub(crate) fn forget(&self) {
        *self.known.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Forgets the version after an error that suggests it changed: the server unreachable
    /// (restarted, maybe upgraded) or a body field refused.
    pub(crate) fn note(&self, e: &AdapterError) {
        let refused_field = matches!(e, AdapterError::Permanent(r)
            if r.to_string().contains("Extra inputs are not permitted"));
        if matches!(e, AdapterError::Unavailable(_)) || refused_field {
            self.forget();
        }
    }
}

/// `GET /version` beside the API root: `apiURL` without its trailing `/v1`.
pub(crate) fn version_url(api_url: &str) -> String {
    let root = api_url.trim_end_matches('/');
    let root = root.strip_suffix("/v1").unwrap_or(root);
    format!("{root}/version")
}

/// How far the adapter is verified against the server that said `said`: 1.1.1 ran live
/// here on the Docker runtime (other runtimes only against the fake); 1.2.x and 1.3.0 only
/// against the fake's version switch; anything else never ran.
pub(crate) fn verification(said: Option<&str>, docker: bool) -> Verification {
    let Some(said) = said else {
        return Verification::new(
            VerifiedStatus::Unknown,
            "server version not detected yet (asked at the first call); \
             1.1.1 is verified live, 1.2.x and 1.3.0 against a spec-faithful fake",
        );
    };
    let bare = said.trim().trim_start_matches('v');
    let numbers: Vec<u32> = bare
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map_while(|n| n.parse().ok())
        .collect();
    let prerelease = bare.contains(|c: char| c.is_ascii_alphabetic());
    match numbers.as_slice() {
        [1, 1, 1] if !prerelease && !docker => Verification::new(
            VerifiedStatus::FakeOnly,
            "OpenSandbox 1.1.1: run live on the Docker runtime only; this pool's runtime \
             only against the fake",
        ),
        [1, 1, 1] if !prerelease => Verification::new(
            VerifiedStatus::Live,
            "OpenSandbox 1.1.1 on its Docker runtime: adapter and end-to-end tests run live, \
             and the fake is replayed against exchanges recorded from it",
        ),
        [1, 2, _] | [1, 3, 0] => Verification::new(
            VerifiedStatus::FakeOnly,
            format!(
                "OpenSandbox {said}: tested against the fake's version switch, \
                 written from the 1.2/1.3 release notes; not run live"
            ),
        ),
        _ => Verification::new(
            VerifiedStatus::Unknown,
            format!(
                "OpenSandbox {said}: never checked; treated as {}",
                ServerVersion::parse(said)
                    .unwrap_or(ServerVersion::V1_1)
                    .label()
            ),
        ),
    }
}

async fn ask(c: &Client, api_url: &str) -> Result<(ServerVersion, String), AdapterError> {
    let op = "get server version";
    let rb = c
        .to(Method::GET, &version_url(api_url))
        .timeout(c.request_timeout());
    let answer: VersionAnswer = c.json(rb, op).await?;
    let v = ServerVersion::parse(&answer.version).ok_or_else(|| {
        AdapterError::permanent(format!("{op}: unreadable version {:?}", answer.version))
    })?;
    Ok((v, answer.version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_their_line() {
        assert_eq!(ServerVersion::parse("1.1.1"), Some(ServerVersion::V1_1));
        assert_eq!(ServerVersion::parse("0.1.14"), Some(ServerVersion::V1_1));
        assert_eq!(
            ServerVersion::parse("1.2.1-rc.2"),
            Some(ServerVersion::V1_2)
        );
        assert_eq!(ServerVersion::parse("v1.2.0"), Some(ServerVersion::V1_2));
        assert_eq!(ServerVersion::parse("1.3.0rc4"), Some(ServerVersion::V1_3));
        assert_eq!(ServerVersion::parse("2.0.0"), Some(ServerVersion::V1_3));
        assert_eq!(ServerVersion::parse("dev"), None);
    }

    #[test]
    fn only_1_1_1_is_live_and_the_fake_versions_are_fake_only() {
        let status = |s: Option<&str>| verification(s, true).status;
        assert_eq!(status(Some("1.1.1")), VerifiedStatus::Live);
        assert_eq!(status(Some("v1.1.1")), VerifiedStatus::Live);
        assert_eq!(status(Some("1.2.0")), VerifiedStatus::FakeOnly);
        assert_eq!(status(Some("1.2.1-rc.2")), VerifiedStatus::FakeOnly);
        assert_eq!(status(Some("1.3.0")), VerifiedStatus::FakeOnly);
        assert_eq!(status(Some("1.1.1rc1")), VerifiedStatus::Unknown);
        assert_eq!(status(Some("1.1.0")), VerifiedStatus::Unknown);
        assert_eq!(status(Some("1.4.0")), VerifiedStatus::Unknown);
        assert_eq!(status(None), VerifiedStatus::Unknown);
        assert!(verification(Some("1.4.0"), true)
            .basis
            .contains("treated as 1.3"));
        assert_eq!(
            verification(Some("1.1.1"), false).status,
            VerifiedStatus::FakeOnly
        );
    }

    #[test]
    fn the_version_route_is_beside_v1() {
        assert_eq!(version_url("http://h:8090/v1"), "http://h:8090/version");
        assert_eq!(version_url("http://h:8090/v1/"), "http://h:8090/version");
        assert_eq!(version_url("http://h/osb/v1"), "http://h/osb/version");
        assert_eq!(version_url("http://h:8090"), "http://h:8090/version");
    }

    #[test]
    fn a_field_the_version_lacks_is_named_and_not_sent() {
        let body = serde_json::json!({"name": "s1", "mode": "rootfsOnly"});
        let b = ServerVersion::V1_2.behaviour();
        let e = audit(&body, b.snapshot_fields, "create snapshot", b.version).unwrap_err();
        assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
        assert!(e.to_string().contains("`mode`"), "{e}");
        let b = ServerVersion::V1_3.behaviour();
        audit(&body, b.snapshot_fields, "create snapshot", b.version).unwrap();
    }
}
