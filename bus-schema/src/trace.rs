//! W3C trace context, carried in every envelope so one trace spans API → bus → worker.

use serde::{Deserialize, Serialize};

/// W3C trace context carried across the bus so one trace spans API → worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceContext {
    pub traceparent: Option<String>,
}

impl TraceContext {
    /// Takes a caller's `traceparent` header when it is a valid W3C version-00 value
    /// (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, ids not all zero).
    pub fn from_header(value: &str) -> Option<TraceContext> {
        let v = value.trim();
        let parts: Vec<&str> = v.split('-').collect();
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        match parts.as_slice() {
            [ver, trace, parent, flags]
                if *ver == "00"
                    && hex(trace, 32)
                    && hex(parent, 16)
                    && hex(flags, 2)
                    && !zero(trace)
                    && !zero(parent) =>
            {
                Some(TraceContext {
                    traceparent: Some(v.to_owned()),
                })
            }
            _ => None,
        }
    }

    /// A new root context from 16 random bytes of trace id and 8 of parent id.
    pub fn from_random(trace: [u8; 16], parent: [u8; 8]) -> TraceContext {
        let (mut t, mut p) = (trace, parent);
        // All-zero ids are invalid in W3C trace context.
        if t.iter().all(|b| *b == 0) {
            t[15] = 1;
        }
        if p.iter().all(|b| *b == 0) {
            p[7] = 1;
        }
        TraceContext {
            traceparent: Some(format!("00-{}-{}-01", hex::encode(t), hex::encode(p))),
        }
    }

    /// The 32-hex-digit trace id, the part that stays the same across processes.
    pub fn trace_id(&self) -> Option<&str> {
        let tp = self.traceparent.as_deref()?;
        tp.split('-').nth(1).filter(|t| t.len() == 32)
    }
}
