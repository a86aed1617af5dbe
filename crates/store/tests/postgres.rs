//! The store contract on PostgreSQL, plus what only a shared database can show: nodes
//! connecting at once to an empty database, data outliving a connection.
//!
//! `SKED_TEST_DATABASE_URL` points at a PostgreSQL database these tests may create schemas in
//! (for example `postgres://postgres@127.0.0.1:5432/test`). Each test gets a schema of its own,
//! `sked_test_<random>`, dropped when it ends. Without the variable the tests are skipped, with
//! a notice; on CI (`CI` set) they fail instead, so a missing database cannot pass for green.

use sked_store::{PgStore, PutMode, Store, StoreError};
use tokio_postgres::NoTls;

const URL_VAR: &str = "SKED_TEST_DATABASE_URL";

/// The database URL, or `None` (with a notice) when these tests are to be skipped.
fn database_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => panic!(
            "{URL_VAR} must point at PostgreSQL (for example \
             postgres://postgres@127.0.0.1:5432/test): on CI the PostgreSQL store tests \
             cannot be skipped"
        ),
        _ => {
            eprintln!("{URL_VAR} is not set: skipping the PostgreSQL store tests");
            None
        }
    }
}

/// `url` with its search path set to `schema`, in whichever form the URL is written. Its
/// sessions are named after the schema, so the guard can end those a test left open.
fn in_schema(url: &str, schema: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}options=-csearch_path%3D{schema}&application_name={schema}")
    } else {
        format!("{url} options='-csearch_path={schema}' application_name={schema}")
    }
}

async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// An empty schema of the test's own, dropped (best effort) when the guard goes.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    async fn create(url: &str) -> Schema {
        let name = format!("sked_test_{:016x}", rand::random::<u64>());
        admin(url)
            .await
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .expect("create the test schema");
        Schema {
            url: url.to_string(),
            name,
        }
    }

    fn url(&self) -> String {
        in_schema(&self.url, &self.name)
    }

    async fn query_one(&self, sql: &str) -> tokio_postgres::Row {
        admin(&self.url())
            .await
            .query_one(sql, &[])
            .await
            .expect("query the test schema")
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        // The test's runtime may be the one being dropped: use a thread with a runtime of its
        // own. A schema left behind (a killed test) harms nothing: every name is fresh.
        let (url, name) = (self.url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url, NoTls).await.ok()?;
                let task = tokio::spawn(connection);
                // Sessions of the test still open (a connection whose task was cancelled but
                // not yet dropped, because this very drop blocks its runtime) would hold locks
                // the drop waits for: end them first.
                let done = client
                    .batch_execute(&format!(
                        "SET lock_timeout = '10s'; \
                         SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE application_name = '{name}' AND pid <> pg_backend_pid(); \
                         DROP SCHEMA IF EXISTS {name} CASCADE"
                    ))
                    .await;
                drop(client);
                let _ = task.await;
                done.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop the test schema {}", self.name);
        }
    }
}

async fn open() -> Option<(PgStore, Schema)> {
    let url = database_url()?;
    let schema = Schema::create(&url).await;
    let store = PgStore::connect(&schema.url())
        .await
        .expect("connect the store");
    Some((store, schema))
}

sked_store::store_contract_tests!(optional open);

fn job() -> sked_core::job::ValidJob {
    sked_store::contract::job(
        "kept",
        serde_json::json!({"schedule": {"every": "1m"}, "target": {"shell": {"command": "true"}}}),
        chrono::Utc::now(),
    )
}

#[tokio::test]
async fn nodes_connecting_at_once_migrate_once() {
    let Some(url) = database_url() else { return };
    let schema = Schema::create(&url).await;
    let url = schema.url();
    let (a, b, c) = tokio::join!(
        PgStore::connect(&url),
        PgStore::connect(&url),
        PgStore::connect(&url)
    );
    let (a, b, _c) = (a.unwrap(), b.unwrap(), c.unwrap());
    let row = schema
        .query_one("SELECT count(*), min(version) FROM sked_schema")
        .await;
    assert_eq!(row.get::<_, i64>(0), 1, "one version row");
    assert!(row.get::<_, i32>(1) >= 1, "migrated");
    let tables = schema
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()",
        )
        .await;
    assert_eq!(
        tables.get::<_, i64>(0),
        6,
        "sked_schema and the five tables, once"
    );
    // Both nodes see one database.
    let now = chrono::Utc::now();
    a.put_job("default", &job(), PutMode::CreateOnly, now)
        .await
        .unwrap();
    assert!(b.get_job("default", "kept").await.unwrap().is_some());
    // A later node finds the schema up to date.
    PgStore::connect(&url).await.unwrap();
}

#[tokio::test]
async fn data_survives_reconnecting() {
    let Some(url) = database_url() else { return };
    let schema = Schema::create(&url).await;
    let now = chrono::Utc::now();
    {
        let store = PgStore::connect(&schema.url()).await.unwrap();
        store
            .put_job("default", &job(), PutMode::Upsert, now)
            .await
            .unwrap();
    }
    let store = PgStore::connect(&schema.url()).await.unwrap();
    let found = store.get_job("default", "kept").await.unwrap();
    assert_eq!(found.map(|j| j.name), Some("kept".to_string()));
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let Some(url) = database_url() else { return };
    let schema = Schema::create(&url).await;
    PgStore::connect(&schema.url()).await.unwrap();
    admin(&schema.url())
        .await
        .batch_execute("UPDATE sked_schema SET version = version + 1")
        .await
        .unwrap();
    let err = PgStore::connect(&schema.url()).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Open(m) if m.contains("newer than this sked knows")),
        "{err}"
    );
}

#[tokio::test]
async fn an_unreachable_database_is_a_clear_error() {
    let err = PgStore::connect("postgres://sked:secret@127.0.0.1:1/sked?connect_timeout=5")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Open(_)), "{err:?}");
    assert!(text.contains("127.0.0.1:1/sked"), "{text}");
    assert!(!text.contains("secret"), "no password in errors: {text}");
    let err = PgStore::connect("postgres://[not a url").await.unwrap_err();
    assert!(matches!(err, StoreError::Open(_)), "{err:?}");
}
