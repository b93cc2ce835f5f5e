//! The store behind the gateway's limiter: the in-process memory store, or
//! (with the `redis` feature) a Redis store every instance shares. One
//! enum, dispatched statically; the memory arm is handed out through
//! [`Store::memory`], so the limiter decides on it synchronously exactly as
//! before, and so does [`Store::check_local`] for a denial the Redis
//! store's local cache answers.

use std::future::Future;

use paceline_core::{
    Cost, Decision, GroupDecision, GroupItem, MemoryStore, Nanos, Plan, Store, StoreError,
};

/// Where a gateway keeps its counters.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum GatewayStore {
    /// In this process.
    Memory(MemoryStore),
    /// In Redis, shared by every instance on it.
    #[cfg(feature = "redis")]
    Redis(paceline_redis::RedisStore),
}

impl Store for GatewayStore {
    fn memory(&self) -> Option<&MemoryStore> {
        match self {
            GatewayStore::Memory(m) => Some(m),
            #[cfg(feature = "redis")]
            GatewayStore::Redis(_) => None,
        }
    }

    fn check_local(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> Option<Result<Decision, StoreError>> {
        match self {
            GatewayStore::Memory(m) => Some(m.check_sync(plan, key, cost, now)),
            #[cfg(feature = "redis")]
            GatewayStore::Redis(r) => r.check_local(plan, key, cost, now),
        }
    }

    fn peek_local(&self, plan: &Plan, key: &str, now: Nanos) -> Option<Decision> {
        match self {
            GatewayStore::Memory(m) => m.peek_local(plan, key, now),
            #[cfg(feature = "redis")]
            GatewayStore::Redis(r) => r.peek_local(plan, key, now),
        }
    }

    fn check(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.check_cost(plan, key, Cost::requests(cost), now)
    }

    async fn check_cost(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        match self {
            GatewayStore::Memory(m) => m.check_sync(plan, key, cost, now),
            #[cfg(feature = "redis")]
            GatewayStore::Redis(r) => r.check_cost(plan, key, cost, now).await,
        }
    }

    async fn check_all(
        &self,
        items: &[GroupItem<'_>],
        now: Nanos,
    ) -> Result<GroupDecision, StoreError> {
        match self {
            GatewayStore::Memory(m) => m.check_all_sync(items, now),
            #[cfg(feature = "redis")]
            GatewayStore::Redis(r) => r.check_all(items, now).await,
        }
    }

    async fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
        now: Nanos,
    ) -> Result<(), StoreError> {
        match self {
            GatewayStore::Memory(m) => {
                m.release_sync(plan, key, amount, now);
                Ok(())
            }
            #[cfg(feature = "redis")]
            GatewayStore::Redis(r) => r.release(plan, key, amount, now).await,
        }
    }

    async fn refund(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        charged: Nanos,
        now: Nanos,
    ) -> Result<(), StoreError> {
        match self {
            GatewayStore::Memory(m) => {
                m.refund_sync(plan, key, cost, charged, now);
                Ok(())
            }
            #[cfg(feature = "redis")]
            GatewayStore::Redis(r) => r.refund(plan, key, cost, charged, now).await,
        }
    }

    async fn settle(
        &self,
        plan: &Plan,
        key: &str,
        charged: Cost,
        actual: Cost,
        charged_at: Nanos,
        now: Nanos,
    ) -> Result<(), StoreError> {
        match self {
            GatewayStore::Memory(m) => m.settle_sync(plan, key, charged, actual, charged_at, now),
            #[cfg(feature = "redis")]
            GatewayStore::Redis(r) => r.settle(plan, key, charged, actual, charged_at, now).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::Policy;

    /// The gateway's store passes a settle on: an answer that cost more
    /// than its estimate spends the window (the trait's default would only
    /// give back, and charge nothing more).
    #[tokio::test]
    async fn a_settle_reaches_the_memory_store() {
        let store = GatewayStore::Memory(MemoryStore::new());
        let plan = Plan::new("p", vec![Policy::fixed_window("m", 10, 60).unwrap()]).unwrap();
        let now = Nanos::from_secs(1_800_000_000);
        let estimate = Cost::requests(2);
        let d = store.check_cost(&plan, "k", estimate, now).await.unwrap();
        assert!(d.is_allowed());
        store
            .settle(&plan, "k", estimate, Cost::requests(10), now, now)
            .await
            .unwrap();
        let d = store
            .check_cost(&plan, "k", Cost::requests(1), now)
            .await
            .unwrap();
        assert!(!d.is_allowed(), "10 of 10 spent after the settle");
    }
}
