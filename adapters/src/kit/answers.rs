//! An HTTP provider's answers: a 2xx passes, an error answer is read once
//! ([`ErrorAnswer`]) and mapped by the client's [`crate::http::ErrorMapper`], with the
//! credential re-read after a refusal and every message scrubbed. Each provider's client
//! used to carry its own copy of this.

use reqwest::{RequestBuilder, Response, StatusCode};

use super::errors::ErrorAnswer;
use crate::http::{decode_answer, retry_after, HttpClient};
use crate::AdapterError;

impl HttpClient {
    /// Reads an error answer: status, `Retry-After` and body.
    pub async fn read_answer(resp: Response) -> ErrorAnswer {
        let status = resp.status();
        let retry_after = retry_after(resp.headers());
        let body = resp.bytes().await.unwrap_or_default();
        ErrorAnswer {
            status,
            retry_after,
            body,
        }
    }

    /// Maps an error answer with the client's [`ErrorMapper`]: a refused credential (401,
    /// 403) is read again on the next request, and the message is scrubbed.
    pub fn map_answer(&self, op: &str, answer: &ErrorAnswer) -> AdapterError {
        if matches!(answer.status.as_u16(), 401 | 403) {
            self.forget_credential();
        }
        self.scrub_error((self.errors)(op, answer))
    }

    /// Reads an error answer and maps it ([`HttpClient::map_answer`]).
    pub async fn error_of(&self, op: &str, resp: Response) -> AdapterError {
        let answer = Self::read_answer(resp).await;
        self.map_answer(op, &answer)
    }

    /// Sends; an error answer comes back read, for a caller that gives some statuses a
    /// meaning of its own (a 409 on create: the name is taken) and maps the rest with
    /// [`HttpClient::map_answer`].
    pub async fn call(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Result<Response, ErrorAnswer>, AdapterError> {
        let resp = self.send(rb, op).await?;
        if resp.status().is_success() {
            Ok(Ok(resp))
        } else {
            Ok(Err(Self::read_answer(resp).await))
        }
    }

    /// Sends a file operation on sandbox path `path`: a 404 is the path missing
    /// ([`AdapterError::PathNotFound`]), not the instance.
    pub async fn file_call(
        &self,
        rb: RequestBuilder,
        op: &str,
        path: &str,
    ) -> Result<Response, AdapterError> {
        match self.call(rb, op).await? {
            Ok(resp) => Ok(resp),
            Err(a) if a.status == StatusCode::NOT_FOUND => {
                Err(AdapterError::PathNotFound(path.to_owned()))
            }
            Err(a) => Err(self.map_answer(op, &a)),
        }
    }

    /// The JSON body of a 2xx answer (a cut or garbled body is transient).
    pub async fn decode<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        resp: Response,
    ) -> Result<T, AdapterError> {
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.transport_error(op, e))?;
        decode_answer(&bytes, op, &self.service)
    }

    /// `resp` if it is a 2xx, else its error ([`HttpClient::error_of`]).
    pub async fn check(&self, op: &str, resp: Response) -> Result<Response, AdapterError> {
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(self.error_of(op, resp).await)
        }
    }

    /// Sends and requires a 2xx answer.
    pub async fn send_ok(&self, rb: RequestBuilder, op: &str) -> Result<Response, AdapterError> {
        let resp = self.send(rb, op).await?;
        self.check(op, resp).await
    }

    /// Sends, requires a 2xx answer and decodes its JSON body (a cut or garbled body is
    /// transient).
    pub async fn json<T: serde::de::DeserializeOwned>(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<T, AdapterError> {
        let resp = self.send_ok(rb, op).await?;
        self.decode(op, resp).await
    }
}
