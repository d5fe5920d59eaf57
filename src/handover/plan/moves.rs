//! The planner's one question, asked of every change of the published list whatever caused it: the list
//! goes from `old` to `new` under the clients' hashing; which keys move from which server to which?

use std::sync::Arc;

use crate::api::Server;
use crate::handover::bounds::KeyFilter;
use crate::hashing::{Handover, InvalidEntry, KeyMove, Scheme};

/// One copy of a change: the keys owned by `old[source]` before and by `new[target]` after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pair {
    pub source: usize,
    pub target: usize,
}

/// A planned copy: its pair, and the keys it takes (`None`: every item the source holds).
#[derive(Clone)]
pub struct Copy {
    pub pair: Pair,
    pub filter: Option<KeyFilter>,
}

impl std::fmt::Debug for Copy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copy")
            .field("pair", &self.pair)
            .field("filtered", &self.filter.is_some())
            .finish()
    }
}

/// The pairs of servers between which keys can move when the list changes from `old` to `new` under
/// `scheme` (`None`: `hashing: unknown`), without hashing a key.
///
/// - Unknown hashing: each slot index whose entry changed, to itself.
/// - A scheme that places by slot index (`jump`, `modula`) over lists of one length: the same.
/// - A scheme consistent between the two sizes ([`Scheme::consistent_between`]): a key changes server
///   only when its server left or its new one joined, so only pairs with a leaving source or a joining
///   target (for `jump`, by slot index: from an index past the new list, to one past the old list, or at
///   an index whose entry changed).
/// - Otherwise (`modula` across sizes, `ketama` across a rounding size) every pair of distinct entries,
///   and the filters find the keys.
pub fn pairs(scheme: Option<Scheme>, old: &[String], new: &[String]) -> Vec<Pair> {
    let same_index = |pairs: &mut Vec<Pair>| {
        for (index, (from, to)) in old.iter().zip(new).enumerate() {
            if from != to {
                pairs.push(Pair {
                    source: index,
                    target: index,
                });
            }
        }
    };
    let mut pairs = Vec::new();
    let Some(scheme) = scheme else {
        same_index(&mut pairs);
        return pairs;
    };
    if old.len() == new.len() && matches!(scheme, Scheme::Jump | Scheme::ProxyJump | Scheme::Modula)
    {
        same_index(&mut pairs);
        return pairs;
    }
    let consistent = scheme.consistent_between(old.len(), new.len());
    for (source, from) in old.iter().enumerate() {
        for (target, to) in new.iter().enumerate() {
            if from == to {
                continue;
            }
            let may_move = !consistent
                || match scheme {
                    Scheme::Jump | Scheme::ProxyJump => {
                        source == target || source >= new.len() || target >= old.len()
                    }
                    _ => !new.contains(from) || !old.contains(to),
                };
            if may_move {
                pairs.push(Pair { source, target });
            }
        }
    }
    pairs
}

/// The copies that keep the keys warm when the published list changes from `old` to `new` under
/// `scheme` (`None`: `hashing: unknown`): one per pair of [`pairs`], each with the filter of the keys
/// that move from its source to its target (none under unknown hashing: the slot's every item). Fails on
/// an entry that is not `host:port`, which the operator never publishes.
pub fn copies(
    scheme: Option<Scheme>,
    old: &[String],
    new: &[String],
) -> Result<Vec<Copy>, InvalidEntry> {
    let pairs = pairs(scheme, old, new);
    let Some(scheme) = scheme.filter(|_| !pairs.is_empty()) else {
        return Ok(pairs
            .into_iter()
            .map(|pair| Copy { pair, filter: None })
            .collect());
    };
    let handover = Arc::new(Handover::new(scheme, old, new)?);
    Ok(pairs
        .into_iter()
        .map(|pair| Copy {
            pair,
            filter: Some(filter(handover.clone(), pair)),
        })
        .collect())
}

/// The keys of `pair`: owned by its source under the old list and by its target under the new one.
pub fn filter(handover: Arc<Handover>, pair: Pair) -> KeyFilter {
    Arc::new(move |key: &[u8]| {
        matches!(handover.key_move(key), KeyMove::Moves { from, to }
            if from == pair.source && to == pair.target)
    })
}

/// The published entries of `servers` (those with an address), in slot order, with their slots.
pub fn published(servers: &[Server]) -> (Vec<String>, Vec<i32>) {
    servers
        .iter()
        .filter_map(|s| Some((s.address.clone()?, s.slot)))
        .unzip()
}

#[cfg(test)]
mod tests;
