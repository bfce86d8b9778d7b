//! The facade's DNS mode: requests routed by Host header, as the SDKs send them without URL
//! overrides.

use super::*;

/// DNS mode (`DIFFERENTLY_E2B_DOMAIN`): requests for `api.<domain>` reach the control plane
/// and `<port>-<id>.<domain>` envd, by Host header alone. The SDKs insist on `https://` in this
/// mode (outside `E2B_DEBUG`, which makes no control-plane calls), so this sends the requests
/// the SDKs send (SDK-FACADE recordings' shapes) over plain HTTP with the Host header set, as a
/// TLS-terminating proxy in front of Differently would pass them on.
#[tokio::test(flavor = "multi_thread")]
async fn e2b_dns_mode_routes_by_host() {
    let domain = "e2b.test";
    let dev = Dev::start_with(&[("DIFFERENTLY_E2B_DOMAIN", domain)]);
    let key = tenant_key(&dev, "e2b-dns").await;
    let http = reqwest::Client::new();
    let api = format!("api.{domain}");

    // The control plane at the root of api.<domain>.
    let resp = http
        .post(format!("{}/v2/sandboxes", dev.url))
        .header("host", &api)
        .header("x-api-key", &key)
        .json(&json!({ "templateID": "base", "timeout": 60, "metadata": {"dns": "1"} }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let token = created["envdAccessToken"].as_str().unwrap().to_owned();
    // The SDK builds envd's and get_host's names from the answer's domain: the configured one.
    assert_eq!(created["domain"], domain, "{created}");
    let listed: Value = http
        .get(format!("{}/v2/sandboxes?metadata=dns%3D1", dev.url))
        .header("host", format!("{api}:443"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed[0]["sandboxID"], id.as_str(), "{listed}");

    // envd at <port>-<id>.<domain>, the id lowercased as URL parsers leave host names, and
    // no E2b-Sandbox-Id header: the host names the sandbox.
    let envd = format!("49983-{}.{domain}", id.to_ascii_lowercase());
    let resp = http
        .post(format!("{}/files?path=/tmp/dns.txt", dev.url))
        .header("host", &envd)
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .body("by host")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let mut start = vec![0u8];
    let msg = json!({"process": {"cmd": "/bin/sh", "args": ["-c", "cat /tmp/dns.txt"]}});
    let msg = serde_json::to_vec(&msg).unwrap();
    start.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    start.extend_from_slice(&msg);
    let resp = http
        .post(format!("{}/process.Process/Start", dev.url))
        .header("host", &envd)
        .header("x-access-token", &token)
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(start)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await.unwrap();
    let mut msgs = vec![];
    let mut rest = &body[..];
    while rest.len() >= 5 {
        let n = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        msgs.push((
            rest[0],
            serde_json::from_slice::<Value>(&rest[5..5 + n]).unwrap(),
        ));
        rest = &rest[5 + n..];
    }
    assert!(
        msgs[0].1["event"]["start"]["pid"].as_u64().is_some(),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|(_, m)| m["event"]["data"]["stdout"] == "YnkgaG9zdA=="),
        "the command read the file uploaded by host: {msgs:?}"
    );
    assert_eq!(msgs.last().unwrap(), &(2, json!({})), "{msgs:?}");
    let health = http
        .get(format!("{}/health", dev.url))
        .header("host", &envd)
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 204);

    // The host wins over a sent E2b-Sandbox-Id (as E2B's edge routes by host): another
    // sandbox's host with this sandbox's token is that sandbox's "not found".
    let other = format!("49983-sbx_{}.{domain}", "0".repeat(26));
    let resp = http
        .get(format!("{}/files?path=/tmp/dns.txt", dev.url))
        .header("host", &other)
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["message"],
        format!("The sandbox sbx_{} was not found", "0".repeat(26))
    );
    // A signed URL in this mode is https://49983-<id>.<domain>/files?…: no headers, the host
    // names the sandbox, and only that sandbox's tokens open it.
    use differently_api::facade::e2b::signed::{signature, Operation};
    let sig = signature("/tmp/dns.txt", Operation::Read, "", &token, None);
    let signed = |host: String| {
        http.get(format!("{}/files", dev.url))
            .query(&[("path", "/tmp/dns.txt"), ("signature", sig.as_str())])
            .header("host", host)
            .send()
    };
    let resp = signed(envd.clone()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "by host");
    let resp = signed(other.clone()).await.unwrap();
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body, json!({"code": 401, "message": "invalid signature"}));
    // Another port of the sandbox goes to the endpoint its pool gives (the port proxy); this
    // pool (devhost under bubblewrap) exposes no ports, and that is what the answer says.
    let resp = http
        .get(format!("{}/health", dev.url))
        .header("host", format!("8080-{}.{domain}", id.to_ascii_lowercase()))
        .header("x-access-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 501);
    let body: Value = resp.json().await.unwrap();
    let m = body["message"].as_str().unwrap();
    assert!(
        m.starts_with(&format!("port 8080 of sandbox {id} cannot be exposed"))
            && m.contains("ports.expose"),
        "{body}"
    );

    // Other hosts are untouched: /v1 by address, and the facade's paths under /e2b.
    let resp = http
        .get(format!("{}/v2/sandboxes", dev.url))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let resp = http
        .delete(format!("{}/e2b/sandboxes/{id}", dev.url))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
}
