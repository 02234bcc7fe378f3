//! Engine signals the host provides to routers that ask for them by name
//! (`routelab_policy_api::signals`): negotiated once per router, then filled into one dense
//! replicas × signals table before each `route`. Routers that ask for none cost nothing here.
//!
//! A world that reports every change to a view ([`SignalTable::track_changes`], then
//! [`SignalTable::changed`] per changed replica) gets the table refilled only at those rows —
//! the dispatch world, where a decision changes one server and a departure another, so a
//! router asking for signals at 1,024 servers does not pay a 1,024-row refill per request.
//! Rows whose values move with the clock (`scraped.age_s` after a scrape) are refilled every time.

use routelab_policy_api::{ReplicaView, Replicas, RouterBox, signals};

use crate::facts::NegotiationError;

/// A replica's engine metrics as a metrics scraper last read them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Scrape {
    pub waiting: f64,
    pub running: f64,
    pub kv_utilisation: f64,
    /// Simulated time of the scrape (s).
    pub at_s: f64,
}

fn kv_utilisation(v: &ReplicaView) -> f64 {
    if v.kv_capacity_tokens == 0 { 0.0 } else { v.kv_used_tokens as f64 / v.kv_capacity_tokens as f64 }
}

impl Scrape {
    /// The metrics of `v` read at `at_s`.
    pub fn of(v: &ReplicaView, at_s: f64) -> Self {
        Self { waiting: v.waiting as f64, running: v.running as f64, kv_utilisation: kv_utilisation(v), at_s }
    }
}

/// What a router is told of one replica about the LoRA adapter of the request it routes (the
/// `lora.*` signals; cluster world).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AdapterFigures {
    pub resident: f64,
    pub running: f64,
    pub waiting: f64,
    pub running_adapters: f64,
    pub waiting_adapters: f64,
    pub max_adapters: f64,
}

/// Per-replica figures a world sets that are not in the view (0 until it sets them).
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    /// When its queued work ends (dispatch world).
    busy_until: f64,
    /// Requests admitted whose first token is not out yet (cluster world).
    prefilling: f64,
    /// About the routed request's adapter (cluster world with `lora:`).
    lora: AdapterFigures,
    /// The routed request's GPU match continued in the KV tiers, tokens [cpu, remote]
    /// (cluster world with `kv_tiers:`).
    tier_matched: [f64; 2],
}

/// What the host knows of one replica when it fills its row: the view, the last scrape of it,
/// the figures the world set and the time of the decision.
struct Row<'a> {
    view: &'a ReplicaView,
    scrape: Scrape,
    figures: Figures,
    now: f64,
}

/// How the host computes one signal from a [`Row`].
type Column = fn(&Row) -> f64;

/// The signals this host provides, by name. Adding one here (and to the API's catalogue) is a
/// compatible change: no layout moves.
fn column(name: &str) -> Option<Column> {
    Some(match name {
        signals::KV_UTILISATION => |r| kv_utilisation(r.view),
        signals::SCRAPED_WAITING => |r| r.scrape.waiting,
        signals::SCRAPED_RUNNING => |r| r.scrape.running,
        signals::SCRAPED_KV_UTILISATION => |r| r.scrape.kv_utilisation,
        signals::SCRAPED_AGE_S => |r| (r.now - r.scrape.at_s).max(0.0),
        signals::BUSY_UNTIL => |r| r.figures.busy_until,
        signals::PREFILLING => |r| r.figures.prefilling,
        signals::LORA_RESIDENT => |r| r.figures.lora.resident,
        signals::LORA_RUNNING => |r| r.figures.lora.running,
        signals::LORA_WAITING => |r| r.figures.lora.waiting,
        signals::LORA_RUNNING_ADAPTERS => |r| r.figures.lora.running_adapters,
        signals::LORA_WAITING_ADAPTERS => |r| r.figures.lora.waiting_adapters,
        signals::LORA_MAX_ADAPTERS => |r| r.figures.lora.max_adapters,
        signals::TIER_CPU_MATCHED_TOKENS => |r| r.figures.tier_matched[0],
        signals::TIER_REMOTE_MATCHED_TOKENS => |r| r.figures.tier_matched[1],
        _ => return None,
    })
}

/// Most signals a router may ask for (the catalogue is far smaller; this bounds a bad answer).
const MAX_SIGNALS: usize = 1024;

