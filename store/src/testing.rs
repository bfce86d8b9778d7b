//! Test support (feature `test-support`): a fresh, migrated Postgres database per test.
//!
//! Migrating for every test would dominate the suite's run time, so the schema is migrated
//! once into a template database named after a hash of the embedded migrations
//! (`dly_template_<hash>`) and every test database is a `CREATE DATABASE … TEMPLATE` copy.
//! The template is reused across runs (it changes name when the migrations change), so
//! nothing leaks per run; each test database is dropped when its `TestDb` is dropped.
//!
//! Postgres must be reachable: a test never skips silently.

use sqlx::{Connection, PgConnection};
use tokio::sync::OnceCell;

use crate::pg::PgStore;
use crate::pg::MIGRATIONS;

/// Where the test server is when `DIFFERENTLY_TEST_DATABASE_URL` is unset.
pub const DEFAULT_TEST_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Session advisory lock serializing template creation across test processes.
const TEMPLATE_LOCK: i64 = 0x646c_795f_746d_706c; // "dly_tmpl"

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// A throwaway, migrated database; dropped (with `FORCE`) when this value is dropped.
pub struct TestDb {
    name: String,
    url: String,
    admin_url: String,
    store: PgStore,
}

impl TestDb {
    /// Creates a fresh database from the migrated template and connects a `PgStore` to it.
    /// Panics with instructions if Postgres is not reachable.
    pub async fn new() -> TestDb {
        let admin_url = std::env::var("DIFFERENTLY_TEST_DATABASE_URL")
            .unwrap_or_else(|_| DEFAULT_TEST_DATABASE_URL.to_owned());
        let template = TEMPLATE
            .get_or_init(|| create_template(&admin_url))
            .await
            .clone();
        let name = format!("dly_test_{}", ulid::Ulid::new().to_string().to_lowercase());
        let mut admin = admin_connection(&admin_url).await;
        sqlx::raw_sql(&format!(
            r#"CREATE DATABASE "{name}" TEMPLATE "{template}""#
        ))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        let _ = admin.close().await;
        let url = with_database(&admin_url, &name);
        let store = PgStore::connect(&url, 16)
            .await
            .unwrap_or_else(|e| panic!("connecting to test database {name}: {e}"));
        TestDb {
            name,
            url,
            admin_url,
            store,
        }
    }

    /// The URL of this test database (to connect further stores to it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A store connected to this database (clones share one pool).
    pub fn store(&self) -> PgStore {
        self.store.clone()
    }

    /// A new active organization with one project, stored; their ids.
    pub async fn tenant(&self) -> (differently_core::OrgId, differently_core::ProjectId) {
        use crate::TenancyStore;
        let org = crate::Org {
            id: differently_core::OrgId::new(),
            name: "o".into(),
            status: crate::OrgStatus::Active,
            created_at: chrono::Utc::now(),
        };
        let prj = crate::Project {
            id: differently_core::ProjectId::new(),
            org_id: org.id.clone(),
            name: "p".into(),
            created_at: chrono::Utc::now(),
        };
        if let Err(e) = self.store.ensure_tenant(&org, &prj).await {
            panic!("storing a test tenant: {e}");
        }
        (org.id, prj.id)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime, where blocking on async is not allowed: use a
        // thread with its own small runtime and wait for it.
        let joined = std::thread::spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let mut c = PgConnection::connect(&admin_url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::raw_sql(&format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#))
                    .execute(&mut c)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = c.close().await;
                Ok(())
            })
        })
        .join();
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: dropping test database {}: {e}", self.name),
            Err(_) => eprintln!("warning: dropping test database {} panicked", self.name),
        }
    }
}

/// Connects to the admin database or panics with how to start Postgres.
async fn admin_connection(url: &str) -> PgConnection {
    match PgConnection::connect(url).await {
        Ok(c) => c,
        Err(e) => panic!(
            "Postgres is not reachable at {url}: start it with `pg_ctlcluster \
             --skip-systemctl-redirect $(ls /etc/postgresql) main start` or set \
             DIFFERENTLY_TEST_DATABASE_URL ({e})"
        ),
    }
}

