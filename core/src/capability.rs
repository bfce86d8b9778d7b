//! What an adapter can say it does, typed: one enum whose wire names are the strings the API
//! accepts in `capabilities` and shows in pool documents. Adapters advertise these values and
//! callers test for them by value, so a misspelt name is a compile error rather than a
//! capability that silently never matches. The policy's wider vocabulary (aliases, isolation
//! levels) lives in [`crate::policy::capabilities`]; every name here is in it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One capability an adapter may implement. Declared in the order pool documents list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Capability {
    /// Run a command to completion.
    #[serde(rename = "exec")]
    Exec,
    /// Upload, download, list and delete files.
    #[serde(rename = "files")]
    Files,
    /// Stream a command's output while it runs.
    #[serde(rename = "exec.stream")]
    ExecStream,
    /// Run a program on an interactive terminal.
    #[serde(rename = "exec.pty")]
    ExecPty,
    /// Feed a running command's stdin at any time and close it (processes started with
    /// `stdin: true`), without a terminal.
    #[serde(rename = "exec.stdin")]
    ExecStdin,
    /// Pause with memory kept, and resume.
    #[serde(rename = "lifecycle.pause")]
    LifecyclePause,
    /// Stop with disk kept, and start again.
    #[serde(rename = "lifecycle.stop")]
    LifecycleStop,
    /// Snapshot the sandbox and restore from it.
    #[serde(rename = "snapshots")]
    Snapshots,
    /// Serve a sandbox port at a URL.
    #[serde(rename = "ports.expose")]
    PortsExpose,
    /// The pool enforces an outbound network policy.
    #[serde(rename = "network.egress-control")]
    NetworkEgressControl,
    /// A GPU is attached.
    #[serde(rename = "gpu")]
    Gpu,
    /// The pool can hold warm instances created ahead of time. About the pool, not the
    /// sandbox, so a create request may not ask for it (it is not [`Capability::REQUESTABLE`]).
    #[serde(rename = "warm")]
    Warm,
}

impl Capability {
    /// Every capability, in declaration order.
    pub const ALL: [Capability; 12] = [
        Capability::Exec,
        Capability::Files,
        Capability::ExecStream,
        Capability::ExecPty,
        Capability::ExecStdin,
        Capability::LifecyclePause,
        Capability::LifecycleStop,
        Capability::Snapshots,
        Capability::PortsExpose,
        Capability::NetworkEgressControl,
        Capability::Gpu,
        Capability::Warm,
    ];

    /// Those a create request may require (all but [`Capability::Warm`]).
    pub const REQUESTABLE: [Capability; 11] = [
        Capability::Exec,
        Capability::Files,
        Capability::ExecStream,
        Capability::ExecPty,
        Capability::ExecStdin,
        Capability::LifecyclePause,
        Capability::LifecycleStop,
        Capability::Snapshots,
        Capability::PortsExpose,
        Capability::NetworkEgressControl,
        Capability::Gpu,
    ];

    /// The wire name (`exec.stream`), as serde writes it.
    pub const fn name(self) -> &'static str {
        match self {
            Capability::Exec => "exec",
            Capability::Files => "files",
            Capability::ExecStream => "exec.stream",
            Capability::ExecPty => "exec.pty",
            Capability::ExecStdin => "exec.stdin",
            Capability::LifecyclePause => "lifecycle.pause",
            Capability::LifecycleStop => "lifecycle.stop",
            Capability::Snapshots => "snapshots",
            Capability::PortsExpose => "ports.expose",
            Capability::NetworkEgressControl => "network.egress-control",
            Capability::Gpu => "gpu",
            Capability::Warm => "warm",
        }
    }

    /// The capability of a wire name; `None` for a name this build does not know.
    pub fn parse(name: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The wire names of `caps`, in declaration order, each once: what pool documents and
/// health rows carry.
pub fn names(caps: &[Capability]) -> Vec<String> {
    let mut sorted = caps.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    sorted.into_iter().map(|c| c.name().to_owned()).collect()
}

/// The wire names of `caps`, as a const array (for tables such as the API's known names).
pub const fn names_of<const N: usize>(caps: [Capability; N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = caps[i].name();
        i += 1;
    }
    out
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Compares with a wire name, for code holding names as the API carries them (a request's
/// `capabilities`, a plugin's declaration).
impl PartialEq<str> for Capability {
    fn eq(&self, other: &str) -> bool {
        self.name() == other
    }
}

impl PartialEq<&str> for Capability {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

impl PartialEq<String> for Capability {
    fn eq(&self, other: &String) -> bool {
        self.name() == other
    }
}

/// A name that is not a [`Capability`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown capability `{0}`")]
pub struct UnknownCapability(pub String);

impl FromStr for Capability {
    type Err = UnknownCapability;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Capability::parse(s).ok_or_else(|| UnknownCapability(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::capabilities::is_known;

    #[test]
    fn wire_names_are_serdes_and_round_trip() {
        for c in Capability::ALL {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.name()));
            assert_eq!(serde_json::from_str::<Capability>(&json).unwrap(), c);
            assert_eq!(c.name().parse::<Capability>(), Ok(c));
            assert_eq!(c.to_string(), c.name());
        }
        assert_eq!(
            "teleport".parse::<Capability>(),
            Err(UnknownCapability("teleport".into()))
        );
    }

    #[test]
    fn requestable_ones_are_in_the_policy_vocabulary_and_warm_is_not() {
        for c in Capability::REQUESTABLE {
            assert!(is_known(c.name()), "{c}");
        }
        assert_eq!(
            names_of(Capability::REQUESTABLE),
            crate::sandbox::KNOWN_CAPABILITIES
        );
        assert!(!Capability::REQUESTABLE.contains(&Capability::Warm));
        assert!(!is_known(Capability::Warm.name()));
        let all_but_warm: Vec<_> = Capability::ALL
            .into_iter()
            .filter(|c| *c != Capability::Warm)
            .collect();
        assert_eq!(all_but_warm, Capability::REQUESTABLE);
    }

    #[test]
    fn names_are_ordered_and_unique() {
        let caps = [
            Capability::Warm,
            Capability::Exec,
            Capability::Snapshots,
            Capability::Exec,
        ];
        assert_eq!(names(&caps), ["exec", "snapshots", "warm"]);
        assert_eq!(
            names_of([Capability::Gpu, Capability::Files]),
            ["gpu", "files"]
        );
        assert!(Capability::ExecStream == "exec.stream" && Capability::Exec != "exec.stream");
    }
}
