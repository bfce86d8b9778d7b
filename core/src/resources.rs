//! Compute resources of a sandbox and their bounds.

use serde::{Deserialize, Serialize};

use crate::FieldError;

/// CPU, memory and disk a sandbox asks for. Bounds follow the seeds: 1–256 CPU,
/// 128 MiB–1 TiB memory, 0–16384 GiB disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    pub cpu: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    #[serde(rename = "diskGiB")]
    pub disk_gib: u64,
}

impl Resources {
    /// What a sandbox gets when it asks for nothing.
    pub const DEFAULT: Resources = Resources {
        cpu: 1,
        memory_mib: 1024,
        disk_gib: 5,
    };
    pub const MAX_CPU: u32 = 256;
    pub const MIN_MEMORY_MIB: u64 = 128;
    pub const MAX_MEMORY_MIB: u64 = 1024 * 1024;
    pub const MAX_DISK_GIB: u64 = 16384;

    /// Checks the bounds; `field` is the JSON path prefix used in the error.
    pub fn validate(&self, field: &str) -> Result<(), FieldError> {
        if self.cpu < 1 || self.cpu > Self::MAX_CPU {
            return Err(FieldError::new(
                format!("{field}.cpu"),
                format!("must be between 1 and {}", Self::MAX_CPU),
            ));
        }
        if self.memory_mib < Self::MIN_MEMORY_MIB || self.memory_mib > Self::MAX_MEMORY_MIB {
            return Err(FieldError::new(
                format!("{field}.memoryMiB"),
                format!(
                    "must be between {} and {}",
                    Self::MIN_MEMORY_MIB,
                    Self::MAX_MEMORY_MIB
                ),
            ));
        }
        if self.disk_gib > Self::MAX_DISK_GIB {
            return Err(FieldError::new(
                format!("{field}.diskGiB"),
                format!("must be between 0 and {}", Self::MAX_DISK_GIB),
            ));
        }
        Ok(())
    }
}

/// Resources with every field optional, as a request may give them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourcesRequest {
    pub cpu: Option<u32>,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    #[serde(rename = "diskGiB")]
    pub disk_gib: Option<u64>,
}

impl ResourcesRequest {
    /// Fills the gaps from `base`.
    pub fn resolve(&self, base: Resources) -> Resources {
        Resources {
            cpu: self.cpu.unwrap_or(base.cpu),
            memory_mib: self.memory_mib.unwrap_or(base.memory_mib),
            disk_gib: self.disk_gib.unwrap_or(base.disk_gib),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_field() {
        assert!(Resources::DEFAULT.validate("resources").is_ok());
        let e = Resources {
            cpu: 0,
            ..Resources::DEFAULT
        }
        .validate("resources")
        .unwrap_err();
        assert_eq!(e.field, "resources.cpu");
        let e = Resources {
            memory_mib: 64,
            ..Resources::DEFAULT
        }
        .validate("resources")
        .unwrap_err();
        assert_eq!(e.field, "resources.memoryMiB");
        let e = Resources {
            disk_gib: 20000,
            ..Resources::DEFAULT
        }
        .validate("resources")
        .unwrap_err();
        assert_eq!(e.field, "resources.diskGiB");
    }
}