/// Name of the template for the current migrations: changes whenever a migration does, or
/// what `migrate` writes after them from core (the usage classification function).
fn template_name() -> String {
    let synced = crate::pg::usage_counters::class_function_body();
    let parts = MIGRATIONS
        .iter()
        .map(|(version, sql)| (*version, *sql))
        .chain([("usage_class", synced.as_str())]);
    template_name_of(parts)
}

/// The template's name for a schema made of `parts` (version, SQL): a hash of every byte, so
/// any change to a migration names a new template and a stale one is never reused.
fn template_name_of<'a>(parts: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    // FNV-1a: stable across runs and toolchains, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (version, sql) in parts {
        for b in version.bytes().chain([0]).chain(sql.bytes()).chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("dly_template_{h:016x}")
}

/// Creates the migrated template unless it exists; serialized across processes by an
/// advisory lock. Built under a temporary name and renamed, so a half-built one is never used.
async fn create_template(admin_url: &str) -> String {
    let name = template_name();
    let building = format!("{name}_building");
    let mut admin = admin_connection(admin_url).await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(TEMPLATE_LOCK)
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("locking template creation: {e}"));
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("looking up template {name}: {e}"));
    if !exists {
        for sql in [
            format!(r#"DROP DATABASE IF EXISTS "{building}" WITH (FORCE)"#),
            format!(r#"CREATE DATABASE "{building}""#),
        ] {
            sqlx::raw_sql(&sql)
                .execute(&mut admin)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let store = PgStore::connect(&with_database(admin_url, &building), 1)
            .await
            .unwrap_or_else(|e| panic!("connecting to {building}: {e}"));
        store
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("migrating template {building}: {e}"));
        store.close().await;
        let sql = format!(r#"ALTER DATABASE "{building}" RENAME TO "{name}""#);
        sqlx::raw_sql(&sql)
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(TEMPLATE_LOCK)
        .execute(&mut admin)
        .await;
    let _ = admin.close().await;
    name
}

/// `base` with its database path replaced by `db` (query parameters kept).
fn with_database(base: &str, db: &str) -> String {
    let (head, query) = match base.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (base, None),
    };
    let authority = head.find("://").map_or(0, |i| i + 3);
    let path = head[authority..]
        .find('/')
        .map_or(head.len(), |i| authority + i);
    let mut url = format!("{}/{db}", &head[..path]);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_keeping_the_query() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h/postgres?sslmode=disable", "x"),
            "postgres://u:p@h/x?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h:5432", "x"),
            "postgres://h:5432/x"
        );
    }

    #[test]
    fn template_name_follows_every_byte_of_the_schema_and_fits_postgres() {
        let schema = [
            ("0001", "CREATE TABLE a (x int);"),
            ("0002", "CREATE TABLE b ();"),
        ];
        let name = template_name_of(schema.into_iter());
        // Pinned (FNV-1a, computed outside Rust): the name must not depend on the toolchain
        // or the run, since one template is shared by every test process on the machine.
        assert_eq!(name, "dly_template_7041b41fe8baab6e");
        let edited = [("0001", "CREATE TABLE a (x bigint);"), schema[1]];
        assert_ne!(
            name,
            template_name_of(edited.into_iter()),
            "a changed migration"
        );
        let added = schema.into_iter().chain([("0003", "")]);
        assert_ne!(name, template_name_of(added), "one more migration");
        // Where one part ends counts: moving text between version and SQL is a change.
        let shifted = [("0001C", "REATE TABLE a (x int);"), schema[1]];
        assert_ne!(name, template_name_of(shifted.into_iter()));
        // Postgres identifiers are at most 63 bytes.
        assert!(template_name().len() < 63);
    }
}
