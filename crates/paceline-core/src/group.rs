//! A group check: several keys, each on its own plan, admitted together or
//! not at all.
//!
//! Why: a request limited by several independent rules (Envoy's
//! descriptors, say) must spend nothing when one rule refuses it. Checking
//! each key and giving the charges back after a refusal spends nothing in
//! the end, but between the charge and the give-back another request can
//! see (and be refused by) a charge that is about to vanish. A store that
//! decides the whole group in one step never shows such a charge.
//!
//! [`Store::check_all`] is that step. Its default, [`check_each`], is the
//! fallback for a store that cannot do better: one check after another,
//! the charges given back on a refusal. [`MemoryStore`](crate::MemoryStore)
//! holds its group stripes while it decides and puts every state back on
//! a refusal, and the Redis store sends the group as one server-side
//! call that does the same.
//!
//! ```
//! use paceline_core::{Cost, GroupItem, MemoryStore, Nanos, Plan, Policy, Store};
//!
//! let day = Plan::new("day", vec![Policy::daily("d", 50).unwrap()]).unwrap();
//! let one = Plan::new("one", vec![Policy::daily("o", 1).unwrap()]).unwrap();
//! let store = MemoryStore::new();
//! let now = Nanos::from_secs(1_790_000_000);
//! let items = [
//!     GroupItem::new(&day, "a", Cost::requests(1)),
//!     GroupItem::new(&one, "b", Cost::requests(1)),
//! ];
//! let first = store.check_all_sync(&items, now).unwrap();
//! assert!(first.is_admitted());
//! let second = store.check_all_sync(&items, now).unwrap();
//! assert_eq!(second.refused(), Some(1));
//! // the refused group charged nothing: "a" has spent one of 50
//! let a = store.check_sync(&day, "a", 0, now).unwrap();
//! assert_eq!(a.statuses[0].remaining, 49);
//! ```

use crate::check::Cost;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::plan::Plan;
use crate::store::{Store, StoreError};

/// One key of a group check: its plan, its key and what it costs.
#[derive(Clone, Copy, Debug)]
pub struct GroupItem<'a> {
    /// The key's plan.
    pub plan: &'a Plan,
    /// The key.
    pub key: &'a str,
    /// What the group charges it (0 reads it).
    pub cost: Cost,
}

impl<'a> GroupItem<'a> {
    /// An item of `plan` for `key`, costing `cost`.
    pub fn new(plan: &'a Plan, key: &'a str, cost: Cost) -> Self {
        GroupItem { plan, key, cost }
    }
}

/// What a group check answered, item by item in the items' order.
///
/// The group was charged only if [`is_admitted`](Self::is_admitted): then
/// every item was charged its cost and its decision tells the standing
/// after the charge. Otherwise nothing was charged: a refusing item's
/// decision is its denial, another item's its standing without this
/// group's charge (`None` when the store did not ask it: a refusal known
/// before it was).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDecision {
    /// Each item's decision.
    pub decisions: Vec<Option<Decision>>,
}

impl GroupDecision {
    /// Whether every item admitted the group (and so it was charged).
    pub fn is_admitted(&self) -> bool {
        self.decisions
            .iter()
            .all(|d| d.as_ref().is_some_and(Decision::is_allowed))
    }

    /// The first item that refused the group, if any.
    pub fn refused(&self) -> Option<usize> {
        self.decisions
            .iter()
            .position(|d| d.as_ref().is_some_and(|d| !d.is_allowed()))
    }

    /// How long until every refusing item would admit its cost again (the
    /// longest of their waits); `None` when admitted or when no wait helps
    /// (a cost over a burst).
    pub fn retry_after(&self) -> Option<Nanos> {
        let mut wait = None;
        for d in self.decisions.iter().flatten() {
            match d.outcome {
                crate::Outcome::Allowed => {}
                crate::Outcome::Denied(den) => {
                    wait = Some(wait.map_or(den.retry_after, |w: Nanos| w.max(den.retry_after)))
                }
                crate::Outcome::CostExceedsBurst { .. } => return None,
            }
        }
        wait
    }
}

