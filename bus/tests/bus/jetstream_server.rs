//! The JetStream bus on its own: what only a real nats-server can show (restarts, a lost
//! store, drifted streams, R3 de-duplication) and every way of connecting to one (a server
//! list, token, password, nkey, TLS, the version gate).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_unacked_work_survives_a_server_restart() {
    let mut h = Harness::jetstream().await;
    h.publish(&h.work("a"), "m1", "durable").await;
    {
        let mut p = h.pull("a").await;
        let d = next(&mut p, Duration::from_secs(2))
            .await
            .expect("a message");
        assert_eq!(body(&d), "durable");
        // Not acked: the worker dies with the server.
    }
    h.server.as_mut().expect("server").restart();
    let url = h.server.as_ref().expect("server").url();
    let bus: Arc<dyn Bus> = Arc::new(jetstream::connect(&url, 1).await.expect("reconnect"));
    bus.ensure_streams(&h.naming)
        .await
        .expect("ensure after restart");
    let mut p = bus
        .pull(&h.consumer("a"))
        .await
        .expect("pull after restart");
    let d = next(&mut p, Duration::from_secs(5))
        .await
        .expect("redelivered after restart");
    assert_eq!(body(&d), "durable");
    assert!(d.delivered >= 1);
    d.acker.ack().await.expect("ack");
    h.bus = bus;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_refuses_nats_server_2_9() {
    let old = std::path::Path::new("/usr/sbin/nats-server");
    assert!(
        old.is_file(),
        "{} is missing: this test needs the packaged nats-server 2.9.10 to check that old \
         servers are refused",
        old.display()
    );
    let server = NatsServer::start_with(old);
    match jetstream::connect(&server.url(), 1).await {
        Err(BusError::Unsupported(msg)) => {
            assert!(
                msg.contains("2.9.10"),
                "message does not name the version: {msg}"
            );
            assert!(
                msg.contains("2.10"),
                "message does not name the minimum: {msg}"
            );
        }
        Err(e) => panic!("expected Unsupported, got {e}"),
        Ok(_) => panic!("connected to nats-server 2.9.10"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_connects_through_a_server_list_whose_first_member_is_down() {
    let server = NatsServer::start();
    // Port 1 on loopback: nothing listens there, so the first member is "down".
    let list = format!("nats://127.0.0.1:1, {}", server.url());
    let bus = jetstream::connect(&list, 1)
        .await
        .expect("connect via the second member");
    let naming = Naming::new("list").expect("naming");
    bus.ensure_streams(&naming)
        .await
        .expect("streams through the list");
    // An entry that does not parse names its position and never its text.
    match jetstream::connect("nats://127.0.0.1:4222,nats://u:s3cret@bad host:x", 1).await {
        Err(e) => {
            let said = e.to_string();
            assert!(said.contains("server 2"), "{said}");
            assert!(!said.contains("s3cret"), "{said}");
        }
        Ok(_) => panic!("a malformed list connected"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_connects_with_a_token_or_a_password_by_reference_and_says_which_is_missing() {
    use differently_bus::jetstream::{connect_with, ConnectOptions, NatsAuth};
    let server = NatsServer::start_with_args(&["--auth", "s3cret-token"]);
    std::env::set_var("DLY_TEST_NATS_TOKEN_OK", "s3cret-token");
    std::env::set_var("DLY_TEST_NATS_TOKEN_BAD", "wrong-token");
    let with = |auth| ConnectOptions {
        auth,
        ..ConnectOptions::default()
    };
    let bus = connect_with(
        &server.url(),
        with(NatsAuth::TokenEnv("DLY_TEST_NATS_TOKEN_OK".into())),
    )
    .await
    .expect("token from the environment");
    bus.ensure_streams(&Naming::new("auth").expect("naming"))
        .await
        .expect("streams");
    for auth in [
        NatsAuth::None,
        NatsAuth::TokenEnv("DLY_TEST_NATS_TOKEN_BAD".into()),
    ] {
        match connect_with(&server.url(), with(auth)).await {
            Err(e) => assert!(!e.to_string().contains("s3cret"), "{e}"),
            Ok(_) => panic!("connected without the right token"),
        }
    }
    match connect_with(
        &server.url(),
        with(NatsAuth::TokenEnv("DLY_TEST_NATS_UNSET".into())),
    )
    .await
    {
        Err(e) => assert!(e.to_string().contains("DLY_TEST_NATS_UNSET"), "{e}"),
        Ok(_) => panic!("connected with an unset token variable"),
    }

    let server = NatsServer::start_with_args(&["--user", "dly", "--pass", "pa55word"]);
    std::env::set_var("DLY_TEST_NATS_PASSWORD", "pa55word");
    connect_with(
        &server.url(),
        with(NatsAuth::UserPassword {
            user: "dly".into(),
            password_env: "DLY_TEST_NATS_PASSWORD".into(),
        }),
    )
    .await
    .expect("user and password");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_connects_with_an_nkey_seed_file_and_names_a_bad_one() {
    use differently_bus::jetstream::{connect_with, ConnectOptions, NatsAuth};
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("nkey.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            user.public_key()
        ),
    )
    .expect("server config");
    let server = NatsServer::start_with_args(&["-c", &conf.display().to_string()]);
    let seed_file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("seed file");
        path
    };
    let with = |path| ConnectOptions {
        auth: NatsAuth::NkeySeedFile(path),
        ..ConnectOptions::default()
    };
    let seed = user.seed().expect("seed");
    let good = seed_file("user.nk", &format!("{seed}\n"));
    let bus = connect_with(&server.url(), with(good))
        .await
        .expect("the listed user's seed");
    bus.ensure_streams(&Naming::new("nkey").expect("naming"))
        .await
        .expect("streams");

    let other = stranger.seed().expect("seed");
    let unlisted = seed_file("stranger.nk", &other);
    match connect_with(&server.url(), with(unlisted)).await {
        Err(e) => assert!(!e.to_string().contains(&other), "{e}"),
        Ok(_) => panic!("connected with a seed the server does not list"),
    }
    match connect_with(&server.url(), ConnectOptions::default()).await {
        Err(_) => {}
        Ok(_) => panic!("connected without credentials to a server that wants an nkey"),
    }
    let garbage = seed_file("garbage.nk", "not-a-seed");
    match connect_with(&server.url(), with(garbage.clone())).await {
        Err(e) => {
            let said = e.to_string();
            assert!(said.contains(&garbage.display().to_string()), "{said}");
            assert!(said.contains("not a user nkey seed"), "{said}");
            assert!(!said.contains("not-a-seed"), "{said}");
        }
        Ok(_) => panic!("connected with a malformed seed"),
    }
    let missing = dir.path().join("missing.nk");
    match connect_with(&server.url(), with(missing.clone())).await {
        Err(e) => assert!(e.to_string().contains("missing.nk"), "{e}"),
        Ok(_) => panic!("connected with a missing seed file"),
    }
}

/// A CA and a server certificate for 127.0.0.1, made with the openssl command in `dir`.
fn make_tls_files(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (Debian package openssl) runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=differently test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").expect("ext file");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_connects_over_tls_trusting_a_private_ca() {
    use differently_bus::jetstream::{connect_with, ConnectOptions};
    let dir = tempfile::tempdir().expect("tempdir");
    make_tls_files(dir.path());
    let cert = dir.path().join("server.pem");
    let key = dir.path().join("server.key");
    let server = NatsServer::start_with_args(&[
        "--tls",
        "--tlscert",
        cert.to_str().expect("path"),
        "--tlskey",
        key.to_str().expect("path"),
    ]);
    let url = format!("tls://127.0.0.1:{}", server.port());
    let bus = connect_with(
        &url,
        ConnectOptions {
            ca_bundle: Some(dir.path().join("ca.pem")),
            ..ConnectOptions::default()
        },
    )
    .await
    .expect("TLS with the private CA");
    bus.ensure_streams(&Naming::new("tls").expect("naming"))
        .await
        .expect("streams over TLS");
    // Without the CA the server's certificate is not trusted.
    assert!(connect_with(&url, ConnectOptions::default()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_racing_publishes_of_one_message_id_on_r3_store_it_once_and_none_fails() {
    use differently_bus::{Bus, Published};
    // On R3 streams a message is "in process" while its raft proposal is in flight, which
    // is when a racing duplicate is answered "duplicate message id is in process".
    let cluster = differently_bus::testing::NatsCluster::start(3);
    let bus = std::sync::Arc::new(
        jetstream::connect(&cluster.urls(), 3)
            .await
            .expect("connect"),
    );
    let naming = Naming::new("dup").expect("naming");
    bus.ensure_streams(&naming).await.expect("streams");
    let subject = naming.work_subject("p", differently_bus_schema::WorkOp::Create);
    for round in 0..20 {
        let id = format!("same-id-{round}");
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (bus, subject, id) = (bus.clone(), subject.clone(), id.clone());
                tokio::spawn(async move {
                    bus.publish(&subject, &id, bytes::Bytes::from_static(b"{}"))
                        .await
                })
            })
            .collect();
        let mut stored = 0;
        for t in tasks {
            match t.await.expect("task") {
                Ok(Published::Stored) => stored += 1,
                Ok(Published::Duplicate) => {}
                Err(e) => panic!("a racing duplicate failed: {e}"),
            }
        }
        assert_eq!(stored, 1, "round {round}: stored {stored} times");
    }
}

#[test]
fn harness_finds_a_recent_server() {
    let path = differently_bus::testing::find_nats_server().expect("nats-server ≥ 2.10");
    let server = NatsServer::start_with(&path);
    assert_eq!(server.url(), format!("nats://127.0.0.1:{}", server.port()));
    assert_eq!(server.binary(), path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_ensure_streams_repairs_a_drifted_stream() {
    use async_nats::jetstream::stream::{Config, RetentionPolicy};
    let server = NatsServer::start();
    let bus = jetstream::connect(&server.url(), 1).await.expect("connect");
    let naming = Naming::new("t").expect("naming");
    let def = naming.work_stream();
    bus.context()
        .create_stream(Config {
            name: def.name.clone(),
            subjects: vec!["t.work.only.>".to_owned()],
            retention: RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .expect("create a drifted stream");
    bus.ensure_streams(&naming).await.expect("ensure_streams");
    let info = bus
        .context()
        .get_stream(&def.name)
        .await
        .expect("stream")
        .cached_info()
        .clone();
    assert_eq!(info.config.subjects, def.subjects);
    assert_eq!(info.config.duplicate_window, Duration::from_secs(120));
}

/// A server that lost its whole store ("amnesia", FAULTS.md S7) comes back without streams;
/// the bus must recreate them itself, so a publish and a consumer bind work again without a
/// process restart (they used to fail with "stream not found" forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_recreates_streams_after_the_server_lost_its_store() {
    let mut h = Harness::jetstream().await;
    h.publish(&h.work("a"), "before", "old").await;
    {
        let server = h.server.as_mut().expect("server");
        server.stop();
        std::fs::remove_dir_all(server.store_dir()).expect("wipe the store");
        server.restart();
    }
    // The client reconnects by itself; give it a moment, then the publish must be stored.
    let deadline = Instant::now() + Duration::from_secs(15);
    let stored = loop {
        match h
            .bus
            .publish(&h.work("a"), "after", Bytes::from_static(b"new"))
            .await
        {
            Ok(p) => break p,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("publish after the store was lost: {e}"),
        }
    };
    assert_eq!(stored, Published::Stored);
    let mut p = h.pull("a").await;
    let d = next(&mut p, Duration::from_secs(5))
        .await
        .expect("the message published after the wipe");
    assert_eq!(body(&d), "new");
    d.acker.ack().await.expect("ack");
}

/// A consumer waiting on a trickle of work keeps one request open for as many messages as
/// its caller has room for (`Pull::set_room`), rather than asking once per message: 32
/// messages published one at a time, each after the last was taken, cost a handful of
/// requests (one per 8 and one per second of waiting), where a fetch per message cost 32.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_a_trickle_of_work_is_served_by_few_pull_requests() {
    const N: usize = 32;
    let server = NatsServer::start();
    let js = jetstream::connect(&server.url(), 1).await.expect("connect");
    let stats = js.context().client().statistics();
    let h = Harness::ready(Arc::new(js), Some(server)).await;
    let mut p = h.pull("a").await;
    p.set_room(8);
    let sent = || {
        stats
            .out_messages
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = sent();
    let started = Instant::now();
    let (took, mut taken) = tokio::sync::mpsc::unbounded_channel();
    let consumer = tokio::spawn(async move {
        for _ in 0..N {
            let d = next(&mut p, Duration::from_secs(10))
                .await
                .expect("the next message within 10 s");
            d.acker.ack().await.expect("ack");
            took.send(body(&d)).expect("the test listens");
        }
    });
    for i in 0..N {
        h.publish(&h.work("a"), &format!("m{i}"), &i.to_string())
            .await;
        assert_eq!(taken.recv().await, Some(i.to_string()), "taken in order");
    }
    consumer.await.expect("consumer");
    let elapsed = started.elapsed().as_secs() as usize;
    // What this client sent: the publishes, the acks, and the pull requests.
    let requests = (sent() - before) as usize - 2 * N;
    assert!(
        requests <= N / 8 + 2 + elapsed,
        "{requests} pull requests for {N} messages in {elapsed} s"
    );
}
