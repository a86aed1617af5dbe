//! The enforcing side of the HTTP target policy (`sked_core::egress`): the policy in force, in a
//! cell shared with the client that HTTP targets (on a worker) and webhooks (on the server) are
//! requested with, and that client. Its resolver resolves names with the system resolver and hands the connection only
//! addresses the policy allows, so the address checked is the address connected to (a name
//! that resolves differently a moment later changes nothing); [`TargetClient::send`] follows
//! redirects itself, judging every hop and dropping the headers that carry secrets when a hop
//! leaves the first request's origin; [`TargetClient::permits`] judges a URL whose host is an
//! IP literal, which no resolver sees. The verdicts are core's; this crate must not speak the
//! worker protocol or know what it sends.

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderName, LOCATION};
use reqwest::{Method, StatusCode, Url};
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

/// Why [`TargetClient::send`] got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    /// A redirect to a URL the policy refuses; `from` answered with it.
    #[error("{refused} (redirected from {from})")]
    RedirectRefused {
        #[source]
        refused: Refused,
        from: Url,
    },
    #[error("{why} (redirected from {from})")]
    BadRedirect { why: String, from: Url },
    #[error("too many redirects (more than {MAX_REDIRECTS}), the last to {to}")]
    TooManyRedirects { to: Url },
}

/// Headers that carry credentials whatever a job says of them: never sent to another origin
/// by a redirect.
pub const CREDENTIAL_HEADERS: [HeaderName; 3] = [
    reqwest::header::AUTHORIZATION,
    reqwest::header::COOKIE,
    reqwest::header::PROXY_AUTHORIZATION,
];

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
        // Redirects are followed by `send`, which alone knows which headers carry secrets.
        let mut builder = reqwest::Client::builder()
            .user_agent(user_agent)
            .dns_resolver(Arc::new(PolicyResolver {
                policy: policy.clone(),
            }))
            .redirect(reqwest::redirect::Policy::none());
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

    /// Sends `request`, following up to [`MAX_REDIRECTS`] redirects as browsers do (303, and
    /// 301/302 after anything but GET or HEAD, go on as a GET without the body), each hop
    /// judged by the policy before it is requested. Once a hop leaves the origin of the first
    /// request, the `secret` headers and [`CREDENTIAL_HEADERS`] are dropped for good, so a
    /// redirect cannot carry a credential to another server. A redirect whose request cannot
    /// be repeated (a streamed body) is answered as it is.
    pub async fn send(
        &self,
        request: reqwest::Request,
        secret: &[HeaderName],
    ) -> Result<reqwest::Response, SendError> {
        let origin = request.url().origin();
        let mut request = request;
        for _ in 0..=MAX_REDIRECTS {
            let again = request.try_clone();
            let method = request.method().clone();
            let response = self.http.execute(request).await?;
            let status = response.status();
            let Some(to) = redirect_target(&response) else {
                return Ok(response);
            };
            let from = response.url().clone();
            let to = to.map_err(|why| SendError::BadRedirect {
                why,
                from: from.clone(),
            })?;
            self.permits(&to)
                .map_err(|refused| SendError::RedirectRefused {
                    refused,
                    from: from.clone(),
                })?;
            let Some(mut next) = again else {
                return Ok(response);
            };
            let becomes_get = status == StatusCode::SEE_OTHER
                || (matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND)
                    && method != Method::GET
                    && method != Method::HEAD);
            if becomes_get {
                *next.method_mut() = if method == Method::HEAD {
                    Method::HEAD
                } else {
                    Method::GET
                };
                *next.body_mut() = None;
                for name in [
                    reqwest::header::CONTENT_TYPE,
                    reqwest::header::CONTENT_LENGTH,
                    reqwest::header::CONTENT_ENCODING,
                    reqwest::header::TRANSFER_ENCODING,
                ] {
                    next.headers_mut().remove(name);
                }
            }
            if to.origin() != origin {
                for name in secret.iter().chain(CREDENTIAL_HEADERS.iter()) {
                    next.headers_mut().remove(name);
                }
            }
            *next.url_mut() = to;
            request = next;
        }
        Err(SendError::TooManyRedirects {
            to: request.url().clone(),
        })
    }
}

/// Where a redirect answer sends the request: `None` for an answer that is not a redirect (or
/// names no `Location`), an error for a `Location` that is no http(s) URL.
fn redirect_target(response: &reqwest::Response) -> Option<Result<Url, String>> {
    let status = response.status();
    if !matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    ) {
        return None;
    }
    let location = response.headers().get(LOCATION)?;
    let to = location
        .to_str()
        .map_err(|_| "the redirect's Location is not text".to_string())
        .and_then(|text| {
            response
                .url()
                .join(text)
                .map_err(|e| format!("the redirect's Location is not a URL: {e}"))
        })
        .and_then(|url| match url.scheme() {
            "http" | "https" => Ok(url),
            other => Err(format!("a redirect to a {other}: URL is not followed")),
        });
    Some(to)
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
