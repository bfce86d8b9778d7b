//! The OpenSandbox facade in process: its routes answer through the `/v1` handlers with
//! OpenSandbox's shapes (202 create, capitalised states, `{code, message}` errors, 400s that
//! name the unmappable field), and execd needs the endpoint's token.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, Answer, Api};

const HOST: (&str, &str) = ("host", "facade.test:8080");

async fn osb(api: &Api, method: Method, path: &str, key: Option<&str>, body: Value) -> Answer {
    let mut headers = vec![HOST];
    if let Some(k) = key {
        headers.push(("open-sandbox-api-key", k));
    }
    api.call(method, &format!("/opensandbox{path}"), None, body, &headers)
        .await
}

fn assert_osb_error(a: &Answer, status: StatusCode, code: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.body["code"], code, "{}", a.body);
    assert!(a.body["message"].is_string(), "{}", a.body);
    assert!(
        a.body.get("error").is_none(),
        "not the /v1 envelope: {}",
        a.body
    );
}

fn sdk_create() -> Value {
    json!({"image": {"uri": "img:1"}, "timeout": 600, "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
        "env": {"K": "V"}, "metadata": {"team": "a"}, "entrypoint": ["tail", "-f", "/dev/null"],
        "secureAccess": false})
}

#[tokio::test]
async fn the_sdk_create_maps_onto_v1_and_answers_in_opensandbox_shapes() {
    let api = api().await;
    let key = api.key.clone();
    let a = osb(
        &api,
        Method::POST,
        "/v1/sandboxes",
        Some(&key),
        sdk_create(),
    )
    .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let id = a.body["id"].as_str().unwrap().to_owned();
    assert_eq!(a.body["status"]["state"], "Pending", "{}", a.body);
    assert_eq!(a.body["metadata"], json!({"team": "a"}));
    assert_eq!(a.body["entrypoint"], json!(["tail", "-f", "/dev/null"]));
    assert!(a.body["createdAt"].is_string(), "{}", a.body);
    // `/v1` sets the expiry when the sandbox starts; a queued one has none yet (optional).
    assert!(a.body.get("expiresAt").is_none(), "{}", a.body);
    // The same sandbox through /v1: the mapping's result.
    let v1 = api
        .admin(Method::GET, &format!("/v1/sandboxes/{id}"), Value::Null)
        .await;
    assert_eq!(v1.body["template"], "img:1");
    assert_eq!(v1.body["resources"]["cpu"], 1);
    assert_eq!(v1.body["resources"]["memoryMiB"], 512);
    assert_eq!(v1.body["labels"], json!({"team": "a"}));
    assert_eq!(v1.body["ttlSeconds"], 600);
    let info = osb(
        &api,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        Some(&key),
        Value::Null,
    )
    .await;
    assert_eq!(info.status, StatusCode::OK);
    assert_eq!(info.body["image"]["uri"], "img:1");
    assert_eq!(
        info.body["extensions"]["differently.placement"],
        format!("/v1/sandboxes/{id}/placement")
    );
    let list = osb(
        &api,
        Method::GET,
        "/v1/sandboxes?state=Pending&metadata=team%3Da&pageSize=1",
        Some(&key),
        Value::Null,
    )
    .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert_eq!(list.body["items"][0]["id"], id.as_str());
    assert_eq!(list.body["pagination"]["totalItems"], 1);
    let none = osb(
        &api,
        Method::GET,
        "/v1/sandboxes?metadata=team%3Db",
        Some(&key),
        Value::Null,
    )
    .await;
    assert_eq!(none.body["pagination"]["totalItems"], 0, "{}", none.body);
    let del = osb(
        &api,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&key),
        Value::Null,
    )
    .await;
    assert_eq!(del.status, StatusCode::NO_CONTENT, "{}", del.body);
    let gone = osb(
        &api,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        Some(&key),
        Value::Null,
    )
    .await;
    assert_osb_error(
        &gone,
        StatusCode::NOT_FOUND,
        "DIFFERENTLY::SANDBOX_NOT_FOUND",
    );
}

