//! Files over the runtime: its `/upload` and `/download/{path}` move bytes (relative to its
//! base directory, which is why paths must lie under `runtime.baseDir`); it has no endpoint
//! for modes or deletes, and its `/list` has no modes, so those are small scripts run
//! through `/execute` (`script.rs`).

use futures::StreamExt;

use super::runtime::Call;
use super::script;
use super::AgentSandboxAdapter;
use crate::kit::listing::{self, Fields};
use crate::{AdapterError, ByteRange, ByteStream, Download, FileEntry, InstanceRef, PathProblem};

/// How long a file script may run.
const SCRIPT_SECS: u64 = 60;

impl AgentSandboxAdapter {
    /// `path` relative to the runtime's base directory; refused when it is not absolute,
    /// leaves the base, or has characters the runtime's multipart filename cannot carry.
    fn rel(&self, path: &str) -> Result<String, AdapterError> {
        let bad = |why: &str| {
            Err(AdapterError::invalid_field(
                "path",
                format!("`{path}` {why}"),
            ))
        };
        if !path.starts_with('/') {
            return bad("is not an absolute path");
        }
        if path.contains(['\0', '"', '\r', '\n']) {
            return bad("has characters this runtime cannot carry (NUL, quote, CR, LF)");
        }
        let mut parts: Vec<&str> = Vec::new();
        for c in path.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                c => parts.push(c),
            }
        }
        let normal = format!("/{}", parts.join("/"));
        let base = &self.settings.base_dir;
        let rel = if base == "/" {
            Some(normal.trim_start_matches('/'))
        } else if normal == *base {
            Some("")
        } else {
            normal
                .strip_prefix(base.as_str())
                .and_then(|r| r.strip_prefix('/'))
        };
        match rel {
            Some(r) => Ok(r.to_owned()),
            None => bad(&format!(
                "is outside the runtime's base directory {base} (runtime.baseDir)"
            )),
        }
    }

    async fn script_files(
        &self,
        at: &InstanceRef,
        path: &str,
        s: &str,
    ) -> Result<String, AdapterError> {
        let done = self.run_script(at, s, SCRIPT_SECS).await?;
        match script::refusal(done.exit_code, &done.stderr) {
            None if done.exit_code == 0 => Ok(done.stdout),
            None => Err(AdapterError::permanent(format!(
                "files: exit {}: {}",
                done.exit_code,
                done.stderr.trim_end()
            ))),
            Some(script::NO_PATH) => Err(AdapterError::PathNotFound(path.to_owned())),
            Some(script::NOT_DIR) => Err(AdapterError::bad_path(path, PathProblem::NotADirectory)),
            Some(script::NOT_EMPTY) => Err(AdapterError::invalid_field(
                "path",
                format!("`{path}` is a directory that is not empty"),
            )),
            Some(other) => Err(AdapterError::permanent(format!("files: {other}"))),
        }
    }

    pub(super) async fn put_file(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        let rel = self.rel(path)?;
        if rel.is_empty() || path.ends_with('/') {
            return Err(AdapterError::bad_path(path, PathProblem::IsADirectory));
        }
        // The runtime reads the whole multipart body before writing it.
        let whole = crate::files::read_whole(body, usize::MAX, "").await?;
        if let Err(c) = self
            .runtime
            .upload(&at.backend_ref, &rel, path, whole.into())
            .await
        {
            return Err(self.call_error(&at.backend_ref, c).await);
        }
        if let Some(mode) = mode {
            self.script_files(at, path, &script::chmod_script(path, mode))
                .await?;
        }
        Ok(())
    }

    pub(super) async fn get_file(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        let rel = self.rel(path)?;
        let resp = match self.runtime.download(&at.backend_ref, &rel, path).await {
            Ok(r) => r,
            Err(Call::Failed(e)) => return Err(e),
            Err(c) => return Err(self.call_error(&at.backend_ref, c).await),
        };
        let total_size = resp.content_length();
        let runtime = self.runtime.clone();
        let whole = resp
            .bytes_stream()
            .map(move |c| c.map_err(|e| runtime.transport_error("download", e)));
        // The runtime answers whole files: the range is cut here.
        Ok(Download {
            total_size,
            body: crate::files::cut_to_range(whole, range),
        })
    }

    pub(super) async fn list_dir(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        self.rel(path)?;
        crate::files::list_levels(path, depth, |dir| async move {
            let out = self
                .script_files(at, &dir, &script::list_script(&dir))
                .await?;
            Ok(parse_listing(&dir, &out))
        })
        .await
    }

    pub(super) async fn remove_file(
        &self,
        at: &InstanceRef,
        path: &str,
    ) -> Result<(), AdapterError> {
        let rel = self.rel(path)?;
        if rel.is_empty() {
            return Err(AdapterError::invalid_field(
                "path",
                "the runtime's base directory itself cannot be deleted",
            ));
        }
        self.script_files(at, path, &script::delete_script(path))
            .await
            .map(|_| ())
    }
}

/// `find -printf '%y %m %s %T@ %f\0'` output → entries under `dir`.
fn parse_listing(dir: &str, out: &str) -> Vec<FileEntry> {
    out.split('\0')
        .filter(|r| !r.is_empty())
        .filter_map(|rec| {
            let mut e = listing::record(rec, ' ', Fields::ModeSize)?;
            e.path = listing::under(dir, &e.path);
            Some(e)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileKind;

    #[test]
    fn listings_parse_kind_mode_size_and_time() {
        let out = "f 640 11 1700000000.5 a b.txt\0d 755 4096 1700000001.0 sub\0l 777 3 1.0 ln\0";
        let e = parse_listing("/w", out);
        assert_eq!(e.len(), 3);
        assert_eq!(
            (e[0].path.as_str(), e[0].kind, e[0].mode, e[0].size),
            ("/w/a b.txt", FileKind::File, 0o640, 11)
        );
        assert_eq!((e[1].kind, e[2].kind), (FileKind::Dir, FileKind::Symlink));
        assert!(e[0].modified_at.is_some());
    }
}
