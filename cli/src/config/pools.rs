//! `[[pools]]`: the pools the file declares, and their warm classes read in the file's style.

use differently_core::pool::Trust;
use differently_core::warm::{WarmClass, WarmClasses};
use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[[pools]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    pub name: String,
    pub kind: String,
    pub trust: Option<Trust>,
    pub region: Option<String>,
    pub max_concurrent: Option<u32>,
    /// Declared isolation of the backend runtime (`container` | `microvm`), reported only.
    pub isolation: Option<differently_core::policy::Isolation>,
    /// Cost model: currency units per CPU-hour (ranking by `cheapest`).
    pub cost_per_cpu_hour: Option<f64>,
    /// Speed hint: typical seconds from create to running (ranking by `fastest`).
    pub typical_create_seconds: Option<f64>,
    /// Adapter-specific settings.
    #[serde(default)]
    pub settings: Option<toml::Value>,
    /// Warm classes (`warm = [{ name = "py", size = 2, refill_per_second = 1 }]`); declared,
    /// they replace the pool's stored classes at every start. Absent: the stored classes
    /// (set through the admin API) are left as they are.
    pub warm: Option<Vec<WarmSection>>,
}

/// One warm class of a `[[pools]]` entry: `core::warm::WarmClass` in the file's
/// snake_case.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmSection {
    pub name: String,
    pub size: u32,
    pub max_size: Option<u32>,
    pub refill_per_second: f64,
    pub max_age_seconds: Option<u64>,
    pub template: Option<String>,
    pub resources: Option<WarmResources>,
}

/// A warm class's resources, all three given (a class fixes them whole).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmResources {
    pub cpu: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
}

impl PoolSection {
    /// The declared warm classes as the store keeps them, validated; `None` if the pool
    /// declares none. Errors name the file's field (`pools[0].warm[1].refill_per_second`)
    /// under `at` (`pools[0]`).
    pub fn warm_classes(&self, at: &str) -> Result<Option<WarmClasses>, ConfigError> {
        let Some(warm) = &self.warm else {
            return Ok(None);
        };
        let classes = WarmClasses {
            classes: warm
                .iter()
                .map(|w| WarmClass {
                    name: w.name.clone(),
                    size: w.size,
                    max_size: w.max_size,
                    refill_per_second: w.refill_per_second,
                    max_age_seconds: w
                        .max_age_seconds
                        .unwrap_or(differently_core::warm::DEFAULT_MAX_AGE_SECONDS),
                    template: w.template.clone(),
                    resources: w.resources.map(|r| differently_core::Resources {
                        cpu: r.cpu,
                        memory_mib: r.memory_mib,
                        disk_gib: r.disk_gib,
                    }),
                })
                .collect(),
        };
        classes.validate().map_err(|e| {
            invalid(
                warm_field_in_config(at, &e.field),
                format!("pool {:?}: {}", self.name, e.message),
            )
        })?;
        Ok(Some(classes))
    }
}

/// A warm-class field path as the store names it (`classes[1].refillPerSecond`) as the file
/// names it (`pools[0].warm[1].refill_per_second`).
fn warm_field_in_config(at: &str, field: &str) -> String {
    let rest = field.strip_prefix("classes").unwrap_or(field);
    let rest = [
        ("maxSize", "max_size"),
        ("refillPerSecond", "refill_per_second"),
        ("maxAgeSeconds", "max_age_seconds"),
        ("memoryMiB", "memory_mib"),
        ("diskGiB", "disk_gib"),
    ]
    .iter()
    .fold(rest.to_owned(), |f, (api, file)| f.replace(api, file));
    format!("{at}.warm{rest}")
}
