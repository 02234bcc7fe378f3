//! Where a cluster run reads its requests from: a whole stream shared by every policy run on
//! a seed, or a [`LazyStream`] the run generates as its clock reaches each arrival (and drops
//! once the run has retired them), so that a sketched run's memory does not grow with its length.

use std::ops::Deref;

use crate::time::SimTime;
use crate::workload::generate::{LazyStream, RequestStream};

pub enum Feed<'a> {
    /// A whole stream, and whether every request was checked to fit a replica that may serve it
    /// (a prepared workload's were: [`Feed::fitted`]); a run checks the stream if not.
    Whole(&'a RequestStream, Fit),
    /// A stream generated as the run goes; preparing it checked every request
    /// (`LazyStream::extent`).
    Lazy(Box<LazyStream<'a>>),
}

/// Whether a whole stream's requests were checked to fit ([`super::check_fits`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fit {
    Checked,
    Unchecked,
}

impl<'a> From<&'a RequestStream> for Feed<'a> {
    fn from(s: &'a RequestStream) -> Self {
        Feed::Whole(s, Fit::Unchecked)
    }
}

impl<'a> Feed<'a> {
    /// A stream whose every request was checked to fit a replica of the pool that serves it (by
    /// `runner::prepare`, which names the workload in its error): the run does not check it
    /// again.
    pub fn fitted(s: &'a RequestStream) -> Self {
        Feed::Whole(s, Fit::Checked)
    }

    /// Whether the run must still check that every request fits.
    pub fn needs_fit_check(&self) -> bool {
        matches!(self, Feed::Whole(_, Fit::Unchecked))
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
            Feed::Whole(s, _) => s,
            Feed::Lazy(l) => l.stream(),
        }
    }
}

impl<'a> Feed<'a> {
    /// The whole stream, when the run holds it whole (the lifetime of the run, not of `self`).
    pub fn whole(&self) -> Option<&'a RequestStream> {
        match self {
            Feed::Whole(s, _) => Some(s),
            Feed::Lazy(_) => None,
        }
    }

    /// Request `id`'s arrival time (generated if need be); `None` past the stream's end.
    pub fn arrival(&mut self, id: usize) -> Option<SimTime> {
        match self {
            Feed::Whole(s, _) => s.requests.get(id).map(|r| r.arrived_at),
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
