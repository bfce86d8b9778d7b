//! The shell scripts the adapter runs through the bridge's `/exec`, for what the bridge has
//! no route of its own: running a command with env, cwd, stdin and a deadline, placing and
//! fetching files anywhere (the file routes only reach `/workspace`), listing, deleting,
//! and the index. Each runs as `sh -c SCRIPT sh ARGS…`; the bridge shell-quotes every argv
//! element, so the arguments arrive exactly as given.
//!
//! Every exec is sent with `cwd: /workspace`, and the scripts take the workspace from where
//! they start (`$PWD`) rather than spelling it: a path the caller gives under `/workspace`
//! is read relative to it, so the scripts agree with the file routes about where the
//! workspace is.

/// The adapter keeps its own files in `.differently` of a sandbox's workspace: the marker,
/// the sandbox's environment, transfers in flight and the pid files of running commands.
/// The marker file: the sandbox and installation ids, written last at create.
pub(crate) const MARKER: &str = ".differently/sandbox.json";
/// The sandbox's environment, sourced by every command.
pub(crate) const ENV_FILE: &str = ".differently/env";
/// Files in transit between the file routes and their place.
pub(crate) const XFER_DIR: &str = ".differently/xfer";
/// The index sandbox's directory of entries: one file per sandbox name, holding its
/// installation id and when it was written.
pub(crate) const INDEX_DIR: &str = "differently-index";

/// Exit codes the scripts use for conditions the adapter maps (chosen above what the
/// commands they wrap give, and only ever the script's own).
pub(crate) const NO_SUCH_PATH: i32 = 93;
pub(crate) const IS_A_DIRECTORY: i32 = 94;
pub(crate) const NOT_A_DIRECTORY: i32 = 95;
pub(crate) const NOT_EMPTY: i32 = 96;
pub(crate) const RESERVED: i32 = 97;

