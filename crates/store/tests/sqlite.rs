//! The store contract on SQLite, plus what only a file-backed store can show.

use sked_store::{Audit, SqliteStore, Store};

async fn open() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = SqliteStore::open(&dir.path().join("sked.db")).expect("open the store");
    (store, dir)
}

sked_store::store_contract_tests!(open);

#[tokio::test]
async fn data_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sked.db");
    let now = chrono::Utc::now();
    let job = sked_store::contract::job(
        "kept",
        serde_json::json!({"schedule": {"every": "1m"}, "target": {"shell": {"command": "true"}}}),
        now,
    );
    {
        let store = SqliteStore::open(&path).unwrap();
        store
            .put_job(
                "default",
                &job,
                sked_store::PutMode::Upsert,
                now,
                Audit::none(),
            )
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let found = store.get_job("default", "kept").await.unwrap();
    assert_eq!(found.map(|j| j.name), Some("kept".to_string()));
}

/// Dropping the store closes every connection, the threads' too, before the drop returns: the
/// last to close merges the WAL into the database file and removes it, so a stopped sked leaves
/// one file that holds everything.
#[tokio::test]
async fn a_dropped_store_leaves_its_commits_in_the_database_file_alone() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("sked.db");
    let now = chrono::Utc::now();
    let store = SqliteStore::open(&path).expect("open the store");
    for i in 0..20 {
        let job = sked_store::contract::job(
            &format!("job-{i}"),
            serde_json::json!({"schedule": {"every": "1m"}, "target": {"shell": {"command": "true"}}}),
            now,
        );
        store
            .put_job(
                "default",
                &job,
                sked_store::PutMode::Upsert,
                now,
                Audit::none(),
            )
            .await
            .expect("a write");
    }
    assert!(
        dir.path().join("sked.db-wal").exists(),
        "writes go to the WAL first"
    );
    drop(store);
    assert!(
        !dir.path().join("sked.db-wal").exists(),
        "the WAL is merged and removed once the store is dropped"
    );
    let store = SqliteStore::open(&path).expect("open it again");
    let found = store.get_job("default", "job-19").await.expect("a read");
    assert_eq!(found.map(|j| j.name), Some("job-19".to_string()));
}

#[test]
fn a_path_that_cannot_be_a_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = match SqliteStore::open(dir.path()) {
        Ok(_) => panic!("a directory opened as a database"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("cannot open the store"), "{err}");
}
