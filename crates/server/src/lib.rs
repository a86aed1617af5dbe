//! sked's server: the firing loop, the dispatcher, maintenance duties and the HTTP API, wired
//! around one [`Store`](sked_store::Store).
//!
//! Each background duty is a module with a `run(..., shutdown)` loop; [`serve`] starts them all
//! and the HTTP API, and stops them together. Rules (schedules, overlap, retries, dispatch
//! policy) live in `sked-core`; queries live in `sked-store`. This crate decides *when* to call
//! them and carries the results between them.

pub mod admission;
pub mod api;
pub mod attempts;
pub mod audit;
pub mod auth;
pub mod browsers;
pub mod changes;
pub mod completion;
pub mod config;
pub mod console;
pub mod dispatch;
pub mod firing;
pub mod follows;
pub mod health;
pub mod http;
pub mod maintenance;
pub mod membership;
pub mod metrics;
pub mod namespaces;
pub mod notify;
pub mod oidc;
pub mod publish;
pub mod rate;
pub mod schedule_rules;
pub mod secrets;
pub mod traces;

use std::future::Future;
use std::sync::Arc;

pub use config::ServerConfig;
use sked_store::{NodeInfo, Store};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Http(std::io::Error),
    #[error(transparent)]
    Store(#[from] sked_store::StoreError),
    /// A duty (firing, dispatch, membership…) ended while the node was serving: the node stops
    /// rather than answer the API while nothing fires.
    #[error("the server stopped because a duty ended unexpectedly: {0}")]
    DutyEnded(String),
}

/// Everything the API handlers and duties share.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub config: Arc<ServerConfig>,
    pub firing: firing::FiringHandle,
    pub dispatcher: Arc<dispatch::Dispatcher>,
    /// What new runs are admitted against (the firing loop, backfills, events).
    pub backlog: Arc<admission::NodeBacklog>,
    pub metrics: Arc<metrics::Metrics>,
    /// Whether the store commits: `/readyz` is 503 while writes fail.
    pub health: Arc<health::StoreHealth>,
    /// Whether each broker connection works, for `/readyz` and `/metrics`.
    pub brokers: Arc<publish::BrokerHealth>,
    /// Log follows, at most `config.max_log_follows` at once, shared by tokens and namespaces.
    pub follows: Arc<follows::Follows>,
    /// Set once the firing loop has loaded the schedules of its first partitions.
    pub ready: watch::Receiver<bool>,
    /// This server node, as the cluster knows it.
    pub node: Arc<NodeInfo>,
    /// Whether this node runs the maintenance duties now (elected through the store).
    pub maintenance: watch::Receiver<bool>,
    /// Finds the caller behind each request.
    pub auth: Arc<auth::Authenticator>,
    /// How often each token may call the API; `None`: no limit.
    pub rate: Option<Arc<rate::RequestRate>>,
    /// Makes and checks the tokens consumers report completions with.
    pub completion: Arc<completion::CompletionKey>,
    /// Completion reports refused per peer, which bound what a peer with made-up tokens costs.
    pub completion_refusals: Arc<rate::Refusals>,
    /// Pings each heartbeat job may take through its ping address (`/ping/{token}`).
    pub pings: Option<Arc<rate::RequestRate>>,
    /// Worker registrations each token may make.
    pub registrations: Option<Arc<rate::RequestRate>>,
    /// How runs' traces are named and sampled, when the server exports traces
    /// (`config.traces`): every node hands attempts their trace context through it.
    pub run_traces: Option<traces::RunTracing>,
}

impl AppState {
    /// The address clients reach this node at: `--public-url`, or else the address it
    /// listens on.
    pub fn public_url(&self) -> String {
        match &self.config.public_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                let scheme = if self.config.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}", self.node.address)
            }
        }
    }
}

