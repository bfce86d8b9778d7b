//! Command lines for the runtime's `/execute`, which splits its string with `shlex.split` and
//! runs the words without a shell, in its base directory, with no env, stdin or timeout of
//! the caller's. So every exec is `sh -c '<script>'` whose script does what the runtime
//! cannot: change directory, add env, feed stdin from a file, and bound the command with
//! `timeout` (coreutils). File operations the runtime has no endpoint for (listing with
//! modes, delete, chmod) are scripts too. Exit codes 196-199 are the scripts' own answers,
//! each paired with a marker line on stderr so a command's own exit code is never mistaken
//! for one.

use std::collections::BTreeMap;

/// Stderr line of a `cd` that failed (the cwd is not a directory).
pub(crate) const NO_CWD: &str = "differently-agent-sandbox: cwd is not a directory";
/// Stderr line of a path that does not exist.
pub(crate) const NO_PATH: &str = "differently-agent-sandbox: no such path";
/// Stderr line of a listing of something that is not a directory.
pub(crate) const NOT_DIR: &str = "differently-agent-sandbox: not a directory";
/// Stderr line of a delete of a directory that is not empty.
pub(crate) const NOT_EMPTY: &str = "differently-agent-sandbox: directory not empty";

/// Exit code of the script's own refusals.
pub(crate) const REFUSED: i64 = 199;

/// `s` single-quoted for `sh` (and so for `shlex.split`, which reads quotes the same way).
pub(crate) fn sq(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for ch in s.chars() {
        if ch == '\'' {
            out.push_str("'\"'\"'");
        } else {
            out.push(ch);
        }
    }
    out.push('\'');
    out
}

/// The `/execute` command line running `script` in `sh -c`.
pub(crate) fn sh_line(script: &str) -> String {
    format!("sh -c {}", sq(script))
}

fn refuse(marker: &str) -> String {
    format!("{{ printf '%s\\n' {} >&2; exit {REFUSED}; }}", sq(marker))
}

/// What an exec runs with besides its argv.
pub(crate) struct Exec<'a> {
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: Option<&'a str>,
    /// A file holding stdin; unlinked once opened.
    pub stdin_file: Option<&'a str>,
    pub timeout_secs: u64,
}

/// The script of one exec: cd, stdin, then `timeout` (TERM, KILL 2 s later) over `env`.
pub(crate) fn exec_script(e: &Exec<'_>) -> String {
    let mut s = String::new();
    if let Some(cwd) = e.cwd {
        s.push_str(&format!(
            "cd -- {} 2>/dev/null || {}\n",
            sq(cwd),
            refuse(NO_CWD)
        ));
    }
    match e.stdin_file {
        Some(f) => s.push_str(&format!("exec 0<{q} && rm -f -- {q}\n", q = sq(f))),
        None => s.push_str("exec 0</dev/null\n"),
    }
    s.push_str(&format!("exec timeout -k 2 {} env", e.timeout_secs.max(1)));
    for (k, v) in e.env {
        s.push(' ');
        s.push_str(&sq(&format!("{k}={v}")));
    }
    for a in e.argv {
        s.push(' ');
        s.push_str(&sq(a));
    }
    s
}

/// Lists one directory: per entry `type mode size mtime name`, NUL-terminated.
pub(crate) fn list_script(dir: &str) -> String {
    let d = sq(dir);
    format!(
        "[ -e {d} ] || {}\n[ -d {d} ] || {}\nexec find {d} -mindepth 1 -maxdepth 1 -printf '%y %m %s %T@ %f\\0'",
        refuse(NO_PATH),
        refuse(NOT_DIR)
    )
}

/// Removes a file, a symlink or an empty directory.
pub(crate) fn delete_script(path: &str) -> String {
    let p = sq(path);
    format!(
        "if [ -d {p} ] && [ ! -L {p} ]; then rmdir -- {p} 2>/dev/null || {}; elif [ -e {p} ] || [ -L {p} ]; then rm -f -- {p}; else {}; fi",
        refuse(NOT_EMPTY),
        refuse(NO_PATH)
    )
}

/// Sets a file's permission bits.
pub(crate) fn chmod_script(path: &str, mode: u32) -> String {
    format!("exec chmod {:o} -- {}", mode & 0o7777, sq(path))
}

/// Which refusal a script's answer is, if it is one.
pub(crate) fn refusal(exit_code: i64, stderr: &str) -> Option<&'static str> {
    if exit_code != REFUSED {
        return None;
    }
    let last = stderr.lines().last()?;
    [NO_CWD, NO_PATH, NOT_DIR, NOT_EMPTY]
        .into_iter()
        .find(|m| *m == last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_shell_splitting() {
        assert_eq!(sq("it's"), r#"'it'"'"'s'"#);
        assert_eq!(sh_line("echo 'a b'"), r#"sh -c 'echo '"'"'a b'"'"''"#);
    }

    #[test]
    fn exec_scripts_wrap_cwd_stdin_env_and_timeout() {
        let env = BTreeMap::from([("X".to_owned(), "a b".to_owned())]);
        let argv = vec!["cat".to_owned()];
        let s = exec_script(&Exec {
            argv: &argv,
            env: &env,
            cwd: Some("/w"),
            stdin_file: Some("/app/.in"),
            timeout_secs: 5,
        });
        assert!(s.starts_with("cd -- '/w' 2>/dev/null || {"), "{s}");
        assert!(
            s.contains("exec 0<'/app/.in' && rm -f -- '/app/.in'"),
            "{s}"
        );
        assert!(s.ends_with("exec timeout -k 2 5 env 'X=a b' 'cat'"), "{s}");
        assert_eq!(refusal(199, &format!("x\n{NO_CWD}\n")), Some(NO_CWD));
        assert_eq!(refusal(199, "something else"), None);
        assert_eq!(refusal(1, NO_CWD), None);
        assert_eq!(chmod_script("/a", 0o640), "exec chmod 640 -- '/a'");
    }
}
