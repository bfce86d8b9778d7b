//! Daytona's toolbox (the daemon inside each sandbox, reached through the toolbox proxy at
//! `{toolboxURL}/{sandboxId}`): process execution, sessions and files. Wire types and one
//! function per call; the adapter decides what they mean.

use reqwest::{Method, Response};
use serde::{Deserialize, Serialize};

use super::client::{Client, Side};
use crate::kit::multipart::Multipart;
use crate::kit::paths::segment;
use crate::{AdapterError, ByteStream};

/// The toolbox's code for a command that outlived its `timeout` (a 408, with no output).
pub(crate) const TIMEOUT_CODE: &str = "PROCESS_EXECUTION_TIMEOUT";

/// `POST /process/execute`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ExecuteBody {
    pub command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub envs: std::collections::BTreeMap<String, String>,
    /// Seconds; the spec's default is 10, so it is always sent.
    pub timeout: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecuteAnswer {
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    result: String,
}

/// How a synchronous execute ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Executed {
    /// Output is stdout and stderr together (the toolbox combines them).
    Done {
        exit_code: i32,
        output: String,
    },
    TimedOut,
}

/// Runs a command to completion; `http_timeout` covers the whole call.
pub(crate) async fn execute(
    c: &Client,
    id: &str,
    body: &ExecuteBody,
    http_timeout: std::time::Duration,
) -> Result<Executed, AdapterError> {
    let op = "exec";
    let rb = c
        .toolbox(Method::POST, id, "/process/execute")
        .json(body)
        .timeout(http_timeout);
    let http = c.http(Side::Toolbox);
    let resp = match http.call(rb, op).await? {
        Ok(resp) => resp,
        Err(a) if a.status.as_u16() == 408 && a.error().code == TIMEOUT_CODE => {
            return Ok(Executed::TimedOut)
        }
        Err(a) => return Err(http.map_answer(op, &a)),
    };
    let ans: ExecuteAnswer = http.decode(op, resp).await?;
    Ok(Executed::Done {
        // An answer without an exit code is a command the daemon could not start.
        exit_code: ans.exit_code.unwrap_or(127),
        output: ans.result,
    })
}

