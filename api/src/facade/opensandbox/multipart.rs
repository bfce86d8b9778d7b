//! Just enough `multipart/form-data` for execd's upload: parts with their
//! `Content-Disposition` name and filename and their bytes. The body is read whole first
//! (bounded by the caller), so this is a parser over one buffer.

/// One part.
#[derive(Debug, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub filename: Option<String>,
    pub data: Vec<u8>,
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (mime, params) = content_type.split_once(';')?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (from..=hay.len() - needle.len()).find(|&i| &hay[i..i + needle.len()] == needle)
}

fn param(disposition: &str, key: &str) -> Option<String> {
    disposition.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The parts of `body`, or why it is not multipart.
pub fn parse(body: &[u8], boundary: &str) -> Result<Vec<Part>, String> {
    let delim = format!("--{boundary}");
    let mut pos = find(body, delim.as_bytes(), 0).ok_or("no multipart boundary in the body")?;
    let mut parts = Vec::new();
    loop {
        pos += delim.len();
        if body[pos..].starts_with(b"--") {
            return Ok(parts);
        }
        let head_start = pos
            + if body[pos..].starts_with(b"\r\n") {
                2
            } else {
                0
            };
        let head_end = find(body, b"\r\n\r\n", head_start).ok_or("a part has no header end")?;
        let head = String::from_utf8_lossy(&body[head_start..head_end]);
        let disposition = head
            .split("\r\n")
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-disposition")
                    .then(|| v.trim().to_owned())
            })
            .ok_or("a part has no Content-Disposition")?;
        let data_start = head_end + 4;
        let next = find(body, format!("\r\n{delim}").as_bytes(), data_start)
            .ok_or("a part is not terminated by the boundary")?;
        parts.push(Part {
            name: param(&disposition, "name").unwrap_or_default(),
            filename: param(&disposition, "filename"),
            data: body[data_start..next].to_vec(),
        });
        pos = next + 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sdk_upload() {
        let ct = "multipart/form-data; boundary=opensandbox_x";
        let b = boundary(ct).unwrap();
        let body = b"--opensandbox_x\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{\"path\":\"/tmp/a\"}\r\n--opensandbox_x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nhi\r\n\r\n--opensandbox_x--\r\n";
        let parts = parse(body, &b).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "metadata");
        assert_eq!(parts[0].filename.as_deref(), Some("metadata"));
        assert_eq!(parts[1].data, b"hi\r\n");
        assert!(parse(b"junk", &b).is_err());
        assert_eq!(boundary("application/json"), None);
    }
}
