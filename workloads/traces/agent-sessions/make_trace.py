"""Writes sessions.jsonl: a small synthetic agent trace in the Mooncake format with routelab's
session fields (see README.md). Deterministic: python3 make_trace.py > sessions.jsonl"""
import json
import random

BLOCK = 512
rng = random.Random(29)
next_id = [1000]


def new_id():
    next_id[0] += 1
    return next_id[0]


SYSTEM_BLOCKS = list(range(8))  # a 4096-token system prompt shared by every session
rows = []
for session in range(12):
    start_ms = session * 4000 + rng.randrange(0, 2000)
    full = list(SYSTEM_BLOCKS)  # ids of the full blocks of the context so far
    tokens = len(full) * BLOCK + rng.randrange(200, 800)  # + the task
    t = start_ms
    for call in range(rng.randrange(3, 9)):
        n_full = tokens // BLOCK
        while len(full) < n_full:
            full.append(new_id())
        ids = list(full)
        if tokens % BLOCK:
            ids.append(new_id())  # the partial last block: its own id (it differs once extended)
        output = rng.randrange(40, 400)
        row = {"timestamp": t, "input_length": tokens, "output_length": output, "hash_ids": ids,
               "session_id": f"s{session}", "call_index": call}
        wait = round(rng.lognormvariate(0.5, 0.8), 3)
        if call > 0:
            row["wait_s"] = prev_wait
        rows.append(row)
        prev_wait = wait
        # The recorded send time of the next call: this one's (rough) latency plus the wait.
        t += int(1000 * (0.5 + output * 0.02 + wait))
        tokens += output + rng.randrange(100, 1500)  # its output and the tool's result
rows.sort(key=lambda r: r["timestamp"])
for r in rows:
    print(json.dumps(r))
