//! Prefixed ULID identifiers (`sbx_01J…`). Time-sortable, so ID order is admission order.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a valid identifier of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected an id of the form {prefix}_<ulid>")]
pub struct IdParseError {
    /// The prefix the caller expected, e.g. `sbx`.
    pub prefix: &'static str,
}

/// One monotonic generator per process, so ids made in the same millisecond still sort in
/// creation order (placement takes "older first" from id order).
static GENERATOR: Mutex<ulid::Generator> = Mutex::new(ulid::Generator::new());

fn next_ulid() -> ulid::Ulid {
    let mut g = match GENERATOR.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    };
    g.generate().unwrap_or_else(|_| ulid::Ulid::new())
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The prefix every id of this kind starts with.
            pub const PREFIX: &'static str = $prefix;

            /// A fresh, time-sortable id.
            pub fn new() -> Self {
                Self(format!("{}_{}", $prefix, next_ulid()))
            }

            /// Parses and validates an id received from outside.
            pub fn parse(s: &str) -> Result<Self, IdParseError> {
                let err = IdParseError { prefix: $prefix };
                let rest = s.strip_prefix(concat!($prefix, "_")).ok_or(err.clone())?;
                ulid::Ulid::from_string(rest).map_err(|_| err)?;
                Ok(Self(s.to_owned()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdParseError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }

        /// A string of exactly what [`Self::parse`] accepts (inlined where used: an id is
        /// not a component of its own in the OpenAPI document).
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some(id_pattern($prefix)))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

/// The pattern of an id with `prefix`: a ULID (26 characters of Crockford base 32, either
/// case), exactly what `parse` accepts.
pub fn id_pattern(prefix: &str) -> String {
    format!("^{prefix}_[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{{26}}$")
}

prefixed_id!(
    /// An organization: the unit of quota and fairness.
    OrgId, "org");
prefixed_id!(
    /// A project inside an organization; idempotency keys are scoped to it.
    ProjectId, "prj");
prefixed_id!(
    /// An API key's public part (`dly_<keyid>_<secret>`).
    KeyId, "key");
prefixed_id!(
    /// A sandbox; also the idempotency key for every backend call about it.
    SandboxId, "sbx");
prefixed_id!(
    /// A snapshot of a sandbox; restore and fork create from it.
    SnapshotId, "snp");
prefixed_id!(
    /// A lifecycle operation executed by a pool's workers (pause, snapshot, port …).
    OpId, "op");
prefixed_id!(
    /// This installation; backend instances are tagged with it so reconcilers leave others alone.
    InstallationId, "inst");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_kinds() {
        let id = SandboxId::new();
        assert!(id.as_str().starts_with("sbx_"));
        assert_eq!(SandboxId::parse(id.as_str()), Ok(id.clone()));
        assert!(OrgId::parse(id.as_str()).is_err());
        assert!(SandboxId::parse("sbx_notaulid").is_err());
        assert!(SandboxId::parse("").is_err());
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<SandboxId>(&json).unwrap(), id);
    }

    #[test]
    fn ids_sort_by_creation_even_within_a_millisecond() {
        let ids: Vec<SandboxId> = (0..1000).map(|_| SandboxId::new()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
    }
}
