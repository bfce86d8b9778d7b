//! The capability vocabulary: every name a request may require and a pool may advertise,
//! defined once. A request naming anything else is refused (422) before placement.
//!
//! Two of today's API names (`lifecycle.pause`, `snapshots`) predate the seeds' names
//! (`lifecycle.pause-resume`, `snapshots.disk`); each is kept as an alias, so a pool
//! advertising either spelling satisfies a request for either.

use crate::pool::PoolView;

/// One capability name and what a pool advertising it promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    /// The name as it appears in requests and pool features.
    pub name: &'static str,
    /// What it means, for documentation and error messages.
    pub meaning: &'static str,
    /// For an alias, the name it stands for.
    pub same_as: Option<&'static str>,
}

const fn cap(name: &'static str, meaning: &'static str) -> Capability {
    Capability {
        name,
        meaning,
        same_as: None,
    }
}

const fn alias(name: &'static str, same_as: &'static str) -> Capability {
    Capability {
        name,
        meaning: "alias",
        same_as: Some(same_as),
    }
}

/// Every known capability name. Includes all of [`crate::sandbox::KNOWN_CAPABILITIES`].
pub const CAPABILITIES: [Capability; 17] = [
    cap("exec", "run a command and get its output and exit code"),
    cap("exec.stream", "stream a command's output while it runs"),
    cap(
        "exec.pty",
        "run a program on an interactive terminal (WebSocket)",
    ),
    cap(
        "exec.stdin",
        "feed a running command's stdin at any time (background processes)",
    ),
    cap("files", "upload, download and list files"),
    cap(
        "lifecycle.pause-resume",
        "pause a running sandbox with its memory kept, and resume it",
    ),
    alias("lifecycle.pause", "lifecycle.pause-resume"),
    cap(
        "lifecycle.stop",
        "stop a sandbox with its disk kept, and start it again",
    ),
    cap(
        "snapshots.disk",
        "snapshot the disk and restore or fork from it",
    ),
    alias("snapshots", "snapshots.disk"),
    cap(
        "snapshots.memory",
        "snapshot memory and processes as well as the disk",
    ),
    cap("fork", "create a new sandbox from another one's snapshot"),
    cap("ports.expose", "serve a sandbox port at a URL"),
    cap(
        "network.egress-control",
        "the pool enforces an outbound network policy",
    ),
    cap(
        "isolation.container",
        "at least container isolation (a microVM pool also satisfies it)",
    ),
    cap("isolation.microvm", "each sandbox runs in its own microVM"),
    cap("gpu", "a GPU is attached"),
];

/// Whether `name` is in the vocabulary.
pub fn is_known(name: &str) -> bool {
    CAPABILITIES.iter().any(|c| c.name == name)
}

/// The canonical spelling of `name` (aliases resolved; unknown names unchanged).
pub fn canonical(name: &str) -> &str {
    CAPABILITIES
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.same_as)
        .unwrap_or(name)
}

/// The names in `names` that the vocabulary does not know, in input order.
pub fn unknown(names: &[String]) -> Vec<&str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|n| !is_known(n))
        .collect()
}

/// Whether a pool offers `required`: advertised under either spelling, or (for
/// `isolation.*`) implied by the pool's declared isolation. Unknown names are never offered.
pub fn offers(pool: &PoolView, isolation: Option<super::Isolation>, required: &str) -> bool {
    use super::Isolation;
    if !is_known(required) {
        return false;
    }
    let want = canonical(required);
    let declared = match isolation {
        Some(Isolation::Microvm) => &["isolation.microvm", "isolation.container"][..],
        Some(Isolation::Container) => &["isolation.container"][..],
        None => &[][..],
    };
    if declared.contains(&want) {
        return true;
    }
    if want == "isolation.container" && pool.capabilities.iter().any(|c| c == "isolation.microvm") {
        return true;
    }
    pool.capabilities.iter().any(|c| canonical(c) == want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::KNOWN_CAPABILITIES;

    #[test]
    fn vocabulary_covers_todays_names_and_the_seeds_names() {
        for n in KNOWN_CAPABILITIES {
            assert!(is_known(n), "{n}");
        }
        for n in [
            "lifecycle.pause-resume",
            "snapshots.disk",
            "isolation.microvm",
            "network.egress-control",
        ] {
            assert!(is_known(n), "{n}");
        }
        assert!(!is_known("teleport"));
    }

    #[test]
    fn aliases_point_at_known_canonical_names() {
        for c in CAPABILITIES {
            if let Some(target) = c.same_as {
                assert!(
                    is_known(target) && canonical(target) == target,
                    "{}",
                    c.name
                );
            }
        }
        let mut names: Vec<_> = CAPABILITIES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CAPABILITIES.len(), "duplicate names");
    }
}