/// `ws` (the workspace) and `p PATH` (the path, read under the workspace when it names it).
const PRELUDE: &str = r#"ws=$PWD
p() { case $1 in /workspace) printf '%s' "$ws";; /workspace/*) printf '%s' "$ws${1#/workspace}";; *) printf '%s' "$1";; esac; }
x="$ws/.differently/xfer"
"#;

/// Runs a command: `cwd timeout stdin-name env-name run-id argv…`. The sandbox's env file
/// first, then the request's (staged like stdin, so values never travel in the command line
/// the bridge's SDK logs; sourced after, so they win), stdin from the staged file (or
/// nothing), killed at the deadline by coreutils `timeout` (124; 137 if it needed KILL);
/// its pid is kept so a cancel can kill its process group.
const RUN: &str = r#"cwd=$1 t=$2 in=$3 envf=$4 id=$5
shift 5
[ -f "$ws/.differently/env" ] && . "$ws/.differently/env"
if [ -n "$envf" ]; then . "$x/$envf"; rm -f -- "$x/$envf"; fi
mkdir -p "$x"
if [ -n "$in" ]; then src="$x/$in"; else src=/dev/null; fi
if [ -n "$cwd" ]; then cd -- "$(p "$cwd")" || exit 1; fi
timeout -k 2 "$t" "$@" <"$src" &
pid=$!
echo "$pid" >"$x/$id.pid"
wait "$pid"
rc=$?
rm -f -- "$x/$id.pid"
[ -z "$in" ] || rm -f -- "$src"
exit "$rc"
"#;

/// Kills a command started by [`RUN`]: `run-id`.
const CANCEL: &str = r#"f="$x/$1.pid"
[ -f "$f" ] || exit 0
kill -s KILL -- "-$(cat "$f")" 2>/dev/null
rm -f -- "$f"
"#;

/// Whether a directory exists: `path`.
const IS_DIR: &str = r#"[ -d "$(p "$1")" ]
"#;

/// Moves a staged upload into place: `staged-name path mode`.
const PLACE: &str = r#"src="$x/$1" dst=$(p "$2") mode=$3
case $dst in "$ws/.differently"|"$ws/.differently/"*) rm -f -- "$src"; exit 97;; esac
[ -d "$dst" ] && { rm -f -- "$src"; exit 94; }
mkdir -p -- "$(dirname -- "$dst")" 2>/dev/null || { rm -f -- "$src"; exit 95; }
mv -f -- "$src" "$dst" || exit 1
[ -z "$mode" ] || chmod "$mode" "$dst"
"#;

/// Copies a file where the file route can read it: `path staged-name`.
const STAGE: &str = r#"src=$(p "$1")
[ -e "$src" ] || exit 93
[ -d "$src" ] && exit 94
mkdir -p "$x" && cp -- "$src" "$x/$2"
"#;

/// Removes a staged file: `staged-name`.
const UNSTAGE: &str = r#"rm -f -- "$x/$1"
"#;

/// Lists `path` to `depth` levels: one NUL-terminated record per entry, `type size mode
/// mtime relative-path` separated by tabs; a file lists itself. The adapter's own
/// directory is left out.
const LIST: &str = r#"d=$(p "$1")
[ -e "$d" ] || [ -L "$d" ] || exit 93
fmt='%y\t%s\t%m\t%T@\t%P\0'
if [ -d "$d" ]; then
  find "$d" -mindepth 1 -maxdepth "$2" -path "$ws/.differently" -prune -o -printf "$fmt"
else
  find "$d" -maxdepth 0 -printf "$fmt"
fi
"#;

/// Removes a file, a symlink or an empty directory: `path`.
const DELETE: &str = r#"t=$(p "$1")
case $t in "$ws/.differently"|"$ws/.differently/"*) exit 97;; esac
[ -e "$t" ] || [ -L "$t" ] || exit 93
if [ -d "$t" ] && [ ! -L "$t" ]; then rmdir -- "$t" 2>/dev/null || exit 96; else rm -f -- "$t"; fi
"#;

/// The index's entries, one per line: `name installation written`.
const INDEX_LIST: &str = r#"[ -d differently-index ] || exit 0
for f in differently-index/*; do
  [ -f "$f" ] && printf '%s %s\n' "${f##*/}" "$(cat -- "$f")"
done
exit 0
"#;

/// Removes index entries: `name…`.
const INDEX_REMOVE: &str = r#"for n in "$@"; do rm -f -- "differently-index/$n"; done
"#;

fn argv(script: &str, args: &[&str]) -> Vec<String> {
    let mut v = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!("{PRELUDE}{script}"),
        "sh".to_owned(),
    ];
    v.extend(args.iter().map(|a| (*a).to_owned()));
    v
}

/// What [`run`] needs besides the command; staged files are named within [`XFER_DIR`].
pub(crate) struct RunSpec<'a> {
    pub cwd: Option<&'a str>,
    pub timeout_seconds: u64,
    pub stdin_name: Option<&'a str>,
    /// The request's variables, staged as an [`env_file`].
    pub env_name: Option<&'a str>,
    pub run_id: &'a str,
}

