//! Whether each broker connection of this node works, as `/readyz` and `/metrics` report it:
//! the outcome of the latest publish or probe through it. A connection is `down` from the
//! first failure to reach its broker until a publish or probe gets through again; a broker
//! that refused one message (unroutable, no stream) is up. Publishers and probes report here;
//! this module does no IO.

use chrono::{DateTime, SecondsFormat, Utc};
use sked_core::publish::BrokerConnection;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq)]
enum Link {
    /// Not tried yet (the first probe runs as the server starts).
    Unknown,
    Up,
    Down {
        since: DateTime<Utc>,
        error: String,
    },
}

/// The state of every broker connection this node has, by name.
#[derive(Debug)]
pub struct BrokerHealth {
    links: Mutex<BTreeMap<String, (String, Link)>>,
}

impl BrokerHealth {
    pub fn new(connections: &[BrokerConnection]) -> BrokerHealth {
        let links = connections
            .iter()
            .map(|c| (c.name.clone(), (c.display(), Link::Unknown)))
            .collect();
        BrokerHealth {
            links: Mutex::new(links),
        }
    }

    fn set(&self, name: &str, link: Link) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let Some((link_name, current)) = links.get_mut(name) else {
            return;
        };
        match (&*current, &link) {
            // The first failure starts the outage; later ones keep its start.
            (Link::Down { .. }, Link::Down { .. }) => {}
            (Link::Down { since, .. }, Link::Up) => {
                let seconds = (Utc::now() - *since).num_seconds();
                tracing::info!("broker connection {link_name} works again after {seconds} s");
                *current = link;
            }
            (_, Link::Down { error, .. }) => {
                tracing::warn!("broker connection {link_name} is down: {error}");
                *current = link;
            }
            _ => *current = link,
        }
    }

    /// A message or a probe got through connection `name`.
    pub fn reached(&self, name: &str) {
        self.set(name, Link::Up);
    }

    /// Connection `name` could not reach its broker.
    pub fn unreachable(&self, name: &str, error: &str) {
        self.set(
            name,
            Link::Down {
                since: Utc::now(),
                error: error.to_string(),
            },
        );
    }

    /// Whether connection `name` is down now.
    pub fn is_down(&self, name: &str) -> bool {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        matches!(links.get(name), Some((_, Link::Down { .. })))
    }

    /// One line per connection, for `/readyz`: `broker main (amqp at host:port): up`.
    pub fn lines(&self) -> Vec<String> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links
            .values()
            .map(|(display, link)| match link {
                Link::Unknown => format!("broker {display}: not tried yet"),
                Link::Up => format!("broker {display}: up"),
                Link::Down { since, error } => format!(
                    "broker {display}: down since {}: {error}",
                    since.to_rfc3339_opts(SecondsFormat::Secs, true)
                ),
            })
            .collect()
    }

    /// `sked_broker_up{connection="main"} 1` for each connection (0 while down or untried).
    pub fn render_metrics(&self) -> String {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        if links.is_empty() {
            return out;
        }
        let _ = writeln!(
            out,
            "# HELP sked_broker_up Whether this node reaches the broker of each connection \
             (1) or not (0).\n# TYPE sked_broker_up gauge"
        );
        for (name, (_, link)) in links.iter() {
            let up = u8::from(*link == Link::Up);
            let _ = writeln!(out, "sked_broker_up{{connection=\"{name}\"}} {up}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> BrokerHealth {
        let connections: Vec<BrokerConnection> = ["main=amqp://u:secret@rabbit:5672/%2f"]
            .iter()
            .map(|s| s.parse().expect("a connection"))
            .collect();
        BrokerHealth::new(&connections)
    }

    #[test]
    fn an_outage_lasts_from_its_first_failure_until_the_broker_is_reached() {
        let health = health();
        assert!(health
            .render_metrics()
            .contains("sked_broker_up{connection=\"main\"} 0"));
        health.reached("main");
        assert!(health
            .render_metrics()
            .contains("sked_broker_up{connection=\"main\"} 1"));
        health.unreachable("main", "cannot connect: refused");
        let first = health.lines();
        health.unreachable("main", "cannot connect: timed out");
        assert_eq!(
            health.lines(),
            first,
            "the outage keeps its start and first cause"
        );
        assert!(health.is_down("main"));
        assert!(first[0].contains("down since") && first[0].contains("refused"));
        health.reached("main");
        assert!(!health.is_down("main"));
        assert_eq!(
            health.lines(),
            vec!["broker main (amqp at rabbit:5672): up"]
        );
    }

    #[test]
    fn credentials_never_reach_the_report() {
        let health = health();
        health.unreachable("main", "cannot connect");
        let text = format!("{}{}", health.lines().join("\n"), health.render_metrics());
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn unknown_connections_are_ignored() {
        let health = health();
        health.unreachable("other", "x");
        assert!(!health.is_down("other"));
        assert_eq!(health.lines().len(), 1);
    }
}
