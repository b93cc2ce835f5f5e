//! Plans: the set of policies a key is checked against, together.

use std::fmt;
use std::sync::Arc;

use crate::policy::{Policy, Unit};

/// Why a plan could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// A plan needs at least one policy.
    Empty,
    /// Two policies share a name.
    DuplicatePolicy(String),
    /// Too many policies for one check.
    TooMany(usize),
    /// The plan counts two units besides requests (content bytes and a
    /// named unit, or two named units): a request carries one amount
    /// beside its request count.
    MixedUnits(String, String),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Empty => f.write_str("a plan needs at least one policy"),
            PlanError::DuplicatePolicy(n) => write!(f, "policy {n:?} appears twice in the plan"),
            PlanError::TooMany(n) => write!(f, "{n} policies in one plan; at most {MAX_POLICIES}"),
            PlanError::MixedUnits(a, b) => write!(
                f,
                "the plan counts both {a:?} and {b:?}; a plan counts requests and at most one other unit"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// The most policies one plan may hold.
pub const MAX_POLICIES: usize = 16;

/// A named set of policies, checked together. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    inner: Arc<PlanInner>,
}

#[derive(Debug, PartialEq, Eq)]
struct PlanInner {
    name: String,
    policies: Vec<Policy>,
    offsets: Vec<usize>,
    spans: Vec<(usize, usize)>,
    words: usize,
    layout: u64,
    identity: u64,
}

impl Plan {
    /// Builds a plan from its policies (order is kept: it is the order the
    /// headers list them in).
    pub fn new(name: &str, policies: Vec<Policy>) -> Result<Plan, PlanError> {
        if policies.is_empty() {
            return Err(PlanError::Empty);
        }
        if policies.len() > MAX_POLICIES {
            return Err(PlanError::TooMany(policies.len()));
        }
        for (i, p) in policies.iter().enumerate() {
            if policies[..i].iter().any(|o| o.name() == p.name()) {
                return Err(PlanError::DuplicatePolicy(p.name().to_string()));
            }
        }
        // requests (and concurrency) and at most one other unit
        let mut other: Option<crate::Unit> = None;
        for p in &policies {
            let u = p.unit();
            if matches!(u, crate::Unit::ContentBytes | crate::Unit::Named(_)) {
                match other {
                    Some(o) if o != u => {
                        return Err(PlanError::MixedUnits(o.as_str().into(), u.as_str().into()))
                    }
                    _ => other = Some(u),
                }
            }
        }
        let mut offsets = Vec::with_capacity(policies.len());
        let mut words = 0;
        let mut layout: u64 = 0xcbf2_9ce4_8422_2325;
        for p in &policies {
            offsets.push(words);
            words += p.state_words();
            for x in [p.algorithm().tag(), p.state_words() as u64] {
                layout = (layout ^ x).wrapping_mul(0x0100_0000_01b3);
            }
        }
        let spans = offsets
            .iter()
            .zip(&policies)
            .map(|(&o, p)| (o, o + p.state_words()))
            .collect();
        let mut identity = layout;
        for b in name.bytes() {
            identity = (identity ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Ok(Plan {
            inner: Arc::new(PlanInner {
                name: name.to_string(),
                policies,
                spans,
                offsets,
                words,
                layout,
                identity,
            }),
        })
    }

    /// The plan's name (for example `free`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// The policies, in order.
    pub fn policies(&self) -> &[Policy] {
        &self.inner.policies
    }
    /// The policy at `index`.
    pub fn policy(&self, index: usize) -> &Policy {
        &self.inner.policies[index]
    }
    /// The index of the policy named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.inner.policies.iter().position(|p| p.name() == name)
    }
    /// Words of state per key.
    pub fn state_words(&self) -> usize {
        self.inner.words
    }
    /// Where policy `index`'s words start in a key's state.
    pub fn offset(&self, index: usize) -> usize {
        self.inner.offsets[index]
    }
    /// Per policy, the `start..end` of its words in a key's state.
    pub fn spans(&self) -> &[(usize, usize)] {
        &self.inner.spans
    }
    /// A fingerprint of the state layout: two plans with the same
    /// fingerprint read each other's state the same way, so a reload that
    /// changes only quotas keeps every counter.
    pub fn layout_fingerprint(&self) -> u64 {
        self.inner.layout
    }
    /// A fingerprint of the plan's name and layout: keys of different plans
    /// never share state.
    pub fn identity(&self) -> u64 {
        self.inner.identity
    }
    /// Whether any policy counts content bytes.
    pub fn counts_bytes(&self) -> bool {
        self.policies()
            .iter()
            .any(|p| p.unit() == Unit::ContentBytes)
    }
    /// Whether any policy counts a named unit ([`Unit::Named`]).
    pub fn counts_units(&self) -> bool {
        self.policies()
            .iter()
            .any(|p| matches!(p.unit(), Unit::Named(_)))
    }
    /// Whether any policy is a concurrency cap (its lease must be released).
    pub fn has_concurrency(&self) -> bool {
        self.policies()
            .iter()
            .any(|p| p.unit() == Unit::ConcurrentRequests)
    }
}
