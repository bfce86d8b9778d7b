//! Chains, checkpoints and the verifier over hand-built and tampered records.

use serde_json::json;

use super::*;

fn key(b: u8) -> AuditKey {
    AuditKey::from_bytes([b; 32])
}

#[test]
fn a_resource_always_maps_to_the_same_shard_and_shards_are_all_used() {
    let org = OrgId::new();
    assert_eq!(chain_of(None, "pool-a"), INSTALLATION_CHAIN);
    let mut used = std::collections::BTreeSet::new();
    for i in 0..400 {
        let resource = format!("sbx_{i}");
        let chain = chain_of(Some(&org), &resource);
        assert_eq!(chain, chain_of(Some(&org), &resource));
        let (o, shard) = chain.rsplit_once('/').unwrap_or_default();
        assert_eq!(o, org.as_str());
        used.insert(shard.parse::<u32>().unwrap_or(u32::MAX));
    }
    assert_eq!(used, (0..ORG_CHAIN_SHARDS).collect());
    // Pinned: the mapping is part of the stored data, it must not change between versions.
    assert_eq!(chain_of(Some(&org), "sbx_pinned"), format!("{org}/2"));
}

fn new_event(action: &str) -> NewAuditEvent {
    NewAuditEvent {
        org_id: None,
        project_id: None,
        actor: "system:test".into(),
        action: action.into(),
        resource: "r".into(),
        outcome: OUTCOME_OK.into(),
        detail: json!({"b": 1, "a": [true, null, "x"]}),
    }
}

fn chain(k: &AuditKey, n: i64) -> Vec<AuditEvent> {
    let mut out: Vec<AuditEvent> = vec![];
    for i in 0..n {
        let prev = out.last().map(|r| (r.chain_seq, r.hash.clone()));
        let mut r = AuditEvent::chained(
            k,
            INSTALLATION_CHAIN.into(),
            prev,
            new_event(&format!("a{i}")),
            Utc::now(),
            Some(format!("req{i}")),
        );
        r.seq = i + 10;
        out.push(r);
    }
    out
}

fn verify(k: &AuditKey, cps: &[Checkpoint], recs: &[AuditEvent]) -> VerifyReport {
    let mut v = Verifier::new(k.clone());
    cps.iter().for_each(|c| v.checkpoint(c));
    recs.iter().for_each(|r| v.record(r));
    v.finish()
}

/// `recs` continued by `n` records signed with `k` (a key rotation mid-chain).
fn extend(k: &AuditKey, mut recs: Vec<AuditEvent>, n: i64) -> Vec<AuditEvent> {
    for i in 0..n {
        let prev = recs.last().map(|r| (r.chain_seq, r.hash.clone()));
        let mut r = AuditEvent::chained(
            k,
            INSTALLATION_CHAIN.into(),
            prev,
            new_event(&format!("b{i}")),
            Utc::now(),
            None,
        );
        r.seq = 100 + i;
        recs.push(r);
    }
    recs
}

fn head_of(r: &AuditEvent) -> ChainHead {
    ChainHead {
        chain: r.chain.clone(),
        chain_seq: r.chain_seq,
        hash: r.hash.clone(),
    }
}

fn segment(reason: &str) -> Option<Segment> {
    Some(Segment {
        reason: reason.into(),
        lost_key_ids: vec![],
    })
}

#[test]
fn records_name_their_key_and_the_name_is_covered_by_the_hash() {
    let k = key(1);
    let mut recs = chain(&k, 2);
    assert_eq!(recs[0].key_id.as_deref(), Some(k.key_id().as_str()));
    assert!(recs[0].canonical().contains("\"keyId\""));
    assert!(recs[0].canonical().contains("\"v\":2"));
    // Relabelling a record with another key's id breaks it.
    recs[1].key_id = Some(key(2).key_id());
    let ring = AuditKeyring::new(k.clone()).with_previous(vec![key(2)]);
    let mut v = Verifier::new(ring);
    recs.iter().for_each(|r| v.record(r));
    let bad = v.finish().first_bad.unwrap();
    assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::HashMismatch, 2));
}