/// The group check of a store that cannot decide a group in one step: each
/// item checked in turn, stopping at the first refusal; on a refusal the
/// items already charged are given back ([`Store::refund`], and
/// [`Store::release`] for their leases) and read again, so the answer holds their standing without the charge. An error
/// gives back what was charged before it and is returned.
///
/// Nearly exact in the end (once this returns, a refused group has spent
/// what a refund cannot give back: a shadow policy's count) and not in
/// between: until the give-back, another caller may see the charges.
/// [`Store::check_all`]'s default.
pub async fn check_each<S: Store + ?Sized>(
    store: &S,
    items: &[GroupItem<'_>],
    now: Nanos,
) -> Result<GroupDecision, StoreError> {
    let mut decisions: Vec<Option<Decision>> = Vec::with_capacity(items.len());
    let mut failed = None;
    for it in items {
        let d = match store.check_local(it.plan, it.key, it.cost, now) {
            Some(r) => r,
            None => store.check_cost(it.plan, it.key, it.cost, now).await,
        };
        match d {
            Ok(d) => {
                let refused = !d.is_allowed();
                decisions.push(Some(d));
                if refused {
                    break;
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let refused = failed.is_some() || decisions.iter().flatten().any(|d| !d.is_allowed());
    if refused {
        give_back(store, items, &mut decisions, now).await;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    decisions.resize(items.len(), None);
    Ok(GroupDecision { decisions })
}

/// Gives back the charges of the admitted items of a refused group, and
/// reads each one's standing again.
async fn give_back<S: Store + ?Sized>(
    store: &S,
    items: &[GroupItem<'_>],
    decisions: &mut [Option<Decision>],
    now: Nanos,
) {
    let zero = Cost::requests(0);
    for (it, d) in items.iter().zip(decisions.iter_mut()) {
        let charged = d.as_ref().is_some_and(Decision::is_allowed) && it.cost != zero;
        if !charged {
            continue;
        }
        // a refund that fails leaves the charge, as a failed give-back
        // always has; the read then shows it. A refund gives no lease
        // back: a concurrency policy's units are released
        let _ = store.refund(it.plan, it.key, it.cost, now, now).await;
        if it.plan.has_concurrency() && it.cost.requests > 0 {
            let _ = store.release(it.plan, it.key, it.cost.requests, now).await;
        }
        let read = match store.check_local(it.plan, it.key, zero, now) {
            Some(r) => r,
            None => store.check_cost(it.plan, it.key, zero, now).await,
        };
        if let Ok(r) = read {
            *d = Some(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryStore, Policy};

    fn plan(name: &str, p: Policy) -> Plan {
        Plan::new(name, vec![p]).unwrap()
    }

    #[test]
    fn a_refused_group_puts_back_shadow_counts_leases_and_repeated_keys() {
        let store = MemoryStore::new();
        let now = Nanos::from_secs(1_790_000_000);
        let shadow = plan("s", Policy::daily("s", 10).unwrap().with_shadow(true));
        let lease = plan("l", Policy::concurrency("l", 2).unwrap());
        let pair = plan(
            "p",
            Policy::token_bucket("p", 3, 3).unwrap().with_shadow(false),
        );
        let one = plan("o", Policy::daily("o", 1).unwrap());
        let c = Cost::requests(1);
        let items = [
            GroupItem::new(&shadow, "k", c),
            GroupItem::new(&lease, "k", c),
            GroupItem::new(&pair, "k", Cost::requests(2)),
            GroupItem::new(&pair, "k", Cost::requests(2)),
            GroupItem::new(&one, "k", c),
        ];
        // the second `pair` item refuses (3 tokens, 4 asked in all)
        let g = store.check_all_sync(&items, now).unwrap();
        assert_eq!(g.refused(), Some(3), "{g:?}");
        assert!(g.decisions[4].is_none(), "not asked after the refusal");
        let standing = |d: &Option<Decision>| d.as_ref().unwrap().statuses[0].remaining;
        assert_eq!(standing(&g.decisions[0]), 10);
        assert_eq!(standing(&g.decisions[1]), 2);
        assert_eq!(standing(&g.decisions[2]), 3);
        // nothing kept: every key reads as fresh
        for it in &items[..3] {
            let d = store.check_sync(it.plan, it.key, 0, now).unwrap();
            assert_eq!(d.statuses[0].remaining, it.plan.policy(0).quota());
        }
        let alone = [items[0], items[1], items[2], items[4]];
        let g = store.check_all_sync(&alone, now).unwrap();
        assert!(g.is_admitted(), "{g:?}");
        assert_eq!(standing(&g.decisions[2]), 1);
        assert_eq!(g.retry_after(), None);
        let g = store.check_all_sync(&alone, now).unwrap();
        assert_eq!(g.refused(), Some(2));
        assert!(g.retry_after().is_some());
    }
}
