//! The Kubernetes API as this adapter uses it: plain HTTPS and JSON with a bearer token on
//! the four agent-sandbox resources, no client library. What is Kubernetes' own is here:
//! resource paths, `Status` error bodies (`reason` says what happened), a group the server
//! does not serve answering a plain-text 404 (the CRDs are not installed), label-selector
//! listing with `limit`/`continue` paging, merge patches, and 409 `AlreadyExists`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use super::config::Settings;
use crate::kit::{
    self, ClientSettings, ConfigError, Credentials, ErrorAnswer, HttpClient, KeyHeader,
};
use crate::AdapterError;

/// One of the resources this adapter reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Res {
    Sandbox,
    Claim,
    WarmPool,
}

impl Res {
    fn group_version(self) -> &'static str {
        match self {
            Res::Sandbox => "agents.x-k8s.io/v1beta1",
            _ => "extensions.agents.x-k8s.io/v1beta1",
        }
    }

    pub(crate) fn plural(self) -> &'static str {
        match self {
            Res::Sandbox => "sandboxes",
            Res::Claim => "sandboxclaims",
            Res::WarmPool => "sandboxwarmpools",
        }
    }

    /// `apiVersion` of an object of this resource.
    pub(crate) fn api_version(self) -> &'static str {
        self.group_version()
    }
}

/// Items asked per page of a list.
const PAGE: usize = 250;

/// A Kubernetes API client bound to one namespace.
#[derive(Debug, Clone)]
pub(crate) struct Kube {
    http: HttpClient,
    namespace: String,
}

/// What a create found.
pub(crate) enum Created {
    Made,
    /// The name is taken (409 `AlreadyExists`).
    Exists,
}

/// The fields of a `Status` body this adapter reads.
#[derive(Debug, Default, Deserialize)]
struct StatusBody {
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

/// A page of a list.
#[derive(Debug, Deserialize)]
struct ListPage {
    #[serde(default)]
    items: Vec<Value>,
    #[serde(default)]
    metadata: ListMeta,
}

#[derive(Debug, Default, Deserialize)]
struct ListMeta {
    #[serde(rename = "continue", default)]
    cont: Option<String>,
}

pub(crate) use crate::kit::paths::segment as enc;

/// The kit's error mapper for the Kubernetes API: its `Status` body, or none at all.
fn errors(op: &str, a: &ErrorAnswer) -> AdapterError {
    let st: Option<StatusBody> = serde_json::from_slice(&a.body).ok();
    let plain = st.is_none();
    map_status(op, a.status, &st.unwrap_or_default(), plain, a.retry_after)
}

impl Kube {
    pub(crate) fn new(s: &Settings, credentials: &Credentials) -> Result<Kube, ConfigError> {
        let http = kit::build_client(
            &ClientSettings {
                service: "Kubernetes API",
                base_url: &s.api_server_url,
                ca_bundle: &s.ca_bundle,
                request_timeout: s.request_timeout,
                credential: &s.credential,
                initial: s.initial_token.as_ref(),
                what: "bearer token",
                header: KeyHeader::Bearer,
                errors,
                retries: 2,
            },
            credentials,
        )
        .map_err(|mut e| {
            if e.field == "apiURL" {
                e.field = "apiServerURL".to_owned();
            }
            e
        })?;
        Ok(Kube {
            http,
            namespace: s.namespace.clone(),
        })
    }

    fn path(&self, res: Res, name: Option<&str>) -> String {
        let base = format!(
            "/apis/{}/namespaces/{}/{}",
            res.group_version(),
            self.namespace,
            res.plural()
        );
        match name {
            Some(n) => format!("{base}/{}", enc(n)),
            None => base,
        }
    }

