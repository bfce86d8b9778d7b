//! Admission of new sandboxes, optionally placed directly.

use async_trait::async_trait;
use differently_core::accounting;

use super::activation::activate_in;
use super::warm::{admit_claimed as claim_in, Claim};
use super::{MemoryStore, Row};
use crate::prelude::*;
use crate::shared::rules;
use crate::{Activation, Admission, Admitted, QuotaScope, StoreError};

#[async_trait]
impl AdmissionStore for MemoryStore {
    async fn admit(&self, admission: Admission) -> Result<Admitted, StoreError> {
        let Admission {
            sandbox,
            request_hash,
            defaults,
            actor,
            request_id: _,
            direct,
        } = admission;
        accounting::check_admissible(&sandbox)?;
        let (activated, direct) = 'decided: {
            let mut st = self.lock();
            if !st.orgs.contains_key(&sandbox.org_id) {
                return Err(StoreError::NotFound);
            }
            match st.projects.get(&sandbox.project_id) {
                Some(p) if p.org_id == sandbox.org_id => {}
                _ => return Err(StoreError::NotFound),
            }
            if let Some(key) = &sandbox.idempotency_key {
                let existing = st.sandboxes.values().find(|r| {
                    r.sandbox.project_id == sandbox.project_id
                        && r.sandbox.idempotency_key.as_ref() == Some(key)
                });
                if let Some(r) = existing {
                    return if r.request_hash == request_hash {
                        Ok(Admitted::Replayed(r.sandbox.clone()))
                    } else {
                        Err(StoreError::IdempotencyMismatch)
                    };
                }
            }
            let org_scope = QuotaScope::Org(sandbox.org_id.clone());
            let prj_scope = QuotaScope::Project(sandbox.project_id.clone());
            accounting::check_admission_limits(
                &sandbox,
                (
                    &st.usage(&org_scope),
                    &st.stored_quota(&org_scope).or(&defaults),
                ),
                (&st.usage(&prj_scope), &st.stored_quota(&prj_scope)),
            )?;
            if st.sandboxes.contains_key(&sandbox.id) {
                return Err(StoreError::Internal(format!(
                    "sandbox {} already exists",
                    sandbox.id
                )));
            }
            // Read before the insert: whether anything of the org already waits.
            let org_queued = st.usage(&org_scope).queued;
            let mut direct = direct.filter(|d| d.applies() && org_queued == 0);
            let mut sandbox = sandbox;
            if let Some(d) = direct.as_ref() {
                match claim_in(&mut st, &sandbox, &request_hash, &actor, d, &defaults)? {
                    Claim::Claimed(claimed) => {
                        break 'decided (Activation::Activated(*claimed), d.clone());
                    }
                    // Claim only (a capped pool): queued for the leader, never placed cold;
                    // saying why when a limit stops it, as the leader would.
                    Claim::Waits(reason) if d.claim_only() => {
                        let at = sandbox.created_at;
                        accounting::wait(&mut sandbox, reason, at);
                        direct = None;
                    }
                    Claim::Waits(_) | Claim::None if d.claim_only() => direct = None,
                    Claim::Waits(_) | Claim::None => {}
                }
            }
            let entry = rules::admit_entry(&sandbox, &actor);
            st.audit(
                &sandbox.org_id,
                sandbox.id.as_str(),
                entry,
                sandbox.created_at,
            );
            st.sandboxes.insert(
                sandbox.id.clone(),
                Row {
                    sandbox: sandbox.clone(),
                    request_hash,
                    next_attempt_at: sandbox.created_at,
                },
            );
            let Some(direct) = direct else {
                return Ok(Admitted::New(sandbox));
            };
            let now = sandbox.created_at;
            let activated = activate_in(
                &mut st,
                &sandbox.id,
                &direct.pool,
                &defaults,
                now,
                rules::activate_direct,
            )?;
            (activated, direct)
        };
        match activated {
            Activation::Activated(active) => {
                crate::placement::PlacementStore::save_placement(
                    self,
                    &active.id,
                    &direct.explanation,
                )
                .await?;
                Ok(Admitted::New(active))
            }
            Activation::Waiting(waiting, _) | Activation::NotQueued(waiting) => {
                Ok(Admitted::New(waiting))
            }
        }
    }
}
