//! The shell text sent to Runloop: its executions take one command line, run by the devbox
//! shell, so an argv with env, cwd and stdin becomes a script with every piece single-quoted,
//! and the file operations the API lacks (listing, delete, directories, modes) are small
//! scripts whose exit codes say what happened.

use std::collections::BTreeMap;

use crate::kit::shell::{self, quote};

/// Exit codes of the file scripts, each a distinct answer (a real failure of a command in
/// them keeps its own small code).
pub(crate) mod code {
    /// The path does not exist.
    pub const MISSING: i32 = 70;
    /// The path is a directory where a file is needed.
    pub const IS_DIR: i32 = 71;
    /// A parent of the path is not a directory.
    pub const NOT_DIR: i32 = 72;
    /// A directory to delete is not empty.
    pub const NOT_EMPTY: i32 = 73;
}

/// Whether `name` can be exported by a shell (`[A-Za-z_][A-Za-z0-9_]*`): anything else
/// would be shell text, not a name.
pub(crate) fn env_name_ok(name: &str) -> bool {
    let mut b = name.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The command line running `argv` with `env` exported, in `cwd`, reading `stdin_file`
/// (removed once opened) or, without one, an empty stdin rather than whatever the execution
/// has.
pub(crate) fn command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    stdin_file: Option<&str>,
) -> String {
    let wrap = shell::Wrap {
        env: Some(env),
        cwd,
        stdin_file,
    };
    let script = shell::script(argv, &wrap);
    match stdin_file {
        Some(_) => script,
        None => format!("{{\n{script}\n}} < /dev/null"),
    }
}

/// Whether `path` is a directory: exit 0 if so, [`code::MISSING`] otherwise.
pub(crate) fn is_dir(path: &str) -> String {
    format!("[ -d {} ] || exit {}", quote(path), code::MISSING)
}

/// Readies `path` for an upload: its parent directories made, refusing a directory in its
/// place or a file among its parents.
pub(crate) fn prepare_upload(path: &str) -> String {
    let p = quote(path);
    let parent = match path.rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => path[..i].to_owned(),
    };
    format!(
        "[ -d {p} ] && exit {dir}\nmkdir -p -- {d} 2>/dev/null || exit {notdir}\nexit 0",
        dir = code::IS_DIR,
        d = quote(&parent),
        notdir = code::NOT_DIR,
    )
}

/// Sets `path`'s permission bits.
pub(crate) fn chmod(path: &str, mode: u32) -> String {
    format!("chmod {:o} -- {}", mode & 0o7777, quote(path))
}

/// What `path` is: `d` directory, `f` file, or [`code::MISSING`].
pub(crate) fn kind(path: &str) -> String {
    let p = quote(path);
    format!(
        "if [ -d {p} ]; then echo d; elif [ -e {p} ]; then echo f; else exit {}; fi",
        code::MISSING
    )
}

/// Removes a file, link or empty directory.
pub(crate) fn delete(path: &str) -> String {
    let p = quote(path);
    format!(
        "[ -e {p} ] || [ -L {p} ] || exit {missing}\n\
         if [ -d {p} ] && [ ! -L {p} ]; then rmdir -- {p} 2>/dev/null || exit {full}; \
         else rm -f -- {p}; fi",
        missing = code::MISSING,
        full = code::NOT_EMPTY,
    )
}

/// Lists `dir` `depth` levels deep, one NUL-ended record per entry: type letter, size,
/// octal mode, modification time (seconds, fractional), path; tab-separated (GNU find).
pub(crate) fn list(dir: &str, depth: u32) -> String {
    let d = quote(dir);
    format!(
        "[ -e {d} ] || exit {missing}\n[ -d {d} ] || exit {notdir}\n\
         find {d} -mindepth 1 -maxdepth {depth} -printf '%y\\t%s\\t%m\\t%T@\\t%p\\0'",
        missing = code::MISSING,
        notdir = code::NOT_DIR,
        depth = depth.max(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> (i32, String) {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    #[test]
    fn a_command_reads_an_empty_stdin_and_its_env_and_cwd() {
        let argv: Vec<String> = ["sh", "-c", "cat; printf '%s|%s' \"$V\" \"$(pwd)\""]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let env = BTreeMap::from([("V".to_owned(), "x 'y'".to_owned())]);
        let c = command(&argv, &env, Some("/"), None);
        assert_eq!(sh(&c), (0, "x 'y'|/".to_owned()));
        assert!(
            env_name_ok("_A1") && !env_name_ok("1A") && !env_name_ok("A;rm") && !env_name_ok("")
        );
    }

    #[test]
    fn file_scripts_answer_their_codes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap().to_owned();
        let file = format!("{d}/a/b.txt");
        assert_eq!(sh(&prepare_upload(&file)).0, 0);
        std::fs::write(&file, "x").unwrap();
        assert_eq!(sh(&prepare_upload(&format!("{file}/c"))).0, code::NOT_DIR);
        assert_eq!(sh(&prepare_upload(&format!("{d}/a"))).0, code::IS_DIR);
        assert_eq!(sh(&kind(&file)), (0, "f\n".to_owned()));
        assert_eq!(sh(&delete(&format!("{d}/a"))).0, code::NOT_EMPTY);
        assert_eq!(sh(&delete(&file)).0, 0);
        assert_eq!(sh(&delete(&file)).0, code::MISSING);
        assert_eq!(sh(&list(&format!("{d}/nope"), 1)).0, code::MISSING);
    }
}
