//! A pool's warm classes: `/v1/admin/pools/{name}/warm` (admin only). The document an
//! operator puts is `core::warm::WarmClasses`; the answer adds each class's live instance
//! counts, so an operator sees at once whether the pool keeps up.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::ErrorCode;
use differently_store::warm::{claim_minute, WarmClaims, WarmCount};
use serde::{Deserialize, Serialize};

use crate::auth::access::forbidden;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/admin/pools/{name}/warm", get(get_warm).put(put_warm))
}

/// Body of `PUT`: the whole document (`classes` required, so a forgotten field never
/// empties a pool's classes by accident; `[]` does, on purpose).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WarmBody {
    classes: Vec<WarmClass>,
}

/// One class as served: its fields and its instances by state.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServedClass {
    #[serde(flatten)]
    class: WarmClass,
    ready: u32,
    creating: u32,
    /// Instances claimed per minute over the last [`CLAIMS_WINDOW_MINUTES`] minutes.
    claims_per_minute: f64,
    /// Hits ÷ creates that matched the class, over the same window; `None` when none did.
    #[schema(required)]
    hit_ratio: Option<f64>,
}

/// The minutes `claimsPerMinute` and `hitRatio` are taken over (the current one included).
pub(crate) const CLAIMS_WINDOW_MINUTES: i64 = 10;

/// `GET`'s answer.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct WarmDocument {
    pub(crate) classes: Vec<ServedClass>,
}

fn require_admin(p: &Principal) -> ApiResult<()> {
    if p.is_admin() {
        Ok(())
    } else {
        Err(forbidden("manage pools (admin scope needed)"))
    }
}

async fn require_pool(state: &AppState, name: &str) -> ApiResult<()> {
    if state
        .store
        .list_pools()
        .await?
        .iter()
        .any(|r| r.name == name)
    {
        Ok(())
    } else {
        Err(ApiError::not_found("pool"))
    }
}

/// The declared classes with their counts and recent claims (over `minutes`), in document
/// order. Instances of classes no longer declared (being retired) are not classes of the
/// pool, so they are not listed.
fn served(
    classes: WarmClasses,
    counts: &[WarmCount],
    claims: &[WarmClaims],
    minutes: f64,
) -> WarmDocument {
    WarmDocument {
        classes: classes
            .classes
            .into_iter()
            .map(|class| {
                let count = counts.iter().find(|c| c.class == class.name);
                let (hits, misses) = claims
                    .iter()
                    .find(|c| c.class == class.name)
                    .map_or((0, 0), |c| (c.hits, c.misses));
                let matched = hits + misses;
                ServedClass {
                    ready: count.map_or(0, |c| c.ready),
                    creating: count.map_or(0, |c| c.creating),
                    claims_per_minute: hits as f64 / minutes.max(1.0),
                    hit_ratio: (matched > 0).then(|| hits as f64 / matched as f64),
                    class,
                }
            })
            .collect(),
    }
}

/// `pool`'s warm classes with their counts and recent claims (also the trust report's, per
/// pool). This process's own uncounted claims are added to the store's first.
pub(crate) async fn document(state: &AppState, pool: &str) -> ApiResult<WarmDocument> {
    let classes = state.store.warm_classes(pool).await?;
    let counts = state.store.warm_counts(pool).await?;
    state.warm.flush_claims(state.store.as_ref()).await?;
    let now = chrono::Utc::now();
    let since = claim_minute(now - chrono::TimeDelta::minutes(CLAIMS_WINDOW_MINUTES - 1));
    let claims = state.store.warm_claims_since(pool, since).await?;
    let minutes = (now - since).num_milliseconds() as f64 / 60_000.0;
    Ok(served(classes, &counts, &claims, minutes))
}

/// Longest a pool's delete waits for its warm instances to be deleted.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// A drained pool counts as drained only this long after its classes were emptied: two
/// refill passes, so a pass that read the classes before they were emptied has begun (and
/// so shows) whatever it began.
const DRAIN_SETTLE: std::time::Duration = std::time::Duration::from_millis(600);
/// How often the drain looks again.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Before a pool is deleted: its warm classes are emptied (audited as any `PUT`), so the
/// refill leader retires its instances and the pool's workers delete them on the backend,
/// which they can only do while the pool exists. Waits for them to be gone, at most
/// [`DRAIN_WAIT`]; then the delete goes on (and the store refuses it if any is left: a 409
/// saying so, to retry).
pub(crate) async fn drain_for_delete(
    state: &AppState,
    pool: &str,
    actor: &differently_store::Actor,
) -> ApiResult<()> {
    let classes = state.store.warm_classes(pool).await?;
    if classes.classes.is_empty() && state.store.warm_instances(pool).await?.is_empty() {
        return Ok(());
    }
    if !classes.classes.is_empty() {
        state
            .store
            .set_warm_classes(pool, &WarmClasses::default(), actor)
            .await?;
        state.warm.clear();
    }
    let started = tokio::time::Instant::now();
    loop {
        let left = state.store.warm_instances(pool).await?.len();
        let waited = started.elapsed();
        if (left == 0 && waited >= DRAIN_SETTLE) || waited >= DRAIN_WAIT {
            return Ok(());
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

async fn get_warm(
    State(state): State<AppState>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<WarmDocument>> {
    require_admin(&p)?;
    require_pool(&state, &name).await?;
    Ok(Json(document(&state, &name).await?))
}

async fn put_warm(
    State(state): State<AppState>,
    p: Principal,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<WarmDocument>> {
    require_admin(&p)?;
    require_pool(&state, &name).await?;
    let b: WarmBody = parse_json(&body)?;
    let classes = WarmClasses { classes: b.classes };
    classes
        .validate()
        .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    state
        .store
        .set_warm_classes(&name, &classes, &p.actor())
        .await?;
    // The create path's view of the classes is this process's cache: refreshed now here,
    // within its TTL elsewhere.
    state.warm.clear();
    Ok(Json(document(&state, &name).await?))
}
