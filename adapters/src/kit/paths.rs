//! Small things about names and paths that every HTTP provider gets wrong the same way if
//! each writes its own: a provider id put in a URL path, a sandbox path a command is given,
//! a sandbox id as a DNS-style name, and a unique token for temporary names.

use std::sync::atomic::{AtomicU64, Ordering};

use differently_core::SandboxId;

use crate::AdapterError;

/// A token unique to this process and moment (time, process id, counter): hex digits and
/// dashes, for temporary file names, multipart boundaries and session ids.
pub fn unique() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{t:x}-{:x}-{n:x}", std::process::id())
}

/// One URL path segment, percent-encoded (ids come from the provider; never trust them in a
/// path). Unreserved characters (RFC 3986 §2.3) stay as they are.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Refuses a sandbox path that is not absolute or carries a NUL, naming request field
/// `field`.
pub fn check_path(field: &'static str, path: &str) -> Result<(), AdapterError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(AdapterError::invalid_field(
            field,
            format!("`{path}` is not an absolute path"),
        ));
    }
    Ok(())
}

/// A sandbox id in the lower-case, dash form provider names and slugs take
/// (`sbx_01J…` → `sbx-01j…`); still unique, since ids are case-insensitive.
pub fn dns_name(id: &SandboxId) -> String {
    id.as_str().to_ascii_lowercase().replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_paths_and_names() {
        assert_eq!(segment("a/b c~d"), "a%2Fb%20c~d");
        assert!(check_path("cwd", "/tmp").is_ok());
        for bad in ["tmp", "/a\0b"] {
            let e = check_path("cwd", bad).unwrap_err();
            assert!(e.to_string().contains("not an absolute path"), "{e}");
        }
        let id = SandboxId::new();
        let name = dns_name(&id);
        assert!(
            !name.contains('_') && name == name.to_ascii_lowercase(),
            "{name}"
        );
        let (a, b) = (unique(), unique());
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() || c == '-'), "{a}");
    }
}
