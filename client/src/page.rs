//! Paged lists (`{items, nextCursor}`), read a page at a time or as one stream of items.

use futures::stream::{self, BoxStream, StreamExt};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{encode, Client, Result};

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass it as `cursor` for the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

impl Client {
    /// One page of the list at `path` (whose query, if any, is already in it).
    pub(crate) async fn page<T: DeserializeOwned>(
        &self,
        path: &str,
        cursor: Option<&str>,
    ) -> Result<Page<T>> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let full = match cursor {
            Some(c) => format!("{path}{sep}cursor={}", encode(c)),
            None => path.to_owned(),
        };
        self.json::<_, ()>(Method::GET, &full, None, &[]).await
    }

    /// Every item of the list at `path`, page after page, as a stream; it ends after the
    /// page without a cursor, or at the first error (yielded).
    pub(crate) fn paginate<T: DeserializeOwned + Send + 'static>(
        &self,
        path: String,
    ) -> BoxStream<'static, Result<T>> {
        enum State {
            Next(Option<String>),
            Done,
        }
        let client = self.clone();
        stream::unfold(State::Next(None), move |state| {
            let client = client.clone();
            let path = path.clone();
            async move {
                let cursor = match state {
                    State::Done => return None,
                    State::Next(c) => c,
                };
                match client.page::<T>(&path, cursor.as_deref()).await {
                    Ok(page) => {
                        let next = match page.next_cursor {
                            Some(c) if !c.is_empty() => State::Next(Some(c)),
                            _ => State::Done,
                        };
                        let items: Vec<Result<T>> = page.items.into_iter().map(Ok).collect();
                        Some((stream::iter(items), next))
                    }
                    Err(e) => Some((stream::iter(vec![Err(e)]), State::Done)),
                }
            }
        })
        .flatten()
        .boxed()
    }
}
