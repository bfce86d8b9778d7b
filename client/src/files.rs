//! Files in a sandbox, as served: upload (raw body), download (whole, a range, or chunk by
//! chunk into a writer), list a directory, stat one path, delete, make a directory. An upload
//! creates the parents it needs too, and a listing descends `depth` levels.

use bytes::Bytes;
use reqwest::Method;

use crate::{
    query, sandbox_path, Client, Error, FileEntry, FileList, MadeDir, MakeDirectory, Result,
    TransportError,
};

fn files_path(id: &str, rest: &str, pairs: &[(&str, Option<String>)]) -> String {
    sandbox_path(id, &format!("/files{rest}{}", query(pairs)))
}

fn check(path: &str) -> Result<()> {
    if !path.starts_with('/') {
        return Err(Error::invalid(
            "path",
            format!("{path:?} is not absolute (paths in a sandbox start with /)"),
        ));
    }
    Ok(())
}

impl Client {
    /// `PUT …/files?path=`: writes `bytes` at `path` (parents created), with `mode` (octal
    /// permission bits such as `644`) when given.
    pub async fn upload(
        &self,
        id: &str,
        path: &str,
        bytes: impl Into<Bytes>,
        mode: Option<u32>,
    ) -> Result<()> {
        check(path)?;
        let p = files_path(
            id,
            "",
            &[
                ("path", Some(path.to_owned())),
                ("mode", mode.map(|m| format!("{m:o}"))),
            ],
        );
        let rb = self
            .authorized(Method::PUT, &p)
            .header("content-type", "application/octet-stream")
            .body(bytes.into());
        let resp = self.send(&Method::PUT, &p, rb).await?;
        let url = resp.url().to_string();
        resp.bytes()
            .await
            .map_err(|e| TransportError::new("PUT", &url, self.base_url(), e))?;
        Ok(())
    }

    /// `GET …/files?path=`: the whole file.
    pub async fn download(&self, id: &str, path: &str) -> Result<Bytes> {
        let mut out = Vec::new();
        self.download_to(id, path, None, &mut out).await?;
        Ok(Bytes::from(out))
    }

    /// `GET …/files?path=` with `Range: bytes=start-end` (inclusive; `end` `None` for the
    /// rest): the bytes of that range.
    pub async fn download_range(
        &self,
        id: &str,
        path: &str,
        start: u64,
        end: Option<u64>,
    ) -> Result<Bytes> {
        let mut out = Vec::new();
        self.download_to(id, path, Some((start, end)), &mut out)
            .await?;
        Ok(Bytes::from(out))
    }

    /// Streams the file (or a range) into `w` as it arrives; the bytes written.
    pub async fn download_to(
        &self,
        id: &str,
        path: &str,
        range: Option<(u64, Option<u64>)>,
        w: &mut impl std::io::Write,
    ) -> Result<u64> {
        check(path)?;
        let p = files_path(id, "", &[("path", Some(path.to_owned()))]);
        let mut rb = self.authorized(Method::GET, &p);
        if let Some((start, end)) = range {
            let end = end.map(|e| e.to_string()).unwrap_or_default();
            rb = rb.header("range", format!("bytes={start}-{end}"));
        }
        let mut resp = self.send(&Method::GET, &p, rb).await?;
        let url = resp.url().to_string();
        let mut n = 0u64;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| TransportError::new("GET", &url, self.base_url(), e))?
        {
            w.write_all(&chunk)
                .map_err(|e| Error::invalid("destination", format!("cannot write {path}: {e}")))?;
            n += chunk.len() as u64;
        }
        Ok(n)
    }

    /// `GET …/files/list?path=&depth=`: a directory's entries, `depth` levels down
    /// (default 1). A file's path lists that file alone.
    pub async fn list_files(
        &self,
        id: &str,
        path: &str,
        depth: Option<u32>,
    ) -> Result<Vec<FileEntry>> {
        check(path)?;
        let p = files_path(
            id,
            "/list",
            &[
                ("path", Some(path.to_owned())),
                ("depth", depth.map(|d| d.to_string())),
            ],
        );
        let list: FileList = self.json::<_, ()>(Method::GET, &p, None, &[]).await?;
        Ok(list.items)
    }

    /// What is at `path`: a file's own entry, or for a directory an entry of type `dir`
    /// (`None`: nothing there). Served by the listing route, which answers a file's entry.
    pub async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>> {
        let entries = match self.list_files(id, path, Some(1)).await {
            Ok(e) => e,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let trimmed = path.trim_end_matches('/');
        if let Some(own) = entries.iter().find(|e| e.path == path || e.path == trimmed) {
            return Ok(Some(own.clone()));
        }
        Ok(Some(FileEntry {
            path: if trimmed.is_empty() {
                "/".to_owned()
            } else {
                trimmed.to_owned()
            },
            kind: "dir".to_owned(),
            size: 0,
            mode: 0,
            modified_at: None,
            extra: Default::default(),
        }))
    }

    /// `DELETE …/files?path=`.
    pub async fn delete_file(&self, id: &str, path: &str) -> Result<()> {
        check(path)?;
        let p = files_path(id, "", &[("path", Some(path.to_owned()))]);
        self.empty::<()>(Method::DELETE, &p, None).await
    }

    /// `POST …/files/directories`: makes the directory at `path` and any missing parents
    /// (`mkdir -p`; parents get `755`), with `mode` (octal permission bits such as `0o750`,
    /// default `755`) when given. `created` says whether it was made (201) or a directory was
    /// already there (200, its mode left as it was). A file at `path` or among its parents is
    /// a 409 `conflict`.
    pub async fn make_dir(&self, id: &str, path: &str, mode: Option<u32>) -> Result<MadeDir> {
        check(path)?;
        let body = MakeDirectory {
            path: path.to_owned(),
            mode: mode.map(|m| format!("{m:o}")),
        };
        let p = files_path(id, "/directories", &[]);
        self.json(Method::POST, &p, Some(&body), &[]).await
    }
}

/// A 404 about the file (not the sandbox: that one says "sandbox").
fn is_missing(e: &Error) -> bool {
    e.api()
        .is_some_and(|a| a.status == 404 && !a.message.to_lowercase().contains("sandbox"))
}
