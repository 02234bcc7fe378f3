//! A replica's LoRA adapters (`cluster.lora`, `workload/cluster/lora.rs`): which adapters its
//! running and waiting requests use, which it has loaded, and what loading them cost.
//!
//! The batcher asks [`Adapters::can_run`] before admitting a request on an adapter (vLLM's v1
//! scheduler skips a waiting request whose adapter would make the batch use more than
//! `max_loras` distinct adapters, and goes on with the next), then [`Adapters::admit`], which
//! loads the adapter if it is not loaded — evicting the least recently used loaded adapter that
//! no running request uses when all `max_cpu_loras` are taken — and adds the load's seconds to
//! the step being formed ([`Adapters::take_step_load_s`]): vLLM applies the batch's adapters
//! inside `execute_model`, so a cold load holds up that step for every request in it.
//! An adapter's last use is the last admission or completion of a request on it (vLLM touches
//! the batch's adapters every step; the last step that ran one ended with its last request).
//! Without `max_loras` every adapter is loaded from the start: admissions are all hits.

use crate::ids::{ReplicaId, RequestId};
use crate::signals::AdapterFigures;
use crate::workload::cluster::lora::Lora;
use crate::workload::generate::RequestStream;

/// One replica's adapters.
#[derive(Clone, Debug)]
pub struct Adapters {
    /// Most distinct adapters among running requests (`u32::MAX`: no limit).
    max_loras: u32,
    /// Adapters kept loaded; `None`: all of them, always.
    slots: Option<u32>,
    load_s: f64,
    /// Per adapter: requests on it running here, and waiting here.
    running: Vec<u32>,
    waiting: Vec<u32>,
    /// Distinct adapters with running (waiting) requests.
    running_distinct: u32,
    waiting_distinct: u32,
    /// Per adapter: when it was last used (a counter; 0: not loaded).
    last_use: Vec<u64>,
    loaded: u32,
    clock: u64,
    /// Seconds of loads the step being formed waits for.
    step_load_s: f64,
    /// Admissions of requests on an adapter that was loaded, and cold loads.
    pub hits: u64,
    pub loads: u64,
    /// Seconds steps spent loading adapters.
    pub load_busy_s: f64,
}

impl Adapters {
    pub fn new(spec: &Lora) -> Self {
        let n = spec.adapters as usize;
        Self {
            max_loras: spec.max_loras.unwrap_or(u32::MAX),
            slots: spec.cache_slots(),
            load_s: spec.load_s(),
            running: vec![0; n],
            waiting: vec![0; n],
            running_distinct: 0,
            waiting_distinct: 0,
            last_use: vec![0; n],
            loaded: 0,
            clock: 0,
            step_load_s: 0.0,
            hits: 0,
            loads: 0,
            load_busy_s: 0.0,
        }
    }

    /// Whether adapter `a` is loaded.
    pub fn resident(&self, a: u32) -> bool {
        self.slots.is_none() || self.last_use[a as usize] > 0
    }

    /// A request on `a` joins the waiting queue (routed here, or preempted).
    pub fn enqueued(&mut self, a: u32) {
        let w = &mut self.waiting[a as usize];
        self.waiting_distinct += (*w == 0) as u32;
        *w += 1;
    }

    /// Whether a request on `a` may join the running batch now (`max_loras`).
    pub fn can_run(&self, a: u32) -> bool {
        self.running[a as usize] > 0 || self.running_distinct < self.max_loras
    }

    /// A waiting request on `a` is admitted: `a` is loaded if it was not (the step waits).
    pub fn admit(&mut self, a: u32) {
        let i = a as usize;
        debug_assert!(self.can_run(a) && self.waiting[i] > 0);
        self.waiting[i] -= 1;
        self.waiting_distinct -= (self.waiting[i] == 0) as u32;
        self.running_distinct += (self.running[i] == 0) as u32;
        self.running[i] += 1;
        if self.resident(a) {
            self.hits += 1;
        } else {
            if Some(self.loaded) == self.slots {
                self.evict_oldest_idle();
            }
            self.loaded += 1;
            self.loads += 1;
            self.step_load_s += self.load_s;
            self.load_busy_s += self.load_s;
        }
        self.touch(i);
    }

    /// A running request on `a` finished (`requeued`: preempted, back to waiting).
    pub fn left(&mut self, a: u32, requeued: bool) {
        let i = a as usize;
        self.running[i] -= 1;
        self.running_distinct -= (self.running[i] == 0) as u32;
        if self.slots.is_some() {
            self.touch(i);
        }
        if requeued {
            self.enqueued(a);
        }
    }

