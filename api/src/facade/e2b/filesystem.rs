//! envd's `filesystem.Filesystem` service: `Stat` and `ListDir` from `/v1`'s file listing,
//! `MakeDir` on `/v1`'s `POST …/files/directories`, `Move` and `Remove` as one-shot commands
//! through `/v1` exec (`mv`, `rm`: every backend that runs commands has them). The polling watchers (`CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher`) are in `watchers`; the `WatchDir` stream in `watch`.
//!
//! `EntryInfo` carries what `/v1` lists: name, type, path, size, permission bits and their
//! `ls`-style string, modification time. Owner and group are not listed by `/v1` and are
//! left empty.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::facade::opensandbox::inner::q;

use super::connect::{self, ConnectError};
use super::envd::{ctx, Ctx, EnvdError};
use super::{watchers, Facade, InnerError};

const MAX_REQUEST: usize = 64 << 10;
/// `/v1`'s deepest listing.
const MAX_DEPTH: u64 = 10;
/// The exit code the facade's `mv` script uses for "not found" (never `mv`'s own).
const MISSING: i64 = 44;
/// The exit code the facade's `mv` script uses for "the destination is a directory".
const DIRECTORY_THERE: i64 = 45;

/// `POST /filesystem.Filesystem/{method}`.
pub async fn call(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(method): Path<String>,
    body: Body,
) -> Response {
    let c = match ctx(&f, &headers, None) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let req = match axum::body::to_bytes(body, MAX_REQUEST).await {
        Ok(b) => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            connect::request(ct, &b)
        }
        Err(_) => Err(ConnectError::new(
            "resource_exhausted",
            "request over 64 KiB",
        )),
    };
    let req = match req {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    // Paths resolve against the home, which a create may still be making.
    if super::home::is_made(&c.home) {
        f.homes.ensure(&f, &c.caller, &c.sandbox).await;
    }
    let answer = match method.as_str() {
        "Stat" => stat(&f, &c, &req).await,
        "ListDir" => list_dir(&f, &c, &req).await,
        "MakeDir" => make_dir(&f, &c, &req).await,
        "Move" => move_entry(&f, &c, &req).await,
        "Remove" => remove(&f, &c, &req).await,
        "CreateWatcher" => watchers::create(&f, &c, &req).await,
        "GetWatcherEvents" => watchers::events(&f, &c, &req),
        "RemoveWatcher" => watchers::remove(&f, &c, &req),
        other => Err(ConnectError::new(
            "unimplemented",
            format!("filesystem.Filesystem/{other} is not an envd method"),
        )
        .into()),
    };
    match answer {
        Ok(v) => connect::unary(v),
        Err(e) => e.into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    /// The SDKs' proto3 JSON leaves out a field holding its default, so `""` (the user's
    /// home, as envd resolves it) arrives as no field at all.
    #[serde(default)]
    path: String,
    depth: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

fn parse<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, EnvdError> {
    serde_json::from_value(v.clone()).map_err(|e| ConnectError::field("body", e).into())
}

/// Go's mode string (`drwxr-xr-x`) of a type and permission bits.
fn permissions(kind: &str, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        "dir" => 'd',
        "symlink" => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// envd's `EntryInfo` of a `/v1` listing item.
pub(super) fn entry(item: &Value) -> Value {
    let path = item["path"].as_str().unwrap_or_default();
    let kind = item["type"].as_str().unwrap_or_default();
    let mode = item["mode"].as_u64().unwrap_or(0) as u32 & 0o7777;
    let name = path.rsplit('/').next().unwrap_or_default();
    let mut e = json!({
        "name": if path == "/" { "/" } else { name },
        "type": match kind {
            "file" => "FILE_TYPE_FILE",
            "dir" => "FILE_TYPE_DIRECTORY",
            // envd reports a link by its target's type; /v1 does not say it, so a file.
            "symlink" => "FILE_TYPE_FILE",
            _ => "FILE_TYPE_UNSPECIFIED",
        },
        "path": path,
        "size": item["size"].as_u64().unwrap_or(0).to_string(),
        "mode": mode & 0o777,
        "permissions": permissions(kind, mode),
        "owner": "",
        "group": "",
    });
    if kind == "symlink" {
        e["isSymlink"] = json!(true);
    }
    if let Some(t) = item["modifiedAt"].as_str() {
        e["modifiedTime"] = json!(t);
    }
    e
}

fn not_found(path: &str) -> EnvdError {
    ConnectError::new("not_found", format!("path '{path}' does not exist")).into()
}

/// The `/v1` listing of `path` (`depth` levels below it).
pub(super) async fn listing(
    f: &Facade,
    c: &Ctx,
    path: &str,
    depth: u64,
) -> Result<Vec<Value>, EnvdError> {
    let uri = format!(
        "/v1/sandboxes/{}/files/list?path={}&depth={depth}",
        q(&c.sandbox),
        q(path)
    );
    match c.json(f, Method::GET, &uri, None).await {
        Ok(v) => Ok(v["items"].as_array().cloned().unwrap_or_default()),
        Err(EnvdError::Rpc(e)) if e.code == "not_found" => Err(not_found(path)),
        Err(e) => Err(e),
    }
}

/// The entry of one path: its parent's listing, filtered.
pub(super) async fn entry_of(f: &Facade, c: &Ctx, path: &str) -> Result<Value, EnvdError> {
    if path == "/" {
        return Ok(entry(&json!({ "path": "/", "type": "dir", "mode": 0o755 })));
    }
    let parent = match path.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((p, _)) => p,
    };
    listing(f, c, parent, 1)
        .await?
        .iter()
        .find(|i| i["path"] == path)
        .map(entry)
        .ok_or_else(|| not_found(path))
}

async fn stat(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: PathRequest = parse(req)?;
    let path = c.resolve(&r.path);
    Ok(json!({ "entry": entry_of(f, c, &path).await? }))
}

async fn list_dir(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: PathRequest = parse(req)?;
    let path = c.resolve(&r.path);
    let depth = r.depth.unwrap_or(1).max(1);
    if depth > MAX_DEPTH {
        return Err(ConnectError::field("depth", format!("at most {MAX_DEPTH}")).into());
    }
    let dir = entry_of(f, c, &path).await?;
    if dir["type"] != "FILE_TYPE_DIRECTORY" {
        return Err(ConnectError::field("path", format!("'{path}' is not a directory")).into());
    }
    let entries: Vec<Value> = listing(f, c, &path, depth)
        .await?
        .iter()
        .map(entry)
        .collect();
    Ok(json!({ "entries": entries }))
}

/// A failed helper command as a Connect error: what the facade's other file calls say for a
/// path refused as it stands, else envd's `internal` (as its `Move` and `Remove` answer any
/// failure of the call but a missing source).
fn command_failed(what: &str, path: &str, stderr: &str) -> EnvdError {
    let code = if stderr.contains("Permission denied") || stderr.contains("Read-only") {
        "permission_denied"
    } else if stderr.contains("Not a directory") || stderr.contains("not a directory") {
        "invalid_argument"
    } else {
        "internal"
    };
    ConnectError::new(code, format!("{what} '{path}': {}", stderr.trim())).into()
}

async fn make_dir(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: PathRequest = parse(req)?;
    let path = c.resolve(&r.path);
    let uri = format!("/v1/sandboxes/{}/files/directories", q(&c.sandbox));
    let body = json!({ "path": path });
    let created = match f
        .json(&c.caller, Method::POST, &uri, Some(&body), &[])
        .await
    {
        Ok((_, v)) => v["created"].as_bool().unwrap_or(false),
        // Something other than a directory there: envd says "already exists" for it too.
        Err(InnerError::Answer(status, b)) if status == StatusCode::CONFLICT && exists(&b) => false,
        Err(e) => return Err(EnvdError::from_inner(&c.sandbox, e)),
    };
    if !created {
        return Err(ConnectError::new(
            "already_exists",
            format!("directory '{path}' already exists"),
        )
        .into());
    }
    Ok(json!({ "entry": entry_of(f, c, &path).await? }))
}

/// Whether a `/v1` 409 says something already is at the path.
fn exists(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .is_ok_and(|v| v["error"]["details"]["reason"] == "exists_not_directory")
}

/// envd's `Move`, which is Go's `os.Rename`: rename(2), except that a destination that is
/// a directory (empty or not, the source itself included) is refused with EEXIST before the
/// call. So: a file or directory onto a file or symlink replaces it, anything onto a
/// directory is an error, a file onto itself is a no-op; a missing source is `not_found`,
/// any other failure `internal`; the entry answered is the destination's. The call is
/// `mv -T` (GNU and busybox: the destination is never a directory to move into) after
/// making the destination's parent, as envd does.
async fn move_entry(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: MoveRequest = parse(req)?;
    let (src, dst) = (c.resolve(&r.source), c.resolve(&r.destination));
    if src == dst {
        // rename(2) of a path onto itself does nothing; Go refuses it for a directory.
        let entry = entry_of(f, c, &src).await?;
        if entry["type"] == "FILE_TYPE_DIRECTORY" {
            return Err(directory_there(&src, &dst));
        }
        return Ok(json!({ "entry": entry }));
    }
    let script = format!(
        r#"[ -e "$1" ] || [ -L "$1" ] || exit {MISSING}; [ -d "$2" ] && [ ! -L "$2" ] && exit {DIRECTORY_THERE}; mkdir -p -- "$(dirname -- "$2")" && mv -T -- "$1" "$2""#
    );
    let (code, _, stderr) = c
        .exec(f, &["/bin/sh", "-c", &script, "sh", &src, &dst])
        .await?;
    match code {
        0 => Ok(json!({ "entry": entry_of(f, c, &dst).await? })),
        MISSING => Err(not_found(&src)),
        DIRECTORY_THERE => Err(directory_there(&src, &dst)),
        _ => Err(command_failed("cannot move", &src, &stderr)),
    }
}

/// envd's answer to a move onto a directory (Go's `os.Rename`: EEXIST).
fn directory_there(src: &str, dst: &str) -> EnvdError {
    ConnectError::new(
        "internal",
        format!("error renaming: rename {src} {dst}: file exists (the destination is a directory)"),
    )
    .into()
}

async fn remove(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: PathRequest = parse(req)?;
    // `""` would be the whole home (envd removes it); only a path named removes anything.
    if r.path.is_empty() {
        return Err(ConnectError::field("path", "required: the path to remove").into());
    }
    let path = c.resolve(&r.path);
    if path == "/" {
        return Err(ConnectError::field("path", "cannot remove /").into());
    }
    let (code, _, stderr) = c.exec(f, &["rm", "-rf", "--", &path]).await?;
    if code != 0 {
        return Err(command_failed("cannot remove", &path, &stderr));
    }
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_left_out_is_the_empty_path() {
        // The SDKs' proto3 JSON drops `path: ""`: the home, as envd resolves it.
        let r: PathRequest = parse(&json!({})).unwrap();
        assert_eq!(r.path, "");
        let r: PathRequest = parse(&json!({"depth": 2})).unwrap();
        assert_eq!((r.path.as_str(), r.depth), ("", Some(2)));
    }

    #[test]
    fn a_failed_move_is_envds_internal_unless_the_path_is_refused_as_it_stands() {
        let code = |stderr: &str| match command_failed("cannot move", "/a", stderr) {
            EnvdError::Rpc(e) => e.code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code("mv: cannot overwrite non-directory '/b' with directory '/a'"),
            "internal"
        );
        assert_eq!(
            code("mv: cannot move '/a': Permission denied"),
            "permission_denied"
        );
        assert_eq!(
            code("mv: cannot stat '/a/x': Not a directory"),
            "invalid_argument"
        );
        match directory_there("/a", "/b") {
            EnvdError::Rpc(e) => {
                assert_eq!(e.code, "internal");
                assert!(
                    e.message.contains("rename /a /b: file exists"),
                    "{}",
                    e.message
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn entries_look_like_envds() {
        let e = entry(
            &json!({"path": "/home/user/a.txt", "type": "file", "size": 35,
            "mode": 0o644, "modifiedAt": "2026-12-06T05:33:23.941454Z"}),
        );
        assert_eq!(e["name"], "a.txt");
        assert_eq!(e["type"], "FILE_TYPE_FILE");
        assert_eq!(e["size"], "35");
        assert_eq!(e["mode"], 0o644);
        assert_eq!(e["permissions"], "-rw-r--r--");
        let d = entry(&json!({"path": "/d", "type": "dir", "size": 0, "mode": 0o755}));
        assert_eq!(d["permissions"], "drwxr-xr-x");
        assert_eq!(d["type"], "FILE_TYPE_DIRECTORY");
    }
}