/// Resolves once shutdown was signalled (or its sender is gone).
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Reads queued runs until the store answers (or shutdown): a run committed as queued that
/// this node failed to learn of would wait for a worker polling another node, or, alone, for
/// a restart.
pub(crate) async fn read_queued(
    store: &dyn Store,
    ids: Option<&[i64]>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Vec<sked_store::QueuedRun>> {
    loop {
        match store.queued_runs(ids).await {
            Ok(runs) => return Some(runs),
            Err(e) => tracing::error!("cannot read queued runs, retrying: {e}"),
        }
        tokio::select! {
            _ = stopped(shutdown) => return None,
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
        }
    }
}

/// Binds the listener, so callers learn the address (and a taken port) before serving.
pub async fn bind(config: &ServerConfig) -> Result<TcpListener, ServerError> {
    TcpListener::bind(&config.listen)
        .await
        .map_err(|source| ServerError::Listen {
            addr: config.listen.clone(),
            source,
        })
}

/// Runs the server on `listener` until `shutdown` resolves.
pub async fn serve(
    config: ServerConfig,
    store: Arc<dyn Store>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let config = Arc::new(config);
    if let Some(key) = &config.secret_key {
        // Before anything reads a definition: from here on, only bound values open.
        let done = secrets::migrate::reseal(store.as_ref(), key).await?;
        if done.values > 0 || done.urls > 0 {
            tracing::info!(
                "sealed {} values again for where they are stored ({} stored texts) and {} \
                 default webhook URLs",
                done.values,
                done.texts,
                done.urls
            );
        }
        for place in &done.unopened {
            tracing::warn!(
                "a sealed value in {place} does not open with key {}",
                key.id()
            );
        }
    }
    let metrics = Arc::new(metrics::Metrics::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ready_tx, ready_rx) = watch::channel(false);
    let (maintenance_tx, maintenance_rx) = watch::channel(false);
    let node = Arc::new(NodeInfo {
        id: format!("{}-{:08x}", config.node_name, rand::random::<u32>()),
        address: listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| config.listen.clone()),
        started_at: chrono::Utc::now(),
    });
    // Listening starts before anything is loaded, so no change committed after the loads
    // began is missed.
    let events = store.subscribe().await?;
    let dispatcher = Arc::new(dispatch::Dispatcher::new(metrics.clone()));
    let health = Arc::new(health::StoreHealth::default());
    store.observe_writes(health.clone());
    let backlog = Arc::new(admission::NodeBacklog::new(
        dispatcher.clone(),
        config.backlog,
    ));
    // The runs the store starts by itself (an event's) are admitted against this queue too.
    store.admit_through(backlog.clone());
    let (firing, firing_loop) = firing::FiringLoop::new(
        store.clone(),
        dispatcher.clone(),
        metrics.clone(),
        config.fire_batch,
        backlog.clone(),
    );
    let state = AppState {
        store: store.clone(),
        config: config.clone(),
        firing,
        dispatcher: dispatcher.clone(),
        backlog,
        metrics: metrics.clone(),
        health,
        brokers: Arc::new(publish::BrokerHealth::new(&config.brokers)),
        follows: Arc::new(follows::Follows::new(config.max_log_follows)),
        ready: ready_rx,
        node: node.clone(),
        maintenance: maintenance_rx,
        auth: Arc::new(auth::Authenticator::new(config.auth, store.clone())),
        rate: rate::RequestRate::new(config.rate_limit).map(Arc::new),
        completion: Arc::new(completion::CompletionKey::new(config.secret_key.as_ref())),
        completion_refusals: Arc::new(rate::Refusals::new(rate::REFUSALS_PER_SECOND)),
        pings: rate::RequestRate::new(rate::PINGS_PER_JOB).map(Arc::new),
        registrations: rate::RequestRate::new(rate::REGISTRATIONS_PER_TOKEN).map(Arc::new),
        run_traces: config.traces.as_ref().map(|settings| traces::RunTracing {
            key: config
                .secret_key
                .as_ref()
                .map_or(sked_core::trace::TraceKey::UNKEYED, |key| key.trace_key()),
            sampling: settings.sampling,
        }),
    };

    if let Some(on_ready) = config.on_ready.clone() {
        let mut ready = state.ready.clone();
        tokio::spawn(async move {
            if ready.wait_for(|ready| *ready).await.is_ok() {
                let _ = on_ready.send(true);
            }
        });
    }
    let mut duties = tokio::task::JoinSet::new();
    duties.spawn(duty("firing", firing_loop.run(ready_tx, stop_rx.clone())));
    duties.spawn(duty(
        "membership",
        membership::run(
            store.clone(),
            metrics.clone(),
            node.clone(),
            config.node_lease,
            state.firing.clone(),
            maintenance_tx,
            stop_rx.clone(),
        ),
    ));
    if let Some(events) = events {
        duties.spawn(duty(
            "change feed",
            changes::run(
                events,
                store.clone(),
                state.firing.clone(),
                dispatcher.clone(),
                stop_rx.clone(),
            ),
        ));
    }
    duties.spawn(duty(
        "dispatch",
        dispatcher.clone().run(store.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "queue reconciliation",
        dispatch::reconcile::run(store.clone(), dispatcher.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "publisher",
        publish::run(state.clone(), stop_rx.clone()),
    ));
    // Once, beside the start: it only warns, so it is no duty.
    tokio::spawn(publish::warn_missing_connections(
        store.clone(),
        config.brokers.clone(),
    ));
    duties.spawn(duty(
        "namespace settings",
        namespaces::run(state.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "reaper",
        maintenance::reaper::run(state.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "dependency timeouts",
        maintenance::dependency_timeouts::run(state.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "ping deadlines",
        maintenance::ping_deadlines::run(state.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "deadlines",
        maintenance::deadlines::run(state.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "blackout stops",
        maintenance::blackout_stops::run(state.clone(), stop_rx.clone()),
    ));
    if state.run_traces.is_some() {
        duties.spawn(duty("traces", traces::run(state.clone(), stop_rx.clone())));
    }
    duties.spawn(duty(
        "notifier",
        notify::run(state.clone(), stop_rx.clone()),
    ));
    duties.spawn(duty(
        "retention",
        maintenance::retention::run(state.clone(), stop_rx.clone()),
    ));
    if let (Some(retention), true) = (config.retention, config.partition_runs) {
        duties.spawn(duty(
            "partitions of runs",
            maintenance::retention::prepare_partitions(state.clone(), retention, stop_rx.clone()),
        ));
    }

    // The console's pages call the API router in-process, as the visitor's token.
    let api = api::router(state.clone());
    let mut app = api.clone().merge(console::router(&state, api));
    if config.auth == auth::AuthMode::Open {
        let own = browsers::OwnAddress::from_public_url(config.public_url.as_deref());
        app = app.layer(axum::middleware::from_fn_with_state(
            own,
            browsers::answer_own_hosts,
        ));
    }
    let http = http::serve(
        listener,
        app,
        config.connections,
        config.tls.clone(),
        stop_rx.clone(),
    );
    // Once nothing fires here any more, the partitions are handed over at once rather than
    // when their leases expire, while open requests still finish.
    let handover = async move {
        match store.leave_cluster(&node.id).await {
            Ok(()) => tracing::info!(
                "stopping: nothing fires here any more; partitions handed over, open requests \
                 finishing"
            ),
            Err(e) => {
                tracing::warn!(
                    "could not give up this node's leases (they expire on their own): {e}"
                )
            }
        }
    };
    supervise(http, shutdown, &mut duties, &stop_tx, handover).await
}

/// Serves until `http` ends, which it does once `stop` is sent: on `shutdown`, or when a duty
/// ends first. Duties return only on shutdown; one that ends before it (a panic, a bug) would
/// leave the node answering while nothing fires or dispatches, so the whole node stops with
/// an error instead, for its supervisor to restart it and for its partitions to move on.
///
/// Once stopping, `handover` runs as soon as every duty has ended (nothing fires here any
/// more), without waiting for the open requests `http` lets finish; or, should `http` end
/// first, after the duties are aborted.
async fn supervise(
    http: impl Future<Output = std::io::Result<()>>,
    shutdown: impl Future<Output = ()>,
    duties: &mut tokio::task::JoinSet<&'static str>,
    stop: &watch::Sender<bool>,
    handover: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let mut http = std::pin::pin!(http);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut handover = std::pin::pin!(handover);
    let mut handed_over = false;
    let mut failed = None;
    let served = loop {
        let stopping = *stop.borrow();
        // Before stopping, a duty that ends is a failure; once stopping, the duties end one
        // by one, and when the last has, the partitions are handed over.
        let watch_duties = !handed_over && (stopping || !duties.is_empty());
        tokio::select! {
            served = &mut http => break served,
            () = &mut shutdown, if !stopping => {
                let _ = stop.send(true);
            }
            ended = duties.join_next(), if watch_duties => match ended {
                None => {
                    handover.as_mut().await;
                    handed_over = true;
                }
                Some(_) if stopping => {}
                Some(ended) => {
                    let why = match ended {
                        Ok(name) => format!("{name} returned"),
                        Err(e) if e.is_panic() => {
                            format!("a duty panicked: {}", panic_message(e))
                        }
                        Err(e) => format!("a duty was cancelled: {e}"),
                    };
                    tracing::error!("stopping the server: {why}");
                    failed = Some(ServerError::DutyEnded(why));
                    let _ = stop.send(true);
                }
            },
        }
    };
    // The HTTP server only ends on shutdown or failure; either way the duties stop too.
    duties.abort_all();
    while duties.join_next().await.is_some() {}
    if !handed_over {
        handover.as_mut().await;
    }
    match failed {
        Some(e) => Err(e),
        None => served.map_err(ServerError::Http),
    }
}

/// A duty of the node under its name, which `serve` reports if the duty ends before shutdown.
async fn duty(name: &'static str, work: impl Future<Output = ()>) -> &'static str {
    work.await;
    name
}

fn panic_message(e: tokio::task::JoinError) -> String {
    let payload = e.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::task::JoinSet;

    /// An HTTP server stand-in that ends once `stop` is sent, as axum's graceful shutdown does.
    fn http(stop: &watch::Sender<bool>) -> impl Future<Output = std::io::Result<()>> {
        let mut stopped = stop.subscribe();
        async move {
            crate::stopped(&mut stopped).await;
            Ok(())
        }
    }

    /// A duty that runs until `stop` is sent, as every real duty does.
    fn until_stopped(stop: &watch::Sender<bool>) -> impl Future<Output = ()> + Send + 'static {
        let mut stopped = stop.subscribe();
        async move { crate::stopped(&mut stopped).await }
    }

    #[tokio::test]
    async fn a_panicking_duty_stops_the_node_with_its_message() {
        let (stop, _) = watch::channel(false);
        let mut duties = JoinSet::new();
        duties.spawn(duty("dispatch", until_stopped(&stop)));
        duties.spawn(duty("firing", async { panic!("the timer broke") }));
        let outcome = supervise(
            http(&stop),
            std::future::pending(),
            &mut duties,
            &stop,
            async {},
        )
        .await;
        match outcome {
            Err(ServerError::DutyEnded(why)) => assert!(why.contains("the timer broke"), "{why}"),
            other => panic!("expected DutyEnded, got {other:?}"),
        }
        assert!(*stop.borrow(), "the other duties were told to stop");
    }

    #[tokio::test]
    async fn a_duty_that_returns_early_is_named() {
        let (stop, _) = watch::channel(false);
        let mut duties = JoinSet::new();
        duties.spawn(duty("membership", async {}));
        let outcome = supervise(
            http(&stop),
            std::future::pending(),
            &mut duties,
            &stop,
            async {},
        )
        .await;
        match outcome {
            Err(ServerError::DutyEnded(why)) => assert_eq!(why, "membership returned"),
            other => panic!("expected DutyEnded, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn duties_ending_on_shutdown_are_no_failure() {
        let (stop, _) = watch::channel(false);
        let mut duties = JoinSet::new();
        for name in ["firing", "dispatch", "reaper"] {
            duties.spawn(duty(name, until_stopped(&stop)));
        }
        let shutdown = tokio::time::sleep(std::time::Duration::from_millis(20));
        let outcome = supervise(http(&stop), shutdown, &mut duties, &stop, async {}).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert!(*stop.borrow());
    }

    /// The partitions are handed over once every duty has ended, while a request is still
    /// open, not after it.
    #[tokio::test]
    async fn the_handover_comes_when_the_duties_end_not_when_requests_do() {
        let (stop, _) = watch::channel(false);
        let mut duties = JoinSet::new();
        duties.spawn(duty("firing", until_stopped(&stop)));
        let (handed, handed_rx) = tokio::sync::oneshot::channel::<()>();
        // HTTP with a request open: it ends only once the handover has happened.
        let mut stopped = stop.subscribe();
        let http = async move {
            crate::stopped(&mut stopped).await;
            handed_rx.await.map_err(std::io::Error::other)
        };
        let handover = async move {
            let _ = handed.send(());
        };
        let shutdown = tokio::time::sleep(std::time::Duration::from_millis(20));
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            supervise(http, shutdown, &mut duties, &stop, handover),
        )
        .await
        .expect("the handover did not wait for the open request");
        assert!(outcome.is_ok(), "{outcome:?}");
    }
}
