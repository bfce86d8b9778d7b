//! Bus envelope decoding: every consumer reads a payload off NATS with `decode::<T>()` before
//! it trusts anything in it, so no payload may panic it, a newer major version is always
//! refused as such, and what it accepts survives a round trip through `encode`.
#![no_main]

use differently_bus_schema::{decode, Admitted, DecodeError, Message, StatusChanged, Work};
use libfuzzer_sys::fuzz_target;

fn check<T: Message + PartialEq + std::fmt::Debug>(payload: &[u8]) {
    match decode::<T>(payload) {
        Ok(env) => {
            assert!(
                env.v <= differently_bus_schema::SCHEMA_VERSION,
                "decoded an envelope of a newer version"
            );
            let bytes = env.encode().expect("a decoded envelope encodes");
            let again = decode::<T>(&bytes).expect("an encoded envelope decodes");
            assert_eq!(env, again, "{} envelope changed in a round trip", T::KIND);
        }
        Err(DecodeError::NewerVersion { found, supported }) => assert!(found > supported),
        Err(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    check::<Admitted>(data);
    check::<Work>(data);
    check::<StatusChanged>(data);
});
