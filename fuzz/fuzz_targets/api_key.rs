//! API key parsing (`dly_<keyid>_<secret>`): every bearer token a client sends reaches
//! `parse_key` before any lookup, so it must never panic, and what it accepts must be a
//! well-formed key whose parts put back together are the token itself.
#![no_main]

use differently_api::auth::parse_key;
use differently_api::BootstrapKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let token = String::from_utf8_lossy(data);
    let parsed = parse_key(&token);
    if let Some(p) = &parsed {
        assert_eq!(
            format!("dly_{}_{}", p.key_id, p.secret),
            *token,
            "the parts of an accepted key are the key"
        );
        assert_eq!(p.secret.len(), 40, "an accepted secret is 40 characters");
        assert!(
            p.secret.bytes().all(|b| b.is_ascii_alphanumeric()),
            "an accepted secret is base62"
        );
        assert!(
            differently_core::KeyId::parse(p.key_id).is_ok(),
            "an accepted key id parses as a key id"
        );
    }
    // The configured bootstrap key goes through the same shape check.
    assert_eq!(
        BootstrapKey::from_key(&token).is_ok(),
        parsed.is_some(),
        "bootstrap key validation agrees with parse_key"
    );
});
