//! Turning an argv (plus env, cwd and a stdin file) into one `sh -c` command line, for
//! providers whose exec API takes a command string. Every piece is single-quoted, so the
//! provider's own splitting (a shell, or shell-words) yields exactly `sh`, `-c` and the script.

use std::collections::BTreeMap;

/// `a` single-quoted for a POSIX shell.
pub fn quote(a: &str) -> String {
    if !a.is_empty()
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b))
    {
        return a.to_owned();
    }
    format!("'{}'", a.replace('\'', r"'\''"))
}

/// An argv as one shell command.
pub fn join(argv: &[String]) -> String {
    argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

/// What a command runs with, besides its argv.
#[derive(Debug, Default)]
pub struct Wrap<'a> {
    pub env: Option<&'a BTreeMap<String, String>>,
    pub cwd: Option<&'a str>,
    /// A file holding stdin; the script unlinks it once the shell has opened it.
    pub stdin_file: Option<&'a str>,
}

/// The script running `argv` as `wrap` says.
pub fn script(argv: &[String], wrap: &Wrap<'_>) -> String {
    let mut s = String::new();
    if let Some(cwd) = wrap.cwd {
        s.push_str(&format!("cd -- {} || exit 1\n", quote(cwd)));
    }
    for (k, v) in wrap.env.into_iter().flatten() {
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    match wrap.stdin_file {
        Some(f) => {
            let q = quote(f);
            s.push_str(&format!("{{ rm -f -- {q}; {}\n}} < {q}", join(argv)));
        }
        None => s.push_str(&join(argv)),
    }
    s
}

/// `sh -c <script>` as one command string.
pub fn sh_c(script: &str) -> String {
    format!("sh -c {}", quote(script))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_a_real_shell() {
        let argv: Vec<String> = ["printf", "%s|", "it's", "a b", "", "$HOME", "\"q\""]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let env = BTreeMap::from([("V".to_owned(), "x 'y'".to_owned())]);
        let script = script(
            &[
                "sh".to_owned(),
                "-c".to_owned(),
                format!("{}; printf %s \"$V\"", join(&argv)),
            ],
            &Wrap {
                env: Some(&env),
                cwd: Some("/"),
                stdin_file: None,
            },
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "it's|a b||$HOME|\"q\"|x 'y'"
        );
        assert_eq!(sh_c("echo 'a'"), r#"sh -c 'echo '\''a'\'''"#);
    }
}
