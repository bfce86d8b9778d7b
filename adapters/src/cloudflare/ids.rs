//! Names on the bridge. A bridge sandbox id is a caller-chosen name of `[a-z2-7]{1,128}`
//! (RFC 4648 base32, lower case): the adapter names each sandbox the base32 of Differently's
//! sandbox id, so the name is the same on every call and every process (create is
//! idempotent by construction) and the sandbox id can be read back from it. The per-
//! installation index sandbox is named the same way from the installation id.

use differently_core::SandboxId;

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// The index sandbox's name before encoding; no sandbox id reads so.
const INDEX: &str = "differently-index";

/// Lower-case base32 without padding.
pub(crate) fn encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() * 8 / 5 + 1);
    let (mut bits, mut value) = (0u32, 0u32);
    for &b in data {
        value = (value << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            out.push(char::from(ALPHABET[((value >> (bits - 5)) & 31) as usize]));
            bits -= 5;
        }
        value &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((value << (5 - bits)) & 31) as usize]));
    }
    out
}

/// The bytes of `s` (as [`encode`] wrote them); `None` for anything else.
pub(crate) fn decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 5 / 8);
    let (mut bits, mut value) = (0u32, 0u32);
    for c in s.bytes() {
        let v = ALPHABET.iter().position(|a| *a == c)? as u32;
        value = (value << 5) | v;
        bits += 5;
        if bits >= 8 {
            out.push(((value >> (bits - 8)) & 0xff) as u8);
            bits -= 8;
        }
        value &= (1 << bits) - 1;
    }
    // Leftover bits are padding and must be zero, or the text was not ours.
    (value == 0).then_some(out)
}

/// Whether the bridge accepts `id` as a sandbox name.
pub(crate) fn valid(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| ALPHABET.contains(&b))
}

/// The bridge name of sandbox `id`.
pub(crate) fn bridge_id(id: &SandboxId) -> String {
    encode(id.as_str().as_bytes())
}

/// The sandbox a bridge name stands for, if it is one of ours.
pub(crate) fn sandbox_of(bridge_id: &str) -> Option<SandboxId> {
    let text = String::from_utf8(decode(bridge_id)?).ok()?;
    let id = SandboxId::parse(&text).ok()?;
    (id.as_str() == text).then_some(id)
}

/// The bridge name of the index sandbox.
pub(crate) fn index_id() -> String {
    encode(INDEX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bridge_ids_and_read_back() {
        assert_eq!(encode(b"f"), "my");
        assert_eq!(encode(b"foobar"), "mzxw6ytboi");
        assert_eq!(decode("mzxw6ytboi").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(decode("mz"), None, "non-zero padding bits");
        assert_eq!(decode("A"), None);
        let id = SandboxId::new();
        let name = bridge_id(&id);
        assert!(valid(&name), "{name}");
        assert_eq!(sandbox_of(&name), Some(id));
        let index = index_id();
        assert!(valid(&index) && sandbox_of(&index).is_none(), "{index}");
        assert!(!valid("conformance-no-such-instance"));
        assert!(!valid(&"a".repeat(129)));
    }
}
