//! The plugin protocol's own checks, which only raw HTTP can see.

use std::time::Duration;

use differently_core::SandboxId;

use super::runner::Runner;
use crate::remote::wire::{self, ErrorBody, ErrorCode};

/// What only raw HTTP can see: a missing or wrong token, a version it does not speak, the
/// error body's shape.
pub(super) async fn protocol_checks(r: &mut Runner, base: &str, token: &str) {
    let http = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            r.fail("auth.required", format!("cannot build an HTTP client: {e}"));
            return;
        }
    };
    let info = format!("{base}/info");
    let expect = |name: &'static str, status: u16, code: ErrorCode| {
        move |resp: Result<(u16, Vec<u8>), reqwest::Error>| -> Result<String, String> {
            let (s, body) = resp.map_err(|e| format!("request failed: {e}"))?;
            let parsed: Result<ErrorBody, _> = serde_json::from_slice(&body);
            match parsed {
                Ok(b) if s == status && b.code == code => Ok(format!("HTTP {s} {code:?}")),
                Ok(b) => Err(format!(
                    "{name}: expected HTTP {status} {code:?}, got HTTP {s} {:?}",
                    b.code
                )),
                Err(_) => Err(format!(
                    "{name}: expected HTTP {status} with an error body, got HTTP {s}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(120)])
                )),
            }
        }
    };
    async fn call(rb: reqwest::RequestBuilder) -> Result<(u16, Vec<u8>), reqwest::Error> {
        let resp = rb.send().await?;
        let s = resp.status().as_u16();
        Ok((s, resp.bytes().await?.to_vec()))
    }
    let res = call(http.get(&info)).await;
    r.record(
        "auth.required",
        expect("no token", 401, ErrorCode::Unauthenticated)(res),
    );
    let res = call(http.get(&info).bearer_auth("not-the-token")).await;
    r.record(
        "auth.wrong-token",
        expect("wrong token", 401, ErrorCode::Unauthenticated)(res),
    );
    let res = call(
        http.get(&info)
            .bearer_auth(token)
            .header(wire::VERSION_HEADER, "999"),
    )
    .await;
    r.record(
        "version.refused",
        expect("version 999", 400, ErrorCode::UnsupportedVersion)(res),
    );
    let missing = format!("{base}/instances/{}", SandboxId::new());
    let res = call(http.get(&missing).bearer_auth(token)).await;
    let shape = match res {
        Ok((s, body)) => match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(v)
                if s == 404
                    && v["code"] == "not_found"
                    && v["message"].is_string()
                    && v["retryable"] == false =>
            {
                Ok("a missing instance is HTTP 404 {code: not_found, message, retryable: false}".to_owned())
            }
            _ => Err(format!(
                "a missing instance: expected HTTP 404 {{code: not_found, message, retryable: false}}, got HTTP {s}: {}",
                String::from_utf8_lossy(&body[..body.len().min(160)])
            )),
        },
        Err(e) => Err(format!("request failed: {e}")),
    };
    r.record("errors.shape", shape);
}
