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
