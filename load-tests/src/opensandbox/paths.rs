//! The timed paths of one bench round: straight to the server, through the adapter, through
//! Differently's routes, and the audit append alone.

use super::*;

/// What counts as ready for a sandbox created straight on the server.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ready {
    /// The first OK execd `/ping`.
    Ping,
    /// The first execd command `true` that completes.
    ExecTrue,
}

/// Create → first `ready` answer, straight to the server (no Differently in the path),
/// timed; the sandbox is deleted afterwards (untimed). `tag` labels it as the bench's.
pub(crate) async fn create_direct(
    s: &Server,
    image: &str,
    memory: &str,
    tag: &str,
    ready: Ready,
    within: Duration,
) -> Result<f64, LoadError> {
    let body = json!({
        "image": {"uri": image},
        "entrypoint": ["tail", "-f", "/dev/null"],
        "timeout": 600,
        "resourceLimits": {"cpu": "1", "memory": memory},
        "metadata": {"differently-bench": tag},
    });
    let t = Instant::now();
    let created = s
        .json(
            s.req(reqwest::Method::POST, "/sandboxes").json(&body),
            "direct create",
        )
        .await?;
    let id = created["id"]
        .as_str()
        .ok_or_else(|| LoadError::Check(format!("create answer without id: {created}")))?
        .to_owned();
    let result = async {
        let mut base = None;
        let mut last = String::new();
        while t.elapsed() < within {
            if base.is_none() {
                match s.execd_base(&id).await {
                    Ok(b) => base = Some(b),
                    Err(e) => last = e.to_string(),
                }
            }
            if let Some(b) = &base {
                match probe(s, b, ready).await {
                    Ok(()) => return Ok(ms(t.elapsed())),
                    Err(e) => last = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(LoadError::Timeout(format!(
            "{id}: not ready ({ready:?}) within {within:?}; last: {last}"
        )))
    }
    .await;
    s.delete(&id).await?;
    result
}

/// One readiness probe of execd at `base`.
pub(super) async fn probe(s: &Server, base: &str, ready: Ready) -> Result<(), String> {
    match ready {
        Ready::Ping => {
            let r = s
                .http
                .get(format!("{base}/ping"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if r.status().is_success() {
                Ok(())
            } else {
                Err(format!("/ping answered {}", r.status()))
            }
        }
        Ready::ExecTrue => run_execd(s, base, false, "true", "")
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    }
}

/// Create → ready through the adapter in this process; deleted (untimed).
pub(super) async fn create_adapter(
    a: &OpenSandboxAdapter,
    installation: &InstallationId,
) -> Result<f64, LoadError> {
    let req = CreateInstance {
        sandbox_id: SandboxId::new(),
        installation_id: installation.clone(),
        template: None,
        resources: differently_core::Resources {
            cpu: 1,
            memory_mib: 512,
            disk_gib: 1,
        },
        env: Default::default(),
        ttl_seconds: 600,
        from_snapshot: None,
    };
    let t = Instant::now();
    let made = a.create(&req).await;
    let took = ms(t.elapsed());
    let deleted = a.delete(&req.sandbox_id).await;
    made.map_err(|e| LoadError::Check(format!("adapter create: {e}")))?;
    deleted.map_err(|e| LoadError::Check(format!("adapter delete: {e}")))?;
    Ok(took)
}

/// Create → `running` through Differently; deleted and waited out (untimed).
pub(super) async fn create_differently(api: &Api) -> Result<f64, LoadError> {
    let body = json!({"resources": {"cpu": 1, "memoryMiB": 512, "diskGiB": 1}, "ttlSeconds": 600});
    let t = Instant::now();
    let v = api
        .expect(
            reqwest::Method::POST,
            "/v1/sandboxes",
            Some(body),
            202,
            "create",
        )
        .await?;
    let id = v["id"]
        .as_str()
        .ok_or_else(|| LoadError::Check(format!("create answer without id: {v}")))?
        .to_owned();
    let waited = api.wait(&id, "running").await;
    let took = ms(t.elapsed());
    api.expect(
        reqwest::Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
        202,
        "delete",
    )
    .await?;
    api.wait(&id, "terminated").await?;
    waited.map(|()| took)
}

/// `echo hi` on execd at `base` (direct or the server's proxy), read until
/// `execution_complete`; checks the output.
pub(super) async fn exec_execd(s: &Server, base: &str, with_key: bool) -> Result<f64, LoadError> {
    run_execd(s, base, with_key, "echo hi", "hi").await
}

/// `command` on execd at `base`, read until `execution_complete`; checks that its stdout,
/// trailing whitespace aside, is `want`. Milliseconds from sending to `execution_complete`.
pub(crate) async fn run_execd(
    s: &Server,
    base: &str,
    with_key: bool,
    command: &str,
    want: &str,
) -> Result<f64, LoadError> {
    let mut rb = s
        .http
        .post(format!("{base}/command"))
        .json(&json!({"command": command}))
        .timeout(Duration::from_secs(30));
    if with_key {
        rb = rb.header("OPEN-SANDBOX-API-KEY", &s.key);
    }
    let t = Instant::now();
    let mut r = rb
        .send()
        .await
        .map_err(|e| LoadError::http("execd exec", e))?;
    if !r.status().is_success() {
        return Err(LoadError::Api {
            context: "execd exec".to_owned(),
            status: r.status().as_u16(),
            body: String::new(),
        });
    }
    let mut buf = String::new();
    let mut stdout = String::new();
    loop {
        let chunk = r
            .chunk()
            .await
            .map_err(|e| LoadError::http("execd stream", e))?;
        let Some(chunk) = chunk else {
            return Err(LoadError::Check(format!(
                "execd stream ended without execution_complete after {:.1} ms; \
                 stdout so far {stdout:?}, unparsed {buf:?}",
                ms(t.elapsed())
            )));
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(nl) = buf.find('\n') {
            let line: String = buf.drain(..=nl).collect();
            let line = line.trim().trim_start_matches("data:").trim();
            let Ok(ev) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            match ev["type"].as_str() {
                Some("stdout") => stdout.push_str(ev["text"].as_str().unwrap_or_default()),
                Some("execution_complete") => {
                    let took = ms(t.elapsed());
                    if stdout.trim_end() != want {
                        return Err(LoadError::Check(format!(
                            "execd {command:?} printed {stdout:?}"
                        )));
                    }
                    return Ok(took);
                }
                Some("error") => {
                    return Err(LoadError::Check(format!("execd exec failed: {ev}")));
                }
                _ => {}
            }
        }
    }
}

/// `echo hi` through the adapter in this process; checks the result.
pub(super) async fn exec_adapter(
    a: &OpenSandboxAdapter,
    at: &InstanceRef,
) -> Result<f64, LoadError> {
    let req = ExecRequest {
        command: vec!["echo".to_owned(), "hi".to_owned()],
        ..Default::default()
    };
    let t = Instant::now();
    let out = a
        .exec(at, &req)
        .await
        .map_err(|e| LoadError::Check(format!("adapter exec: {e}")))?;
    let took = ms(t.elapsed());
    if out.exit_code == 141 {
        return Err(LoadError::Check(format!(
            "adapter echo hi: broken pipe (exit 141): {out:?}"
        )));
    }
    if out.exit_code != 0 || out.stdout != "hi\n" {
        return Err(LoadError::Check(format!("adapter echo hi: {out:?}")));
    }
    Ok(took)
}

/// A record of the benchmark's own on the installation chain, about `resource`.
pub(super) fn probe_event(action: &str, resource: &str) -> differently_store::audit::NewAuditEvent {
    differently_store::audit::NewAuditEvent {
        org_id: None,
        project_id: None,
        actor: "system:bench".to_owned(),
        action: action.to_owned(),
        resource: resource.to_owned(),
        outcome: "ok".to_owned(),
        detail: json!({}),
    }
}

/// One audit record appended and committed through the store.
pub(super) async fn audit_append(
    store: &differently_store::postgres::PgStore,
    id: &str,
) -> Result<f64, LoadError> {
    let ev = probe_event("bench.audit_probe", id);
    let t = Instant::now();
    differently_store::audit::AuditStore::append_audit(store, ev)
        .await
        .map_err(|e| LoadError::Store {
            context: "audit append".to_owned(),
            source: e,
        })?;
    Ok(ms(t.elapsed()))
}

/// One guarded record staged as the exec route stages its own; only the swap is timed.
pub(super) async fn audit_stage(
    store: &differently_store::postgres::PgStore,
    id: &SandboxId,
) -> Result<f64, LoadError> {
    use differently_store::audit::{AuditStore, RowGuard};
    let store_err = |context: &str| {
        let context = context.to_owned();
        move |source| LoadError::Store { context, source }
    };
    let row = differently_store::SandboxReadStore::get_sandbox(store, id)
        .await
        .map_err(store_err("read the exec sandbox"))?
        .ok_or_else(|| LoadError::Check(format!("sandbox {id} is gone")))?;
    let guard = RowGuard {
        sandbox: id.clone(),
        status: row.status,
        status_version: row.status_version,
    };
    let ev = probe_event("bench.audit_stage_probe", id.as_str());
    let t = Instant::now();
    let staged = store
        .stage_audit_if(ev, &guard)
        .await
        .map_err(store_err("stage an audit record"))?
        .ok_or_else(|| LoadError::Check(format!("sandbox {id} moved under the probe")))?;
    let took = ms(t.elapsed());
    staged
        .commit()
        .await
        .map_err(store_err("commit a staged audit record"))?;
    Ok(took)
}

/// An authenticated read of the sandbox through the API.
pub(super) async fn api_get(api: &Api, id: &str) -> Result<f64, LoadError> {
    let t = Instant::now();
    api.expect(
        reqwest::Method::GET,
        &format!("/v1/sandboxes/{id}"),
        None,
        200,
        "get sandbox",
    )
    .await?;
    Ok(ms(t.elapsed()))
}

/// `GET /healthz` through the API: the HTTP hop with nothing behind it.
pub(super) async fn api_hop(api: &Api) -> Result<f64, LoadError> {
    let t = Instant::now();
    api.expect(reqwest::Method::GET, "/healthz", None, 200, "healthz")
        .await?;
    Ok(ms(t.elapsed()))
}

/// `echo hi` through Differently's exec route; checks the answer.
pub(super) async fn exec_differently(api: &Api, id: &str) -> Result<f64, LoadError> {
    let t = Instant::now();
    let v = api
        .expect(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": ["echo", "hi"]})),
            200,
            "exec",
        )
        .await?;
    let took = ms(t.elapsed());
    if v["exitCode"] == 141 {
        return Err(LoadError::Check(format!(
            "exec echo hi: broken pipe (exit 141): {v}"
        )));
    }
    if v["exitCode"] != 0 || v["stdout"] != "hi\n" {
        return Err(LoadError::Check(format!("exec echo hi answered {v}")));
    }
    Ok(took)
}

/// `echo hi` through Differently's streamed exec route (SSE), read to its `exit` event;
/// checks the output and the exit code.
pub(super) async fn exec_differently_stream(api: &Api, id: &str) -> Result<f64, LoadError> {
    let what = "exec stream";
    let t = Instant::now();
    let mut r = api
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", api.base))
        .bearer_auth(&api.key)
        .json(&json!({"command": ["echo", "hi"]}))
        .send()
        .await
        .map_err(|e| LoadError::http(what, e))?;
    let status = r.status().as_u16();
    if status != 200 {
        let body = r.text().await.unwrap_or_default();
        return Err(LoadError::Api {
            context: what.to_owned(),
            status,
            body: body.chars().take(300).collect(),
        });
    }
    let mut reader = crate::sse::SseReader::default();
    let mut stdout = Vec::new();
    let mut exit = None;
    while exit.is_none() {
        let Some(chunk) = r.chunk().await.map_err(|e| LoadError::http(what, e))? else {
            break;
        };
        for ev in reader.push(&chunk) {
            let data: Value = serde_json::from_slice(&ev.data).unwrap_or(Value::Null);
            match ev.event.as_str() {
                "stdout" => {
                    stdout.extend_from_slice(data["data"].as_str().unwrap_or("").as_bytes())
                }
                "exit" | "error" => exit = Some(data),
                _ => {}
            }
        }
    }
    let took = ms(t.elapsed());
    let exit = exit.ok_or_else(|| LoadError::Check("exec stream ended without exit".into()))?;
    if exit["exitCode"] == 141 {
        return Err(LoadError::Check(format!(
            "exec stream echo hi: broken pipe (exit 141): {exit}"
        )));
    }
    if exit["exitCode"] != 0 || stdout != b"hi\n" {
        return Err(LoadError::Check(format!(
            "exec stream echo hi ended {exit} with stdout {:?}",
            String::from_utf8_lossy(&stdout)
        )));
    }
    Ok(took)
}
