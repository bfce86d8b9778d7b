//! Query strings, read one way for every `/v1` route: an unknown parameter, one given twice,
//! or one the type cannot take is a 400 `invalid_argument` naming the parameter in
//! `details.field`, in the words a body's refusal uses ([`crate::requests::decode`]), never
//! the HTTP framework's text.
//!
//! Every parameter is read as a string (a route's query type has `Option<String>` fields):
//! the route parses it and states its bound, as docs/api.md's *Bounds* asks for
//! (`limit: must be an integer between 1 and 1000`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::requests::decode::{refusal, Source};
use crate::requests::page::bad_query;

/// A query string read as `T` by [`parse_query`]; its rejection is the API's error.
#[derive(Debug)]
pub struct StrictQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parse_query(parts.uri.query()).map(StrictQuery)
    }
}

/// Reads query string `raw` (none: empty) as `T`, each parameter given at most once.
pub fn parse_query<T: DeserializeOwned>(raw: Option<&str>) -> Result<T, ApiError> {
    let mut params = Map::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if params
            .insert(k.to_string(), Value::String(v.into_owned()))
            .is_some()
        {
            return Err(bad_query(&k, "given more than once"));
        }
    }
    from_params(params)
}

/// Reads parameters already split out of a query (a route that takes one of them
/// repeatedly, as `GET /v1/sandboxes` takes `label`, gathers the others here) as `T`.
pub fn from_params<T: DeserializeOwned>(params: Map<String, Value>) -> Result<T, ApiError> {
    let value = Value::Object(params);
    serde_path_to_error::deserialize(&value)
        .map_err(|e| refusal(Source::Query, e.path(), &e.inner().to_string(), &value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Q {
        project_id: Option<String>,
    }

    fn field(e: &ApiError) -> &str {
        e.details
            .as_ref()
            .and_then(|d| d["field"].as_str())
            .unwrap_or("-")
    }

    #[test]
    fn parameters_are_read_and_refusals_name_them() {
        let q: Q = parse_query(Some("projectId=prj_1")).expect("read");
        assert_eq!(q.project_id.as_deref(), Some("prj_1"));
        let q: Q = parse_query(None).expect("read");
        assert!(q.project_id.is_none());
        let e = parse_query::<Q>(Some("bogus=1")).expect_err("unknown");
        assert_eq!(field(&e), "bogus");
        assert!(
            e.message.starts_with("bogus: unknown parameter `bogus`"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("deserialize"), "{}", e.message);
        let e = parse_query::<Q>(Some("projectId=a&projectId=b")).expect_err("twice");
        assert_eq!(field(&e), "projectId");
        assert_eq!(e.message, "projectId: given more than once");
    }
}
