//! A webhook receiver on loopback: what notification tests point their rules at.

use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request a webhook receiver got.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub headers: BTreeMap<String, String>,
    pub body: Value,
    /// The status it answered.
    pub answered: u16,
}

/// A webhook receiver on `port` (or any free one) that answers 503 to its first
/// `refuse_first` requests and 200 after.
#[derive(Clone, Default)]
pub struct Receiver {
    got: Arc<Mutex<Vec<Delivery>>>,
}

impl Receiver {
    pub async fn start(port: u16, refuse_first: usize) -> (Receiver, String) {
        let receiver = Receiver::default();
        let got = receiver.got.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let got = got.clone();
                    async move {
                        let mut got = got.lock().unwrap();
                        let answered = if got.len() < refuse_first { 503 } else { 200 };
                        got.push(Delivery {
                            headers: headers
                                .iter()
                                .map(|(k, v)| {
                                    (k.to_string(), v.to_str().unwrap_or_default().to_string())
                                })
                                .collect(),
                            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                            answered,
                        });
                        axum::http::StatusCode::from_u16(answered).unwrap()
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the receiver");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}/hook"))
    }

    /// The deliveries it answered 200, once `count` have arrived.
    pub async fn delivered(&self, count: usize, timeout: Duration) -> Vec<Delivery> {
        let deadline = Instant::now() + timeout;
        loop {
            let ok: Vec<Delivery> = {
                let got = self.got.lock().unwrap();
                got.iter().filter(|d| d.answered == 200).cloned().collect()
            };
            if ok.len() >= count {
                return ok;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} notifications delivered; all requests: {:?}",
                ok.len(),
                self.got.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn requests(&self) -> Vec<Delivery> {
        self.got.lock().unwrap().clone()
    }
}
