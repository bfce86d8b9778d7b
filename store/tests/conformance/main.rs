//! One conformance suite for every `Store`: each case in `cases` is written once against
//! `&Env` and run twice, against `MemoryStore` and against a fresh Postgres database.
//!
//! Postgres must be reachable (see `differently_store::testing`); nothing is skipped.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use differently_store::memory::MemoryStore;
use differently_store::postgres::PgStore;
use differently_store::testing::TestDb;
use differently_store::Store;

mod admission_swap;
mod cases;
mod postgres_only;
mod status_swap;
mod usage_counters;

/// The store under test and how to open another handle on the same data.
pub struct Env {
    pub store: Arc<dyn Store>,
    backend: Backend,
}

enum Backend {
    Memory(MemoryStore),
    Postgres(Box<TestDb>),
}

impl Env {
    pub fn memory() -> Env {
        let m = MemoryStore::new();
        Env {
            store: Arc::new(m.clone()),
            backend: Backend::Memory(m),
        }
    }

    pub async fn postgres() -> Env {
        let db = TestDb::new().await;
        Env {
            store: Arc::new(db.store()),
            backend: Backend::Postgres(Box::new(db)),
        }
    }

    /// Another handle on the same data: a new connection pool for Postgres (as another
    /// replica or a restart would have), the same process state for memory.
    pub async fn reopen(&self) -> Arc<dyn Store> {
        match &self.backend {
            Backend::Memory(m) => Arc::new(m.clone()),
            Backend::Postgres(db) => Arc::new(PgStore::connect(db.url(), 4).await.unwrap()),
        }
    }
}

macro_rules! conformance {
    ($m:ident; $($case:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $case() {
                    crate::$m::$case(&crate::Env::memory()).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    crate::$m::$case(&crate::Env::postgres().await).await;
                }
            )+
        }
    };
}

conformance!(
    cases;
    admit_inserts_queued_row_and_audit_record,
    admit_requires_existing_org_and_project,
    replay_with_same_hash_returns_original,
    replay_with_different_hash_is_mismatch,
    same_key_in_another_project_is_independent,
    max_queued_is_enforced,
    activate_respects_max_active,
    activate_respects_max_cpu_and_stopped_frees_cpu,
    activate_respects_memory_and_disk_quota,
    activate_many_decides_in_order_like_one_by_one,
    admit_many_decides_in_order_like_one_by_one,
    activity_batches_keep_the_latest_time,
    concurrent_admission_groups_never_exceed_the_queue_limit,
    concurrent_admits_each_get_their_own_outcome,
    starting_a_stopped_sandbox_rechecks_quota,
    activate_respects_pool_cap,
    activate_not_queued_and_missing,
    concurrent_activation_respects_pool_cap,
    mark_running_sets_times_and_bumps_version,
    briefs_answer_many_ids_at_once,
    live_rows_missing_from_a_listing,
    rows_that_drifted_from_their_listed_instance,
    idempotency_keys_replay_refuse_and_expire,
    cas_conflict_when_status_moved,
    a_change_from_a_seen_row_is_the_plain_change,
    concurrent_status_changes_each_apply_once,
    illegal_transition_writes_nothing,
    final_transition_sets_ended_at,
    requeue_clears_pool_and_respects_not_before,
    set_queued_reason_only_touches_queued_rows,
    runnable_queued_in_id_order_with_limit,
    stale_selection,
    expired_selection,
    list_filters_and_cursor_pagination,
    active_cpu_counts_only_compute_reserving_statuses,
    installation_id_is_stable,
    leadership_is_exclusive_and_released_on_drop,
    org_create_get_list_and_unique_names,
    org_update_and_delete,
    project_create_rename_and_list,
    project_delete_waits_for_live_sandboxes,
    project_delete_refuses_while_it_has_snapshots,
    keys_create_get_list_revoke_touch,
    quota_put_get_replace,
    usage_matches_the_accounting_table,
    admit_enforces_max_sandbox_and_queue_limits,
    admit_refuses_a_sandbox_larger_than_a_total_limit,
    activation_waits_on_project_quota,
    tenancy_changes_are_audited_without_key_hash,
    direct_admission_places_only_when_nothing_waits,
    direct_admissions_in_one_group_place_in_order,
    concurrent_direct_admissions_and_activations_respect_max_active,
);

mod audit;
mod bounds;
mod placement;
mod secrets_at_rest;
mod snapshots;
mod warm;
mod warm_capped;
mod webhooks;
mod work_claims;
