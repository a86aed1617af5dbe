//! The store contract on PostgreSQL, plus what only a shared database can show: nodes
//! connecting at once to an empty database, data outliving a connection.
//!
//! `SKED_TEST_DATABASE_URL` points at a PostgreSQL database these tests may create schemas in
//! (for example `postgres://postgres@127.0.0.1:5432/test`). Each test gets a schema of its own,
//! `sked_test_<random>`, dropped when it ends. Without the variable the tests are reported as
//! ignored (see build.rs); on CI (`CI` set) they run and fail instead, so a missing database
//! cannot pass for green.

use sked_core::cluster::{partition_of, PARTITIONS, PARTITION_SQL};
use sked_core::run::Trigger;
use sked_store::{
    Audit, Fire, LeaseRenewal, NodeInfo, PgStore, PutMode, Store, StoreError, StoreEvent,
};
use std::time::Duration;

const URL_VAR: &str = "SKED_TEST_DATABASE_URL";

/// The database URL. Tests that ask for it were compiled to run (see build.rs): a missing
/// database fails them loudly instead of letting them pass without running.
fn database_url() -> String {
    std::env::var(URL_VAR)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| {
            panic!(
                "{URL_VAR} must point at PostgreSQL (for example \
                 postgres://postgres@127.0.0.1:5432/test)"
            )
        })
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
    sked_store::postgres::client(url)
        .await
        .expect("connect to the test database")
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
                let client = sked_store::postgres::client(&url).await.ok()?;
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
                done.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop the test schema {}", self.name);
        }
    }
}

async fn open() -> (PgStore, Schema) {
    let url = database_url();
    let schema = Schema::create(&url).await;
    let store = PgStore::connect(&schema.url())
        .await
        .expect("connect the store");
    (store, schema)
}

