//! Sends spans over OTLP: `sked_core::trace::Span`s mapped to the OpenTelemetry SDK's span
//! data and handed to `opentelemetry-otlp`'s exporter, over HTTP (protobuf, through a reqwest
//! client of our own, with its timeout) or gRPC (tonic). It knows nothing of runs: what a
//! span says is core's, when spans are sent is `traces/mod.rs`'.

use super::{OtlpProtocol, TraceSettings};
use crate::metrics::Metrics;
use bytes::Bytes;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use opentelemetry_sdk::Resource;
use sked_core::trace::{self, Value};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Spans sent in one export request at most: a page of runs is split into requests of this
/// many spans, each well under a collector's usual 4 MiB limit.
pub const SPANS_PER_REQUEST: usize = 2_000;

/// Why the exporter could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Build(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("cannot make an HTTP client: {0}")]
    Client(String),
    #[error("header {0:?} is not a valid gRPC metadata entry")]
    Metadata(String),
}

/// The exporter and the scope its spans are told under.
pub struct Exporter {
    inner: opentelemetry_otlp::SpanExporter,
    scope: InstrumentationScope,
    /// Repeated failures are logged once a minute, with how many there were.
    failures: Mutex<sked_core::throttle::Throttle>,
}

impl Exporter {
    /// An exporter to `settings.endpoint`, telling spans as service `sked`, instance `node`.
    pub fn new(settings: &TraceSettings, node: &str) -> Result<Exporter, ExportError> {
        let mut inner = match settings.protocol {
            OtlpProtocol::Http => {
                let client = reqwest::Client::builder()
                    .timeout(settings.timeout)
                    .build()
                    .map_err(|e| ExportError::Client(e.to_string()))?;
                let endpoint = format!("{}/v1/traces", settings.endpoint.trim_end_matches('/'));
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(OtlpHttpClient(client))
                    .with_endpoint(endpoint)
                    .with_timeout(settings.timeout)
                    .with_headers(settings.headers.iter().cloned().collect::<HashMap<_, _>>())
                    .build()?
            }
            OtlpProtocol::Grpc => {
                let mut headers = http::HeaderMap::new();
                for (name, value) in &settings.headers {
                    let bad = || ExportError::Metadata(name.clone());
                    let key = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                        .map_err(|_| bad())?;
                    headers.insert(key, http::HeaderValue::from_str(value).map_err(|_| bad())?);
                }
                let metadata =
                    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(headers);
                let mut builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(settings.endpoint.clone())
                    .with_timeout(settings.timeout)
                    .with_metadata(metadata);
                if settings.endpoint.starts_with("https://") {
                    builder = builder.with_tls_config(
                        opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new()
                            .with_webpki_roots(),
                    );
                }
                builder.build()?
            }
        };
        inner.set_resource(
            &Resource::builder_empty()
                .with_service_name("sked")
                .with_attributes([
                    KeyValue::new("service.instance.id", node.to_string()),
                    KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                ])
                .build(),
        );
        Ok(Exporter {
            inner,
            scope: InstrumentationScope::builder("sked")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            failures: Mutex::new(sked_core::throttle::Throttle::new(Duration::from_secs(60))),
        })
    }

    /// Sends `spans`, counting what went and what did not; never retries (the next pass has
    /// other runs to tell).
    pub async fn send(&self, spans: Vec<trace::Span>, metrics: &Metrics) {
        let mut spans = spans.into_iter().peekable();
        while spans.peek().is_some() {
            let batch: Vec<SpanData> = spans
                .by_ref()
                .take(SPANS_PER_REQUEST)
                .map(|span| self.data(span))
                .collect();
            let count = batch.len() as u64;
            match self.inner.export(batch).await {
                Ok(()) => metrics.spans_exported(count),
                Err(e) => {
                    metrics.spans_dropped(count);
                    let mut throttle = self.failures.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(repeats) = throttle.admit(std::time::Instant::now()) {
                        tracing::warn!(
                            "traces: {count} spans not exported ({repeats} earlier failures \
                             not logged): {e}"
                        );
                    }
                }
            }
        }
    }

    pub async fn shutdown(&self) {
        if let Err(e) = self.inner.shutdown() {
            tracing::warn!("traces: the exporter did not shut down cleanly: {e}");
        }
    }

    fn data(&self, span: trace::Span) -> SpanData {
        // Non-exhaustive, with public fields.
        let mut events = SpanEvents::default();
        events.events = span
            .events
            .iter()
            .map(|(name, at)| {
                opentelemetry::trace::Event::new(*name, SystemTime::from(*at), Vec::new(), 0)
            })
            .collect();
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(span.trace_id.0),
                SpanId::from_bytes(span.span_id.0),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: span
                .parent
                .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.0)),
            parent_span_is_remote: span.parent_remote,
            span_kind: match span.kind {
                trace::SpanKind::Internal => SpanKind::Internal,
                trace::SpanKind::Client => SpanKind::Client,
                trace::SpanKind::Producer => SpanKind::Producer,
            },
            name: Cow::Owned(span.name),
            start_time: SystemTime::from(span.start),
            end_time: SystemTime::from(span.end),
            attributes: span
                .attributes
                .into_iter()
                .map(|(key, value)| match value {
                    Value::Str(s) => KeyValue::new(key, s),
                    Value::Int(i) => KeyValue::new(key, i),
                    Value::Bool(b) => KeyValue::new(key, b),
                })
                .collect(),
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: match span.error {
                Some(why) => Status::Error {
                    description: Cow::Owned(why),
                },
                None => Status::Unset,
            },
            instrumentation_scope: self.scope.clone(),
        }
    }
}

/// `opentelemetry-otlp`'s HTTP transport over our reqwest client (the library's own is of
/// another reqwest version): the request as given, the response read whole up to 4 MiB.
#[derive(Debug)]
struct OtlpHttpClient(reqwest::Client);

/// The largest response body read from a collector.
const MAX_RESPONSE: usize = 4 << 20;

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OtlpHttpClient {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let mut response = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let status = response.status();
        let headers = std::mem::take(response.headers_mut());
        let mut read = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            if read.len() + chunk.len() > MAX_RESPONSE {
                return Err("the collector's response is over 4 MiB".into());
            }
            read.extend_from_slice(&chunk);
        }
        let mut answer = http::Response::new(Bytes::from(read));
        *answer.status_mut() = status;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}
