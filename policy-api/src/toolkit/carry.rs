//! Carrying a decision from `route` to `on_dispatch` (0.5.9).
//!
//! A router often works out more in `route` than the index it returns — the prefix each replica
//! holds, the cost it charged, the key it matched — and needs some of it again in `on_dispatch`.
//! [`Carried`] keeps it for the one request being routed.
//!
//! It rests on the order of the host's calls, the same in the simulator and the gateway: after
//! `route` for a request, the router's next routing call is `on_dispatch` for that request (sent
//! to the replica chosen, or, in the gateway, to another one when the chosen backend is down), or
//! the next request's `route` when the request was sent nowhere. So one slot is enough, and
//! nothing is kept for a request that is never dispatched beyond the next `route`: memory stays
//! bounded in a long-lived gateway.

use crate::types::Request;

/// What `route` decided for one request, kept for that request's `on_dispatch`.
///
/// ```
/// use routelab_policy_api::prelude::*;
///
/// struct Note {
///     matched_tokens: u32,
/// }
///
/// let mut carried: Carried<Note> = Carried::new();
/// let request = Request::new(7, 0.0, 100);
/// // In `route`: return the chosen index and keep what `on_dispatch` will want.
/// let chosen = carried.keep(&request, 2, Note { matched_tokens: 64 });
/// assert_eq!(chosen, 2);
/// // In `on_dispatch` of the same request: the decision, and the replica `route` chose
/// // (which a gateway may not have sent it to).
/// let kept = carried.take(&request).expect("route kept a decision for this request");
/// assert_eq!((kept.replica, kept.decision.matched_tokens), (2, 64));
/// // Taken once: a second take, or a take for another request, finds nothing.
/// assert!(carried.take(&request).is_none());
/// ```
#[derive(Debug)]
pub struct Carried<T> {
    kept: Option<Kept<T>>,
}

/// A decision [`Carried::take`] hands back.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept<T> {
    /// The request it was made for.
    pub request: u64,
    /// The replica `route` chose (the request may have been sent elsewhere: compare with the
    /// replica `on_dispatch` names).
    pub replica: usize,
    /// What `route` kept.
    pub decision: T,
}

impl<T> Default for Carried<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Carried<T> {
    /// Nothing kept.
    pub const fn new() -> Self {
        Self { kept: None }
    }

    /// Keeps `decision`, made by `route` for `request`, which chose `replica`; returns `replica`
    /// (so `route` can end with it). Replaces whatever was kept before: that request was not
    /// dispatched.
    pub fn keep(&mut self, request: &Request<'_>, replica: usize, decision: T) -> usize {
        self.kept = Some(Kept { request: request.id, replica, decision });
        replica
    }

    /// The decision kept for `request`, taken: `None` if `route` kept none for it (the host
    /// dispatched it without asking, or `route` kept something for another request since).
    /// Empties the slot either way.
    pub fn take(&mut self, request: &Request<'_>) -> Option<Kept<T>> {
        self.kept.take().filter(|k| k.request == request.id)
    }

    /// Forgets what was kept (e.g. when the replicas change under a decision in flight).
    pub fn clear(&mut self) {
        self.kept = None;
    }

    /// Whether a decision is kept, for any request.
    pub fn is_empty(&self) -> bool {
        self.kept.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_reaches_the_dispatch_of_its_own_request_only() {
        let (a, b) = (Request::new(1, 0.0, 10), Request::new(2, 0.5, 10));
        let mut c: Carried<&str> = Carried::new();
        assert!(c.take(&a).is_none(), "nothing kept yet");
        c.keep(&a, 0, "a");
        // `a` was declined (sent nowhere): `b`'s route replaces its decision.
        assert_eq!(c.keep(&b, 3, "b"), 3);
        assert!(c.take(&a).is_none(), "a's decision is gone");
        assert!(c.is_empty(), "a take for another request empties the slot");
        c.keep(&b, 3, "b");
        assert_eq!(c.take(&b), Some(Kept { request: 2, replica: 3, decision: "b" }));
        assert!(c.take(&b).is_none(), "taken once");
        c.keep(&b, 1, "b");
        c.clear();
        assert!(c.take(&b).is_none(), "cleared");
    }
}
