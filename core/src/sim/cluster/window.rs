//! Per-request state of the requests a run still needs, by request id: ids below `base` are
//! retired (their request ended and every earlier one too, and its record went to the summary),
//! ids from `base` are held in a ring. A sketched run retires as it goes, so its memory follows
//! the span from the oldest unfinished request to the newest arrival, not the run's length; an
//! exact run never retires (its records are the summary), so the window is a plain list.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

use crate::ids::RequestId;

pub struct Window<T> {
    base: usize,
    items: VecDeque<T>,
    /// What a retired id reads as. Only stale references read one: an event still queued for
    /// a request that has since ended, which its handler skips.
    retired: T,
}

impl<T> Window<T> {
    /// An empty window; retired ids read as `retired`.
    pub fn new(retired: T) -> Self {
        Self { base: 0, items: VecDeque::new(), retired }
    }

    /// One past the highest id held (retired ids count).
    pub fn len(&self) -> usize {
        self.base + self.items.len()
    }

    /// The lowest id still held.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Adds the state of id `len()`.
    pub fn push(&mut self, item: T) {
        self.items.push_back(item);
    }

    /// The state of id `base()`, if held.
    pub fn front(&self) -> Option<&T> {
        self.items.front()
    }

    /// Retires id `base()`.
    pub fn pop_front(&mut self) -> Option<T> {
        let item = self.items.pop_front()?;
        self.base += 1;
        Some(item)
    }
}

impl<T> Index<RequestId> for Window<T> {
    type Output = T;

    fn index(&self, id: RequestId) -> &T {
        match id.index().checked_sub(self.base) {
            Some(k) => &self.items[k],
            None => &self.retired,
        }
    }
}

impl<T> IndexMut<RequestId> for Window<T> {
    fn index_mut(&mut self, id: RequestId) -> &mut T {
        let base = self.base;
        let k = id
            .index()
            .checked_sub(base)
            .unwrap_or_else(|| panic!("request {id} was retired (ids from {base} are held)"));
        &mut self.items[k]
    }
}

#[cfg(test)]
mod tests {
    use super::Window;
    use crate::ids::RequestId;

    fn id(i: usize) -> RequestId {
        RequestId::new(i)
    }

    #[test]
    fn ids_stay_put_as_the_front_retires() {
        let mut w = Window::new(-1);
        for v in 0..5 {
            w.push(v * 10);
        }
        assert_eq!(w.pop_front(), Some(0));
        assert_eq!(w.pop_front(), Some(10));
        assert_eq!((w.base(), w.len()), (2, 5));
        assert_eq!((w[id(2)], w[id(4)]), (20, 40));
        w[id(3)] = 31;
        assert_eq!((w[id(2)], w[id(3)], w[id(4)]), (20, 31, 40));
        assert_eq!(w[id(1)], -1, "a retired id reads as the sentinel");
        w.push(50);
        assert_eq!(w[id(5)], 50);
    }

    #[test]
    #[should_panic(expected = "request 0 was retired")]
    fn writing_a_retired_id_is_a_bug() {
        let mut w = Window::new(0);
        w.push(1);
        w.pop_front();
        w[id(0)] = 2;
    }
}
