//! The node's log follows (`GET /api/v1/runs/{id}/log?follow=true`): at most
//! `--max-log-follows` at once, shared between tokens and between namespaces so that one
//! viewer cannot take them all. A token may hold a follow while it holds fewer than its fair
//! part, counted with one holder more than hold follows now (`fair_part(total, tokens + 1)`:
//! alone, a third), and a namespace likewise (`fair_part(total, namespaces)`: alone, half), so
//! another token, and another namespace, always find a follow free. An admin's follows count
//! in the shares of others but are bound only by the total.

use sked_core::policy::admission::fair_part;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Why a follow was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every follow of the node is taken.
    Full,
    /// The token holds its part.
    Token(usize),
    /// The run's namespace holds its part.
    Namespace(usize),
}

#[derive(Default)]
struct Held {
    all: usize,
    by_token: HashMap<Option<i64>, usize>,
    by_namespace: HashMap<String, usize>,
}

/// The follows open on this node.
pub struct Follows {
    total: usize,
    held: Mutex<Held>,
}

/// One open follow; dropping it frees its place.
pub struct FollowSlot {
    follows: Arc<Follows>,
    token: Option<i64>,
    namespace: String,
}

fn count_down<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Follows {
    pub fn new(total: usize) -> Follows {
        Follows {
            total: total.max(1),
            held: Mutex::new(Held::default()),
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A follow for `token` of a run of `namespace`, unless a share is full. `admin`: bound
    /// by the total only.
    pub fn take(
        self: &Arc<Self>,
        token: Option<i64>,
        namespace: &str,
        admin: bool,
    ) -> Result<FollowSlot, Refusal> {
        let mut held = self.lock();
        if held.all >= self.total {
            return Err(Refusal::Full);
        }
        if !admin {
            let by_token = held.by_token.get(&token).copied().unwrap_or(0);
            let other_tokens = held.by_token.len() - usize::from(by_token > 0);
            let token_part = fair_part(self.total, other_tokens + 2);
            if by_token >= token_part {
                return Err(Refusal::Token(token_part));
            }
            let by_namespace = held.by_namespace.get(namespace).copied().unwrap_or(0);
            let other_namespaces = held.by_namespace.len() - usize::from(by_namespace > 0);
            let namespace_part = fair_part(self.total, other_namespaces + 1);
            if by_namespace >= namespace_part {
                return Err(Refusal::Namespace(namespace_part));
            }
        }
        held.all += 1;
        *held.by_token.entry(token).or_default() += 1;
        *held.by_namespace.entry(namespace.to_string()).or_default() += 1;
        Ok(FollowSlot {
            follows: self.clone(),
            token,
            namespace: namespace.to_string(),
        })
    }
}

impl Drop for FollowSlot {
    fn drop(&mut self) {
        let mut held = self.follows.lock();
        held.all -= 1;
        count_down(&mut held.by_token, &self.token);
        count_down(&mut held.by_namespace, &self.namespace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_viewer_leaves_follows_for_other_tokens_and_namespaces() {
        let follows = Arc::new(Follows::new(12));
        let mut open = Vec::new();
        while let Ok(slot) = follows.take(Some(1), "a", false) {
            open.push(slot);
        }
        // Alone, a token holds a third.
        assert_eq!(open.len(), 4);
        assert_eq!(
            follows.take(Some(1), "a", false).err(),
            Some(Refusal::Token(4))
        );
        // Another token of the namespace still gets one, up to the namespace's half.
        let mut second = Vec::new();
        while let Ok(slot) = follows.take(Some(2), "a", false) {
            second.push(slot);
        }
        assert_eq!(second.len(), 2);
        assert_eq!(
            follows.take(Some(3), "a", false).err(),
            Some(Refusal::Namespace(6))
        );
        // Another namespace's token does.
        let other = follows.take(Some(3), "b", false);
        assert!(other.is_ok());
        drop(open);
        drop(second);
        drop(other);
        assert_eq!(follows.lock().all, 0);
        assert!(follows.lock().by_token.is_empty());
        // An admin is bound by the total alone.
        let all: Vec<_> = (0..12)
            .map_while(|_| follows.take(None, "a", true).ok())
            .collect();
        assert_eq!(all.len(), 12);
        assert_eq!(follows.take(None, "a", true).err(), Some(Refusal::Full));
    }
}