/// One router's negotiated signals and the buffer their values are written to.
#[derive(Default)]
pub struct SignalTable {
    columns: Vec<Column>,
    values: Vec<f64>,
    /// Whether any column reads a scrape (the world then schedules scrapes).
    reads_scrapes: bool,
    /// Whether any column reads the `lora.*` figures (the world then sets them per request).
    reads_lora: bool,
    /// Whether a column moves with the clock once a scrape exists (`scraped.age_s`).
    reads_age: bool,
    /// Whether any column reads the `tier.*` matches (the world then sets them per request).
    reads_tiers: bool,
    /// The last scrape of every replica; empty until the world scrapes, and then the `scraped.`
    /// signals read the live view (a world that never scrapes is always fresh).
    scraped: Vec<Scrape>,
    /// Per replica, the figures the world last set (empty: 0 for all).
    figures: Vec<Figures>,
    /// The world reports every changed view ([`Self::changed`]), so only those rows are refilled.
    tracked: bool,
    /// Rows to refill before the next decision (may repeat), or every row.
    dirty: Vec<usize>,
    all_dirty: bool,
}

impl SignalTable {
    /// Asks `router` which signals it reads; an unknown name (or a failing `signals()`) is an
    /// error naming it and listing what this host provides.
    pub fn negotiate(router: &RouterBox) -> Result<Self, NegotiationError> {
        let names = router.signals().into_result().map_err(|e| NegotiationError::Erred(e.into()))?;
        if names.len() > MAX_SIGNALS {
            return Err(NegotiationError::TooMany { what: "engine signals", asked: names.len(), limit: MAX_SIGNALS });
        }
        let columns = names
            .iter()
            .map(|n| {
                column(n.as_str()).ok_or_else(|| NegotiationError::UnknownSignal {
                    name: n.to_string(),
                    provided: signals::CATALOGUE.iter().map(|(n, _)| *n).collect(),
                })
            })
            .collect::<Result<_, _>>()?;
        let reads_scrapes = names.iter().any(|n| n.as_str().starts_with("scraped."));
        let reads_age = names.iter().any(|n| n.as_str() == signals::SCRAPED_AGE_S);
        let reads_lora = names.iter().any(|n| n.as_str().starts_with("lora."));
        let reads_tiers = names.iter().any(|n| n.as_str().starts_with("tier."));
        Ok(Self { columns, reads_scrapes, reads_age, reads_lora, reads_tiers, all_dirty: true, ..Self::default() })
    }

    /// Whether the router reads scraped metrics (otherwise scraping would be wasted work).
    pub fn reads_scrapes(&self) -> bool {
        self.reads_scrapes
    }

    /// Whether the router reads the `lora.*` signals (otherwise setting them is wasted work).
    pub fn reads_lora(&self) -> bool {
        self.reads_lora
    }

    /// What `replica` holds of the routed request's adapter (the `lora.*` signals); also marks
    /// it changed when the figures moved.
    pub fn set_lora(&mut self, replica: usize, figures: AdapterFigures) {
        if self.figures.get(replica).is_some_and(|f| f.lora == figures) {
            return;
        }
        self.set_figure(replica, |f| f.lora = figures);
    }

    /// Whether the router reads the `tier.*` signals (otherwise matching in the tiers is wasted work).
    pub fn reads_tiers(&self) -> bool {
        self.reads_tiers
    }

    /// The routed request's GPU match on `replica` continued in its KV tiers, tokens [cpu,
    /// remote] (the `tier.*.matched_tokens` signals); also marks it changed when they moved.
    pub fn set_tier_matches(&mut self, replica: usize, tokens: [u32; 2]) {
        let tokens = tokens.map(f64::from);
        if self.figures.get(replica).is_some_and(|f| f.tier_matched == tokens) {
            return;
        }
        self.set_figure(replica, |f| f.tier_matched = tokens);
    }

    /// Records a scrape of every replica at `at_s`.
    pub fn scrape(&mut self, views: &[ReplicaView], at_s: f64) {
        self.scraped.clear();
        self.scraped.extend(views.iter().map(|v| Scrape::of(v, at_s)));
        self.all_dirty = true;
    }

    /// From now on the world reports every change to a view through [`Self::changed`] (and
    /// [`Self::set_busy_until`]), and the table is refilled only at the rows it named.
    pub fn track_changes(&mut self) {
        self.tracked = true;
        self.all_dirty = true;
    }

