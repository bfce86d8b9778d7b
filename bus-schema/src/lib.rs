//! The bus contract: subjects, streams, consumers, and versioned messages.
//!
//! Pure data, so an outside subscriber can depend on this crate alone. Subjects carry ids,
//! never names ([`naming`]). Every message travels in an [`Envelope`] and is read back with
//! [`decode`], which refuses a newer major version. Message bodies ([`messages`]) are written
//! out field by field, pinned by golden fixtures, and carry no secret material.

pub mod envelope;
pub mod messages;
pub mod naming;
pub mod public;
pub mod trace;

pub use envelope::{decode, msg_id, DecodeError, Envelope, Message, SCHEMA_VERSION};
pub use messages::{
    Admitted, AuditHead, QueuedSandbox, QueuedSpec, SandboxState, StatusChanged, StatusOnly,
    Terminating, WarmWork, WireResources, Work, WorkOp,
};
pub use naming::{ConsumerDef, Naming, Retention, StreamDef};
pub use public::{
    Cause, EventActor, EventData, EventType, Origin, PublicEvent, PUBLIC_EVENT_VERSION,
};
pub use trace::TraceContext;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use differently_core::{OrgId, ProjectId, SandboxId, SandboxStatus};

    use super::*;

    #[test]
    fn an_admission_without_its_row_still_decodes_and_one_with_it_round_trips() {
        let (org, prj) = (OrgId::new(), ProjectId::new());
        let old = format!(r#"{{"orgId":"{org}","projectId":"{prj}"}}"#);
        let body: Admitted = serde_json::from_str(&old).unwrap();
        assert_eq!(body.sandbox, None);
        let spec = differently_core::SandboxSpec::build(&Default::default()).unwrap();
        let row =
            differently_core::Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
        let with = Admitted {
            org_id: org,
            project_id: prj,
            sandbox: Some(Box::new(QueuedSandbox::of(&row))),
        };
        let back: Admitted = serde_json::from_slice(&serde_json::to_vec(&with).unwrap()).unwrap();
        assert_eq!(back, with);
    }

    #[test]
    fn a_status_event_without_its_view_still_decodes_and_one_with_it_keeps_env_values_out() {
        let (org, prj) = (OrgId::new(), ProjectId::new());
        let at = Utc::now();
        let old = format!(
            r#"{{"orgId":"{org}","projectId":"{prj}","status":"running","statusReason":null,"pool":"p","at":"{}"}}"#,
            at.to_rfc3339()
        );
        let body: StatusChanged = serde_json::from_str(&old).unwrap();
        assert_eq!((body.backend_ref, body.view), (None, None));

        let req: differently_core::CreateSandboxRequest =
            serde_json::from_value(serde_json::json!({"env": {"TOKEN": "s3cret-value"}})).unwrap();
        let spec = differently_core::SandboxSpec::build(&req).unwrap();
        let mut row = differently_core::Sandbox::queued(org, prj, spec, None, at);
        row.status = SandboxStatus::Running;
        row.pool = Some("p".into());
        row.backend_ref = Some("ref".into());
        let with = StatusChanged::of(&row);
        assert_eq!(with.view.as_deref(), Some(&SandboxState::of(&row)));
        let wire = serde_json::to_vec(&with).unwrap();
        let text = String::from_utf8(wire.clone()).unwrap();
        assert!(
            text.contains("TOKEN") && !text.contains("s3cret-value"),
            "{text}"
        );
        let back: StatusChanged = serde_json::from_slice(&wire).unwrap();
        assert_eq!(back, with);
        // Read for its status alone, through the same envelope decode every reader uses.
        let env = Envelope::new(row.id.clone(), 4, with).encode().unwrap();
        let only = decode::<StatusOnly>(&env).unwrap();
        assert_eq!(
            (only.body.status, only.status_version),
            (SandboxStatus::Running, 4)
        );
    }

    #[test]
    fn names_derive_from_the_prefix() {
        let n = Naming::new("t1").unwrap();
        let org = OrgId::new();
        assert_eq!(n.admit_subject(&org), format!("t1.admit.{org}"));
        assert_eq!(
            n.work_subject("pool-a", WorkOp::Create),
            "t1.work.pool-a.create"
        );
        assert_eq!(n.admit_stream().name, "T1_ADMIT");
        assert_eq!(
            n.work_consumer("p", Duration::from_secs(1)).filter,
            "t1.work.p.>"
        );
        assert!(Naming::new("Bad.Prefix").is_err());
        assert!(Naming::new("").is_err());
    }

    #[test]
    fn an_event_subject_names_its_sandbox_and_nothing_else_does() {
        let n = Naming::new("t1").unwrap();
        let (org, prj, sbx) = (OrgId::new(), ProjectId::new(), SandboxId::new());
        let subject = n.event_subject(&org, &prj, &sbx, SandboxStatus::Running);
        assert_eq!(n.event_subject_sandbox(&subject), Some(sbx.clone()));
        let earlier = format!("t1.evt.{org}.{prj}.{sbx}");
        assert_eq!(
            n.event_subject_sandbox(&earlier),
            Some(sbx.clone()),
            "an earlier version's subject, without a phase"
        );
        for other in [
            Naming::default().event_subject(&org, &prj, &sbx, SandboxStatus::Running),
            n.public_subject(&org, &prj, Some(&sbx), EventType::StatusChanged),
            format!("{subject}.extra"),
            format!("{earlier}.other"),
            format!("t1.evt.{org}.{prj}.not-a-sandbox"),
            format!("t1.evt.{org}.{sbx}"),
        ] {
            assert_eq!(n.event_subject_sandbox(&other), None, "{other}");
        }
    }

    #[test]
    fn a_public_subject_names_its_org_and_project_and_nothing_else_does() {
        let n = Naming::new("t1").unwrap();
        let (org, prj, sbx) = (OrgId::new(), ProjectId::new(), SandboxId::new());
        for sandbox in [Some(&sbx), None] {
            let subject = n.public_subject(&org, &prj, sandbox, EventType::StatusChanged);
            assert_eq!(
                n.public_subject_scope(&subject),
                Some((org.clone(), prj.clone())),
                "{subject}"
            );
        }
        for other in [
            Naming::default().public_subject(&org, &prj, Some(&sbx), EventType::StatusChanged),
            n.event_subject(&org, &prj, &sbx, SandboxStatus::Running),
            format!("t1.pub.{org}.{prj}.{sbx}"),
            format!("t1.pub.{org}.not-a-project.{sbx}.sandbox.status.changed"),
        ] {
            assert_eq!(n.public_subject_scope(&other), None, "{other}");
        }
    }

    #[test]
    fn public_subjects_are_per_tenant_and_apart_from_internal_ones() {
        let n = Naming::default();
        let (org, prj, sbx) = (OrgId::new(), ProjectId::new(), SandboxId::new());
        let subject = n.public_subject(&org, &prj, Some(&sbx), EventType::ExecFinished);
        assert_eq!(
            subject,
            format!("dly.pub.{org}.{prj}.{sbx}.sandbox.exec.finished")
        );
        assert_eq!(
            n.public_subject(&org, &prj, None, EventType::WebhookDisabled),
            format!("dly.pub.{org}.{prj}._.webhook.disabled")
        );
        assert_eq!(
            n.public_filter(&org, None, None),
            format!("dly.pub.{org}.>")
        );
        assert_eq!(
            n.public_filter(&org, None, Some(&sbx)),
            format!("dly.pub.{org}.*.{sbx}.>")
        );
        let public = n.public_stream();
        assert_eq!(public.name, "DLY_PUB");
        assert_eq!(public.retention, Retention::Limits);
        assert_eq!(public.max_age, Some(Duration::from_secs(24 * 3600)));
        assert!(public.max_bytes.is_some());
        // No internal stream captures a public subject, and the public stream nothing else.
        for def in n.streams().into_iter().filter(|d| d.name != public.name) {
            for f in &def.subjects {
                assert!(!f.starts_with("dly.pub."), "{} captures {f}", def.name);
            }
        }
        assert_eq!(public.subjects, vec!["dly.pub.>".to_owned()]);
    }

    #[test]
    fn work_ops_round_trip_their_subject_token() {
        for op in WorkOp::ALL {
            assert_eq!(WorkOp::parse(op.as_str()), Some(op));
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json, format!("\"{}\"", op.as_str()));
        }
        // A message from before `opId` existed still decodes.
        let old: Work = serde_json::from_str(r#"{"op":"create","pool":"p"}"#).unwrap();
        assert_eq!(old.op_id, None);
    }

    #[test]
    fn envelope_round_trips() {
        let env = Envelope::new(
            SandboxId::new(),
            3,
            Work {
                op: WorkOp::Delete,
                pool: "p".into(),
                op_id: None,
                terminating: Some(Terminating {
                    reason: Some("deleted".into()),
                }),
                warm: None,
            },
        );
        let json = serde_json::to_vec(&env).unwrap();
        let back: Envelope<Work> = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, env);
        assert!(back.published_at.is_some());
        // An envelope from before `publishedAt` existed still decodes.
        let sid = SandboxId::new();
        let old = format!(
            r#"{{"v":1,"sandboxId":"{sid}","statusVersion":1,"body":{{"op":"create","pool":"p"}}}}"#
        );
        let old: Envelope<Work> = serde_json::from_str(&old).unwrap();
        assert_eq!(old.published_at, None);
        assert_eq!(old.trace, TraceContext::default());
        // …and one without `terminating`: the worker reads the row.
        assert_eq!(old.body.terminating, None);
    }

    #[test]
    fn traceparent_is_validated_and_yields_its_trace_id() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = TraceContext::from_header(ok).unwrap();
        assert_eq!(t.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            assert!(TraceContext::from_header(bad).is_none(), "{bad}");
        }
        let r = TraceContext::from_random([7; 16], [0; 8]);
        let back = TraceContext::from_header(r.traceparent.as_deref().unwrap()).unwrap();
        assert_eq!(back.trace_id(), Some("07070707070707070707070707070707"));
    }
}
