//! One emulated engine: the cluster world's [`Replica`] (continuous batching, chunked prefill, KV
//! admission, the segment-level prefix cache, the local scheduler) stepped in real time.
//!
//! One task owns the replica. Requests arrive as commands; a step formed by the batcher at model
//! time `t` with duration `d` (the step model's price) ends at model time `t + d`, which is wall
//! time `start + (t + d) × time_scale`. Step ends are scheduled on model time, not on when the
//! task woke, so timer lateness never accumulates: a late task runs the overdue steps back to
//! back. An idle replica starts a step when a request arrives (model time read from the wall
//! clock). After each step every active request hears how many tokens it has produced so far.
//!
//! Requests are numbered in one [`RequestStream`]; the replica holds the state of the requests
//! in flight and gives back each finished one's, and the stream drops the requests below the
//! oldest in flight (in batches), so memory follows the requests in flight, not how many the
//! engine has served.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use routelab_policy_api::{Roofline, Segment};
use tokio::sync::{mpsc, oneshot};

use routelab_core::handle::SchedulerHandle;
use routelab_core::ids::{ReplicaId, RequestId};
use routelab_core::sim::cluster::replica::{Phase, Replica, ReplicaConfig, RequestState};
use routelab_core::step_model::Pricer;
use routelab_core::time::{SimTime, seconds, ticks};
use routelab_core::workload::generate::{GeneratedRequest, RequestStream};

use super::kv_publish::mirror::Mirror;

/// What an active request hears from the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenEvent {
    /// A step produced `tokens` more output tokens for this request; `done` when the last is out:
    /// (prompt tokens, prompt tokens found cached at admission).
    Step { tokens: u32, done: Option<(u32, u32)> },
    /// The engine failed the request (a scheduler error).
    Failed,
}

/// What `/metrics` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub waiting: u64,
    pub running: u64,
    pub kv_used_tokens: u64,
    pub kv_capacity_tokens: u64,
    /// Prompt tokens of admitted requests, and of those the tokens found cached (vLLM's
    /// prefix_cache_queries / prefix_cache_hits, counted at a request's first admission).
    pub prefix_queries_tokens: u64,
    pub prefix_hits_tokens: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
    pub steps: u64,
}

enum Command {
    Submit { prompt: Vec<Segment>, ids: Vec<u32>, output_tokens: u32, events: mpsc::UnboundedSender<TokenEvent> },
    Snapshot(oneshot::Sender<Snapshot>),
}

/// The handle the HTTP front end holds (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    commands: mpsc::UnboundedSender<Command>,
    pub kv_capacity_tokens: u64,
}

impl Engine {
    /// Starts the engine task on the current tokio runtime; `mirror` publishes its cache as KV
    /// events (`--kv-events`).
    pub fn start(
        cfg: ReplicaConfig,
        cost: Roofline,
        scheduler: SchedulerHandle,
        time_scale: f64,
        mirror: Option<Mirror>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let kv_capacity_tokens = cfg.kv_capacity_tokens;
        let core = Core {
            stream: RequestStream::default(),
            replica: Replica::new(ReplicaId::from_u32(0)),
            cfg,
            cost,
            scheduler,
            active: HashMap::new(),
            completed: Vec::new(),
            start: Instant::now(),
            time_scale,
            step_end: None,
            last_end: SimTime::ZERO,
            snap: Snapshot { kv_capacity_tokens, ..Snapshot::default() },
            mirror,
        };
        tokio::spawn(core.run(rx));
        Self { commands: tx, kv_capacity_tokens }
    }

    /// Queues a request (`ids`: its prompt's token ids, for KV events; may be empty); its tokens
    /// arrive on the returned channel. `Err` when its prompt is empty, it can never fit in KV
    /// memory (prompt plus output), or the engine has stopped.
    pub fn submit(
        &self,
        prompt: Vec<Segment>,
        ids: Vec<u32>,
        output_tokens: u32,
    ) -> Result<mpsc::UnboundedReceiver<TokenEvent>, SubmitError> {
        let prompt_tokens = super::text::tokens_of(&prompt);
        if prompt_tokens == 0 {
            // The batcher never finishes a request without a prompt token: it would hold a slot.
            return Err(SubmitError::EmptyPrompt);
        }
        let need = prompt_tokens as u64 + output_tokens as u64;
        if need > self.kv_capacity_tokens {
            return Err(SubmitError::TooLarge { need, capacity: self.kv_capacity_tokens });
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.commands
            .send(Command::Submit { prompt, ids, output_tokens, events: tx })
            .map_err(|_| SubmitError::Stopped)?;
        Ok(rx)
    }

    pub async fn snapshot(&self) -> Snapshot {
        let (tx, rx) = oneshot::channel();
        let _ = self.commands.send(Command::Snapshot(tx));
        rx.await.unwrap_or_default()
    }
}

/// Why [`Engine::submit`] refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The prompt has no token.
    EmptyPrompt,
    /// Prompt plus output (`need` tokens) can never fit the engine's KV `capacity`.
    TooLarge { need: u64, capacity: u64 },
    /// The engine's task has ended.
    Stopped,
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::EmptyPrompt => f.write_str("the prompt is empty: a request needs at least one prompt token"),
            SubmitError::TooLarge { need, capacity } => write!(
                f,
                "this request needs {need} tokens of KV (prompt plus max_tokens), more than the engine's {capacity} tokens"
            ),
            SubmitError::Stopped => f.write_str("the engine has stopped"),
        }
    }
}