    /// Replica `replica`'s view changed since the last decision.
    pub fn changed(&mut self, replica: usize) {
        if self.columns.is_empty() || self.all_dirty {
            return;
        }
        // More marks than rows: refilling them all is cheaper (and bounds the list).
        if self.dirty.len() >= self.values.len() / self.columns.len() {
            self.all_dirty = true;
            self.dirty.clear();
        } else {
            self.dirty.push(replica);
        }
    }

    /// When `replica`'s queued work ends (the `busy_until` signal); also marks it changed.
    pub fn set_busy_until(&mut self, replica: usize, at: f64) {
        self.set_figure(replica, |f| f.busy_until = at);
    }

    /// Requests admitted to `replica` whose first token is not out yet (the `prefilling`
    /// signal); also marks it changed.
    pub fn set_prefilling(&mut self, replica: usize, requests: u32) {
        self.set_figure(replica, |f| f.prefilling = requests as f64);
    }

    fn set_figure(&mut self, replica: usize, set: impl FnOnce(&mut Figures)) {
        if self.columns.is_empty() {
            return;
        }
        if self.figures.len() <= replica {
            self.figures.resize(replica + 1, Figures::default());
        }
        set(&mut self.figures[replica]);
        self.changed(replica);
    }

    /// `views` with this router's signals filled in, for a decision at `now_s`.
    pub fn replicas<'a>(&'a mut self, views: &'a [ReplicaView], now_s: f64) -> Replicas<'a> {
        if self.columns.is_empty() {
            return Replicas::new(views);
        }
        let k = self.fill(views, now_s);
        Replicas::with_signals(views, &self.values, k)
    }