    /// The seconds of loads the step being formed waits for (and none for the next).
    pub fn take_step_load_s(&mut self) -> f64 {
        std::mem::take(&mut self.step_load_s)
    }

    /// A replica (re)started by the scaler has loaded nothing yet.
    pub fn cold_start(&mut self) {
        debug_assert!(self.running_distinct == 0 && self.waiting_distinct == 0, "a started replica has no requests");
        self.last_use.fill(0);
        self.loaded = 0;
    }

    /// The figures a router reads about a request on `adapter` (`None`: the base model).
    pub fn figures(&self, adapter: Option<u32>) -> AdapterFigures {
        let (resident, running, waiting) = match adapter {
            Some(a) => (self.resident(a), self.running[a as usize], self.waiting[a as usize]),
            None => (true, 0, 0),
        };
        AdapterFigures {
            resident: resident as u8 as f64,
            running: running as f64,
            waiting: waiting as f64,
            running_adapters: self.running_distinct as f64,
            waiting_adapters: self.waiting_distinct as f64,
            max_adapters: if self.max_loras == u32::MAX { f64::INFINITY } else { self.max_loras as f64 },
        }
    }

    fn touch(&mut self, i: usize) {
        self.clock += 1;
        self.last_use[i] = self.clock;
    }

    /// Unloads the least recently used adapter no running request uses (there is one: the
    /// cache holds at least `max_loras` adapters, and the batch uses fewer than that when a new
    /// one is admitted).
    fn evict_oldest_idle(&mut self) {
        let victim = (0..self.last_use.len())
            .filter(|&k| self.last_use[k] > 0 && self.running[k] == 0)
            .min_by_key(|&k| self.last_use[k])
            .expect("a loaded adapter no running request uses");
        self.last_use[victim] = 0;
        self.loaded -= 1;
    }
}

/// The adapter of request `r`, when replicas track adapters.
pub fn adapter_of(lora: &Option<Box<Adapters>>, stream: &RequestStream, r: crate::ids::RequestId) -> Option<u32> {
    lora.as_ref().and_then(|_| stream.adapter(r.index()))
}

/// The run's adapter figures: `lora_loads` (cold loads over every replica), `lora_hit_rate`
/// (admissions of requests on an adapter that found it loaded, over all such admissions; NaN
/// without any), `lora_load_s` (seconds steps waited for loads, summed over replicas).
pub fn push_lora_metrics<'a>(m: &mut crate::metrics::Metrics, adapters: impl Iterator<Item = &'a Adapters>) {
    let (mut hits, mut loads, mut busy) = (0u64, 0u64, 0.0f64);
    for a in adapters {
        hits += a.hits;
        loads += a.loads;
        busy += a.load_busy_s;
    }
    m.push("lora_loads", loads as f64);
    m.push("lora_hit_rate", if hits + loads > 0 { hits as f64 / (hits + loads) as f64 } else { f64::NAN });
    m.push("lora_load_s", busy);
}

impl super::ClusterSim<'_> {
    /// Request `id` joined replica `r`'s waiting queue.
    pub(super) fn lora_enqueued(&mut self, r: ReplicaId, id: RequestId) {
        self.replicas[r].adapter_enqueued(&self.stream, id);
    }

    /// The `lora.*` signals of every routable replica for request `id` (when the router reads them).
    pub(super) fn refresh_lora(&mut self, id: RequestId) {
        if !self.router.reads_lora() {
            return;
        }
        let adapter = self.stream.adapter(id.index());
        for (k, &slot) in self.routable.iter().enumerate() {
            if let Some(l) = self.replicas[slot].lora() {
                self.router.set_lora(k, l.figures(adapter));
            }
        }
    }
}

/// The workload's adapters (`lora:`), which every replica then tracks (aggregated clusters only).
pub(super) fn tracked(spec: &crate::workload::cluster::ClusterSpec) -> Result<Option<&Lora>, crate::sim::SetupError> {
    let Some(l) = &spec.lora else { return Ok(None) };
    if spec.disaggregation.is_some() {
        return Err(crate::sim::SetupError::new(
            "lora",
            "LoRA adapters run on aggregated clusters only here (a P/D handoff would move the adapter too)",
            "drop `lora:`, or drop `disaggregation:`",
        ));
    }
    Ok(Some(l))
}
