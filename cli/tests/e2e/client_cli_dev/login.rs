//! `login`, profiles and their environment overrides, and shell completions.

use super::{json, mode, output, Dev};

#[test]
fn login_profiles_env_overrides_and_completions() {
    let dev = Dev::start();
    // No key anywhere: exit 2, naming the ways to give one.
    let mut none = dev.cmd(&["sandbox", "list"]);
    none.env_remove("DIFFERENTLY_API_KEY")
        .env_remove("DIFFERENTLY_URL");
    let (code, _, err) = output(none, None);
    assert_eq!(code, 2);
    assert!(err.contains("differently login"), "{err}");

    // A bad key is refused by login and stores nothing.
    let mut bad = dev.cmd(&["login", "--url", &dev.url]);
    bad.env_remove("DIFFERENTLY_API_KEY");
    let (code, _, err) = output(bad, Some(b"dly_key_01M8PX56B2BMV5VM228QHCMTS7_nope\n"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401"), "{err}");
    assert!(!dev.config().exists());

    // login with the key on stdin writes the profile, mode 0600.
    let mut login = dev.cmd(&["login", "--url", &dev.url, "--config-profile", "local"]);
    login
        .env_remove("DIFFERENTLY_API_KEY")
        .env_remove("DIFFERENTLY_URL");
    let (code, _, err) = output(login, Some(format!("{}\n", dev.key).as_bytes()));
    assert_eq!(code, 0, "{err}");
    #[cfg(unix)]
    assert_eq!(mode(&dev.config()), 0o600);
    let text = std::fs::read_to_string(dev.config()).unwrap();
    assert!(
        text.contains("[profiles.local]") && text.contains(&dev.url),
        "{text}"
    );
    assert!(!err.contains(&dev.key), "login printed the key: {err}");

    // The profile alone is enough; an unknown one is an error naming it.
    let with_profile = |profile: &str| {
        let mut c = dev.cmd(&["sandbox", "list", "-o", "json", "--config-profile", profile]);
        c.env_remove("DIFFERENTLY_API_KEY")
            .env_remove("DIFFERENTLY_URL");
        output(c, None)
    };
    let (code, out, err) = with_profile("local");
    assert_eq!(code, 0, "{err}");
    assert!(json(&out)["items"].is_array());
    let (code, _, err) = with_profile("staging");
    assert_eq!(code, 2);
    assert!(err.contains("no profile \"staging\""), "{err}");
    // The environment overrides the profile: a URL where nothing listens wins, and says so.
    let mut c = dev.cmd(&["sandbox", "list", "--config-profile", "local"]);
    c.env("DIFFERENTLY_URL", "http://127.0.0.1:1")
        .env_remove("DIFFERENTLY_API_KEY");
    let (code, _, err) = output(c, None);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the API at http://127.0.0.1:1")
            && err.contains("differently dev"),
        "{err}"
    );
    assert!(!err.contains(&dev.key), "the key leaked: {err}");

    // Completions for the shells clap_complete knows; bash's names the commands.
    let bash = dev.ok(&["completions", "bash"]);
    assert!(
        bash.contains("_differently") && bash.contains("snapshot"),
        "{}",
        &bash[..200.min(bash.len())]
    );
    for shell in ["zsh", "fish"] {
        assert!(!dev.ok(&["completions", shell]).is_empty());
    }
    let (code, _, _) = dev.run(&["completions", "tcsh-nope"]);
    assert_eq!(code, 2);
}

/// `login` stores the key it was given (stdin or `--key`), not `DIFFERENTLY_API_KEY`; it saves
/// nothing the API refuses or cannot be asked about, unless told `--no-verify`; it never
/// prints a key.
#[test]
fn login_takes_the_key_given_and_saves_only_what_the_api_accepts() {
    let dev = Dev::start();
    let bogus = "dly_key_01M8PX56B2BMV5VM228QHCMTS7_nope";
    let login = |args: &[&str], env_key: Option<&str>, stdin: Option<&[u8]>| {
        let mut all = vec!["login", "--url"];
        all.extend_from_slice(args);
        let mut c = dev.cmd(&all);
        c.env_remove("DIFFERENTLY_URL");
        match env_key {
            Some(k) => c.env("DIFFERENTLY_API_KEY", k),
            None => c.env_remove("DIFFERENTLY_API_KEY"),
        };
        let (code, out, err) = output(c, stdin);
        for secret in [bogus, dev.key.as_str()] {
            assert!(
                !out.contains(secret) && !err.contains(secret),
                "login printed a key: {out}{err}"
            );
        }
        (code, err)
    };
    let saved = || std::fs::read_to_string(dev.config()).unwrap_or_default();

    // A valid key in the environment, a bad one given on stdin: the given one is checked,
    // refused, and nothing is saved (it once saved the environment's and said so).
    let (code, err) = login(
        &[&dev.url],
        Some(&dev.key),
        Some(format!("{bogus}\n").as_bytes()),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("401") && err.contains("nothing was saved"),
        "{err}"
    );
    assert!(!dev.config().exists(), "{}", saved());

    // The other way round: the good key on stdin is saved, the environment's ignored, said so.
    let (code, err) = login(
        &[&dev.url, "--config-profile", "stdin"],
        Some(bogus),
        Some(format!("{}\n", dev.key).as_bytes()),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("using the key from standard input (DIFFERENTLY_API_KEY is ignored)"),
        "{err}"
    );
    assert!(
        saved().contains(&dev.key) && !saved().contains(bogus),
        "{}",
        saved()
    );
    // --key wins over the environment too.
    let (code, err) = login(
        &[&dev.url, "--config-profile", "flag", "--key", &dev.key],
        Some(bogus),
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(saved().contains("[profiles.flag]"), "{}", saved());
    // Only the environment's: used, and said so.
    let (code, err) = login(&[&dev.url, "--config-profile", "env"], Some(&dev.key), None);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("using the key in DIFFERENTLY_API_KEY"),
        "{err}"
    );

    // An API that cannot be reached: nothing saved, the way around named; --no-verify saves.
    let (code, err) = login(
        &["http://127.0.0.1:1", "--config-profile", "down"],
        None,
        Some(format!("{}\n", dev.key).as_bytes()),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot check the key") && err.contains("--no-verify"),
        "{err}"
    );
    assert!(!saved().contains("[profiles.down]"), "{}", saved());
    let (code, err) = login(
        &[
            "http://127.0.0.1:1",
            "--config-profile",
            "down",
            "--no-verify",
        ],
        None,
        Some(format!("{}\n", dev.key).as_bytes()),
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("without being checked"), "{err}");
    assert!(
        saved().contains("[profiles.down]") && saved().contains("http://127.0.0.1:1"),
        "{}",
        saved()
    );
    #[cfg(unix)]
    assert_eq!(mode(&dev.config()), 0o600);
}