#[tokio::test]
async fn errors_are_opensandbox_bodies_with_its_codes() {
    let api = api().await;
    let key = api.key.clone();
    let a = osb(&api, Method::GET, "/v1/sandboxes", None, Value::Null).await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "MISSING_API_KEY");
    let a = osb(
        &api,
        Method::GET,
        "/v1/sandboxes",
        Some("not-a-key"),
        Value::Null,
    )
    .await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "INVALID_API_KEY");
    let a = osb(
        &api,
        Method::GET,
        "/v1/sandboxes/sbx_01J00000000000000000000000",
        Some(&key),
        Value::Null,
    )
    .await;
    assert_osb_error(&a, StatusCode::NOT_FOUND, "DIFFERENTLY::SANDBOX_NOT_FOUND");
    for (field, body) in [
        (
            "volumes",
            json!({"volumes": [{"name": "v", "mountPath": "/m"}]}),
        ),
        (
            "networkPolicy",
            json!({"networkPolicy": {"defaultAction": "deny"}}),
        ),
        ("entrypoint", json!({"entrypoint": ["python", "app.py"]})),
        (
            "resourceLimits.cpu",
            json!({"resourceLimits": {"cpu": "x"}}),
        ),
        ("nonsense", json!({"nonsense": true})),
    ] {
        let a = osb(&api, Method::POST, "/v1/sandboxes", Some(&key), body).await;
        assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
        assert!(
            a.body["message"].as_str().unwrap().starts_with(field),
            "{}",
            a.body
        );
    }
    // A /v1 validation error is a 400 naming the field the client sent, with /v1's unit.
    let a = osb(
        &api,
        Method::POST,
        "/v1/sandboxes",
        Some(&key),
        json!({"resourceLimits": {"memory": "1Ki"}}),
    )
    .await;
    assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
    let msg = a.body["message"].as_str().unwrap();
    assert!(
        msg.starts_with("resourceLimits.memory: ") && msg.ends_with("(MiB)"),
        "{msg}"
    );
    // Scopes apply: a read-only key cannot create.
    let ro = api.key_with(None, &["sandboxes:read"]).await;
    let a = osb(&api, Method::POST, "/v1/sandboxes", Some(&ro), sdk_create()).await;
    assert_osb_error(&a, StatusCode::FORBIDDEN, "DIFFERENTLY::PERMISSION_DENIED");
    let a = osb(
        &api,
        Method::GET,
        "/v1/sandboxes?page=0",
        Some(&key),
        Value::Null,
    )
    .await;
    assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
    let a = osb(
        &api,
        Method::POST,
        "/v1/metrics/events",
        None,
        json!({"eventType": "sandbox.create"}),
    )
    .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT);
    let a = osb(&api, Method::GET, "/health", None, Value::Null).await;
    assert_eq!(
        (a.status, &a.body["status"]),
        (StatusCode::OK, &json!("healthy"))
    );
}

