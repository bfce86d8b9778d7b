//! The two ends an OpenSandbox benchmark talks to: the server itself (lifecycle API and
//! each sandbox's execd), and Differently's API with an `opensandbox` pool registered on
//! that server. Shared by `opensandbox` (P7, exec overhead) and `opensandbox_warm` (warm
//! create → first exec), so both set up and reach the server the same way.
//!
//! Every address is checked to be on loopback before a request is sent to it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{Cluster, ClusterOpts};
use crate::LoadError;

/// execd's port inside every sandbox.
pub(crate) const EXECD_PORT: u16 = 44772;

/// Refuses any URL whose host is not a loopback address (or `localhost`).
pub fn require_loopback(url: &str) -> Result<(), LoadError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| LoadError::Plan(format!("{url:?} is not a URL: {e}")))?;
    let host = parsed.host_str().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ok = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host == "localhost",
    };
    if ok {
        Ok(())
    } else {
        Err(LoadError::Plan(format!(
            "refusing {url}: this benchmark only sends traffic to loopback addresses"
        )))
    }
}

/// The server, reached directly.
pub(crate) struct Server {
    pub(crate) api: String,
    pub(crate) key: String,
    pub(crate) http: reqwest::Client,
}

impl Server {
    pub(crate) fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.api))
            .header("OPEN-SANDBOX-API-KEY", &self.key)
    }

    pub(crate) async fn json(
        &self,
        rb: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<Value, LoadError> {
        let r = rb.send().await.map_err(|e| LoadError::http(what, e))?;
        let status = r.status().as_u16();
        let text = r.text().await.map_err(|e| LoadError::http(what, e))?;
        if !(200..300).contains(&status) {
            return Err(LoadError::Api {
                context: what.to_owned(),
                status,
                body: text.chars().take(300).collect(),
            });
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `http://<execd endpoint>` of sandbox `id`, checked to be on loopback.
    pub(crate) async fn execd_base(&self, id: &str) -> Result<String, LoadError> {
        let ep = self
            .json(
                self.req(
                    reqwest::Method::GET,
                    &format!("/sandboxes/{id}/endpoints/{EXECD_PORT}"),
                ),
                "execd endpoint",
            )
            .await?;
        let endpoint = ep["endpoint"]
            .as_str()
            .ok_or_else(|| LoadError::Check(format!("endpoint answer without endpoint: {ep}")))?;
        let base = format!("http://{}", endpoint.trim_end_matches('/'));
        require_loopback(&base)?;
        Ok(base)
    }

    pub(crate) async fn delete(&self, id: &str) -> Result<(), LoadError> {
        let r = self
            .req(reqwest::Method::DELETE, &format!("/sandboxes/{id}"))
            .send()
            .await
            .map_err(|e| LoadError::http("delete sandbox", e))?;
        if r.status().is_success() || r.status() == 404 {
            Ok(())
        } else {
            Err(LoadError::Api {
                context: "delete sandbox".to_owned(),
                status: r.status().as_u16(),
                body: String::new(),
            })
        }
    }

    /// The OpenSandbox id of the instance Differently made for `sandbox`.
    pub(crate) async fn instance_of(&self, sandbox: &str) -> Result<String, LoadError> {
        let v = self
            .json(
                self.req(
                    reqwest::Method::GET,
                    &format!("/sandboxes?metadata=differently-sandbox-id%3D{sandbox}"),
                ),
                "find the instance",
            )
            .await?;
        v["items"][0]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| LoadError::Check(format!("no instance tagged {sandbox}: {v}")))
    }
}

/// Differently's API as the bootstrap admin.
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) key: String,
    pub(crate) http: reqwest::Client,
}