    /// The object, or `None` when the server says it does not exist.
    pub(crate) async fn get(
        &self,
        res: Res,
        name: &str,
        op: &str,
    ) -> Result<Option<Value>, AdapterError> {
        let rb = self.http.api(Method::GET, &self.path(res, Some(name)));
        match self.http.json::<Value>(rb, op).await {
            Ok(v) => Ok(Some(v)),
            Err(AdapterError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every object of `res` matching `selector`, page by page.
    pub(crate) async fn list(
        &self,
        res: Res,
        selector: &str,
        op: &str,
    ) -> Result<Vec<Value>, AdapterError> {
        let mut out = Vec::new();
        let mut cont: Option<String> = None;
        loop {
            let mut path = format!(
                "{}?labelSelector={}&limit={PAGE}",
                self.path(res, None),
                enc(selector)
            );
            if let Some(c) = &cont {
                path.push_str(&format!("&continue={}", enc(c)));
            }
            let page: ListPage = self
                .http
                .json(self.http.api(Method::GET, &path), op)
                .await?;
            out.extend(page.items);
            match page.metadata.cont.filter(|c| !c.is_empty()) {
                Some(c) => cont = Some(c),
                None => return Ok(out),
            }
        }
    }

    /// One item of `res` at most: the API serves the resource and lets the token list it.
    pub(crate) async fn probe(&self, res: Res, op: &str) -> Result<(), AdapterError> {
        let path = format!("{}?limit=1", self.path(res, None));
        self.http
            .send_ok(self.http.api(Method::GET, &path), op)
            .await
            .map(|_| ())
    }

    /// Creates `body`; a taken name is [`Created::Exists`].
    pub(crate) async fn create(
        &self,
        res: Res,
        body: &Value,
        op: &str,
    ) -> Result<Created, AdapterError> {
        let rb = self
            .http
            .api(Method::POST, &self.path(res, None))
            .json(body);
        match self.http.call(rb, op).await? {
            Ok(resp) => {
                // CRD schemas prune fields they do not know and say so only in `Warning`
                // headers: a sign that the installed agent-sandbox is older than what is sent.
                for w in resp.headers().get_all("warning") {
                    tracing::warn!(op, warning = %String::from_utf8_lossy(w.as_bytes()), "agent_sandbox: the Kubernetes API warned");
                }
                Ok(Created::Made)
            }
            Err(a)
                if a.status == StatusCode::CONFLICT
                    && serde_json::from_slice::<StatusBody>(&a.body)
                        .is_ok_and(|st| st.reason == "AlreadyExists") =>
            {
                Ok(Created::Exists)
            }
            Err(a) => Err(self.http.map_answer(op, &a)),
        }
    }

    /// Deletes the object; one already gone is fine.
    pub(crate) async fn delete(&self, res: Res, name: &str, op: &str) -> Result<(), AdapterError> {
        let rb = self.http.api(Method::DELETE, &self.path(res, Some(name)));
        match self.http.send_ok(rb, op).await {
            Ok(_) | Err(AdapterError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// An RFC 7386 merge patch (custom resources take no strategic merge).
    pub(crate) async fn merge_patch(
        &self,
        res: Res,
        name: &str,
        patch: &Value,
        op: &str,
    ) -> Result<(), AdapterError> {
        let rb = self
            .http
            .api(Method::PATCH, &self.path(res, Some(name)))
            .header("Content-Type", "application/merge-patch+json")
            .body(patch.to_string());
        self.http.send_ok(rb, op).await.map(|_| ())
    }
}

/// Status code and `Status` body → `AdapterError`. `plain`: the answer was not a `Status`
/// but text (a 404 for a group the server does not serve).
fn map_status(
    op: &str,
    status: StatusCode,
    st: &StatusBody,
    plain: bool,
    wait: Option<Duration>,
) -> AdapterError {
    let code = status.as_u16();
    let text = format!(
        "{op}: Kubernetes API HTTP {code} {}: {}",
        st.reason, st.message
    );
    match code {
        401 => AdapterError::permanent(format!(
            "{op}: the Kubernetes API refused the bearer token (HTTP 401); check the pool's tokenEnv, tokenFile or tokenSecret"
        )),
        403 => AdapterError::permanent(format!(
            "{op}: the token's account may not do this (HTTP 403, RBAC): {}",
            st.message
        )),
        404 if plain || st.reason.is_empty() => AdapterError::permanent(format!(
            "{op}: the Kubernetes API does not serve the agent-sandbox resources (HTTP 404): are the agent-sandbox CRDs (v1beta1) and extensions installed?"
        )),
        404 => AdapterError::NotFound,
        // API priority and fairness shedding load: it passes.
        429 => {
            let e = AdapterError::transient(text);
            match (e, wait) {
                (AdapterError::Transient(r), Some(w)) => AdapterError::Transient(r.with_retry_after(w)),
                (e, _) => e,
            }
        }
        409 | 500..=599 => AdapterError::transient(text),
        _ => AdapterError::permanent(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(reason: &str) -> StatusBody {
        StatusBody {
            reason: reason.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn statuses_map_to_kinds() {
        let m = |c: u16, s: &StatusBody, plain: bool| {
            map_status("op", StatusCode::from_u16(c).unwrap(), s, plain, None)
        };
        assert_eq!(m(404, &st("NotFound"), false), AdapterError::NotFound);
        let crd = m(404, &StatusBody::default(), true);
        assert!(crd.to_string().contains("CRDs"), "{crd}");
        assert!(matches!(
            m(401, &st("Unauthorized"), false),
            AdapterError::Permanent(_)
        ));
        assert!(m(403, &st("Forbidden"), false).to_string().contains("RBAC"));
        assert!(m(429, &st("TooManyRequests"), false).is_retryable());
        assert!(m(503, &st("ServiceUnavailable"), false).is_retryable());
        assert!(matches!(
            m(422, &st("Invalid"), false),
            AdapterError::Permanent(_)
        ));
        assert_eq!(enc("a=b,c"), "a%3Db%2Cc");
    }
}
