//! Directory listings read from `find -printf` output, for the providers that list files by
//! running a command in the sandbox (azure_sessions, cloudflare, runloop, agent_sandbox):
//! one parser for the record each of their scripts prints.

use chrono::{DateTime, Utc};

use crate::{FileEntry, FileKind};

/// Which of size (`%s`) and mode (`%m`) a script prints first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fields {
    /// `%y %s %m %T@ <path>`.
    SizeMode,
    /// `%y %m %s %T@ <path>`.
    ModeSize,
}

/// One record: the type (`%y`), size and mode in `fields` order, the modification time
/// (`%T@`) and the path or name (the rest, which may hold `sep`), separated by `sep`. `None`
/// for a record that does not read (a cut or garbled line); an unreadable time is left out.
pub fn record(record: &str, sep: char, fields: Fields) -> Option<FileEntry> {
    let mut f = record.splitn(5, sep);
    let (kind, a, b, mtime, path) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let (size, mode) = match fields {
        Fields::SizeMode => (a, b),
        Fields::ModeSize => (b, a),
    };
    Some(FileEntry {
        path: path.to_owned(),
        kind: match kind {
            "f" => FileKind::File,
            "d" => FileKind::Dir,
            "l" => FileKind::Symlink,
            _ => FileKind::Other,
        },
        size: size.parse().ok()?,
        mode: u32::from_str_radix(mode, 8).ok()? & 0o7777,
        modified_at: mtime.parse::<f64>().ok().and_then(time),
    })
}

/// `%T@` (seconds since the epoch, with a fraction) as a time.
fn time(secs: f64) -> Option<DateTime<Utc>> {
    let nanos = ((secs.fract() * 1e9) as u32).min(999_999_999);
    DateTime::from_timestamp(secs.trunc() as i64, nanos)
}

/// `rel` (find's `%P` or `%f`) as a path under `base`; an empty `rel` is `base` itself.
pub fn under(base: &str, rel: &str) -> String {
    let trimmed = base.trim_end_matches('/');
    if rel.is_empty() {
        base.to_owned()
    } else {
        format!("{trimmed}/{rel}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_in_either_field_order() {
        let e = record(
            "f 100000 640 1733480000.5 /tmp/a b/data.bin",
            ' ',
            Fields::SizeMode,
        )
        .unwrap();
        assert_eq!(
            (e.kind, e.size, e.mode, e.path.as_str()),
            (FileKind::File, 100_000, 0o640, "/tmp/a b/data.bin")
        );
        assert_eq!(e.modified_at.map(|t| t.timestamp()), Some(1_733_480_000));
        let e = record("l\t3\t777\t1.0\t/x", '\t', Fields::SizeMode).unwrap();
        assert_eq!((e.kind, e.size, e.mode), (FileKind::Symlink, 3, 0o777));
        let e = record("d 755 4096 1700000001.0 sub", ' ', Fields::ModeSize).unwrap();
        assert_eq!((e.kind, e.size, e.mode), (FileKind::Dir, 4096, 0o755));
        let e = record("f\t1\t644\tnot-a-time\t/y", '\t', Fields::SizeMode).unwrap();
        assert_eq!(e.modified_at, None);
        assert!(record("garbage", ' ', Fields::SizeMode).is_none());
        assert!(record("f x 644 1.0 /z", ' ', Fields::SizeMode).is_none());
    }

    #[test]
    fn relative_names_join_their_base() {
        assert_eq!(under("/tmp/d", "sub/a b"), "/tmp/d/sub/a b");
        assert_eq!(under("/", "etc"), "/etc");
        assert_eq!(under("/tmp/f", ""), "/tmp/f");
        assert_eq!(under("/w/", "a"), "/w/a");
    }
}
