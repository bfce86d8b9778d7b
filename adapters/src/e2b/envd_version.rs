//! The envd version matrix. envd has no handshake: create, connect and get answer its version
//! (`envdVersion`) and a client gates features on it, as E2B's SDKs do. This table says which
//! versions this adapter accepts and what it can do with each; `docs/providers.md` prints it.

use crate::AdapterError;

/// Oldest envd accepted at all (E2B's SDKs kill a sandbox below it: "update the template").
pub const OLDEST: Version = Version(0, 1, 0);
/// Newest envd line whose behaviour this table describes; later `0.x` releases are accepted
/// as this one (envd adds features behind new versions, it has not removed any).
pub const NEWEST_KNOWN: Version = Version(0, 6, 13);

/// A `major.minor.patch` envd version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// One row of the matrix: from `since` on, `change` holds.
pub struct Row {
    pub since: Version,
    pub change: &'static str,
    /// What the adapter does below `since`.
    pub below: &'static str,
}

/// Every envd change a client sees (E2B's SDKs, Python 2.63 / JS 2.51), and what this adapter
/// does about each.
pub const MATRIX: &[Row] = &[
    Row {
        since: Version(0, 1, 0),
        change: "the process and filesystem services as spoken here",
        below: "refused at create, connect and first use",
    },
    Row {
        since: Version(0, 1, 4),
        change: "recursive directory watches",
        below: "nothing: the adapter does not watch",
    },
    Row {
        since: Version(0, 1, 5),
        change: "sandbox metrics",
        below: "nothing: the adapter reads no metrics",
    },
    Row {
        since: Version(0, 3, 0),
        change: "`stdin: false` closes a command's stdin at start",
        below:
            "exec without stdin is refused (a command reading stdin would hang until its timeout)",
    },
    Row {
        since: Version(0, 4, 0),
        change: "no default user: every call names one",
        below: "nothing: the adapter always names `user` (Authorization: Basic)",
    },
    Row {
        since: Version(0, 5, 2),
        change: "`CloseStdin`",
        below: "exec with stdin is refused",
    },
    Row {
        since: Version(0, 5, 7),
        change: "`application/octet-stream` uploads",
        below: "upload is refused",
    },
    Row {
        since: Version(0, 6, 2),
        change: "file metadata",
        below: "nothing: the adapter sets none",
    },
    Row {
        since: Version(0, 6, 3),
        change: "watch `include_entry`",
        below: "nothing",
    },
    Row {
        since: Version(0, 6, 4),
        change: "watch `allow_network_mounts`",
        below: "nothing",
    },
];

impl Version {
    /// Parses `0.2.4` (a `-suffix` or `+build` after the patch is ignored).
    pub fn parse(s: &str) -> Option<Version> {
        let core = s.trim().trim_start_matches('v');
        let core = core.split(['-', '+']).next().unwrap_or(core);
        let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
        let v = Version(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(v)
    }

    /// The version an answer gave, if this adapter can use it: an error naming it otherwise.
    /// An answer without one (a backend that leaves it out) is taken as [`NEWEST_KNOWN`].
    pub fn accept(answer: Option<&str>) -> Result<Version, AdapterError> {
        let Some(raw) = answer.map(str::trim).filter(|s| !s.is_empty()) else {
            return Ok(NEWEST_KNOWN);
        };
        match Version::parse(raw) {
            None => Err(AdapterError::permanent(format!(
                "envd version `{raw}` is not a version; this adapter knows envd {OLDEST} to {NEWEST_KNOWN}.x"
            ))),
            Some(v) if v < OLDEST => Err(AdapterError::permanent(format!(
                "envd {v} is older than {OLDEST}, the oldest this adapter speaks to; rebuild the template on a newer envd"
            ))),
            Some(v) if v.0 > NEWEST_KNOWN.0 => Err(AdapterError::permanent(format!(
                "envd {v} is a major version this adapter does not know (it knows {OLDEST} to {NEWEST_KNOWN}.x)"
            ))),
            Some(v) => Ok(v),
        }
    }

    /// Whether exec with these stdin needs is possible; an `Unsupported` naming the version
    /// otherwise.
    pub fn check_exec(self, with_stdin: bool) -> Result<(), AdapterError> {
        if with_stdin {
            self.need(Version(0, 5, 2), "exec with stdin")
        } else {
            self.need(Version(0, 3, 0), "exec without stdin")
        }
    }

    /// Whether streamed uploads are possible.
    pub fn check_upload(self) -> Result<(), AdapterError> {
        self.need(Version(0, 5, 7), "upload")
    }

    fn need(self, since: Version, what: &str) -> Result<(), AdapterError> {
        if self >= since {
            Ok(())
        } else {
            Err(AdapterError::Unsupported(format!(
                "{what} needs envd {since} or newer; this sandbox runs envd {self}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("0.2.4"), Some(Version(0, 2, 4)));
        assert_eq!(Version::parse("v0.6.13-rc1"), Some(Version(0, 6, 13)));
        assert_eq!(Version::parse("dev"), None);
        assert_eq!(Version::parse("0.2"), None);
        assert_eq!(Version::parse("0.2.4.1"), None);
        assert!(Version(0, 5, 7) > Version(0, 5, 2));
        assert!(MATRIX.windows(2).all(|w| w[0].since < w[1].since));
    }

    #[test]
    fn the_matrix_gates_what_the_adapter_uses() {
        assert!(Version::accept(Some("0.0.9")).is_err());
        assert!(Version::accept(Some("dev")).is_err());
        assert!(Version::accept(Some("1.0.0")).is_err());
        assert_eq!(Version::accept(None).ok(), Some(NEWEST_KNOWN));
        assert_eq!(Version::accept(Some("0.9.1")).ok(), Some(Version(0, 9, 1)));
        let old = Version(0, 2, 4);
        assert!(matches!(
            old.check_exec(false),
            Err(AdapterError::Unsupported(_))
        ));
        let mid = Version(0, 5, 2);
        assert!(mid.check_exec(true).is_ok() && mid.check_upload().is_err());
        assert!(Version(0, 5, 7).check_upload().is_ok());
    }
}
