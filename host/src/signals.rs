//! Engine signals the host provides to routers that ask for them by name
//! (`routelab_policy_api::signals`): negotiated once per router, then filled into one dense
//! replicas × signals table before each `route`. Routers that ask for none cost nothing here.

use routelab_policy_api::{ReplicaView, Replicas, RouterBox, signals};

/// How the host computes one signal from what it already tracks per replica.
type Column = fn(&ReplicaView) -> f64;

/// The signals this host provides, by name. Adding one here (and to the API's catalogue) is a
/// compatible change: no layout moves.
fn column(name: &str) -> Option<Column> {
    Some(match name {
        signals::WAITING => |v| v.waiting as f64,
        signals::RUNNING => |v| v.running as f64,
        signals::OUTSTANDING_REQUESTS => |v| v.outstanding_requests as f64,
        signals::KV_USED_TOKENS => |v| v.kv_used_tokens as f64,
        signals::KV_CAPACITY_TOKENS => |v| v.kv_capacity_tokens as f64,
        signals::KV_UTILISATION => {
            |v| if v.kv_capacity_tokens == 0 { 0.0 } else { v.kv_used_tokens as f64 / v.kv_capacity_tokens as f64 }
        }
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
}

impl SignalTable {
    /// Asks `router` which signals it reads; an unknown name (or a failing `signals()`) is an
    /// error naming it and listing what this host provides.
    pub fn negotiate(router: &RouterBox) -> Result<Self, String> {
        let names = router.signals().into_result().map_err(String::from)?;
        if names.len() > MAX_SIGNALS {
            return Err(format!("asks for {} engine signals; at most {MAX_SIGNALS} are allowed", names.len()));
        }
        let columns = names
            .iter()
            .map(|n| {
                column(n.as_str()).ok_or_else(|| {
                    let known: Vec<&str> = signals::CATALOGUE.iter().map(|(n, _)| *n).collect();
                    format!(
                        "asks for engine signal '{n}', which this routelab (policy-api {}) does not provide; it provides: {}",
                        routelab_policy_api::API_VERSION,
                        known.join(", ")
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { columns, values: Vec::new() })
    }

    /// `views` with this router's signals filled in.
    pub fn replicas<'a>(&'a mut self, views: &'a [ReplicaView]) -> Replicas<'a> {
        if self.columns.is_empty() {
            return Replicas::new(views);
        }
        self.values.clear();
        for v in views {
            self.values.extend(self.columns.iter().map(|c| c(v)));
        }
        let k = u32::try_from(self.columns.len()).expect("at most MAX_SIGNALS columns");
        Replicas::with_signals(views, &self.values, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::sabi_trait::TD_Opaque;
    use abi_stable::std_types::{RNone, RSlice};
    use routelab_policy_api::{Guarded, Policy, Request, RouterContext, RouterPolicy, Router_TO, World};

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
            vec![signals::KV_UTILISATION.into(), signals::WAITING.into()]
        }
        fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
            self.seen = replicas.signals.to_vec();
            (0..replicas.len()).min_by(|&a, &b| replicas.signal(a, 0).total_cmp(&replicas.signal(b, 0))).unwrap()
        }
    }

    #[test]
    fn negotiated_signals_arrive_as_a_replica_major_table_in_the_order_asked() {
        let ctx = RouterContext { world: World::Cluster, replicas: 2, seed: 1, kv_capacity_tokens: 100, cost: RNone };
        let mut router = Router_TO::from_value(Guarded::new(Reads::new(Default::default(), &ctx).unwrap()), TD_Opaque);
        let mut table = SignalTable::negotiate(&router).unwrap();
        let views = [
            ReplicaView { waiting: 7, kv_used_tokens: 50, kv_capacity_tokens: 100, ..Default::default() },
            ReplicaView { waiting: 2, kv_used_tokens: 25, kv_capacity_tokens: 100, ..Default::default() },
        ];
        let req = Request { id: 0, arrived_at: 0.0, prompt_tokens: 0, size_hint: RNone, segments: RSlice::EMPTY };
        let chosen = router.route(&req, table.replicas(&views)).into_result().unwrap();
        assert_eq!(chosen, 1);
        let replicas = table.replicas(&views);
        assert_eq!(replicas.signals.as_slice(), &[0.5, 7.0, 0.25, 2.0]);
        assert_eq!(replicas.signals_of(1), &[0.25, 2.0]);
    }

    #[test]
    fn routers_that_ask_for_nothing_get_an_empty_table() {
        let mut table = SignalTable::default();
        let views = [ReplicaView::default(); 3];
        let r = table.replicas(&views);
        assert_eq!((r.len(), r.signal_columns, r.signals.len()), (3, 0, 0));
    }
}
