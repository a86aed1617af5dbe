//! The enforcing side of the HTTP target policy (`sked_core::egress`): the policy in force, in a
//! cell shared with the client that HTTP targets (on a worker) and webhooks (on the server) are
//! requested with, and that client. Its resolver resolves names with the system resolver and hands the connection only
//! addresses the policy allows, so the address checked is the address connected to (a name
//! that resolves differently a moment later changes nothing); its redirect policy judges every
//! hop; [`TargetClient::permits`] judges a URL whose host is an IP literal, which no resolver
//! sees. The verdicts are core's; this crate must not speak the worker protocol or know what it sends.

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;
use sked_core::egress::{EgressPolicy, Refusal};
use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};

/// Redirects followed per request: reqwest's own default.
const MAX_REDIRECTS: usize = 10;

/// The policy in force, shared by its owner (a worker replaces it at each registration) and the
/// client's resolver and redirect policy (which read it for every request).
#[derive(Debug, Clone)]
pub struct SharedPolicy(Arc<RwLock<Arc<EgressPolicy>>>);

impl SharedPolicy {
    pub fn new(policy: EgressPolicy) -> Self {
        SharedPolicy(Arc::new(RwLock::new(Arc::new(policy))))
    }

    pub fn current(&self) -> Arc<EgressPolicy> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `policy` in force; whether it differs from the one before.
    pub fn replace(&self, policy: EgressPolicy) -> bool {
        let mut current = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if **current == policy {
            return false;
        }
        *current = Arc::new(policy);
        true
    }
}

/// A request the HTTP target policy refuses; the attempt's error says so, and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("refused by the HTTP target policy: {0}")]
pub struct Refused(pub Refusal);

/// The client HTTP targets are requested with, under a [`SharedPolicy`].
#[derive(Debug, Clone)]
pub struct TargetClient {
    http: reqwest::Client,
    policy: SharedPolicy,
}

impl TargetClient {
    /// A client that enforces `policy`. When the policy restricts anything it ignores proxy
    /// settings (`HTTP_PROXY`...): through a proxy, the address finally reached cannot be
    /// checked. Build a new one when the policy changes, so no connection pooled under the old
    /// policy is reused and the proxy setting follows.
    pub fn new(policy: SharedPolicy, user_agent: &str) -> Result<Self, reqwest::Error> {
        let hops = policy.clone();
        let limit = reqwest::redirect::Policy::limited(MAX_REDIRECTS);
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            // A name's addresses are judged when it is resolved; what the URL says, here.
            match hops.current().check_url(attempt.url()) {
                Ok(()) => limit.redirect(attempt),
                Err(refusal) => attempt.error(Refused(refusal)),
            }
        });
        let mut builder = reqwest::Client::builder()
            .user_agent(user_agent)
            .dns_resolver(Arc::new(PolicyResolver {
                policy: policy.clone(),
            }))
            .redirect(redirects);
        if policy.current().restricts() {
            builder = builder.no_proxy();
        }
        Ok(TargetClient {
            http: builder.build()?,
            policy,
        })
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn policy(&self) -> &SharedPolicy {
        &self.policy
    }

    /// What can be judged of a URL before the request: a denied host, or an IP literal's
    /// address (the resolver never sees those).
    pub fn permits(&self, url: &Url) -> Result<(), Refused> {
        self.policy.current().check_url(url).map_err(Refused)
    }
}

/// Resolves with the system resolver, then refuses the name unless the policy allows it and
/// every address it resolved to.
struct PolicyResolver {
    policy: SharedPolicy,
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.current();
        let host = name.as_str().to_string();
        Box::pin(async move {
            // A denied name is not even looked up.
            policy.check_host(&host).map_err(Refused)?;
            let found: Vec<_> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let addresses: Vec<IpAddr> = found.iter().map(|a| a.ip()).collect();
            policy.check_addresses(&host, &addresses).map_err(Refused)?;
            let addrs: Addrs = Box::new(found.into_iter());
            Ok(addrs)
        })
    }
}

/// The policy's refusal behind a failed request, if that is why it failed.
pub fn refusal_behind<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e Refused> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(refused) = e.downcast_ref::<Refused>() {
            return Some(refused);
        }
        cause = e.source();
    }
    None
}
