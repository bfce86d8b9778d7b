//! A group's row write sent in the same statement as the audit head lock that follows it.
//!
//! Every audited group (admission, placement, status change) wrote its rows, then locked the
//! audit heads of its chains, each a round trip of its own. Sent as one statement (the write
//! in a data-modifying CTE, the head lock in a `LATERAL` subquery that runs after the write's
//! row count is taken) they cost one round trip, with the same locks in the same order: the
//! write first, then the heads in chain order.

use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Postgres, Row, Transaction};

use crate::StoreError;

/// Adds one parameter to `args` (the next `$n`).
pub(crate) fn bind<'q, T>(args: &mut PgArguments, value: T) -> Result<(), StoreError>
where
    T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + 'q,
{
    args.add(value)
        .map_err(|e| StoreError::Internal(format!("encoding a parameter: {e}")))
}

/// One `INSERT` or `UPDATE` (no `RETURNING`) with its parameters `$1..$params`, and how many
/// rows it must write.
pub(crate) struct PriorWrite {
    sql: &'static str,
    args: PgArguments,
    params: usize,
    rows: u64,
    short: fn(written: u64, expected: u64) -> StoreError,
}

impl PriorWrite {
    /// `short` is the error when the statement writes other than `rows` rows.
    pub(crate) fn new(
        sql: &'static str,
        args: PgArguments,
        params: usize,
        rows: u64,
        short: fn(u64, u64) -> StoreError,
    ) -> PriorWrite {
        PriorWrite {
            sql,
            args,
            params,
            rows,
            short,
        }
    }

    fn check(rows: u64, short: fn(u64, u64) -> StoreError, written: u64) -> Result<(), StoreError> {
        if written == rows {
            Ok(())
        } else {
            Err(short(written, rows))
        }
    }

    /// The write's parameters, `$1..$n` in order, for a statement that passes them on (a
    /// server-side function taking the same arrays).
    pub(crate) fn into_args(self) -> PgArguments {
        self.args
    }

    /// Runs the write alone (a group that appends no audit record).
    pub(crate) async fn run(
        self,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<(), StoreError> {
        let PriorWrite {
            sql,
            args,
            rows,
            short,
            ..
        } = self;
        let res = sqlx::query_with(sql, args).execute(&mut **tx).await?;
        PriorWrite::check(rows, short, res.rows_affected())
    }

    /// Runs the write, then locks the head rows of `chains` (sorted) in that order, in one
    /// statement; the newest committed head of each chain that has one.
    pub(crate) async fn then_lock_heads(
        self,
        tx: &mut Transaction<'static, Postgres>,
        chains: &[&str],
    ) -> Result<Vec<(String, i64, String)>, StoreError> {
        let PriorWrite {
            sql: write,
            mut args,
            params,
            rows: expected,
            short,
        } = self;
        let sql = format!(
            "WITH w AS ({write} RETURNING 1), n AS (SELECT count(*) AS written FROM w)
             SELECT n.written, h.chain, h.chain_seq, h.hash
             FROM n LEFT JOIN LATERAL (
                 SELECT chain, chain_seq, hash FROM audit_heads WHERE chain = ANY(${p})
                 ORDER BY chain COLLATE \"C\" FOR UPDATE) h ON true",
            p = params + 1,
        );
        bind(&mut args, chains)?;
        let rows = sqlx::query_with(&sql, args).fetch_all(&mut **tx).await?;
        let written: i64 = match rows.first() {
            Some(r) => r.try_get("written")?,
            None => 0,
        };
        PriorWrite::check(expected, short, u64::try_from(written).unwrap_or(0))?;
        let mut heads = Vec::with_capacity(rows.len());
        for r in &rows {
            let chain: Option<String> = r.try_get("chain")?;
            if let Some(chain) = chain {
                heads.push((chain, r.try_get("chain_seq")?, r.try_get("hash")?));
            }
        }
        Ok(heads)
    }
}

#[cfg(all(test, feature = "test-support"))]
mod tests {
    use super::*;
    use crate::testing::TestDb;

    /// An `UPDATE` of `ids` that changes nothing but must touch `rows` rows.
    fn touch(ids: &[&str], rows: u64) -> PriorWrite {
        let mut args = PgArguments::default();
        bind(&mut args, ids.to_vec()).unwrap_or_else(|e| panic!("binding ids: {e}"));
        PriorWrite::new(
            "UPDATE sandboxes SET updated_at = updated_at WHERE id = ANY($1)",
            args,
            1,
            rows,
            |written, expected| StoreError::Internal(format!("wrote {written} of {expected}")),
        )
    }

    #[tokio::test]
    async fn the_heads_come_back_locked_in_chain_order_after_the_write() {
        let db = TestDb::new().await;
        let store = db.store();
        sqlx::query(
            "INSERT INTO audit_heads (chain, chain_seq, hash)
             VALUES ('b/1', 7, 'hb'), ('a/1', 3, 'ha'), ('c/1', 1, 'hc')",
        )
        .execute(store.pool())
        .await
        .unwrap();
        let mut tx = store.begin().await.unwrap();
        let heads = touch(&[], 0)
            .then_lock_heads(&mut tx, &["a/1", "b/1", "z/9"])
            .await
            .unwrap();
        assert_eq!(
            heads,
            vec![
                ("a/1".to_owned(), 3, "ha".to_owned()),
                ("b/1".to_owned(), 7, "hb".to_owned())
            ],
            "only existing heads, in chain order"
        );
        // Locked until this transaction ends: another writer cannot take them.
        let taken =
            sqlx::query("SELECT chain FROM audit_heads WHERE chain = 'a/1' FOR UPDATE SKIP LOCKED")
                .fetch_all(store.pool())
                .await
                .unwrap();
        assert!(taken.is_empty(), "a/1 is not locked");
        tx.rollback().await.unwrap();
    }

    #[tokio::test]
    async fn a_short_write_fails_with_its_error_with_heads_or_alone() {
        let db = TestDb::new().await;
        let store = db.store();
        let mut tx = store.begin().await.unwrap();
        let e = touch(&["sbx_missing"], 1)
            .then_lock_heads(&mut tx, &["a/1"])
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            StoreError::Internal("wrote 0 of 1".into()).to_string()
        );
        tx.rollback().await.unwrap();
        let mut tx = store.begin().await.unwrap();
        let e = touch(&["sbx_missing"], 1).run(&mut tx).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            StoreError::Internal("wrote 0 of 1".into()).to_string()
        );
        tx.rollback().await.unwrap();
    }
}
