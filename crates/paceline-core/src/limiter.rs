//! The front door: a store, a clock, and leases for concurrency caps.

use std::fmt;
use std::sync::Arc;

use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::plan::Plan;
use crate::store::{MemoryStore, Store, StoreError};

/// Checks keys against plans, reading the time from its clock.
///
/// ```
/// use paceline_core::{Limiter, ManualClock, MemoryStore, Nanos, Plan, Policy};
///
/// let clock = ManualClock::new(Nanos::from_secs(1_000));
/// let limiter = Limiter::new(MemoryStore::new(), clock.clone());
/// let plan = Plan::new("p", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap();
/// let admitted = (0..10).filter(|_| limiter.check_sync(&plan, "k", 1).unwrap().is_allowed()).count();
/// assert_eq!(admitted, 8);
/// clock.advance(Nanos::from_millis(250));
/// assert!(limiter.check_sync(&plan, "k", 1).unwrap().is_allowed());
/// ```
#[derive(Clone, Debug)]
pub struct Limiter<S = MemoryStore, C = SystemClock> {
    store: S,
    clock: C,
}

impl Limiter<MemoryStore, SystemClock> {
    /// An in-memory limiter on the system clock.
    pub fn in_memory() -> Self {
        Limiter::new(MemoryStore::new(), SystemClock::new())
    }
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// A limiter over `store`, reading time from `clock`.
    pub fn new(store: S, clock: C) -> Self {
        Limiter { store, clock }
    }
    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }
    /// Checks and charges `cost` for `key` under `plan`.
    pub async fn check(&self, plan: &Plan, key: &str, cost: u64) -> Result<Decision, StoreError> {
        self.store.check(plan, key, cost, self.clock.now()).await
    }
    /// Reads the key's standing under `plan` without charging anything.
    pub async fn peek(&self, plan: &Plan, key: &str) -> Result<Decision, StoreError> {
        self.store.check(plan, key, 0, self.clock.now()).await
    }
}

impl<C: Clock + Clone> Limiter<MemoryStore, C> {
    /// The synchronous check on the embedded store.
    #[inline]
    pub fn check_sync(
        &self,
        plan: &Plan,
        key: &str,
        cost: impl Into<crate::Cost>,
    ) -> Result<Decision, StoreError> {
        self.store.check_sync(plan, key, cost, self.clock.now())
    }

    /// Checks and, when admitted under a plan with a concurrency cap, hands
    /// back a [`Lease`] that returns the units when dropped.
    pub fn acquire_sync(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), StoreError> {
        let d = self.check_sync(plan, key, cost)?;
        let lease = (d.is_allowed() && plan.has_concurrency()).then(|| {
            let store = self.store.clone();
            let plan = plan.clone();
            let key: Arc<str> = Arc::from(key);
            let clock = self.clock.clone();
            Lease::new(move || store.release_sync(&plan, &key, cost, clock.now()))
        });
        Ok((d, lease))
    }
}

/// Units of a concurrency cap held by a request in flight; dropping the
/// lease gives them back (also on panic or cancellation).
pub struct Lease {
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Lease {
    /// A lease that runs `release` once, when dropped.
    pub fn new(release: impl FnOnce() + Send + Sync + 'static) -> Self {
        Lease {
            release: Some(Box::new(release)),
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("held", &self.release.is_some())
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}