    /// Like [`Self::replicas`] for a disaggregated cluster: the prefill candidates
    /// `views[..prefill_end]` and the decode candidates `views[decode_start..]` (overlapping at
    /// the mixed instances), each with its rows of the one table.
    pub fn pools<'a>(
        &'a mut self,
        views: &'a [ReplicaView],
        prefill_end: usize,
        decode_start: usize,
        now_s: f64,
    ) -> (Replicas<'a>, Replicas<'a>) {
        let (p, d) = (&views[..prefill_end], &views[decode_start..]);
        if self.columns.is_empty() {
            return (Replicas::new(p), Replicas::new(d));
        }
        let k = self.fill(views, now_s) as usize;
        let (pv, dv) = (&self.values[..prefill_end * k], &self.values[decode_start * k..]);
        (Replicas::with_signals(p, pv, k as u32), Replicas::with_signals(d, dv, k as u32))
    }

    /// Writes the replicas' signals into the table — every row, or with tracked changes only the
    /// rows that changed; returns the columns per replica.
    fn fill(&mut self, views: &[ReplicaView], now_s: f64) -> u32 {
        let k = self.columns.len();
        let moves_with_clock = self.reads_age && !self.scraped.is_empty();
        if !self.tracked || self.all_dirty || moves_with_clock || self.values.len() != views.len() * k {
            self.values.resize(views.len() * k, 0.0);
            for i in 0..views.len() {
                self.fill_row(views, i, now_s);
            }
            self.all_dirty = false;
            self.dirty.clear();
        } else {
            let mut dirty = std::mem::take(&mut self.dirty);
            for &i in &dirty {
                self.fill_row(views, i, now_s);
            }
            dirty.clear();
            self.dirty = dirty;
        }
        u32::try_from(k).expect("at most MAX_SIGNALS columns")
    }

    fn fill_row(&mut self, views: &[ReplicaView], i: usize, now_s: f64) {
        let v = &views[i];
        let row = Row {
            view: v,
            scrape: self.scraped.get(i).copied().unwrap_or_else(|| Scrape::of(v, now_s)),
            figures: self.figures.get(i).copied().unwrap_or_default(),
            now: now_s,
        };
        let k = self.columns.len();
        for (slot, c) in self.values[i * k..(i + 1) * k].iter_mut().zip(&self.columns) {
            *slot = c(&row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::sabi_trait::TD_Opaque;
    use abi_stable::std_types::RNone;
    use routelab_policy_api::{Guarded, Policy, Request, Router_TO, RouterContext, RouterPolicy, World};

    /// Asks for two signals and routes to the replica with the lowest KV utilisation, recording
    /// the table it saw.
    struct Reads {
        seen: Vec<f64>,
    }

    impl Policy for Reads {
        const NAME: &'static str = "reads";
        const DESCRIPTION: &'static str = "test router";
        type Config = routelab_policies::NoConfig;
        type Context = RouterContext;
        fn new(_: Self::Config, _: &RouterContext) -> Result<Self, String> {
            Ok(Self { seen: Vec::new() })
        }
    }

    impl RouterPolicy for Reads {
        fn signals(&self) -> Vec<String> {
            vec![signals::KV_UTILISATION.into(), signals::SCRAPED_WAITING.into()]
        }
        fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
            self.seen = replicas.signals.to_vec();
            (0..replicas.len()).min_by(|&a, &b| replicas.signal(a, 0).total_cmp(&replicas.signal(b, 0))).unwrap()
        }
    }

    #[test]
    fn negotiated_signals_arrive_as_a_replica_major_table_in_the_order_asked() {
        let ctx = RouterContext {
            world: World::Cluster,
            replicas: 2,
            seed: 1,
            kv_capacity_tokens: 100,
            cost: RNone,
            disaggregation: RNone,
            facts: Default::default(),
        };
        let mut router = Router_TO::from_value(Guarded::new(Reads::new(Default::default(), &ctx).unwrap()), TD_Opaque);
        let mut table = SignalTable::negotiate(&router).unwrap();
        let views = [
            ReplicaView { waiting: 7, kv_used_tokens: 50, kv_capacity_tokens: 100, ..Default::default() },
            ReplicaView { waiting: 2, kv_used_tokens: 25, kv_capacity_tokens: 100, ..Default::default() },
        ];
        let req = Request::new(0, 0.0, 0);
        let chosen = router.route(&req, table.replicas(&views, 0.0)).into_result().unwrap();
        assert_eq!(chosen, 1);
        let replicas = table.replicas(&views, 0.0);
        assert_eq!(replicas.signals.as_slice(), &[0.5, 7.0, 0.25, 2.0]);
        assert_eq!(replicas.signals_of(1), &[0.25, 2.0]);
    }

    #[test]
    fn routers_that_ask_for_nothing_get_an_empty_table() {
        let mut table = SignalTable::default();
        let views = [ReplicaView::default(); 3];
        let r = table.replicas(&views, 0.0);
        assert_eq!((r.len(), r.signal_columns, r.signals.len()), (3, 0, 0));
    }

    /// Asks for `names` and always routes to replica 0.
    struct Asks(&'static [&'static str]);

    impl Policy for Asks {
        const NAME: &'static str = "asks";
        const DESCRIPTION: &'static str = "test router";
        type Config = routelab_policies::NoConfig;
        type Context = RouterContext;
        fn new(_: Self::Config, _: &RouterContext) -> Result<Self, String> {
            Ok(Self(&[]))
        }
    }

    impl RouterPolicy for Asks {
        fn signals(&self) -> Vec<String> {
            self.0.iter().map(|n| n.to_string()).collect()
        }
        fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
            0
        }
    }

    fn table_for(names: &'static [&'static str]) -> SignalTable {
        SignalTable::negotiate(&Router_TO::from_value(Guarded::new(Asks(names)), TD_Opaque)).unwrap()
    }

    #[test]
    fn scraped_signals_are_the_last_scrape_with_its_age() {
        // Scraped signals hold the last scrape and its age; without a scrape they are the live view.
        let mut table = table_for(&[signals::SCRAPED_WAITING, signals::SCRAPED_AGE_S, signals::KV_UTILISATION]);
        assert!(table.reads_scrapes());
        let live = |waiting| {
            [ReplicaView { waiting, kv_used_tokens: waiting as u64, kv_capacity_tokens: 10, ..Default::default() }]
        };
        assert_eq!(table.replicas(&live(4), 1.0).signals.as_slice(), &[4.0, 0.0, 0.4], "never scraped: fresh");
        table.scrape(&live(3), 2.0);
        assert_eq!(table.replicas(&live(9), 2.03).signals.as_slice()[0], 3.0);
        assert!((table.replicas(&live(9), 2.03).signals.as_slice()[1] - 0.03).abs() < 1e-12);
        assert_eq!(table.replicas(&live(9), 2.03).signals.as_slice()[2], 0.9, "unscraped signals stay live");
    }

    #[test]
    fn world_figures_fill_their_signals_and_default_to_zero() {
        let mut table = table_for(&[signals::PREFILLING, signals::BUSY_UNTIL]);
        table.set_prefilling(1, 4);
        table.set_busy_until(1, 2.5);
        let views = [ReplicaView::default(); 3];
        assert_eq!(table.replicas(&views, 0.0).signals.as_slice(), &[0.0, 0.0, 4.0, 2.5, 0.0, 0.0]);
    }
}