/// `POST /process/session {sessionId}`.
pub(crate) async fn create_session(c: &Client, id: &str, sid: &str) -> Result<(), AdapterError> {
    c.send_ok(
        Side::Toolbox,
        c.toolbox(Method::POST, id, "/process/session")
            .json(&serde_json::json!({ "sessionId": sid })),
        "exec: create session",
    )
    .await
    .map(drop)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionExecAnswer {
    cmd_id: String,
}

/// `POST /process/session/{sid}/exec {command, runAsync: true}`: the command's id.
pub(crate) async fn session_exec(
    c: &Client,
    id: &str,
    sid: &str,
    command: &str,
) -> Result<String, AdapterError> {
    let path = format!("/process/session/{}/exec", segment(sid));
    let ans: SessionExecAnswer = c
        .json(
            Side::Toolbox,
            c.toolbox(Method::POST, id, &path).json(&serde_json::json!({
                "command": command,
                "runAsync": true,
            })),
            "exec: start command",
        )
        .await?;
    Ok(ans.cmd_id)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Command {
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// `GET /process/session/{sid}/command/{cmd}`: `exitCode` once it ended.
pub(crate) async fn command(
    c: &Client,
    id: &str,
    sid: &str,
    cmd: &str,
) -> Result<Command, AdapterError> {
    let path = format!("/process/session/{}/command/{}", segment(sid), segment(cmd));
    c.json(
        Side::Toolbox,
        c.toolbox(Method::GET, id, &path),
        "exec: command status",
    )
    .await
}

/// A command's output so far, each stream whole.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Logs {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

/// `GET /process/session/{sid}/command/{cmd}/logs` (JSON, not the WebSocket follow).
pub(crate) async fn logs(c: &Client, id: &str, sid: &str, cmd: &str) -> Result<Logs, AdapterError> {
    let path = format!(
        "/process/session/{}/command/{}/logs",
        segment(sid),
        segment(cmd)
    );
    c.json(
        Side::Toolbox,
        c.toolbox(Method::GET, id, &path)
            .header("Accept", "application/json"),
        "exec: command logs",
    )
    .await
}

/// `DELETE /process/session/{sid}`: ends the session and what runs in it; a missing one is fine.
pub(crate) async fn delete_session(c: &Client, id: &str, sid: &str) -> Result<(), AdapterError> {
    let path = format!("/process/session/{}", segment(sid));
    match c
        .send_ok(
            Side::Toolbox,
            c.toolbox(Method::DELETE, id, &path),
            "exec: end session",
        )
        .await
    {
        Ok(_) | Err(AdapterError::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `GET /version`: the daemon answers (readiness).
pub(crate) async fn version(c: &Client, id: &str) -> Result<(), AdapterError> {
    c.send_ok(
        Side::Toolbox,
        c.toolbox(Method::GET, id, "/version"),
        "toolbox version",
    )
    .await
    .map(drop)
}

/// One entry of `GET /files` or `GET /files/info`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileInfo {
    pub name: String,
    #[serde(default)]
    pub is_dir: bool,
    #[serde(default)]
    pub size: u64,
    /// Go's `FileMode.String()`: `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`.
    #[serde(default)]
    pub mode: String,
    /// Octal permission bits (`0644`).
    #[serde(default)]
    pub permissions: String,
    #[serde(default)]
    pub modified_at: Option<String>,
}

/// A file operation: a 404 is the path, not the sandbox.
async fn file_call(
    c: &Client,
    rb: reqwest::RequestBuilder,
    op: &str,
    path: &str,
) -> Result<Response, AdapterError> {
    c.http(Side::Toolbox).file_call(rb, op, path).await
}

/// `GET /files?path=`: the directory's entries.
pub(crate) async fn list(c: &Client, id: &str, path: &str) -> Result<Vec<FileInfo>, AdapterError> {
    let op = "list files";
    let resp = file_call(
        c,
        c.toolbox(Method::GET, id, "/files")
            .query(&[("path", path)]),
        op,
        path,
    )
    .await?;
    c.http(Side::Toolbox).decode(op, resp).await
}

/// `GET /files/info?path=`.
pub(crate) async fn info(c: &Client, id: &str, path: &str) -> Result<FileInfo, AdapterError> {
    let op = "file info";
    let resp = file_call(
        c,
        c.toolbox(Method::GET, id, "/files/info")
            .query(&[("path", path)]),
        op,
        path,
    )
    .await?;
    c.http(Side::Toolbox).decode(op, resp).await
}

/// `GET /files/download?path=`: the whole file (the toolbox has no ranges).
pub(crate) async fn download(c: &Client, id: &str, path: &str) -> Result<Response, AdapterError> {
    file_call(
        c,
        c.toolbox(Method::GET, id, "/files/download")
            .query(&[("path", path)]),
        "download",
        path,
    )
    .await
}

/// `DELETE /files?path=` (not recursive: a non-empty directory is refused).
pub(crate) async fn delete(c: &Client, id: &str, path: &str) -> Result<(), AdapterError> {
    file_call(
        c,
        c.toolbox(Method::DELETE, id, "/files")
            .query(&[("path", path)]),
        "delete file",
        path,
    )
    .await
    .map(drop)
}

/// `POST /files/permissions?path=&mode=` (octal).
pub(crate) async fn chmod(c: &Client, id: &str, path: &str, mode: u32) -> Result<(), AdapterError> {
    let mode = format!("{:o}", mode & 0o7777);
    file_call(
        c,
        c.toolbox(Method::POST, id, "/files/permissions")
            .query(&[("path", path), ("mode", mode.as_str())]),
        "set file mode",
        path,
    )
    .await
    .map(drop)
}

/// `POST /files/upload?path=`, multipart part `file`, streamed.
pub(crate) async fn upload(
    c: &Client,
    id: &str,
    path: &str,
    body: ByteStream,
) -> Result<(), AdapterError> {
    let form = Multipart::new();
    let rb = c
        .toolbox(Method::POST, id, "/files/upload")
        .query(&[("path", path)])
        .header("Content-Type", form.content_type())
        .body(form.streamed("file", path, body));
    file_call(c, rb, "upload", path).await.map(drop)
}
