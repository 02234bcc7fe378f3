"""The dispatch world of `routelab compare exp_rho09` in SimPy: 16 FCFS servers, Poisson arrivals
at utilisation 0.9, exponential service of mean 1, a router picking a server per arrival (random or
join the shortest queue), mean response time over the requests after a 10% warm-up.

    python simpy_dispatch.py [--requests 200000] [--policy random|jsq] [--seed 1]

Prints the mean response time and simulated requests per wall second, to compare with
`routelab bench` (same world) — see docs/performance.md.
"""

import argparse
import random
import time

import simpy


def run(requests, policy, servers=16, rho=0.9, seed=1):
    rng = random.Random(seed)
    env = simpy.Environment()
    queues = [simpy.Resource(env, capacity=1) for _ in range(servers)]
    responses = []

    def job(server, size):
        arrived = env.now
        with queues[server].request() as req:
            yield req
            yield env.timeout(size)
        responses.append(env.now - arrived)

    def source():
        for _ in range(requests):
            yield env.timeout(rng.expovariate(rho * servers))
            if policy == "random":
                s = rng.randrange(servers)
            else:  # join the shortest queue (in service + waiting), random ties
                loads = [len(q.queue) + q.count for q in queues]
                m = min(loads)
                s = rng.choice([i for i, l in enumerate(loads) if l == m])
            env.process(job(s, rng.expovariate(1.0)))

    env.process(source())
    env.run()
    kept = responses[requests // 10:]
    return sum(kept) / len(kept)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--policy", choices=["random", "jsq"], default="jsq")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    t = time.perf_counter()
    mean = run(a.requests, a.policy, seed=a.seed)
    secs = time.perf_counter() - t
    print(f"simpy {a.policy}: mean response {mean:.3f}, {a.requests / secs:,.0f} simulated requests/s ({secs:.1f} s)")
