//! Files end to end: round trips, ranges and traversal, and the upload limit.

use serde_json::{json, Value};

use crate::harness::{Cluster, Opts};

use super::{cluster, post, running, FAKE_CAPS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_ranges_and_traversal() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["files"]})).await;
    let files = format!("/v1/sandboxes/{id}/files");

    // 100 MB up and down, byte for byte.
    let size = 100 * 1024 * 1024;
    let data: Vec<u8> = (0..size)
        .map(|i: usize| (i.wrapping_mul(31) ^ (i >> 13)) as u8)
        .collect();
    let r = c
        .req(
            reqwest::Method::PUT,
            &format!("{files}?path=/big/blob.bin&mode=600"),
        )
        .body(data.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap_or_default());
    let r = c
        .req(reqwest::Method::GET, &format!("{files}?path=/big/blob.bin"))
        .send()
        .await
        .expect("download");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], size.to_string().as_str());
    let back = r.bytes().await.expect("body");
    assert_eq!(back.len(), data.len());
    assert!(back[..] == data[..], "downloaded bytes differ");
    // The command side sees the same file.
    let (_, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["sh", "-c", "wc -c < big/blob.bin; stat -c %a big/blob.bin"]}),
    )
    .await;
    assert_eq!(out["stdout"], format!("{size}\n600\n"));

    // Ranges.
    let range = |h: &'static str| {
        c.req(reqwest::Method::GET, &format!("{files}?path=/big/blob.bin"))
            .header("range", h)
            .send()
    };
    let r = range("bytes=10-19").await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes 10-19/{size}").as_str()
    );
    assert_eq!(&r.bytes().await.unwrap()[..], &data[10..20]);
    let r = range("bytes=-5").await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(&r.bytes().await.unwrap()[..], &data[size - 5..]);
    let r = range("bytes=104857600-").await.unwrap();
    assert_eq!(r.status(), 416);

    // Listing and deleting.
    let (s, list) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("{files}/list?path=/big"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(list["items"][0]["path"], "/big/blob.bin");
    assert_eq!(list["items"][0]["size"], size);
    assert_eq!(list["items"][0]["type"], "file");

    // Traversal is refused at the edge and in the adapter.
    for bad in ["/../../etc/passwd", "etc/passwd", "/a/../../b"] {
        let r = c
            .req(reqwest::Method::GET, &format!("{files}?path={bad}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    let (_, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["ln", "-s", "/etc", "escape"]}),
    )
    .await;
    assert_eq!(out["exitCode"], 0);
    let r = c
        .req(
            reqwest::Method::GET,
            &format!("{files}?path=/escape/hostname"),
        )
        .send()
        .await
        .unwrap();
    // The link is followed as inside the sandbox's root (its `/etc` there holds no
    // `hostname`), never out of it through the API process.
    assert_eq!(
        r.status(),
        404,
        "a symlink must never lead the files API out of the sandbox"
    );

    let r = c
        .req(
            reqwest::Method::DELETE,
            &format!("{files}?path=/big/blob.bin"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = c
        .req(reqwest::Method::GET, &format!("{files}?path=/big/blob.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // The fake pool has no files: 501, never a silent degrade.
    let other = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let (s, e) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{other}/files/list?path=/"),
            None,
        )
        .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (501, Some("unsupported_operation"))
    );
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_over_the_configured_limit_are_refused() {
    let root = tempfile::tempdir().expect("tempdir").keep();
    let mut c = Cluster::new(Opts {
        more_pools: format!(
            "{FAKE_CAPS}\n\n[[pools]]\nname = \"dev\"\nkind = \"devhost\"\n[pools.settings]\nroot = \"{}\"\nisolation = \"none\"\n",
            root.display()
        ),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[("DIFFERENTLY_MAX_UPLOAD_BYTES", "1000")]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let id = running(&c, json!({"capabilities": ["files"]})).await;
    let put = |n: usize| {
        c.req(
            reqwest::Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/f.bin"),
        )
        .body(vec![7u8; n])
        .send()
    };
    let r = put(1000).await.expect("at the limit");
    assert_eq!(r.status(), 204);
    let r = put(1001).await.expect("over the limit");
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(body["error"]["details"]["limitBytes"], 1000);
    // The refused upload left the earlier file as it was.
    let r = c
        .req(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/f.bin"),
        )
        .send()
        .await
        .expect("download");
    assert_eq!(r.bytes().await.expect("body").len(), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_are_made_once_with_their_mode_and_what_is_in_the_way_is_a_conflict() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["files"]})).await;
    let dirs = format!("/v1/sandboxes/{id}/files/directories");

    let (s, made) = post(&c, &dirs, json!({"path": "/proj/src/deep", "mode": "750"})).await;
    assert_eq!(s, 201, "{made}");
    assert_eq!(made, json!({"path": "/proj/src/deep", "created": true}));
    // Made once: the second call finds it and leaves its mode alone.
    let (s, again) = post(&c, &dirs, json!({"path": "/proj/src/deep", "mode": "700"})).await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["created"], false);
    // Commands see it, with the mode asked; the parents are 755.
    let (_, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["stat", "-c", "%a %n", "proj/src/deep", "proj/src"]}),
    )
    .await;
    assert_eq!(out["stdout"], "750 proj/src/deep\n755 proj/src\n", "{out}");

    // A file where the directory is to be, or among its parents: 409 naming the path.
    let r = c
        .req(
            reqwest::Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/proj/f.txt"),
        )
        .body("x")
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 204);
    for (path, reason) in [
        ("/proj/f.txt", "exists_not_directory"),
        ("/proj/f.txt/sub", "not_a_directory"),
    ] {
        let (s, e) = post(&c, &dirs, json!({ "path": path })).await;
        assert_eq!(s, 409, "{path}: {e}");
        assert_eq!(e["error"]["code"], "conflict", "{path}: {e}");
        assert_eq!(
            e["error"]["details"],
            json!({"field": "path", "reason": reason}),
            "{path}"
        );
    }

    // Bad input names the field and makes nothing.
    for (body, field) in [
        (json!({"path": "rel/dir"}), "path"),
        (json!({"path": "/a/../b"}), "path"),
        (json!({"path": "/m", "mode": "9"}), "mode"),
        (json!({"path": "/m", "mode": "17777"}), "mode"),
        // Permission bits only: not every backend can set setuid, setgid or sticky.
        (json!({"path": "/m", "mode": "1777"}), "mode"),
        (json!({"path": "/m", "owner": "root"}), "owner"),
        (json!({}), "path"),
    ] {
        let (s, e) = post(&c, &dirs, body.clone()).await;
        assert_eq!(s, 400, "{body}: {e}");
        assert!(
            e["error"]["message"].as_str().unwrap_or("").contains(field)
                || e["error"]["details"]["field"] == field,
            "{body}: the error names `{field}`: {e}"
        );
    }
    let (_, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["ls", "-d", "m", "rel", "b"]}),
    )
    .await;
    assert_eq!(out["exitCode"], 2, "nothing made by a refused call: {out}");

    // The call is audited with its path.
    let (s, audit) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            "/v1/audit?action=file.mkdir",
            None,
        )
        .await;
    assert_eq!(s, 200, "{audit}");
    let paths: Vec<&Value> = audit["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|r| &r["detail"]["path"])
        .collect();
    assert!(
        paths.iter().any(|p| *p == "/proj/src/deep"),
        "file.mkdir records: {audit}"
    );
}
