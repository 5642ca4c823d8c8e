#!/usr/bin/env python3
"""Writes RELIABILITY.md from the figures the test suite recorded in
target/test-figures/ (crash test, receiver fault matrix, SSRF vectors,
secrets in logs, hostile input, the reconciler, payload bytes and races,
recovery at scale, tenant isolation). Run by tests/run after the tests; a figure
that was not measured in this run says so instead of being made up.

usage: tests/reliability.py <figures dir> <output file>
"""
import datetime
import os
import sys

figures, out = sys.argv[1], sys.argv[2]


def lines(name):
    path = os.path.join(figures, name + ".txt")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [l.rstrip("\n") for l in f if l.strip()]


def section(title, body):
    return f"## {title}\n\n{body}\n"


def or_missing(items, text):
    return text if items else "_not measured in this run_"


doc = [
    "# hookline reliability and security figures\n",
    f"Written by `tests/run` (via `tests/reliability.py`) on "
    f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} from the figures "
    "the tests recorded in this run (`target/test-figures/`). Every row below is an "
    "assertion that passed; a failed assertion fails the suite.\n",
]

crash = lines("crash")
doc.append(section(
    "1. Crash test (SIGKILL mid-batch, restart on the same moto state)",
    or_missing(crash, "\n".join(f"- {l}" for l in crash)
               + "\n\nThe worker running the stream and queue pollers (dispatch and deliver) is "
               "SIGKILLed 5 times at random moments while it is sending, then restarted from "
               "its stream checkpoints; a last worker drains. Lost must be 0; duplicates are "
               "counted at the receiver (at-least-once delivery: receivers dedupe on `webhook-id`)."),
))

faults = lines("faults")
table = lines("faults-table")
doc.append(section(
    "2. Receiver fault matrix",
    or_missing(faults, "\n".join(f"- {l}" for l in faults)
               + "\n\n| fault | final state | endpoint | attempt status codes | longest attempt | largest body kept | first error |\n"
               "|---|---|---|---|---|---|---|\n" + "\n".join(table)),
))

aws = lines("aws-faults")
doc.append(section(
    "3. AWS faults",
    or_missing(aws, "\n".join(f"- {l}" for l in aws)
               + "\n\nEvery SDK client (DynamoDB, Streams, SQS) goes through a fault-injecting proxy "
               "in front of moto: 8 % throttling errors, 4 % 500s, 3 % connections dropped after "
               "moto acted (the caller never learns the outcome). SDK retry settings are explicit "
               "(standard mode, 4 attempts, 50 ms initial backoff, bounded timeouts; "
               "`hookline_aws::clients`); batch handlers report partial failures; conditional "
               "writes make replays harmless."),
))

ssrf = lines("ssrf")
doc.append(section(
    "4. SSRF guard (private endpoints not allowed, the deployed default)",
    or_missing(ssrf, "Each vector is registered through the API (expect 400 `invalid_url`) and sent "
               "to with the real HTTP sender (expect a refusal before any connection; a loopback "
               "listener counts connections).\n\n| vector | URL | at registration | at send |\n|---|---|---|---|\n"
               + "\n".join(ssrf)),
))

hostile = lines("hostile")
doc.append(section(
    "5. Hostile input to the API",
    or_missing(hostile, "\n".join(f"- {l}" for l in hostile)),
))

secrets = lines("secrets")
doc.append(section(
    "6. Secrets",
    or_missing(secrets, "\n".join(f"- {l}" for l in secrets)
               + "\n- Lists never carry secrets (endpoint lists, API key lists) and errors never "
               "echo a presented key or secret: asserted in the operator and pipeline tests."),
))

reconciler = lines("reconciler")
doc.append(section(
    "7. Lost queue messages: the reconciler",
    or_missing(reconciler, "\n".join(f"- {l}" for l in reconciler)
               + "\n\nA pending delivery whose queue message is lost (a stream record dropped after "
               "dispatch's retries, a purged queue, an expired message) stays in the overdue index "
               "(GSI3, pending work only); the scheduled reconciler queues it again once it is "
               "overdue by `WEBHOOKS_RECONCILE_AFTER`, under a new version so a late original message "
               "is acked as stale (no double POST). Tested on moto (`tests/it/guarantees.rs`) and by "
               "`sam local invoke` of the reconcile function."),
))

data = lines("payload") + lines("idempotency") + lines("races")
doc.append(section(
    "8. Data and races",
    or_missing(data, "\n".join(f"- {l}" for l in data)
               + "\n\nInterleavings driven through the in-memory ports (unit tests): a DLQ failure copy "
               "read before deliver records `failed` stays in the DLQ; a short poll answering empty "
               "does not end a redrive; a TransactionConflict on the idempotency key replays the "
               "winner's answer (or retries), never a 5xx; dispatch stops at a poison record and "
               "queues nothing after it; a message older than a re-queue is stale."),
))

health = lines("endpoint-health")
doc.append(section(
    "9. Endpoint health and receiver protection",
    or_missing(health, "\n".join(f"- {l}" for l in health)
               + "\n\nTested on the local stack with a real loopback receiver (`tests/it/endpoint_health.rs`)."),
))

scale = lines("scale")
doc.append(section(
    "10. Recovery at production scale",
    or_missing(scale, "\n".join(f"- {l}" for l in scale)
               + "\n\nThe capacity model and the full scale simulation's figures are in `SCALE.md`."),
))

isolation = lines("isolation")
doc.append(section(
    "11. Tenant isolation",
    or_missing(isolation, "\n".join(f"- {l}" for l in isolation)
               + "\n\nEach limit is tried through the API on moto: refused with its own 409 or 400 "
               "code, nothing written, other tenants unaffected, no secret in an answer."),
))

ordering = lines("ordering")
doc.append(section(
    "12. Ordering per key",
    or_missing(ordering, "\n".join(f"- {l}" for l in ordering)
               + "\n\nThe rules are in the README's retry policy; the in-memory scale simulation "
               "checks each key's order under injected losses (section 10)."),
))

with open(out, "w", encoding="utf-8") as f:
    f.write("\n".join(doc))
print(f"wrote {out}")
