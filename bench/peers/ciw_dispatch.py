"""The dispatch world of `routelab compare exp_rho09` in Ciw: 16 single-server FCFS nodes, Poisson
arrivals at utilisation 0.9 routed on arrival (random, or join the shortest queue), exponential
service of mean 1, mean response time over the requests after a 10% warm-up.

    python ciw_dispatch.py [--requests 200000] [--policy random|jsq] [--seed 1]

Ciw routes with a routing node: an arrival node of zero service time whose `routing` picks the
server node. Prints the mean response time and simulated requests per wall second.
"""

import argparse
import time

import ciw


def run(requests, policy, servers=16, rho=0.9, seed=1):
    ciw.seed(seed)
    # Node 1 routes (instant service); nodes 2..servers+1 are the FCFS servers.
    rate = rho * servers
    routing = ciw.routing.NetworkRouting(
        routers=[ciw.routing.JoinShortestQueue(destinations=list(range(2, servers + 2)), tie_break="random")
                 if policy == "jsq" else ciw.routing.Probabilistic(destinations=list(range(2, servers + 2)),
                                                                    probs=[1 / servers] * servers)]
        + [ciw.routing.Leave() for _ in range(servers)]
    )
    network = ciw.create_network(
        arrival_distributions=[ciw.dists.Exponential(rate)] + [None] * servers,
        service_distributions=[ciw.dists.Deterministic(0.0)] + [ciw.dists.Exponential(1.0)] * servers,
        number_of_servers=[float("inf")] + [1] * servers,
        routing=routing,
    )
    sim = ciw.Simulation(network)
    # Run long enough for `requests` arrivals (mean gap 1 / rate), then keep the first ones.
    sim.simulate_until_max_customers(requests, method="Arrive")
    recs = [r for r in sim.get_all_records() if r.node != 1]
    recs.sort(key=lambda r: r.arrival_date)
    kept = recs[len(recs) // 10:]
    return sum(r.exit_date - r.arrival_date for r in kept) / len(kept)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--policy", choices=["random", "jsq"], default="jsq")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    t = time.perf_counter()
    mean = run(a.requests, a.policy, seed=a.seed)
    secs = time.perf_counter() - t
    print(f"ciw {a.policy}: mean response {mean:.3f}, {a.requests / secs:,.0f} simulated requests/s ({secs:.1f} s)")
