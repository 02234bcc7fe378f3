//! Where a cluster run reads its requests from: a whole stream shared by every policy run on
//! a seed, or a [`LazyStream`] the run generates as its clock reaches each arrival (and drops
//! once the run has retired them), so that a sketched run's memory does not grow with its length.

use std::ops::Deref;

use crate::time::SimTime;
use crate::workload::generate::{LazyStream, RequestStream};

pub enum Feed<'a> {
    Whole(&'a RequestStream),
    Lazy(Box<LazyStream<'a>>),
}

impl<'a> From<&'a RequestStream> for Feed<'a> {
    fn from(s: &'a RequestStream) -> Self {
        Feed::Whole(s)
    }
}

impl<'a> From<LazyStream<'a>> for Feed<'a> {
    fn from(s: LazyStream<'a>) -> Self {
        Feed::Lazy(Box::new(s))
    }
}

impl Deref for Feed<'_> {
    type Target = RequestStream;

    fn deref(&self) -> &RequestStream {
        match self {
            Feed::Whole(s) => s,
            Feed::Lazy(l) => l.stream(),
        }
    }
}

impl<'a> Feed<'a> {
    /// The whole stream, when the run holds it whole (the lifetime of the run, not of `self`).
    pub fn whole(&self) -> Option<&'a RequestStream> {
        match self {
            Feed::Whole(s) => Some(s),
            Feed::Lazy(_) => None,
        }
    }

    /// Request `id`'s arrival time (generated if need be); `None` past the stream's end.
    pub fn arrival(&mut self, id: usize) -> Option<SimTime> {
        match self {
            Feed::Whole(s) => s.requests.get(id).map(|r| r.arrived_at),
            Feed::Lazy(l) => l.reach(id).then(|| l.stream().request(id).arrived_at),
        }
    }

    /// The run reads no request below `id` again.
    pub fn forget_below(&mut self, id: usize) {
        if let Feed::Lazy(l) = self {
            l.forget_below(id);
        }
    }

    /// Every request held from now on (a run that reads every request's state).
    pub fn hold_all(&mut self) {
        if let Feed::Lazy(l) = self {
            l.hold_all();
        }
    }
}
