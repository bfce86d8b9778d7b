//! The bash scripts the adapter sends as `shellCommand`: a Shell session runs one string in
//! bash, so Differently's argument vector, environment and working directory are spelled into
//! it with every value single-quoted, and the file operations the files API cannot do alone
//! (a path outside the data directory, a mode, a listing with modes) are short scripts whose
//! exit codes are the adapter's own.

use std::collections::BTreeMap;

/// Exit code of the exec script when the requested `cwd` is not a directory, with
/// [`CWD_MARKER`] on stderr.
pub(crate) const CWD_EXIT: i32 = 97;
pub(crate) const CWD_MARKER: &str = "differently: cwd is not a directory";

/// Exit codes of the file scripts.
pub(crate) const MISSING: i32 = 3;
pub(crate) const IS_DIR: i32 = 4;
pub(crate) const NOT_DIR: i32 = 5;
pub(crate) const NOT_EMPTY: i32 = 6;

/// `s` as one bash word.
pub(crate) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The contents of the sandbox's environment file: one `export NAME='value'` a line.
pub(crate) fn env_file(env: &BTreeMap<String, String>) -> String {
    env.iter()
        .map(|(k, v)| format!("export {k}={}\n", quote(v)))
        .collect()
}

/// Writes stdin to `path` (mode 0600, its directory made).
pub(crate) fn write_env_script(path: &str) -> String {
    let dir = path
        .rsplit_once('/')
        .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
    format!(
        "umask 077 && mkdir -p -- {} && cat > {}",
        quote(dir),
        quote(path)
    )
}

/// Runs `argv` with the sandbox environment file sourced, then `env`, in `cwd`.
pub(crate) fn exec_script(
    env_file: &str,
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    argv: &[String],
) -> String {
    let mut s = format!("if [ -r {f} ]; then . {f}; fi; ", f = quote(env_file));
    for (k, v) in env {
        s.push_str(&format!("export {k}={}; ", quote(v)));
    }
    if let Some(dir) = cwd {
        s.push_str(&format!(
            "cd -- {} 2>/dev/null || {{ printf '%s' {} >&2; exit {CWD_EXIT}; }}; ",
            quote(dir),
            quote(CWD_MARKER)
        ));
    }
    s.push_str("exec");
    for a in argv {
        s.push(' ');
        s.push_str(&quote(a));
    }
    s
}

/// Moves the staged upload `staged` to `path` (parents made) and sets `mode`.
pub(crate) fn place_script(staged: &str, path: &str, mode: Option<u32>) -> String {
    let (s, p) = (quote(staged), quote(path));
    let dir = path
        .rsplit_once('/')
        .map_or("/", |(d, _)| if d.is_empty() { "/" } else { d });
    let chmod = mode.map_or(String::new(), |m| format!(" && chmod {m:o} -- {p}"));
    format!(
        "if [ -d {p} ]; then rm -f -- {s}; exit {IS_DIR}; fi; \
         mkdir -p -- {d} 2>/dev/null || {{ rm -f -- {s}; exit {NOT_DIR}; }}; \
         mv -f -- {s} {p}{chmod}",
        d = quote(dir)
    )
}

/// Copies `path` to the staging file `staged` for the files API to serve.
pub(crate) fn stage_script(path: &str, staged: &str) -> String {
    let p = quote(path);
    format!(
        "[ -e {p} ] || exit {MISSING}; [ -d {p} ] && exit {IS_DIR}; cp -- {p} {}",
        quote(staged)
    )
}

/// Lists `path` to `depth` levels: `type size mode mtime path`, NUL-terminated.
pub(crate) fn list_script(path: &str, depth: u32) -> String {
    let p = quote(path);
    format!(
        "[ -e {p} ] || exit {MISSING}; [ -d {p} ] || exit {NOT_DIR}; \
         find {p} -mindepth 1 -maxdepth {} -printf '%y %s %m %T@ %p\\0'",
        depth.max(1)
    )
}

/// Removes a file, a link or an empty directory.
pub(crate) fn remove_script(path: &str) -> String {
    let p = quote(path);
    format!(
        "if [ -d {p} ] && [ ! -L {p} ]; then rmdir -- {p} 2>/dev/null || exit {NOT_EMPTY}; \
         elif [ -e {p} ] || [ -L {p} ]; then rm -f -- {p}; else exit {MISSING}; fi"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_every_byte_one_word() {
        assert_eq!(quote("it's"), r"'it'\''s'");
        let env = BTreeMap::from([("A".to_owned(), "x y".to_owned())]);
        let s = exec_script(
            "/tmp/e",
            &env,
            Some("/w d"),
            &["printf".into(), "%s".into()],
        );
        assert_eq!(
            s,
            "if [ -r '/tmp/e' ]; then . '/tmp/e'; fi; export A='x y'; \
             cd -- '/w d' 2>/dev/null || { printf '%s' 'differently: cwd is not a directory' >&2; exit 97; }; \
             exec 'printf' '%s'"
        );
        assert_eq!(env_file(&env), "export A='x y'\n");
        assert_eq!(
            write_env_script("/tmp/.d/env"),
            "umask 077 && mkdir -p -- '/tmp/.d' && cat > '/tmp/.d/env'"
        );
    }
}