sked_store::store_contract_tests!(postgres open);

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn expired_partitions_of_runs_go_whole() {
    let (store, _schema) = open().await;
    sked_store::contract::expired_partitions_of_runs_go_whole(&store).await;
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_run_ahead_of_the_partitions_does_not_stop_them() {
    let (store, _schema) = open().await;
    sked_store::contract::a_run_ahead_of_the_partitions_does_not_stop_them(&store).await;
}

/// A time partition filling faster than autovacuum looks at it is analyzed by the partition
/// upkeep, so statements on it are planned for the rows it holds rather than for an empty
/// table; and only again once it has changed as much as it held.
#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_filling_partition_is_analyzed_by_the_upkeep() {
    let (store, schema) = open().await;
    let base = chrono::Utc::now();
    let hour = Duration::from_secs(3600);
    assert!(store.prepare_run_partitions(base, hour).await.unwrap() >= 1);
    let first = schema
        .query_one("SELECT name, starts FROM run_partitions WHERE starts IS NOT NULL ORDER BY starts LIMIT 1")
        .await;
    let (name, starts): (String, i64) = (first.get(0), first.get(1));
    let runs = format!("runs_{name}");
    // Autovacuum is left out of it, so what analyzes the partition is the upkeep.
    admin(&schema.url())
        .await
        .batch_execute(&format!(
            "ALTER TABLE {runs} SET (autovacuum_enabled = false)"
        ))
        .await
        .unwrap();
    let (_, j) = store
        .put_job("default", &job(), PutMode::CreateOnly, base, Audit::none())
        .await
        .unwrap();
    let starts = chrono::DateTime::from_timestamp_micros(starts).unwrap();
    for batch in 0..4 {
        let fires: Vec<Fire> = (0..500)
            .map(|i| {
                let at = starts + chrono::Duration::milliseconds(batch * 500 + i);
                Fire {
                    job_id: j.id,
                    scheduled_for: at,
                    trigger: Trigger::Manual,
                    skip: None,
                    ready_at: at,
                    advance: None,
                    nominal_for: None,
                    why: None,
                }
            })
            .collect();
        assert_eq!(
            store
                .record_fires(&fires, base, Audit::none())
                .await
                .unwrap()
                .runs
                .len(),
            500
        );
    }
    let analyzed = format!(
        "SELECT s.analyze_count, c.reltuples::bigint FROM pg_stat_user_tables s \
         JOIN pg_class c ON c.oid = s.relid WHERE s.relid = '{runs}'::regclass"
    );
    // A backend reports its changes to the statistics views within seconds, not at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        store.prepare_run_partitions(base, hour).await.unwrap();
        let row = schema.query_one(&analyzed).await;
        if row.get::<_, i64>(0) > 0 {
            assert_eq!(row.get::<_, i64>(0), 1);
            assert_eq!(row.get::<_, i64>(1), 2000, "analyzed with all its runs");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{runs} was never analyzed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    store.prepare_run_partitions(base, hour).await.unwrap();
    let row = schema.query_one(&analyzed).await;
    assert_eq!(
        row.get::<_, i64>(0),
        1,
        "not again while it has not changed"
    );
}

/// Making partitions waits for a reader of `runs` a few times over, so a query of a few
/// seconds delays it rather than stopping it; one that outlasts every try makes it give up
/// for this pass, with nothing half made.
#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_long_reader_of_runs_delays_making_partitions() {
    let (store, schema) = open().await;
    let hour = Duration::from_secs(3600);
    let now = chrono::Utc::now();
    let reader = admin(&schema.url()).await;
    let read = "BEGIN; SELECT count(*) FROM runs";
    reader.batch_execute(read).await.unwrap();
    let err = store.prepare_run_partitions(now, hour).await.unwrap_err();
    assert!(err.to_string().contains("lock timeout"), "{err}");
    let listed = "SELECT count(*) FROM run_partitions";
    assert_eq!(
        schema.query_one(listed).await.get::<_, i64>(0),
        1,
        "the legacy one alone"
    );
    let partitions = "SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs'::regclass";
    assert_eq!(schema.query_one(partitions).await.get::<_, i64>(0), 2);
    reader.batch_execute("COMMIT").await.unwrap();

    // A reader that is done within the tries.
    reader.batch_execute(read).await.unwrap();
    let done = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        reader.batch_execute("COMMIT").await.unwrap();
    });
    let made = store.prepare_run_partitions(now, hour).await.unwrap();
    assert!(made >= 2, "made {made}");
    done.await.unwrap();
    let listed_now = schema.query_one(listed).await.get::<_, i64>(0);
    assert_eq!(listed_now, 1 + i64::from(made));
}

