//! Following a process's output in the API process that supervises it, without a request:
//! what a start hands to the in-process caller that wants the output at once (the E2B
//! facade's `Start`), so starting and attaching is one inner `/v1` request, not two.
//!
//! A `/v1` start answer carries an [`Attached`] response extension (never serialized: only
//! in-process callers see it). Reattaching later, perhaps from another API process, stays
//! `GET …/processes/{pid}/output`.

use std::sync::Arc;

use tokio::sync::watch;

use super::ask::READ_PAGE_BYTES;
use super::entry::{Chunk, Ending, Entry};

/// The process a start just made, for its in-process caller to follow.
#[derive(Clone)]
pub struct Attached(pub(super) Arc<Entry>);

impl Attached {
    /// The process's pid.
    pub fn pid(&self) -> u32 {
        self.0.pid
    }

    /// Its output from byte offset `from` on.
    pub fn follow(self, from: u64) -> Follow {
        Follow::new(self.0, from)
    }
}

/// What comes next of a followed process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Output in order, from where the last piece ended.
    Output(Vec<Chunk>),
    /// The process's end, after all its output.
    End(Ending),
    /// Output from byte `at` to `kept` was dropped before it was read (the reader fell
    /// behind by more than the output kept); nothing more follows.
    Behind { at: u64, kept: u64 },
}

/// A reader of one local process's output, waking on each change (the same reads as
/// `Ask::Read` with no wait limit: a page at a time, the end after the output).
pub struct Follow {
    entry: Arc<Entry>,
    at: u64,
    changed: watch::Receiver<u64>,
}

impl Follow {
    fn new(entry: Arc<Entry>, from: u64) -> Follow {
        // Subscribed before the first read, so no change between them is missed.
        let changed = entry.watch();
        Follow {
            entry,
            at: from,
            changed,
        }
    }

    /// The next piece, waiting for one. Cancel safe: nothing is consumed until it returns.
    pub async fn next(&mut self) -> Piece {
        loop {
            let (chunks, next, ending) = self.entry.read(self.at, READ_PAGE_BYTES);
            if let Some(first) = chunks.first().filter(|c| c.at > self.at) {
                return Piece::Behind {
                    at: self.at,
                    kept: first.at,
                };
            }
            if !chunks.is_empty() {
                self.at = next;
                return Piece::Output(chunks);
            }
            if let Some(ending) = ending {
                return Piece::End(ending);
            }
            // The entry (held here) owns the sender, so this only waits for a change.
            let _ = self.changed.changed().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::super::entry::{running_entry, Stream, OUTPUT_CAP};
    use super::*;

    fn entry() -> Arc<Entry> {
        running_entry(9, "sbx_01jd0000000000000000000000", "cat", false)
    }

    #[tokio::test]
    async fn a_follower_wakes_on_output_and_ends_after_it() {
        let e = entry();
        let mut f = Attached(e.clone()).follow(0);
        let waiting = tokio::spawn(async move {
            let first = f.next().await;
            (first, f)
        });
        tokio::task::yield_now().await;
        e.append(Stream::Stdout, Bytes::from_static(b"hi\n"));
        let (first, mut f) = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken by the output")
            .expect("the task ran");
        let Piece::Output(chunks) = first else {
            panic!("output first, got {first:?}");
        };
        assert_eq!((chunks[0].at, &chunks[0].bytes[..]), (0, &b"hi\n"[..]));
        e.append(Stream::Stderr, Bytes::from_static(b"x"));
        e.end(Ending::Exit {
            exit_code: 2,
            duration_ms: 1,
        });
        let Piece::Output(chunks) = f.next().await else {
            panic!("the stderr before the end");
        };
        assert_eq!(chunks[0].stream, Stream::Stderr);
        assert!(matches!(
            f.next().await,
            Piece::End(Ending::Exit { exit_code: 2, .. })
        ));
    }

    #[tokio::test]
    async fn a_follower_behind_the_kept_output_says_so() {
        let e = entry();
        let f = Attached(e.clone());
        let mut f = f.follow(0);
        let piece = Bytes::from(vec![b'x'; 1 << 20]);
        for _ in 0..(OUTPUT_CAP >> 20) + 1 {
            e.append(Stream::Stdout, piece.clone());
        }
        assert_eq!(
            f.next().await,
            Piece::Behind {
                at: 0,
                kept: 1 << 20
            }
        );
    }
}