/// The argv running `command` as `spec` says.
pub(crate) fn run(command: &[String], spec: &RunSpec<'_>) -> Vec<String> {
    let mut args: Vec<String> = vec![
        spec.cwd.unwrap_or("").to_owned(),
        spec.timeout_seconds.to_string(),
        spec.stdin_name.unwrap_or("").to_owned(),
        spec.env_name.unwrap_or("").to_owned(),
        spec.run_id.to_owned(),
    ];
    args.extend(command.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    argv(RUN, &refs)
}

pub(crate) fn cancel(run_id: &str) -> Vec<String> {
    argv(CANCEL, &[run_id])
}

pub(crate) fn is_dir(path: &str) -> Vec<String> {
    argv(IS_DIR, &[path])
}

pub(crate) fn place(staged: &str, path: &str, mode: Option<u32>) -> Vec<String> {
    let mode = mode.map(|m| format!("{m:o}")).unwrap_or_default();
    argv(PLACE, &[staged, path, &mode])
}

pub(crate) fn stage(path: &str, staged: &str) -> Vec<String> {
    argv(STAGE, &[path, staged])
}

pub(crate) fn unstage(staged: &str) -> Vec<String> {
    argv(UNSTAGE, &[staged])
}

pub(crate) fn list(path: &str, depth: u32) -> Vec<String> {
    argv(LIST, &[path, &depth.max(1).to_string()])
}

pub(crate) fn delete(path: &str) -> Vec<String> {
    argv(DELETE, &[path])
}

pub(crate) fn index_list() -> Vec<String> {
    argv(INDEX_LIST, &[])
}

pub(crate) fn index_remove(names: &[&str]) -> Vec<String> {
    argv(INDEX_REMOVE, names)
}

/// Whether `key` can be exported by a POSIX shell.
pub(crate) fn valid_env_key(key: &str) -> bool {
    let mut b = key.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The env file's text: a comment line (the file is never empty: an empty write is not
/// one the bridge documents), then one `export K='v'` line per variable.
pub(crate) fn env_file(env: &std::collections::BTreeMap<String, String>) -> String {
    let mut text = String::from("# the sandbox's environment, sourced by every command\n");
    for (k, v) in env {
        text.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn sh(argv: &[String], dir: &std::path::Path) -> std::process::Output {
        std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(dir)
            .output()
            .unwrap()
    }

    #[test]
    fn the_scripts_do_what_they_say_in_a_real_shell() {
        let ws = tempfile::tempdir().unwrap();
        let env = BTreeMap::from([("V".to_owned(), "it's x".to_owned())]);
        std::fs::create_dir_all(ws.path().join(".differently")).unwrap();
        std::fs::write(ws.path().join(ENV_FILE), env_file(&env)).unwrap();
        let mine = BTreeMap::from([("W".to_owned(), "a=b c".to_owned())]);
        std::fs::create_dir_all(ws.path().join(XFER_DIR)).unwrap();
        std::fs::write(ws.path().join(XFER_DIR).join("r1.env"), env_file(&mine)).unwrap();
        let spec = RunSpec {
            cwd: Some("/workspace/sub"),
            timeout_seconds: 5,
            stdin_name: None,
            env_name: Some("r1.env"),
            run_id: "r1",
        };
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        let cmd: Vec<String> = ["sh", "-c", "printf '%s|%s|' \"$V\" \"$W\"; pwd"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let out = sh(&run(&cmd, &spec), ws.path());
        let want = format!("it's x|a=b c|{}\n", ws.path().join("sub").display());
        assert_eq!(String::from_utf8_lossy(&out.stdout), want);
        assert!(!ws.path().join(XFER_DIR).join("r1.pid").exists());
        assert!(!ws.path().join(XFER_DIR).join("r1.env").exists());

        let out = sh(&delete("/workspace/.differently/env"), ws.path());
        assert_eq!(out.status.code(), Some(RESERVED));
        let out = sh(&delete("/workspace/nope"), ws.path());
        assert_eq!(out.status.code(), Some(NO_SUCH_PATH));
        std::fs::write(ws.path().join("sub/f"), "x").unwrap();
        let out = sh(&delete("/workspace/sub"), ws.path());
        assert_eq!(out.status.code(), Some(NOT_EMPTY));
        let out = sh(&list("/workspace", 2), ws.path());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let names: Vec<&str> = text
            .split('\0')
            .filter_map(|r| r.rsplit('\t').next())
            .filter(|n| !n.is_empty())
            .collect();
        assert_eq!(names.len(), 2, "{text:?}");
        assert!(
            names.contains(&"sub") && names.contains(&"sub/f"),
            "{names:?}"
        );
        assert!(valid_env_key("_A1") && !valid_env_key("1A") && !valid_env_key("A-B"));
    }
}