#[tokio::test]
async fn execd_needs_the_endpoint_token_and_waits_for_a_running_sandbox() {
    let api = api().await;
    let key = api.key.clone();
    let id = api.sandbox().await;
    let ep = osb(
        &api,
        Method::GET,
        &format!("/v1/sandboxes/{id}/endpoints/44772?use_server_proxy=false"),
        Some(&key),
        Value::Null,
    )
    .await;
    assert_eq!(ep.status, StatusCode::OK, "{}", ep.body);
    assert_eq!(
        ep.body["endpoint"],
        format!("facade.test:8080/opensandbox/execd/{id}")
    );
    let token = ep.body["headers"]["x-differently-execd-token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!token.contains(&key), "the token is not the key");
    let egress = osb(
        &api,
        Method::GET,
        &format!("/v1/sandboxes/{id}/endpoints/18080"),
        Some(&key),
        Value::Null,
    )
    .await;
    assert_eq!(egress.status, StatusCode::OK, "{}", egress.body);
    let ping = |tok: Option<String>| {
        let path = format!("/opensandbox/execd/{id}/ping");
        let api = &api;
        async move {
            let mut h = vec![HOST];
            let t;
            if let Some(x) = tok {
                t = x;
                h.push(("x-differently-execd-token", t.as_str()));
            }
            api.call(Method::GET, &path, None, Value::Null, &h).await
        }
    };
    let a = ping(None).await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    let a = ping(Some(format!("{token}A"))).await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    // Queued (no scheduler here): 409 until it runs, which the SDK keeps polling on.
    let a = ping(Some(token.clone())).await;
    assert_osb_error(&a, StatusCode::CONFLICT, "SANDBOX_NOT_READY");
    let running = api.running_sandbox().await;
    let ep = osb(
        &api,
        Method::GET,
        &format!("/v1/sandboxes/{running}/endpoints/44772"),
        Some(&key),
        Value::Null,
    )
    .await;
    let rtoken = ep.body["headers"]["x-differently-execd-token"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = api
        .call(
            Method::GET,
            &format!("/opensandbox/execd/{running}/ping"),
            None,
            Value::Null,
            &[HOST, ("x-differently-execd-token", &rtoken)],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    // One sandbox's token opens no other sandbox.
    let a = api
        .call(
            Method::GET,
            &format!("/opensandbox/execd/{running}/ping"),
            None,
            Value::Null,
            &[HOST, ("x-differently-execd-token", &token)],
        )
        .await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    // What the facade does not serve says so.
    let a = api
        .call(
            Method::POST,
            &format!("/opensandbox/execd/{running}/code/context"),
            None,
            json!({"language": "python"}),
            &[HOST, ("x-differently-execd-token", &rtoken)],
        )
        .await;
    assert_osb_error(&a, StatusCode::NOT_IMPLEMENTED, "NOT_SUPPORTED");
    // Sessions: an id the facade never issued (a path, say) never reaches the sandbox, and a
    // run needs a command.
    let execd = |m: Method, path: &str, body: Value| {
        let path = format!("/opensandbox/execd/{running}{path}");
        let (api, rtoken) = (&api, rtoken.clone());
        async move {
            api.call(
                m,
                &path,
                None,
                body,
                &[HOST, ("x-differently-execd-token", &rtoken)],
            )
            .await
        }
    };
    for sid in ["session-..%2F..%2Fetc%2Fpasswd", "nope", "session-UPPER"] {
        let a = execd(
            Method::POST,
            &format!("/session/{sid}/run"),
            json!({"command": "id"}),
        )
        .await;
        assert_osb_error(&a, StatusCode::NOT_FOUND, "SESSION_NOT_FOUND");
        let a = execd(Method::DELETE, &format!("/session/{sid}"), Value::Null).await;
        assert_osb_error(&a, StatusCode::NOT_FOUND, "SESSION_NOT_FOUND");
    }
    let a = execd(
        Method::POST,
        "/session/session-01abc/run",
        json!({"cwd": "/"}),
    )
    .await;
    assert_osb_error(&a, StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY");
    let a = execd(Method::POST, "/session", json!({"shell": "zsh"})).await;
    assert_osb_error(&a, StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY");
    // A session is a `/v1` exec like any other: this sandbox was moved to running without a
    // backend instance, and the exec's error comes back in OpenSandbox's shape.
    let a = execd(Method::POST, "/session", json!({})).await;
    assert_osb_error(
        &a,
        StatusCode::SERVICE_UNAVAILABLE,
        "DIFFERENTLY::PROVIDER_UNAVAILABLE",
    );
}

/// Refusals axum answers itself under the facade's prefix (a path no route serves, a method
/// the route does not have, a body over the limit) are the facade's `{code, message}` too:
/// the SDKs read nothing else ("Unexpected SDK error occurred: 'code'").
#[tokio::test]
async fn every_refusal_under_the_prefix_is_an_opensandbox_body() {
    let api = api().await;
    let key = api.key.clone();
    let id = api.live_sandbox().await;
    let tok = api.facade_execd_token(&id).await;
    for (m, path) in [
        (Method::PATCH, format!("/v1/sandboxes/{id}/metadata")),
        (Method::GET, "/v1/templates/tpl_x".to_owned()),
        (Method::GET, format!("/v1/sandboxes/{id}/diagnostics/logs")),
        (Method::GET, "/nope".to_owned()),
        (Method::GET, String::new()),
        (Method::GET, "/".to_owned()),
    ] {
        let a = osb(&api, m.clone(), &path, Some(&key), Value::Null).await;
        assert_osb_error(&a, StatusCode::NOT_FOUND, "DIFFERENTLY::ROUTE_NOT_FOUND");
        let msg = a.body["message"].as_str().unwrap();
        assert!(msg.starts_with(&format!("{m} /opensandbox{path}")), "{msg}");
    }
    let a = osb(
        &api,
        Method::PUT,
        &format!("/v1/sandboxes/{id}"),
        Some(&key),
        json!({}),
    )
    .await;
    assert_osb_error(
        &a,
        StatusCode::METHOD_NOT_ALLOWED,
        "DIFFERENTLY::METHOD_NOT_ALLOWED",
    );
    assert!(a.headers.contains_key("allow"), "{:?}", a.headers);
    let execd_auth = [HOST, ("x-differently-execd-token", tok.as_str())];
    let a = api
        .call(
            Method::PUT,
            &format!("/opensandbox/execd/{id}/command"),
            None,
            json!({"command": "true"}),
            &execd_auth,
        )
        .await;
    assert_osb_error(
        &a,
        StatusCode::METHOD_NOT_ALLOWED,
        "DIFFERENTLY::METHOD_NOT_ALLOWED",
    );
    // Over `/v1`'s 2 MiB body limit, on the lifecycle and on execd.
    let big = format!("{{\"x\":\"{}\"}}", "a".repeat(3 << 20));
    let a = api
        .call_raw(
            Method::POST,
            "/opensandbox/v1/sandboxes",
            None,
            big.clone().into_bytes(),
            &[
                HOST,
                ("open-sandbox-api-key", &key),
                ("content-type", "application/json"),
            ],
        )
        .await;
    assert_osb_error(
        &a,
        StatusCode::PAYLOAD_TOO_LARGE,
        "DIFFERENTLY::PAYLOAD_TOO_LARGE",
    );
    let mut headers = execd_auth.to_vec();
    headers.push(("content-type", "application/json"));
    let a = api
        .call_raw(
            Method::POST,
            &format!("/opensandbox/execd/{id}/command"),
            None,
            big.into_bytes(),
            &headers,
        )
        .await;
    assert_osb_error(
        &a,
        StatusCode::PAYLOAD_TOO_LARGE,
        "DIFFERENTLY::PAYLOAD_TOO_LARGE",
    );
    // A query the route cannot read.
    let a = api
        .call(
            Method::DELETE,
            &format!("/opensandbox/execd/{id}/command?id=1&id=2"),
            None,
            Value::Null,
            &execd_auth,
        )
        .await;
    assert!(a.body.get("error").is_none(), "{}", a.body);
    // `/v1` outside the prefix keeps its own envelope.
    let a = api
        .call(Method::PATCH, "/v1/nope", Some(&key), Value::Null, &[])
        .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.code(), "not_found", "{}", a.body);
}

/// `/v1`'s refusals of what the facade mapped name the field the client sent (and the unit
/// `/v1` counts in), never `/v1`'s own field; a path check's field is named once.
#[tokio::test]
async fn v1_refusals_name_the_opensandbox_field() {
    let api = api().await;
    let key = api.key.clone();
    let base = || json!({"image": {"uri": "img:1"}, "timeout": 600});
    let with = |k: &str, v: Value| {
        let mut b = base();
        b[k] = v;
        b
    };
    for (body, starts, ends) in [
        (
            with("timeout", json!(31_536_000)),
            "timeout: must be between 1 and 2592000",
            "(seconds)",
        ),
        (
            with("resourceLimits", json!({"cpu": "300"})),
            "resourceLimits.cpu: ",
            "(whole CPUs)",
        ),
        (
            with("resourceLimits", json!({"memory": "64Mi"})),
            "resourceLimits.memory: ",
            "(MiB)",
        ),
        (
            with("resourceLimits", json!({"disk": "100000Ti"})),
            "resourceLimits.ephemeral-storage: ",
            "(GiB)",
        ),
        (
            with("metadata", json!({"k": "v".repeat(300)})),
            "metadata.k: ",
            "",
        ),
        (json!({"image": {"uri": ""}}), "image.uri: ", ""),
    ] {
        let a = osb(
            &api,
            Method::POST,
            "/v1/sandboxes",
            Some(&key),
            body.clone(),
        )
        .await;
        assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
        let msg = a.body["message"].as_str().unwrap();
        assert!(
            msg.starts_with(starts) && msg.ends_with(ends),
            "{body}: {msg}"
        );
        for v1 in ["ttlSeconds", "resources", "memoryMiB", "labels", "template"] {
            assert!(!msg.contains(v1), "{body}: {msg}");
        }
    }
    // An organization-wide key names the project with the extension.
    let org_wide = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;
    let a = osb(&api, Method::POST, "/v1/sandboxes", Some(&org_wide), base()).await;
    assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
    let msg = a.body["message"].as_str().unwrap();
    assert!(
        msg.starts_with("extensions.differently.projectId: required"),
        "{msg}"
    );
    // Renew: an expiry beyond the longest TTL names `expiresAt`, in its own terms.
    let id = api.live_sandbox().await;
    let at = (chrono::Utc::now() + chrono::TimeDelta::days(60)).to_rfc3339();
    let a = osb(
        &api,
        Method::POST,
        &format!("/v1/sandboxes/{id}/renew-expiration"),
        Some(&key),
        json!({ "expiresAt": at }),
    )
    .await;
    assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
    let msg = a.body["message"].as_str().unwrap();
    assert!(
        msg.starts_with("expiresAt: must be at most 2592000 seconds (30 days) from now"),
        "{msg}"
    );
    // execd: a command's timeout is execd's (milliseconds, /v1 counts seconds); a path
    // check names `path` once.
    let tok = api.facade_execd_token(&id).await;
    let auth = [HOST, ("x-differently-execd-token", tok.as_str())];
    let a = api
        .call(
            Method::POST,
            &format!("/opensandbox/execd/{id}/command"),
            None,
            json!({"command": "true", "timeout": 1_000_000_000_000u64}),
            &auth,
        )
        .await;
    assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
    let msg = a.body["message"].as_str().unwrap();
    assert!(
        msg.starts_with("timeout: ") && msg.ends_with("(seconds)"),
        "{msg}"
    );
    for (m, path, body, want) in [
        (
            Method::DELETE,
            "/directories?path=rel",
            Value::Null,
            "path: must be absolute",
        ),
        (
            Method::POST,
            "/directories",
            json!({"rel": {"mode": 755}}),
            "path: must be absolute",
        ),
        (
            Method::POST,
            "/files/mv",
            json!([{"src": "/a", "dest": "b"}]),
            "dest: must be absolute",
        ),
    ] {
        let a = api
            .call(
                m,
                &format!("/opensandbox/execd/{id}{path}"),
                None,
                body,
                &auth,
            )
            .await;
        assert_osb_error(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
        assert_eq!(a.body["message"], want, "{path}");
    }
}

/// A killed sandbox looks the same on every facade route: 404 `SANDBOX_NOT_FOUND`, as a
/// lifecycle `GET` answers (the real server has no such sandbox any more), where `/v1`'s
/// data plane says 409 "needs a running sandbox".
#[tokio::test]
async fn a_killed_sandbox_is_not_found_on_every_route() {
    let api = api().await;
    let _ops = api.complete_ops();
    let key = api.key.clone();
    let id = api.live_sandbox().await;
    let tok = api.facade_execd_token(&id).await;
    let a = osb(
        &api,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&key),
        Value::Null,
    )
    .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.body);
    for (m, path, body) in [
        (Method::GET, "", Value::Null),
        (Method::DELETE, "", Value::Null),
        (Method::POST, "/pause", Value::Null),
        (Method::POST, "/resume", Value::Null),
        (
            Method::POST,
            "/renew-expiration",
            json!({"expiresAt": (chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339()}),
        ),
        (Method::GET, "/endpoints/44772", Value::Null),
        (Method::POST, "/snapshots", json!({})),
    ] {
        let a = osb(
            &api,
            m.clone(),
            &format!("/v1/sandboxes/{id}{path}"),
            Some(&key),
            body,
        )
        .await;
        assert_osb_error(&a, StatusCode::NOT_FOUND, "DIFFERENTLY::SANDBOX_NOT_FOUND");
    }
    let auth = [HOST, ("x-differently-execd-token", tok.as_str())];
    for (m, path, body) in [
        (Method::GET, "/ping", Value::Null),
        (Method::POST, "/command", json!({"command": "true"})),
        (Method::POST, "/command", json!({"argv": ["true"]})),
        (Method::GET, "/command/status/1", Value::Null),
        (Method::GET, "/command/1/logs", Value::Null),
        (Method::DELETE, "/command?id=1", Value::Null),
        (Method::GET, "/files/download?path=%2Fa", Value::Null),
        (Method::GET, "/files/info?path=%2Fa", Value::Null),
        (Method::GET, "/files/search?path=%2F", Value::Null),
        (Method::GET, "/directories/list?path=%2F", Value::Null),
        (Method::DELETE, "/files?path=%2Fa", Value::Null),
        (
            Method::POST,
            "/files/mv",
            json!([{"src": "/a", "dest": "/b"}]),
        ),
        (
            Method::POST,
            "/files/permissions",
            json!({"/a": {"mode": 644}}),
        ),
        (Method::POST, "/directories", json!({"/d": {"mode": 755}})),
        (Method::DELETE, "/directories?path=%2Fd", Value::Null),
        (Method::POST, "/session", json!({})),
        (
            Method::POST,
            "/session/session-01abc/run",
            json!({"command": "true"}),
        ),
        (Method::DELETE, "/session/session-01abc", Value::Null),
        (Method::POST, "/pty", json!({})),
        (Method::GET, "/pty/pty_01abc", Value::Null),
        (Method::DELETE, "/pty/pty_01abc", Value::Null),
        (Method::GET, "/pty/pty_01abc/ws", Value::Null),
    ] {
        let a = api
            .call(
                m.clone(),
                &format!("/opensandbox/execd/{id}{path}"),
                None,
                body,
                &auth,
            )
            .await;
        assert_osb_error(&a, StatusCode::NOT_FOUND, "DIFFERENTLY::SANDBOX_NOT_FOUND");
    }
    let multipart = "--b\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\r\n{\"path\":\"/tmp/a\"}\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nhi\r\n--b--\r\n";
    let mut headers = auth.to_vec();
    headers.push(("content-type", "multipart/form-data; boundary=b"));
    let a = api
        .call_raw(
            Method::POST,
            &format!("/opensandbox/execd/{id}/files/upload"),
            None,
            multipart.as_bytes().to_vec(),
            &headers,
        )
        .await;
    assert_osb_error(&a, StatusCode::NOT_FOUND, "DIFFERENTLY::SANDBOX_NOT_FOUND");
}
