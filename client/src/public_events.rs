//! The public event contract outside the SSE stream (`docs/events.md`): the JSON Schema of
//! every type, and NATS credentials for reading the organization's public subjects straight
//! from `DLY_PUB`. Credentials need a NATS server running Differently's auth callout;
//! without one (always under `differently dev`) both credential calls fail with the API's
//! 501 `unsupported_operation`, as an [`Error::Api`](crate::Error::Api) like any other.

use reqwest::Method;
use serde_json::Value;

use crate::{encode, Client, EventCredentials, EventCredentialsRequest, EventSchemaList, Result};

impl Client {
    /// `GET /v1/events/schemas`: the envelope's schema and every type's.
    pub async fn event_schemas(&self) -> Result<EventSchemaList> {
        self.json::<_, ()>(Method::GET, "/v1/events/schemas", None, &[])
            .await
    }

    /// `GET /v1/events/schemas/{type}`: one type's JSON Schema (404 for a type the server
    /// does not know).
    pub async fn event_schema(&self, event_type: &str) -> Result<Value> {
        self.json::<_, ()>(
            Method::GET,
            &format!("/v1/events/schemas/{}", encode(event_type)),
            None,
            &[],
        )
        .await
    }

    /// `POST /v1/events/credentials`: NATS credentials, the token shown this once.
    pub async fn create_event_credentials(
        &self,
        req: &EventCredentialsRequest,
    ) -> Result<EventCredentials> {
        self.json(Method::POST, "/v1/events/credentials", Some(req), &[])
            .await
    }

    /// `DELETE /v1/events/credentials/{id}`: new connections with it are refused at once;
    /// an open one ends within five minutes.
    pub async fn revoke_event_credentials(&self, id: &str) -> Result<()> {
        self.empty::<()>(
            Method::DELETE,
            &format!("/v1/events/credentials/{}", encode(id)),
            None,
        )
        .await
    }
}
