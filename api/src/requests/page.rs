//! Cursor pagination shared by every list route: `?limit=&cursor=` →
//! `{"items": […], "nextCursor": "…" | null}`. Cursors are opaque to clients (the OpenAPI
//! document gives them no shape); here they are the last id served.

use serde::{Deserialize, Serialize};

use differently_core::{ErrorCode, FieldError};

use crate::error::ApiError;

/// Default and largest page.
pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 1000;

/// One page of results; the OpenAPI document's `…List` objects are its schemas.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    pub items: Vec<T>,
    #[schema(required)]
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from `limit + 1` rows: the extra row only says there is more.
    pub fn from_rows(mut rows: Vec<T>, limit: u32, id: impl Fn(&T) -> String) -> Page<T> {
        let next_cursor = if rows.len() > limit as usize {
            rows.truncate(limit as usize);
            rows.last().map(id)
        } else {
            None
        };
        Page {
            items: rows,
            next_cursor,
        }
    }
}

/// A 400 naming a query parameter.
pub fn bad_query(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::field(ErrorCode::InvalidArgument, FieldError::new(field, message))
}

/// Parses `limit`.
pub fn parse_limit(raw: Option<&str>) -> Result<u32, ApiError> {
    match raw {
        None => Ok(DEFAULT_PAGE),
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                bad_query(
                    "limit",
                    format!("must be an integer between 1 and {MAX_PAGE}"),
                )
            }),
    }
}

/// `?limit=&cursor=` alone.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPageQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// Validated paging parameters of a query that has only those; as an extractor, its
/// rejection is the 400 naming the parameter.
#[derive(Debug)]
pub struct PageQuery {
    pub limit: u32,
    pub cursor: Option<String>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for PageQuery {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        PageQuery::parse(parts.uri.query())
    }
}

impl PageQuery {
    /// Validates query string `raw`, which may hold only paging parameters.
    pub fn parse(raw: Option<&str>) -> Result<PageQuery, ApiError> {
        let q: RawPageQuery = crate::requests::query::parse_query(raw)?;
        Ok(PageQuery {
            limit: parse_limit(q.limit.as_deref())?,
            cursor: q.cursor,
        })
    }

    /// The cursor parsed as an id of the listed kind.
    pub fn cursor_id<I, E>(
        &self,
        parse: impl Fn(&str) -> Result<I, E>,
    ) -> Result<Option<I>, ApiError> {
        parse_cursor(self.cursor.as_deref(), parse)
    }
}

/// Parses a `cursor` (the last id served) as an id of the listed kind.
pub fn parse_cursor<I, E>(
    raw: Option<&str>,
    parse: impl Fn(&str) -> Result<I, E>,
) -> Result<Option<I>, ApiError> {
    raw.map(|c| parse(c).map_err(|_| bad_query("cursor", "not a cursor from this API")))
        .transpose()
}
