//! Bodies held in memory, bounded three ways: each body has a cap, a deadline, and every body a
//! server holds at once (requests it reads, non-streamed responses it relays) draws on one
//! budget of `--max-buffered-mb`. A body that would overdraw the budget is refused (503) instead
//! of growing the process: 24 clients sending 30 MiB each no longer take the gateway to 2 GB.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget is counted in KiB (a semaphore's permits are a u32 at most per acquisition).
const UNIT: usize = 1024;

/// One server's budget for bodies in memory, and how long a client may take to send one.
#[derive(Clone)]
pub struct Buffers {
    budget: Arc<Semaphore>,
    budget_bytes: usize,
    pub body_timeout: Duration,
}

/// A body read whole, and its share of the budget (returned when both are dropped).
pub struct Held {
    pub bytes: Bytes,
    _share: Share,
}

/// A body's share of the budget, grown as the body grows ([`Buffers::cover`]); returned when
/// dropped.
#[derive(Default)]
pub struct Share {
    permit: Option<OwnedSemaphorePermit>,
    units: usize,
}

#[derive(Debug)]
pub enum Refused {
    /// Larger than the body's cap.
    TooLarge(usize),
    /// The server already holds its whole budget of bodies.
    OverBudget(usize),
    /// Not complete by the deadline.
    TimedOut(Duration),
    /// The connection failed.
    Failed(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooLarge(cap) => write!(f, "the body is larger than {cap} bytes"),
            Refused::OverBudget(b) => {
                write!(f, "the server holds its {} MiB of bodies already; retry later", b >> 20)
            }
            Refused::TimedOut(t) => write!(f, "the body did not arrive within {} s", t.as_secs_f64()),
            Refused::Failed(e) => write!(f, "reading the body: {e}"),
        }
    }
}

impl Buffers {
    pub fn new(budget_bytes: usize, body_timeout: Duration) -> Self {
        let units = (budget_bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Self { budget: Arc::new(Semaphore::new(units)), budget_bytes, body_timeout }
    }

    /// Reads `body` whole: at most `cap` bytes, by `deadline`, within the budget.
    pub async fn collect<B>(&self, body: B, cap: usize, timeout: Duration) -> Result<Held, Refused>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let read = async {
            let mut body = body;
            let mut buf = BytesMut::new();
            let mut share = Share::default();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| Refused::Failed(e.to_string()))?;
                let Ok(data) = frame.into_data() else { continue };
                if buf.len() + data.len() > cap {
                    return Err(Refused::TooLarge(cap));
                }
                buf.extend_from_slice(&data);
                self.cover(&mut share, buf.len())?;
            }
            Ok(Held { bytes: buf.freeze(), _share: share })
        };
        tokio::time::timeout(timeout, read).await.map_err(|_| Refused::TimedOut(timeout))?
    }

    /// Grows `share` to cover `len` bytes, or refuses when the budget is spent (the share keeps
    /// what it had).
    pub fn cover(&self, share: &mut Share, len: usize) -> Result<(), Refused> {
        let need = len.div_ceil(UNIT).saturating_sub(share.units);
        if need > 0 {
            let more = (self.budget.clone().try_acquire_many_owned(need.min(u32::MAX as usize) as u32))
                .map_err(|_| Refused::OverBudget(self.budget_bytes))?;
            share.units += need;
            match &mut share.permit {
                Some(s) => s.merge(more),
                None => share.permit = Some(more),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[tokio::test]
    async fn bodies_draw_on_one_budget_until_dropped() {
        let b = Buffers::new(10 * UNIT, Duration::from_secs(5));
        let t = Duration::from_secs(5);
        let body = || Full::new(Bytes::from(vec![b'x'; 6 * UNIT]));
        let first = b.collect(body(), 1 << 20, t).await.unwrap();
        assert_eq!(first.bytes.len(), 6 * UNIT);
        assert!(matches!(b.collect(body(), 1 << 20, t).await, Err(Refused::OverBudget(_))));
        drop(first);
        assert!(b.collect(body(), 1 << 20, t).await.is_ok(), "the share came back");
        assert!(matches!(b.collect(body(), 100, t).await, Err(Refused::TooLarge(100))));
    }
}
