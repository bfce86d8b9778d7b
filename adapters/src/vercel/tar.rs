//! The one-file gzip-compressed tar Vercel's `fs/write` takes. Written by hand (a ustar
//! header, and deflate's *stored* blocks inside gzip) rather than with a compression crate:
//! file bodies are mostly already compressed or small, and no new dependency is needed.

/// CRC-32 (IEEE), as gzip's trailer wants it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// A ustar archive holding one regular file `name` (relative, `/`-separated) with `mode`.
pub fn tar_one(name: &str, mode: u32, body: &[u8]) -> Result<Vec<u8>, &'static str> {
    let mut header = [0u8; 512];
    let bytes = name.as_bytes();
    // ustar: up to 100 bytes of name, and a 155-byte prefix split at a `/`.
    let (prefix, base) = if bytes.len() <= 100 {
        (&[][..], bytes)
    } else {
        let split = bytes[..bytes.len().min(156)]
            .iter()
            .rposition(|b| *b == b'/')
            .filter(|i| bytes.len() - i - 1 <= 100 && *i <= 155)
            .ok_or("path too long for a tar header")?;
        (&bytes[..split], &bytes[split + 1..])
    };
    header[..base.len()].copy_from_slice(base);
    let octal = |field: &mut [u8], v: u64| {
        let s = format!("{:0width$o}", v, width = field.len() - 1);
        field[..s.len()].copy_from_slice(s.as_bytes());
    };
    octal(&mut header[100..108], u64::from(mode & 0o7777));
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(
        &mut header[124..136],
        u64::try_from(body.len()).map_err(|_| "file too large")?,
    );
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    octal(&mut header[136..148], mtime);
    header[148..156].copy_from_slice(b"        ");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[345..345 + prefix.len()].copy_from_slice(prefix);
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    let s = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(s.as_bytes());

    let pad = (512 - body.len() % 512) % 512;
    let mut out = Vec::with_capacity(512 + body.len() + pad + 1024);
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    out.extend(std::iter::repeat_n(0u8, pad + 1024));
    Ok(out)
}

/// `data` in a gzip member of stored (uncompressed) deflate blocks.
pub fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + data.len() / 65535 * 5 + 32);
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    let mut chunks = data.chunks(65535).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        out.push(u8::from(chunks.peek().is_none()));
        let len = u16::try_from(c.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(c);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(u32::try_from(data.len() % (1 << 32)).unwrap_or(0)).to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_of_the_check_string() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn the_archive_has_a_valid_header_and_the_body() {
        let t = tar_one("home/user/a.txt", 0o640, b"hi").unwrap();
        assert_eq!(t.len(), 512 + 512 + 1024);
        assert_eq!(&t[..15], b"home/user/a.txt");
        assert_eq!(&t[100..107], b"0000640");
        assert_eq!(&t[124..135], b"00000000002");
        assert_eq!(&t[512..514], b"hi");
        let sum: u32 = t[..512]
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(*b)
                }
            })
            .sum();
        let stored = u32::from_str_radix(std::str::from_utf8(&t[148..154]).unwrap(), 8).unwrap();
        assert_eq!(stored, sum);
        let long = format!("{}/f", "d".repeat(120));
        let t = tar_one(&long, 0o644, b"").unwrap();
        assert_eq!(&t[..1], b"f");
        assert!(tar_one(&"x".repeat(300), 0o644, b"").is_err());
    }

    #[test]
    fn gzip_members_frame_stored_blocks() {
        let data = vec![7u8; 70_000];
        let g = gzip_stored(&data);
        assert_eq!(&g[..3], &[0x1f, 0x8b, 8]);
        assert_eq!(g[10], 0, "first block not final");
        assert_eq!(g.len(), 10 + 5 + 65535 + 5 + (70_000 - 65535) + 8);
        let empty = gzip_stored(b"");
        assert_eq!(&empty[10..15], &[1, 0, 0, 0xff, 0xff]);
    }
}