impl Api {
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        what: &str,
    ) -> Result<(u16, Value), LoadError> {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.map_err(|e| LoadError::http(what, e))?;
        let status = r.status().as_u16();
        let text = r.text().await.map_err(|e| LoadError::http(what, e))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    pub(crate) async fn expect(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        want: u16,
        what: &str,
    ) -> Result<Value, LoadError> {
        let (status, v) = self.call(method, path, body, what).await?;
        if status == want {
            Ok(v)
        } else {
            Err(LoadError::Api {
                context: what.to_owned(),
                status,
                body: v.to_string().chars().take(300).collect(),
            })
        }
    }

    /// Waits (the API's own wait route) until `id` is `status`; fails on a final other one.
    pub(crate) async fn wait(&self, id: &str, status: &str) -> Result<(), LoadError> {
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            let v = self
                .expect(
                    reqwest::Method::GET,
                    &format!("/v1/sandboxes/{id}/wait?status={status}&timeoutSeconds=30"),
                    None,
                    200,
                    "wait",
                )
                .await?;
            match v["status"].as_str() {
                Some(s) if s == status => return Ok(()),
                Some("failed" | "terminated") => {
                    return Err(LoadError::Check(format!(
                        "{id} ended while waiting for {status}: {v}"
                    )))
                }
                _ => {}
            }
        }
        Err(LoadError::Timeout(format!("{id} not {status} after 300 s")))
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The server at `url` (its lifecycle API, ending in `/v1`, on loopback), checked to answer
/// `/version` and to accept `key`; with its `/version` answer.
pub(crate) async fn connect(url: &str, key: &str) -> Result<(Server, Value), LoadError> {
    require_loopback(url)?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| LoadError::http("http client", e))?;
    let server = Server {
        api: url.trim_end_matches('/').to_owned(),
        key: key.to_owned(),
        http,
    };
    let root = server.api.trim_end_matches("/v1").to_owned();
    let version = server
        .json(server.http.get(format!("{root}/version")), "server version")
        .await
        .map_err(|e| {
            LoadError::Preflight(format!(
                "no OpenSandbox server answers at {root} ({e}): start one (docs/opensandbox.md, \"Live checks\")"
            ))
        })?;
    server
        .json(
            server.req(reqwest::Method::GET, "/sandboxes?pageSize=1"),
            "authenticated list (check the key)",
        )
        .await?;
    Ok((server, version))
}

/// Starts the control plane with an `opensandbox` pool named `osb` on `server`, registered
/// with `POST /v1/admin/pools` (`extra` merged over the bench's settings) and the fake pool
/// denied by policy, and waits until the pool is healthy. Returns the pool's settings.
pub(crate) async fn start_with_pool(
    server: &Server,
    opts: ClusterOpts,
    image: &str,
    extra: &Value,
) -> Result<(Cluster, Api, Value), LoadError> {
    let cluster = Cluster::start(opts).await?;
    require_loopback(&cluster.url())?;
    let key_file = cluster.dir.path().join("opensandbox.key");
    std::fs::write(&key_file, &server.key).map_err(|e| LoadError::io("writing the key file", e))?;
    let mut settings = json!({
        "apiURL": server.api, "trust": "private", "apiKeyFile": key_file,
        "image": image, "useServerProxy": false,
        "timeouts": {"readySeconds": 300},
    });
    if let Some(extra) = extra.as_object() {
        for (k, v) in extra {
            settings[k] = v.clone();
        }
    }
    let api = Api {
        base: cluster.url(),
        key: cluster.key.clone(),
        http: server.http.clone(),
    };
    api.expect(
        reqwest::Method::POST,
        "/v1/admin/pools",
        Some(
            json!({"name": "osb", "kind": "opensandbox", "trust": "private", "settings": settings}),
        ),
        201,
        "register the opensandbox pool",
    )
    .await?;
    api.expect(
        reqwest::Method::PUT,
        "/v1/admin/policies/global",
        Some(json!({"deniedPools": ["fake"]})),
        200,
        "deny the fake pool",
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, p) = api
            .call(reqwest::Method::GET, "/v1/admin/pools/osb", None, "pool")
            .await?;
        if p["healthy"] == true {
            break;
        }
        if Instant::now() > deadline {
            return Err(LoadError::Timeout(format!(
                "the opensandbox pool is not healthy after 60 s: {p}\n{}",
                cluster.logs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((cluster, api, settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_targets_pass() {
        for ok in [
            "http://127.0.0.1:8090/v1",
            "http://127.8.9.1/v1",
            "http://localhost:1/",
            "http://[::1]:8090/v1",
        ] {
            assert!(require_loopback(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://10.0.0.1:8090/v1",
            "http://172.17.0.2:44772",
            "http://192.168.1.1/",
            "http://example.com/v1",
            "http://localhost.example.com/",
            "http://[2001:db8::1]/",
            "not a url",
        ] {
            assert!(require_loopback(bad).is_err(), "{bad}");
        }
    }
}
