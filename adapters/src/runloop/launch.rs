//! A sandbox's resources as Runloop's launch parameters. Runloop takes a named size or a
//! custom one on a grid (CPU 1 or even up to 16, memory 1 or even up to 64 GiB, a cpu:memory
//! ratio between 1:2 and 1:8, disk even from 2 to 64 GiB): a request is rounded up onto the
//! grid, never down, and one the grid cannot hold is refused before any call.

use differently_core::Resources;

use super::api::LaunchParameters;
use super::config::Settings;
use crate::AdapterError;

/// `n` rounded up to 1 or an even number.
fn one_or_even(n: u64) -> u64 {
    match n {
        0 | 1 => 1,
        n => n + n % 2,
    }
}

fn too_big(what: &str, max: &str) -> AdapterError {
    AdapterError::invalid_field(
        "resources",
        format!("Runloop devboxes have at most {max} {what}"),
    )
}

/// The launch parameters of a devbox for `r` under `s`.
pub(crate) fn parameters(s: &Settings, r: &Resources) -> Result<LaunchParameters, AdapterError> {
    let mut lp = LaunchParameters {
        keep_alive_time_seconds: s.keep_alive_seconds,
        architecture: s.architecture.clone(),
        network_policy_id: s.network_policy_id.clone(),
        ..LaunchParameters::default()
    };
    if let Some(size) = &s.resource_size {
        lp.resource_size_request = size.clone();
        return Ok(lp);
    }
    let mut cpu = one_or_even(u64::from(r.cpu));
    let mut mem = one_or_even(r.memory_mib.div_ceil(1024));
    if mem < 2 * cpu {
        mem = 2 * cpu;
    }
    if mem > 8 * cpu {
        cpu = one_or_even(mem.div_ceil(8));
    }
    if cpu > 16 {
        return Err(too_big("CPUs", "16"));
    }
    if mem > 64 {
        return Err(too_big("of memory", "64 GiB"));
    }
    let disk = match r.disk_gib {
        0 => None,
        d => Some((d + d % 2).max(2)),
    };
    if disk.is_some_and(|d| d > 64) {
        return Err(too_big("of disk", "64 GiB"));
    }
    lp.resource_size_request = "CUSTOM_SIZE".to_owned();
    lp.custom_cpu_cores = u32::try_from(cpu).ok();
    lp.custom_gb_memory = Some(mem);
    lp.custom_disk_size = disk;
    Ok(lp)
}

#[cfg(test)]
mod tests {
    use super::super::config::RunloopConfig;
    use super::*;

    fn settings(size: Option<&str>) -> Settings {
        RunloopConfig {
            api_key_secret: Some("k".into()),
            resource_size: size.map(str::to_owned),
            ..Default::default()
        }
        .validate()
        .unwrap()
    }

    fn custom(cpu: u32, memory_mib: u64, disk_gib: u64) -> (Option<u32>, Option<u64>, Option<u64>) {
        let lp = parameters(
            &settings(None),
            &Resources {
                cpu,
                memory_mib,
                disk_gib,
            },
        )
        .unwrap();
        assert_eq!(lp.resource_size_request, "CUSTOM_SIZE");
        (
            lp.custom_cpu_cores,
            lp.custom_gb_memory,
            lp.custom_disk_size,
        )
    }

    #[test]
    fn requests_round_up_onto_the_grid() {
        assert_eq!(custom(1, 1024, 5), (Some(1), Some(2), Some(6)));
        assert_eq!(custom(3, 4096, 10), (Some(4), Some(8), Some(10)));
        assert_eq!(custom(1, 20 * 1024, 1), (Some(4), Some(20), Some(2)));
        assert_eq!(custom(2, 3000, 0), (Some(2), Some(4), None));
        let big = Resources {
            cpu: 32,
            memory_mib: 65536,
            disk_gib: 10,
        };
        let e = parameters(&settings(None), &big).unwrap_err();
        assert!(e.to_string().contains("16 CPUs"), "{e}");
        let named = parameters(&settings(Some("LARGE")), &big).unwrap();
        assert_eq!(
            (named.resource_size_request.as_str(), named.custom_cpu_cores),
            ("LARGE", None)
        );
    }
}