#[test]
fn a_rotated_key_still_verifies_old_records_when_the_ring_holds_it() {
    let (old, new) = (key(1), key(2));
    let recs = extend(&new, chain(&old, 3), 3);
    let ring = AuditKeyring::new(new.clone()).with_previous(vec![old.clone()]);
    let mut v = Verifier::new(ring);
    recs.iter().for_each(|r| v.record(r));
    let r = v.finish();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.records, 6);
    // Without the old key the first old record is reported, naming the key it needs.
    let r = verify(&new, &[], &recs);
    let bad = r.first_bad.unwrap();
    assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::UnknownKey, 1));
    assert!(bad.message.contains(&old.key_id()), "{}", bad.message);
    assert_eq!(r.unknown_key_ids, vec![old.key_id()]);
}

#[test]
fn records_without_a_key_id_verify_under_any_key_of_the_ring() {
    let (old, new) = (key(1), key(2));
    let mut recs = chain(&old, 3);
    // As written before key ids: v1 canonical form, no id.
    for i in 0..recs.len() {
        recs[i].key_id = None;
        if i > 0 {
            recs[i].prev_hash = recs[i - 1].hash.clone();
        }
        recs[i].hash = recs[i].expected_hash(&old).unwrap();
    }
    assert!(recs[0].canonical().contains("\"v\":1"));
    let ring = AuditKeyring::new(new.clone()).with_previous(vec![old.clone()]);
    let mut v = Verifier::new(ring);
    recs.iter().for_each(|r| v.record(r));
    assert!(v.finish().ok);
    let bad = verify(&new, &[], &recs).first_bad.unwrap();
    assert_eq!(bad.kind, ProblemKind::HashMismatch);
}

#[test]
fn a_segment_after_a_lost_key_checks_links_before_it_and_everything_after() {
    let (lost, new) = (key(1), key(2));
    let old = chain(&lost, 3);
    let c1 = Checkpoint::next(&lost, None, vec![head_of(&old[2])], Utc::now());
    let seg = Checkpoint::next_segment(
        &new,
        Some(&c1),
        vec![head_of(&old[2])],
        Utc::now(),
        segment("key lost in the 2026-12 incident"),
    );
    let recs = extend(&new, old.clone(), 2);
    // Without the segment: the lost key is reported.
    assert!(!verify(&new, std::slice::from_ref(&c1), &recs).ok);
    let r = verify(&new, &[c1.clone(), seg.clone()], &recs);
    assert!(r.ok, "{r:?}");
    assert_eq!((r.unverifiable_records, r.unverifiable_checkpoints), (3, 1));
    assert_eq!(r.segments.len(), 1);
    assert_eq!(r.segments[0].reason, "key lost in the 2026-12 incident");
    assert_eq!(r.unknown_key_ids, vec![lost.key_id()]);

    // A segment does not excuse a broken link before it ...
    let mut cut = recs.clone();
    cut[1].prev_hash = GENESIS_HASH.into();
    let bad = verify(&new, &[c1.clone(), seg.clone()], &cut)
        .first_bad
        .unwrap();
    assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::BrokenLink, 2));
    // ... nor an edit after it ...
    let mut edited = recs.clone();
    edited[4].detail = json!({"edited": true});
    let bad = verify(&new, &[c1.clone(), seg.clone()], &edited)
        .first_bad
        .unwrap();
    assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::HashMismatch, 5));
    // ... nor records signed with the lost key after it.
    let late = extend(&lost, recs.clone(), 1);
    let bad = verify(&new, &[c1, seg], &late).first_bad.unwrap();
    assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::UnknownKey, 6));
}

#[test]
fn a_segment_signed_with_an_unknown_key_covers_nothing() {
    let (lost, other, new) = (key(1), key(3), key(2));
    let old = chain(&lost, 2);
    let seg = Checkpoint::next_segment(
        &other,
        None,
        vec![head_of(&old[1])],
        Utc::now(),
        segment("forged"),
    );
    let r = verify(&new, std::slice::from_ref(&seg), &old);
    let bad = r.first_bad.unwrap();
    assert_eq!(
        (bad.kind, bad.chain.as_str()),
        (ProblemKind::UnknownKey, "checkpoints")
    );
    assert!(r.segments.is_empty());
    assert_eq!(r.unverifiable_records, 0);
}

