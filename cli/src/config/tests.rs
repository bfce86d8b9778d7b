//! The configuration's own tests: parsing, layering and the checks.

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    let mut c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: "t".into(),
        message: e.to_string(),
    })?;
    c.apply_env(|_| None).unwrap();
    c.validate()?;
    Ok(c)
}

#[test]
fn defaults_are_valid() {
    assert!(parse("").is_ok());
}

#[test]
fn errors_name_the_field() {
    let e = parse("listen = \"nope\"").unwrap_err().to_string();
    assert!(e.contains("listen"), "{e}");
    let e = parse("bogus = 1").unwrap_err().to_string();
    assert!(e.contains("bogus"), "{e}");
    let e = parse("[bus]\nprefix = \"A.B\"").unwrap_err().to_string();
    assert!(e.contains("bus.prefix"), "{e}");
    let e = parse("[[pools]]\nname = \"Bad Name\"\nkind = \"fake\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("pools[0].name"), "{e}");
    let e =
        parse("[[pools]]\nname = \"a\"\nkind = \"fake\"\n[[pools]]\nname = \"a\"\nkind = \"fake\"")
            .unwrap_err()
            .to_string();
    assert!(e.contains("duplicate"), "{e}");
}

#[test]
fn config_pools_get_the_admin_apis_bounds_naming_pool_and_field() {
    // Each of these passed the config's own checks before and the admin API refused it.
    for (line, field) in [
        ("max_concurrent = 2000000", "pools[0].max_concurrent"),
        ("cost_per_cpu_hour = 1e300", "pools[0].cost_per_cpu_hour"),
        (
            "typical_create_seconds = 1e9",
            "pools[0].typical_create_seconds",
        ),
        ("region = \"\"", "pools[0].region"),
        (
            &format!("region = \"{}\"", "r".repeat(64)),
            "pools[0].region",
        ),
        ("region = \"eu\\u0000west\"", "pools[0].region"),
    ] {
        let e = parse(&format!(
            "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n{line}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains(field) && e.contains("\"edge\""), "{line}: {e}");
    }
    assert!(parse(
        "[[pools]]\nname = \"edge\"\nkind = \"fake\"\nmax_concurrent = 1000000\n\
         cost_per_cpu_hour = 1000000.0\ntypical_create_seconds = 86400.0\nregion = \"eu-west\""
    )
    .is_ok());
}

#[test]
fn nats_urls_is_the_array_form_of_a_server_list() {
    let c = parse("nats_urls = [\"nats://a:4222\", \"nats://b:4222\"]").unwrap();
    assert_eq!(c.require_nats_url().unwrap(), "nats://a:4222,nats://b:4222");
    let c = parse("nats_url = \"nats://a:4222\"\nnats_urls = [\"nats://b:4222\"]").unwrap();
    let e = c.require_nats_url().unwrap_err().to_string();
    assert!(e.contains("nats_urls"), "{e}");
    let mut c = parse("nats_urls = [\"nats://b:4222\"]").unwrap();
    c.apply_env(|k| (k == "DIFFERENTLY_NATS_URL").then(|| "nats://env:4222".to_owned()))
        .unwrap();
    assert_eq!(c.require_nats_url().unwrap(), "nats://env:4222");
}

#[test]
fn bus_credentials_are_one_reference_and_never_a_value() {
    use differently_bus::jetstream::NatsAuth;
    let c = parse("[bus]\ntoken_env = \"NATS_TOKEN\"").unwrap();
    assert_eq!(
        c.bus_connect_options().auth,
        NatsAuth::TokenEnv("NATS_TOKEN".into())
    );
    let c = parse("[bus]\nuser = \"dly\"\npassword_env = \"NATS_PW\"").unwrap();
    assert_eq!(
        c.bus_connect_options().auth,
        NatsAuth::UserPassword {
            user: "dly".into(),
            password_env: "NATS_PW".into()
        }
    );
    let e = parse("[bus]\nuser = \"dly\"").unwrap_err().to_string();
    assert!(e.contains("bus.password_env"), "{e}");
    let e = parse("[bus]\ntoken_env = \"T\"\ncredentials_file = \"/x.creds\"")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bus.credentials_file") && e.contains("only one"),
        "{e}"
    );
    let e = parse("[bus]\nca_bundle = \"/nonexistent/ca.pem\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("bus.ca_bundle"), "{e}");
    let e = parse("[bus]\nping_interval_ms = 10")
        .unwrap_err()
        .to_string();
    assert!(e.contains("bus.ping_interval_ms"), "{e}");
    let e = parse("[bus]\nconnect_timeout_ms = 5")
        .expect_err("connect timeout too short")
        .to_string();
    assert!(e.contains("bus.connect_timeout_ms"), "{e}");
    let e = parse("[bus]\ncredentials_file = \"/x.creds\"\nnkey_seed_file = \"/x.nk\"")
        .expect_err("two credentials")
        .to_string();
    assert!(
        e.contains("bus.nkey_seed_file") && e.contains("only one"),
        "{e}"
    );
    assert!(
        parse("[bus]\npassword = \"x\"").is_err(),
        "a literal password is refused"
    );
}

#[test]
fn trusted_proxies_are_addresses_or_cidrs() {
    assert!(parse("").unwrap().api.trusted_proxies.is_empty());
    let c = parse("[api]\ntrusted_proxies = [\"10.0.0.0/8\", \"192.0.2.4\"]").unwrap();
    assert_eq!(c.api.trusted_proxies.len(), 2);
    let e = parse("[api]\ntrusted_proxies = [\"lb.local\"]")
        .unwrap_err()
        .to_string();
    assert!(e.contains("api.trusted_proxies"), "{e}");
}

#[test]
fn metrics_listener_is_optional_and_validated() {
    assert_eq!(parse("").unwrap().metrics.listen, None);
    let c = parse("[metrics]\nlisten = \"127.0.0.1:9464\"").unwrap();
    assert_eq!(c.metrics.listen.as_deref(), Some("127.0.0.1:9464"));
    let e = parse("[metrics]\nlisten = \"nope\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("metrics.listen"), "{e}");
    let e = parse("listen = \"127.0.0.1:9000\"\n[metrics]\nlisten = \"127.0.0.1:9000\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("metrics.listen"), "{e}");
    let mut c: Config = toml::from_str("").unwrap();
    c.apply_env(|k| (k == "DIFFERENTLY_METRICS_LISTEN").then(|| "127.0.0.1:1".to_owned()))
        .unwrap();
    assert_eq!(c.metrics.listen.as_deref(), Some("127.0.0.1:1"));
}

#[test]
fn read_timeouts_default_and_are_bounded() {
    let c = parse("").unwrap();
    assert_eq!(
        (
            c.api.header_read_timeout_seconds,
            c.api.body_read_timeout_seconds
        ),
        (10, 30)
    );
    let c = parse("[api]\nheader_read_timeout_seconds = 2\nbody_read_timeout_seconds = 5").unwrap();
    assert_eq!(
        (
            c.api.header_read_timeout_seconds,
            c.api.body_read_timeout_seconds
        ),
        (2, 5)
    );
    for field in ["header_read_timeout_seconds", "body_read_timeout_seconds"] {
        for bad in [0, 3601] {
            let e = parse(&format!("[api]\n{field} = {bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(field) && e.contains("3600"), "{e}");
        }
    }
}

#[test]
fn placement_group_size_is_bounded() {
    assert_eq!(parse("").unwrap().scheduler.placement_group_size, 32);
    let c = parse("[scheduler]\nplacement_group_size = 64").unwrap();
    assert_eq!(c.scheduler.placement_group_size, 64);
    for bad in [0, 257] {
        let e = parse(&format!("[scheduler]\nplacement_group_size = {bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("scheduler.placement_group_size"), "{e}");
    }
}

#[test]
fn environment_overrides_the_file() {
    let mut c: Config = toml::from_str("listen = \"127.0.0.1:1\"").unwrap();
    c.apply_env(|k| (k == "DIFFERENTLY_LISTEN").then(|| "127.0.0.1:2".to_owned()))
        .unwrap();
    assert_eq!(c.listen, "127.0.0.1:2");
}

#[test]
fn direct_placement_defaults_on_and_the_environment_can_turn_it_off() {
    assert!(parse("").unwrap().api.direct_placement);
    assert!(
        !parse("[api]\ndirect_placement = false")
            .unwrap()
            .api
            .direct_placement
    );
    let mut c: Config = toml::from_str("").unwrap();
    c.apply_env(|k| (k == "DIFFERENTLY_DIRECT_PLACEMENT").then(|| "false".to_owned()))
        .unwrap();
    assert!(!c.api.direct_placement);
    let e = c
        .apply_env(|k| (k == "DIFFERENTLY_DIRECT_PLACEMENT").then(|| "no".to_owned()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("api.direct_placement"), "{e}");
}

#[test]
fn pool_warm_classes_are_read_in_the_files_style_and_checked_naming_the_field() {
    let c = parse(
        "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n\
         warm = [{ name = \"default\", size = 2, refill_per_second = 1 },\n\
                 { name = \"py\", size = 1, max_size = 3, refill_per_second = 0.5, \
                   max_age_seconds = 600, template = \"python:3.12\", \
                   resources = { cpu = 2, memory_mib = 2048, disk_gib = 5 } }]",
    )
    .unwrap();
    let classes = c.pools[0].warm_classes("pools[0]").unwrap().unwrap();
    assert_eq!(classes.classes.len(), 2);
    assert_eq!(
        classes.classes[0].max_age_seconds,
        differently_core::warm::DEFAULT_MAX_AGE_SECONDS
    );
    let py = &classes.classes[1];
    assert_eq!(py.max_size, Some(3));
    assert_eq!(py.refill_per_second, 0.5);
    assert_eq!(py.template.as_deref(), Some("python:3.12"));
    assert_eq!(py.resources.map(|r| r.memory_mib), Some(2048));
    // The array-of-tables form is the same list.
    let c = parse(
        "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n\
         [[pools.warm]]\nname = \"default\"\nsize = 2\nrefill_per_second = 1",
    )
    .unwrap();
    assert_eq!(c.pools[0].warm.as_ref().map(Vec::len), Some(1));
    // Without `warm`, nothing is declared (the stored classes are left alone).
    let c = parse("[[pools]]\nname = \"edge\"\nkind = \"fake\"").unwrap();
    assert_eq!(c.pools[0].warm_classes("pools[0]").unwrap(), None);

    for (class, field) in [
        (
            "name = \"A\", size = 1, refill_per_second = 1",
            "pools[1].warm[0].name",
        ),
        (
            "name = \"a\", size = 1, refill_per_second = 0",
            "pools[1].warm[0].refill_per_second",
        ),
        (
            "name = \"a\", size = 3, max_size = 2, refill_per_second = 1",
            "pools[1].warm[0].max_size",
        ),
        (
            "name = \"a\", size = 1, refill_per_second = 1, max_age_seconds = 1",
            "pools[1].warm[0].max_age_seconds",
        ),
        (
            "name = \"a\", size = 1, refill_per_second = 1, \
             resources = { cpu = 1, memory_mib = 1, disk_gib = 5 }",
            "pools[1].warm[0].resources.memory_mib",
        ),
    ] {
        let e = parse(&format!(
            "[[pools]]\nname = \"one\"\nkind = \"fake\"\n\
             [[pools]]\nname = \"edge\"\nkind = \"fake\"\nwarm = [{{ {class} }}]"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains(field) && e.contains("\"edge\""), "{class}: {e}");
    }
    let e = parse(
        "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n\
         warm = [{ name = \"a\", size = 1, refill_per_second = 1, refillPerSecond = 1 }]",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("refillPerSecond"),
        "unknown fields are refused: {e}"
    );
}

#[test]
fn e2b_domain_is_off_by_default_set_by_the_file_and_overridden_by_the_environment() {
    assert_eq!(parse("").unwrap().e2b.domain, None);
    let c = parse("[e2b]\ndomain = \"e2b.example.com\"").unwrap();
    assert_eq!(c.e2b.domain.as_deref(), Some("e2b.example.com"));

    let env = |value: &'static str| {
        move |k: &str| (k == "DIFFERENTLY_E2B_DOMAIN").then(|| value.to_owned())
    };
    let mut c: Config = toml::from_str("[e2b]\ndomain = \"e2b.example.com\"").unwrap();
    c.apply_env(env("sandboxes.example.org")).unwrap();
    assert_eq!(c.e2b.domain.as_deref(), Some("sandboxes.example.org"));
    // Set and empty: off, whatever the file says.
    c.apply_env(env("")).unwrap();
    assert_eq!(c.e2b.domain, None);
    c.validate().unwrap();
}

#[test]
fn e2b_domain_must_be_a_dns_name_and_the_error_names_the_key() {
    for ok in [
        "e2b.test",
        "E2B.Example.COM",
        "a-b.c1.example.",
        " localhost ",
    ] {
        let text = format!("[e2b]\ndomain = {ok:?}");
        assert!(parse(&text).is_ok(), "{ok:?} should be accepted");
    }
    let long_label = format!("{}.example.com", "a".repeat(64));
    let long_name = vec!["abcdefghi"; 26].join(".");
    for bad in [
        "https://e2b.example.com",
        "e2b.example.com:443",
        "e2b.example.com/x",
        "e2b..example.com",
        "-e2b.example.com",
        "e2b-.example.com",
        "e2b_x.example.com",
        "*.example.com",
        long_label.as_str(),
        long_name.as_str(),
    ] {
        let text = format!("[e2b]\ndomain = {bad:?}");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("e2b.domain"), "{bad:?}: {e}");
    }
    // The environment's value is checked as the file's is.
    let mut c = Config::default();
    c.apply_env(|k| (k == "DIFFERENTLY_E2B_DOMAIN").then(|| "not a name".to_owned()))
        .unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("e2b.domain"), "{e}");
}
