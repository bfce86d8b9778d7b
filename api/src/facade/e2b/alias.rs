//! The `e2b_`-shaped alias of a Differently key, for the E2B SDKs that refuse any other key
//! shape before sending anything (Python 2.25–2.4x, JS 2.27–2.4x check `^e2b_[0-9a-f]+$`).
//!
//! The alias is the key itself, spelled `e2b_` + the lowercase hex of its UTF-8 bytes. Why a
//! spelling and not a second secret: it adds no credential to store, show once, leak or
//! revoke. The facade turns it back into the key before anything else looks at it, so it is
//! checked by the same code as the key (its stored hash, revocation, expiry, scopes, project
//! binding, rate limit): it is scoped and revoked with its key because it *is* its key.
//! Anyone who holds the key can compute it (`differently key e2b-alias`), and nobody else
//! can. It is accepted only on the E2B surface (`/e2b`); `/v1` takes the key as it is.

/// What every alias starts with (what the older SDKs check for).
pub const PREFIX: &str = "e2b_";

/// The alias of `key`.
pub fn to_alias(key: &str) -> String {
    format!("{PREFIX}{}", hex::encode(key))
}

/// The key an alias spells, if `alias` is one (`None` for anything else, including an
/// alias of something that is not a well-formed Differently key).
pub fn from_alias(alias: &str) -> Option<String> {
    let hex = alias.strip_prefix(PREFIX)?;
    if hex.is_empty() || hex.len() % 2 != 0 {
        return None;
    }
    let bytes = hex
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(pair, 16).ok()
        })
        .collect::<Option<Vec<u8>>>()?;
    let key = String::from_utf8(bytes).ok()?;
    crate::auth::parse_key(&key)?;
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alias_has_the_older_sdks_shape_and_spells_its_key() {
        let key = crate::auth::generate_key();
        let alias = to_alias(&key);
        let hex = alias.strip_prefix("e2b_").expect("prefix");
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(from_alias(&alias), Some(key));
    }

    #[test]
    fn anything_else_is_not_an_alias() {
        let key = crate::auth::generate_key();
        assert_eq!(from_alias(&key), None);
        assert_eq!(from_alias("e2b_"), None);
        assert_eq!(from_alias("e2b_abc"), None);
        assert_eq!(from_alias("e2b_zz"), None);
        // A real E2B key: hex, but not a Differently key.
        assert_eq!(
            from_alias("e2b_53ae1fed82754c17ad8077fbc8bcdd90ef5a2a7d"),
            None
        );
        // A mistyped key inside a well-formed alias is refused before any lookup.
        let mut broken = key.clone();
        broken.pop();
        broken.push(if key.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(from_alias(&to_alias(&broken)), None);
    }
}
