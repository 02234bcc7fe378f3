//! A discrete-event queue keyed by (time, sequence): earliest time first, and among equal times
//! the event pushed first pops first (FIFO). Time is an integer, so ordering never depends on
//! floating-point rounding: the cluster world's nanoseconds ([`SimTime`], the default), or the
//! dispatch world's ticks of a mean service time (a plain `u64`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Display;

use crate::time::SimTime;

/// An integer clock the queue can order events on.
pub trait Clock: Copy + Ord + Display {
    /// The start of the run.
    const ZERO: Self;
    /// The clock's last tick: where a saturated conversion lands, so never a valid event time.
    const MAX: Self;
}

impl Clock for SimTime {
    const ZERO: Self = SimTime::ZERO;
    const MAX: Self = SimTime::MAX;
}

impl Clock for u64 {
    const ZERO: Self = 0;
    const MAX: Self = u64::MAX;
}

struct Keyed<E, T> {
    at: T,
    seq: u64,
    event: E,
}

impl<E, T: Clock> PartialEq for Keyed<E, T> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<E, T: Clock> Eq for Keyed<E, T> {}
impl<E, T: Clock> PartialOrd for Keyed<E, T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<E, T: Clock> Ord for Keyed<E, T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Min-queue of events ordered by (time, insertion order).
pub struct EventQueue<E, T: Clock = SimTime> {
    heap: BinaryHeap<Reverse<Keyed<E, T>>>,
    next_seq: u64,
    /// The time of the last event popped: nothing may be scheduled before it.
    now: T,
}

impl<E, T: Clock> Default for EventQueue<E, T> {
    fn default() -> Self {
        Self { heap: BinaryHeap::new(), next_seq: 0, now: T::ZERO }
    }
}

impl<E, T: Clock> EventQueue<E, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Schedules `event` at `at`; after every event already scheduled at the same time.
    ///
    /// In the checked profile, asserts that `at` is on the clock: neither the clock's last tick
    /// (where a saturated `seconds → ticks` lands) nor before the current time (where a wrapped
    /// `now + duration` lands).
    pub fn push(&mut self, at: T, event: E) {
        debug_assert!(
            at >= self.now && at < T::MAX,
            "an event scheduled at tick {at}, off the clock (now {}): a duration overflowed it",
            self.now
        );
        self.heap.push(Reverse(Keyed { at, seq: self.next_seq, event }));
        self.next_seq += 1;
    }

    /// The earliest event (FIFO among equal times).
    pub fn pop(&mut self) -> Option<(T, E)> {
        let (at, event) = self.heap.pop().map(|Reverse(k)| (k.at, k.event))?;
        self.now = at;
        Some((at, event))
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<T> {
        self.heap.peek().map(|Reverse(k)| k.at)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "off the clock")]
    fn an_event_before_the_current_time_is_caught_in_the_checked_profile() {
        let mut q = EventQueue::<_, u64>::new();
        q.push(10, ());
        q.pop();
        // What `now + ticks(huge)` wraps to.
        q.push(10u64.wrapping_add(u64::MAX), ());
    }

    #[test]
    fn equal_times_pop_in_insertion_order() {
        let mut q = EventQueue::<_, u64>::new();
        for i in 0..100 {
            q.push(7, i);
        }
        q.push(3, -1);
        assert_eq!(q.pop(), Some((3, -1)));
        let order: Vec<i32> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn earlier_time_pops_first_regardless_of_insertion() {
        let mut q = EventQueue::<_, u64>::new();
        q.push(10, "late");
        q.push(5, "early");
        q.push(10, "late2");
        assert_eq!(q.pop().unwrap().1, "early");
        assert_eq!(q.pop().unwrap().1, "late");
        assert_eq!(q.pop().unwrap().1, "late2");
        assert!(q.is_empty());
    }
}