#[test]
fn canonical_json_sorts_keys_recursively() {
    let v = json!({"z": 1, "a": {"y": [1, {"c": 2, "b": "é\n"}], "x": null}});
    assert_eq!(
        canonical_json(&v),
        r#"{"a":{"x":null,"y":[1,{"b":"é\n","c":2}]},"z":1}"#
    );
}

#[test]
fn keys_parse_from_hex_only() {
    let k = AuditKey::from_hex(&"ab".repeat(32)).unwrap();
    assert_eq!(k, AuditKey::from_bytes([0xab; 32]));
    assert_eq!(AuditKey::from_hex("abc"), Err(KeyError::Format));
    assert_eq!(AuditKey::from_hex(&"zz".repeat(32)), Err(KeyError::Format));
    assert!(!format!("{k:?}").contains("ab"));
}

#[test]
fn an_intact_chain_verifies_and_a_wrong_key_does_not() {
    let k = key(1);
    let recs = chain(&k, 5);
    let r = verify(&k, &[], &recs);
    assert!(r.ok, "{r:?}");
    assert_eq!((r.records, r.chains), (5, 1));
    let r = verify(&key(2), &[], &recs);
    assert_eq!(r.first_bad.unwrap().chain_seq, 1);
}

#[test]
fn an_edit_is_reported_at_exactly_that_record() {
    let k = key(1);
    let mut recs = chain(&k, 5);
    recs[2].detail = json!({"b": 2});
    let r = verify(&k, &[], &recs);
    let bad = r.first_bad.unwrap();
    assert_eq!(bad.kind, ProblemKind::HashMismatch);
    assert_eq!((bad.chain_seq, bad.seq), (3, Some(12)));
    assert_eq!(r.problems.len(), 1);
}

#[test]
fn a_deletion_is_reported_as_the_missing_position() {
    let k = key(1);
    let mut recs = chain(&k, 5);
    recs.remove(1);
    let bad = verify(&k, &[], &recs).first_bad.unwrap();
    assert_eq!(bad.kind, ProblemKind::Missing);
    assert_eq!((bad.chain_seq, bad.seq), (2, None));
}

#[test]
fn a_reorder_is_reported_at_the_first_moved_record() {
    let k = key(1);
    let mut recs = chain(&k, 5);
    // Swap positions 2 and 3 (as an UPDATE of chain_seq would).
    recs[1].chain_seq = 3;
    recs[2].chain_seq = 2;
    recs.swap(1, 2);
    let bad = verify(&k, &[], &recs).first_bad.unwrap();
    assert_eq!((bad.chain_seq, bad.seq), (2, Some(12)));
}

#[test]
fn checkpoints_catch_a_truncated_tail_and_verify_themselves() {
    let k = key(1);
    let recs = chain(&k, 5);
    let head = |r: &AuditEvent| ChainHead {
        chain: r.chain.clone(),
        chain_seq: r.chain_seq,
        hash: r.hash.clone(),
    };
    let c1 = Checkpoint::next(&k, None, vec![head(&recs[1])], Utc::now());
    let c2 = Checkpoint::next(&k, Some(&c1), vec![head(&recs[4])], Utc::now());
    assert!(verify(&k, &[c1.clone(), c2.clone()], &recs).ok);
    let bad = verify(&k, &[c1.clone(), c2.clone()], &recs[..3])
        .first_bad
        .unwrap();
    assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::Truncated, 4));
    let mut forged = c2.clone();
    forged.heads[0].chain_seq = 3;
    let bad = verify(&k, &[c1, forged], &recs).first_bad.unwrap();
    assert_eq!(bad.kind, ProblemKind::BadCheckpoint);
}

#[test]
fn export_lines_round_trip_and_still_verify() {
    let k = key(3);
    let recs = chain(&k, 3);
    let text: Vec<String> = recs
        .iter()
        .map(|r| serde_json::to_string(&ExportLine::Record(Box::new(r.clone()))).unwrap())
        .collect();
    let back: Vec<AuditEvent> = text
        .iter()
        .map(|l| match serde_json::from_str(l).unwrap() {
            ExportLine::Record(r) => *r,
            ExportLine::Checkpoint(_) => panic!("record expected"),
        })
        .collect();
    assert!(verify(&k, &[], &back).ok);
}