fn job() -> sked_core::job::ValidJob {
    sked_store::contract::job(
        "kept",
        serde_json::json!({"schedule": {"every": "1m"}, "target": {"shell": {"command": "true"}}}),
        chrono::Utc::now(),
    )
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn nodes_connecting_at_once_migrate_once() {
    let url = database_url();
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
        31,
        "sked_schema, the five ledger tables, the three cluster tables, tokens, audit, \
         namespaces, secrets, job dependencies, events, event subscriptions, job versions, \
         notifications, run partitions, calendars, flow control's holders, rates and limits, \
         and dedup and debounce keys, once, and the legacy and default partitions of runs, \
         attempts and output"
    );
    // Both nodes see one database.
    let now = chrono::Utc::now();
    a.put_job("default", &job(), PutMode::CreateOnly, now, Audit::none())
        .await
        .unwrap();
    assert!(b.get_job("default", "kept").await.unwrap().is_some());
    // A later node finds the schema up to date.
    PgStore::connect(&url).await.unwrap();
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn data_survives_reconnecting() {
    let url = database_url();
    let schema = Schema::create(&url).await;
    let now = chrono::Utc::now();
    {
        let store = PgStore::connect(&schema.url()).await.unwrap();
        store
            .put_job("default", &job(), PutMode::Upsert, now, Audit::none())
            .await
            .unwrap();
    }
    let store = PgStore::connect(&schema.url()).await.unwrap();
    let found = store.get_job("default", "kept").await.unwrap();
    assert_eq!(found.map(|j| j.name), Some("kept".to_string()));
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_newer_schema_is_refused() {
    let url = database_url();
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

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn a_version_2_database_upgrades_and_keeps_its_runs_and_workers() {
    let url = database_url();
    let schema = Schema::create(&url).await;
    // A database as version 2 left it: a job, a run with an attempt and its output, a run
    // whose attempt is still running, a worker from before tokens (no namespaces, no drain
    // flag).
    admin(&schema.url())
        .await
        .batch_execute(&format!(
            "CREATE TABLE sked_schema (id INTEGER PRIMARY KEY CHECK (id = 1), \
                 version INTEGER NOT NULL); \
             INSERT INTO sked_schema (id, version) VALUES (1, 2); \
             {} ; \
             INSERT INTO workers (id, name, labels, slots, registered_at, last_heartbeat_at, \
             alive) VALUES ('w', 'w', '{{}}', 1, 0, 0, true); \
             INSERT INTO jobs (namespace, name, spec, overlap, priority, retry, state, \
                 fired_count, schedule_epoch, created_at, updated_at) \
             VALUES ('default', 'old', '{{}}', 'allow', 0, 'none', 'active', 1, 0, 0, 0); \
             INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
                 priority, ready_at, created_at, started_at, finished_at, attempts) \
             SELECT id, 'default', 'old', 1000000, 'schedule', 'succeeded', 0, 1000000, \
                 1000000, 1000000, 2000000, 1 FROM jobs; \
             INSERT INTO attempts (run_id, number, worker_id, token, state, started_at, \
                 finished_at, lease_expires_at, output_bytes) \
             SELECT id, 1, 'w', 1, 'succeeded', 1000000, 2000000, 3000000, 5 FROM runs; \
             INSERT INTO output (attempt_id, \"offset\", data) \
             SELECT id, 0, 'hello'::bytea FROM attempts; \
             INSERT INTO runs (job_id, namespace, job, scheduled_for, trigger, state, \
                 priority, ready_at, created_at, started_at, attempts) \
             SELECT id, 'default', 'old', 3000000, 'schedule', 'running', 0, 3000000, \
                 3000000, 3000000, 1 FROM jobs; \
             INSERT INTO attempts (run_id, number, worker_id, token, state, started_at, \
                 lease_expires_at, output_bytes) \
             SELECT id, 1, 'w', 2, 'running', 3000000, 4000000, 0 FROM runs \
             WHERE state = 'running'",
            sked_store::postgres::migrations_through(2)
        ))
        .await
        .unwrap();
    let store = PgStore::connect(&schema.url()).await.unwrap();
    let version = schema
        .query_one("SELECT version FROM sked_schema WHERE id = 1")
        .await;
    assert_eq!(
        version.get::<_, i32>(0),
        sked_store::postgres::latest_version() as i32
    );
    let w = store
        .get_worker("w")
        .await
        .unwrap()
        .expect("the worker is kept");
    assert_eq!((w.namespaces, w.token_id), (vec!["*".to_string()], None));
    assert!(!w.draining);
    assert!(store.list_tokens().await.unwrap().is_empty());
    // The run, its attempt and output are kept, in the legacy partition; new ids follow theirs.
    let old = schema
        .query_one("SELECT id FROM runs_legacy WHERE state = 'succeeded'")
        .await;
    let old_run: i64 = old.get(0);
    let (run, attempts) = store
        .get_run(old_run)
        .await
        .unwrap()
        .expect("the run is kept");
    assert_eq!(run.job, "old");
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        store.read_output(attempts[0].id, 0).await.unwrap(),
        b"hello".to_vec()
    );
    let (_, job) = store
        .put_job(
            "default",
            &job(),
            PutMode::Upsert,
            chrono::Utc::now(),
            Audit::none(),
        )
        .await
        .unwrap();
    let fired = store
        .record_fires(
            &[sked_store::Fire {
                job_id: job.id,
                scheduled_for: chrono::Utc::now(),
                trigger: sked_core::run::Trigger::Manual,
                skip: None,
                ready_at: chrono::Utc::now(),
                advance: None,
                nominal_for: None,
                why: None,
            }],
            chrono::Utc::now(),
            Audit::none(),
        )
        .await
        .unwrap();
    assert!(fired.runs[0].run_id > old_run);
    // The attempt running across the upgrade (its instant unknown to the legacy partition's
    // attempts, 0) is still its worker's: a heartbeat keeps it and extends its lease.
    let running = schema
        .query_one("SELECT id FROM attempts WHERE state = 'running'")
        .await;
    let attempt: i64 = running.get(0);
    // Stored to the microsecond.
    let now = chrono::SubsecRound::trunc_subsecs(chrono::Utc::now(), 6);
    let until = now + chrono::Duration::seconds(10);
    let beat = store
        .heartbeat("w", &[attempt], now, LeaseRenewal::all(until), now)
        .await
        .unwrap();
    assert!(beat.known && beat.stop.is_empty(), "{beat:?}");
    let (_, attempts) = store
        .get_run(old_run + 1)
        .await
        .unwrap()
        .expect("the running run is kept");
    assert_eq!(attempts[0].lease_expires_at, until);
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
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

fn node(id: &str) -> NodeInfo {
    NodeInfo {
        id: id.to_string(),
        address: format!("{id}:8080"),
        started_at: chrono::Utc::now(),
    }
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn partitions_split_fairly_and_move_when_a_node_dies_or_leaves() {
    let (store, _schema) = open().await;
    let lease = Duration::from_secs(3);
    let t = chrono::Utc::now();
    let ms = chrono::Duration::milliseconds;
    let (a, b, c) = (node("a"), node("b"), node("c"));

    let alone = store.renew_membership(&a, t, lease).await.unwrap();
    assert_eq!(
        alone.partitions.len() as u32,
        PARTITIONS,
        "a lone node holds all"
    );
    assert!(alone.maintenance);
    // b joins: a holds everything until its next round gives back b's share.
    let joining = store.renew_membership(&b, t + ms(10), lease).await.unwrap();
    assert!(joining.partitions.is_empty() && !joining.maintenance);
    let a1 = store
        .renew_membership(&a, t + ms(1000), lease)
        .await
        .unwrap();
    let b1 = store
        .renew_membership(&b, t + ms(1010), lease)
        .await
        .unwrap();
    assert_eq!((a1.partitions.len(), b1.partitions.len()), (128, 128));
    assert!(
        a1.partitions.iter().all(|p| !b1.partitions.contains(p)),
        "disjoint"
    );
    assert!(
        a1.maintenance && !b1.maintenance,
        "maintenance stays with a"
    );

    // c joins; after a round each, the split is 86/85/85 and covers every partition.
    store
        .renew_membership(&c, t + ms(1500), lease)
        .await
        .unwrap();
    let a2 = store
        .renew_membership(&a, t + ms(2000), lease)
        .await
        .unwrap();
    let b2 = store
        .renew_membership(&b, t + ms(2010), lease)
        .await
        .unwrap();
    let c2 = store
        .renew_membership(&c, t + ms(2020), lease)
        .await
        .unwrap();
    let mut all: Vec<u32> = [&a2, &b2, &c2]
        .iter()
        .flat_map(|m| m.partitions.clone())
        .collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..PARTITIONS).collect::<Vec<_>>(),
        "each partition once"
    );
    let mut sizes = vec![
        a2.partitions.len(),
        b2.partitions.len(),
        c2.partitions.len(),
    ];
    sizes.sort_unstable();
    assert_eq!(sizes, vec![85, 85, 86]);

    // a stops renewing (killed): once its leases lapse, b and c take its partitions and one
    // of them the maintenance. (b and c keep renewing meanwhile, each third of the lease.)
    store
        .renew_membership(&b, t + ms(3000), lease)
        .await
        .unwrap();
    store
        .renew_membership(&c, t + ms(3010), lease)
        .await
        .unwrap();
    store
        .renew_membership(&b, t + ms(4000), lease)
        .await
        .unwrap();
    store
        .renew_membership(&c, t + ms(4010), lease)
        .await
        .unwrap();
    let later = t + ms(2000) + ms(3100);
    let b3 = store.renew_membership(&b, later, lease).await.unwrap();
    let c3 = store
        .renew_membership(&c, later + ms(10), lease)
        .await
        .unwrap();
    assert_eq!(
        b3.partitions.len() + c3.partitions.len(),
        PARTITIONS as usize
    );
    assert!(
        b3.maintenance ^ c3.maintenance,
        "one node holds maintenance"
    );
    let nodes = store.cluster_nodes(later + ms(20)).await.unwrap();
    let held: Vec<(String, u32)> = nodes.iter().map(|n| (n.id.clone(), n.partitions)).collect();
    assert_eq!(
        held,
        vec![("a".into(), 0), ("b".into(), 128), ("c".into(), 128)],
        "{nodes:?}"
    );

    // c leaves cleanly: b takes everything at its next round, without waiting for a lease.
    store.leave_cluster("c").await.unwrap();
    let b4 = store
        .renew_membership(&b, later + ms(100), lease)
        .await
        .unwrap();
    assert_eq!(b4.partitions.len() as u32, PARTITIONS);
    assert!(b4.maintenance);
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn the_partition_in_sql_is_the_partition_in_rust() {
    let (_store, schema) = open().await;
    let client = admin(&schema.url()).await;
    let sql = format!(
        "SELECT id, {PARTITION_SQL}::bigint FROM generate_series(1::bigint, 20000) AS id \
         UNION ALL SELECT id, {PARTITION_SQL}::bigint \
         FROM generate_series(140737488355000::bigint, 140737488355327) AS id"
    );
    let rows = client.query(&sql, &[]).await.unwrap();
    assert_eq!(rows.len(), 20_328);
    for row in rows {
        let (id, in_sql): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(in_sql, i64::from(partition_of(id)), "job {id}");
    }
}

async fn next(
    events: &mut sked_store::StoreEvents,
) -> Result<Option<StoreEvent>, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_secs(5), events.recv()).await
}

#[cfg_attr(
    not(sked_pg_tests),
    ignore = "needs SKED_TEST_DATABASE_URL (a PostgreSQL database)"
)]
#[tokio::test]
async fn other_nodes_hear_of_changes_and_a_node_not_of_its_own() {
    let (writer, schema) = open().await;
    let reader = PgStore::connect(&schema.url()).await.unwrap();
    let mut heard = reader
        .subscribe()
        .await
        .unwrap()
        .expect("PostgreSQL has events");
    let mut own = writer
        .subscribe()
        .await
        .unwrap()
        .expect("PostgreSQL has events");
    let now = chrono::Utc::now();
    let (_, created) = writer
        .put_job("default", &job(), PutMode::Upsert, now, Audit::none())
        .await
        .unwrap();
    assert_eq!(
        next(&mut heard).await.unwrap(),
        Some(StoreEvent::JobChanged(created.id))
    );
    let fired = writer
        .record_fires(
            &[sked_store::Fire {
                job_id: created.id,
                scheduled_for: now,
                trigger: sked_core::run::Trigger::Manual,
                skip: None,
                ready_at: now,
                advance: None,
                nominal_for: None,
                why: None,
            }],
            now,
            Audit::none(),
        )
        .await
        .unwrap();
    let run_id = fired.runs[0].run_id;
    assert_eq!(
        next(&mut heard).await.unwrap(),
        Some(StoreEvent::RunsQueued(vec![run_id]))
    );
    assert!(
        next(&mut own).await.is_err(),
        "a store does not hear its own changes"
    );
}