impl std::error::Error for SubmitError {}

struct Active {
    events: mpsc::UnboundedSender<TokenEvent>,
    sent: u32,
    counted: bool,
}

struct Core {
    stream: RequestStream,
    replica: Replica,
    cfg: ReplicaConfig,
    cost: Roofline,
    scheduler: SchedulerHandle,
    active: HashMap<RequestId, Active>,
    completed: Vec<RequestId>,
    start: Instant,
    time_scale: f64,
    /// Model time the running step ends; `None` when idle.
    step_end: Option<SimTime>,
    last_end: SimTime,
    snap: Snapshot,
    mirror: Option<Mirror>,
}

impl Core {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let deadline = self.step_end.map(|t| self.wall(t));
            tokio::select! {
                biased;
                _ = sleep_until(deadline), if deadline.is_some() => self.on_step_end(),
                cmd = commands.recv() => match cmd {
                    Some(Command::Submit { prompt, ids, output_tokens, events }) => {
                        if let Some(m) = &mut self.mirror {
                            m.hold(&prompt, &ids);
                        }
                        self.on_arrival(prompt, output_tokens, events)
                    }
                    Some(Command::Snapshot(reply)) => {
                        let _ = reply.send(self.snapshot());
                    }
                    None => break,
                },
            }
        }
    }

    fn wall(&self, t: SimTime) -> tokio::time::Instant {
        (self.start + Duration::from_secs_f64(seconds(t) * self.time_scale)).into()
    }

    fn model_now(&self) -> SimTime {
        ticks(self.start.elapsed().as_secs_f64() / self.time_scale).max(self.last_end)
    }

    fn on_arrival(&mut self, prompt: Vec<Segment>, output_tokens: u32, events: mpsc::UnboundedSender<TokenEvent>) {
        let now = self.model_now();
        let id = RequestId::new(self.stream.base + self.stream.requests.len());
        let from = self.stream.segments.len() as u32;
        let prompt_tokens = super::text::tokens_of(&prompt);
        self.stream.segments.extend_from_slice(&prompt);
        self.stream.requests.push(GeneratedRequest {
            arrived_at: now,
            prompt_tokens,
            output_tokens: output_tokens.max(1),
            segments: from..self.stream.segments.len() as u32,
            output_segment: None,
        });
        let stream = &self.stream;
        self.replica.enqueue(
            now,
            id,
            stream.prompt(id.index()),
            output_tokens.max(1),
            RequestState::default(),
            &self.cfg,
        );
        self.active.insert(id, Active { events, sent: 0, counted: false });
        if self.step_end.is_none() {
            self.start_step(now);
        }
    }

    fn on_step_end(&mut self) {
        let now = self.step_end.take().expect("a step runs");
        self.last_end = now;
        self.completed.clear();
        self.replica.finish_step(now, &self.stream, &self.cfg, &mut self.completed);
        if let Some(m) = &mut self.mirror {
            m.sync(self.replica.cache());
        }
        let (stream, replica) = (&self.stream, &self.replica);
        for (&id, a) in self.active.iter_mut() {
            let st = replica.state(id);
            let produced = self.replica.produced_now(st);
            let done = (st.phase == Phase::Done).then(|| (stream.request(id.index()).prompt_tokens, st.cached_tokens));
            if produced > a.sent || done.is_some() {
                let _ = a.events.send(TokenEvent::Step { tokens: produced - a.sent, done });
                self.snap.generation_tokens += (produced - a.sent) as u64;
                a.sent = produced;
            }
        }
        // The finished requests' states come back from the replica, and they go.
        for &id in &self.completed {
            self.replica.release(id);
            self.active.remove(&id);
            if let Some(m) = &mut self.mirror {
                m.release(stream.prompt(id.index()));
            }
        }
        self.snap.requests_finished += self.completed.len() as u64;
        self.start_step(now);
    }

    fn start_step(&mut self, now: SimTime) {
        let step =
            self.replica.start_step(now, &self.stream, &self.cfg, &Pricer::Roofline(self.cost), &mut self.scheduler);
        match step {
            Ok(step) => self.step_end = step.map(|d| now + ticks(d).max(SimTime::TICK)),
            Err(e) => {
                // A failing scheduler cannot order the queue: fail every request it holds.
                eprintln!("emulate: {e}");
                for (id, a) in self.active.drain() {
                    let _ = a.events.send(TokenEvent::Failed);
                    if let Some(m) = &mut self.mirror {
                        m.release(self.stream.prompt(id.index()));
                    }
                }
                self.replica = Replica::new(ReplicaId::from_u32(0));
                if let Some(m) = &mut self.mirror {
                    m.cleared();
                }
                self.step_end = None;
            }
        }
        // `start_step` marked the replica busy or idle; nothing here reads its evictions.
        self.replica.drain_evictions();
        // Nothing reads the requests below the oldest in flight again: the stream keeps the span
        // in flight, so the emulator's memory follows the requests in flight, not how many it
        // has served.
        let next = self.stream.base + self.stream.requests.len();
        self.stream.forget_below(self.active.keys().min().map_or(next, |id| id.index()));
        for (&id, a) in self.active.iter_mut().filter(|(_, a)| !a.counted) {
            let st = self.replica.state(id);
            if st.admitted_at.is_some() {
                a.counted = true;
                let prompt = self.stream.request(id.index()).prompt_tokens as u64;
                self.snap.prefix_queries_tokens += prompt;
                self.snap.prefix_hits_tokens += st.cached_tokens as u64;
                self.snap.prompt_tokens += prompt;
            }
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            waiting: self.replica.waiting().len() as u64,
            running: self.replica.running().len() as u64,
            kv_used_tokens: self.replica.kv_referenced_tokens(),
            steps: self.replica.steps(),
            ..self.snap
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    if let Some(d) = deadline {
        tokio::time::sleep_until(d).await;
    }
}

#[cfg(test)]
mod tests {
    use routelab_core::plugin::{Loader, PolicySpec};
    use routelab_core::step_model::StepModel;
    use routelab_policy_api::SchedulerContext;

    use super::*;

    /// The engine's task, without its task: requests submitted and steps ended by hand.
    fn core() -> Core {
        let sm = StepModel::from_catalog("a6000", "mistral-7b", 1, 0.9).unwrap();
        let ctx = SchedulerContext::new(0, 0, sm.kv_capacity_tokens);
        let scheduler = Loader::new().scheduler(&PolicySpec::parse("fcfs").unwrap(), &ctx).unwrap();
        let cfg = ReplicaConfig::plain(sm.kv_capacity_tokens, 512, 64);
        Core {
            stream: RequestStream::default(),
            replica: Replica::new(ReplicaId::from_u32(0)),
            cfg,
            cost: sm.cost,
            scheduler: SchedulerHandle::new(scheduler, 0, "fcfs".into()),
            active: HashMap::new(),
            completed: Vec::new(),
            start: Instant::now(),
            time_scale: 1.0,
            step_end: None,
            last_end: SimTime::ZERO,
            snap: Snapshot::default(),
            mirror: None,
        }
    }

    /// 30,000 requests, eight in flight at a time: every one finishes with its tokens, and the
    /// engine holds only about the span in flight (its stream drops the requests below the
    /// oldest one in flight, in batches; its replica gives back finished states), not a record
    /// of every request it served.
    #[test]
    fn memory_follows_the_requests_in_flight_not_the_requests_served() {
        const N: usize = 30_000;
        let mut core = core();
        let mut outputs = Vec::new();
        let mut most_held = 0;
        for i in 0..N {
            let prompt =
                vec![Segment { id: 1 + i as u64 % 5, tokens: 64 }, Segment { id: 1_000 + i as u64, tokens: 16 }];
            let (tx, rx) = mpsc::unbounded_channel();
            core.on_arrival(prompt, 3, tx);
            outputs.push(rx);
            while core.active.len() >= 8 {
                core.on_step_end();
            }
            most_held = most_held.max(core.stream.requests.len());
        }
        while core.step_end.is_some() {
            core.on_step_end();
        }
        assert!(core.active.is_empty());
        assert_eq!(core.snap.requests_finished, N as u64);
        // Each request heard its three tokens and its end.
        for rx in &mut outputs {
            let mut tokens = 0;
            let mut done = false;
            while let Ok(TokenEvent::Step { tokens: t, done: d }) = rx.try_recv() {
                tokens += t;
                done |= d.is_some();
            }
            assert_eq!((tokens, done), (3, true));
        }
        let bound = 2 * routelab_core::workload::generate::FORGET_BATCH + 8;
        assert!(most_held <= bound, "held {most_held} requests at once (bound {bound})");
        assert!(core.stream.base > N - bound, "dropped up to {} of {N}", core.stream.base);
    }
}
