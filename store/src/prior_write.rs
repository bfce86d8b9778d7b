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
        .map_err(|e| StoreError::Database(format!("encoding a parameter: {e}")))
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
