"""Interop: signatures made by the `hookline` CLI verify with the official
Standard Webhooks library and with Stripe's official signature check, and
signatures made by the Standard Webhooks library verify with our CLI.

Usage: python interop.py /path/to/hookline
Prints one line per check and a closing 'N passed, N failed' line.
"""

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time

import stripe
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

CLI = sys.argv[1]
results = []


def check(name, fn):
    try:
        fn()
        results.append((name, None))
        print(f"ok   {name}")
    except Exception as exc:  # noqa: BLE001 - report every failure
        results.append((name, exc))
        print(f"FAIL {name}: {exc!r}")


def cli(*args, body=b""):
    proc = subprocess.run([CLI, *args], input=body, capture_output=True, timeout=30)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def sign(secrets, body, msg_id="msg_interop", ts=None, scheme="both"):
    args = ["sign", "--id", msg_id, "--scheme", scheme]
    for s in secrets:
        args += ["--secret", s]
    if ts is not None:
        args += ["--timestamp", str(ts)]
    rc, out, err = cli(*args, body=body)
    assert rc == 0, err
    return json.loads(out)


def gen_secret():
    rc, out, err = cli("gen-secret")
    assert rc == 0, err
    return out.strip()


BODY = json.dumps(
    {"type": "order.paid", "timestamp": "2026-12-02T10:00:00.000Z", "data": {"id": "ord_1", "amount": 4200, "note": "çà ✓"}},
    ensure_ascii=False,
    separators=(",", ":"),
).encode()


def published_vector():
    headers = sign(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], b'{"test": 2432232314}', "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330)
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", headers


def standard_library_verifies_cli():
    secret = gen_secret()
    headers = sign([secret], BODY)
    data = Webhook(secret).verify(BODY, headers)
    assert data["data"]["id"] == "ord_1"


def stripe_library_verifies_cli():
    secret = gen_secret()
    headers = sign([secret], BODY)
    assert headers["X-Webhook-Timestamp"] == headers["X-Webhook-Signature"].split(",")[0][2:]
    assert stripe.WebhookSignature.verify_header(BODY.decode(), headers["X-Webhook-Signature"], secret, tolerance=300)
    event = stripe.Webhook.construct_event(BODY.decode(), headers["X-Webhook-Signature"], secret)
    assert event["type"] == "order.paid"


def rotation_verifies_with_either_secret():
    old, new = gen_secret(), gen_secret()
    headers = sign([new, old], BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(BODY, headers)
        stripe.WebhookSignature.verify_header(BODY.decode(), headers["X-Webhook-Signature"], secret, tolerance=300)


def tampering_is_rejected_by_both_libraries():
    secret = gen_secret()
    headers = sign([secret], BODY)
    tampered = BODY.replace(b"4200", b"4201")
    try:
        Webhook(secret).verify(tampered, headers)
        raise AssertionError("standardwebhooks accepted a tampered body")
    except WebhookVerificationError:
        pass
    try:
        stripe.WebhookSignature.verify_header(tampered.decode(), headers["X-Webhook-Signature"], secret, tolerance=300)
        raise AssertionError("stripe accepted a tampered body")
    except stripe.SignatureVerificationError:
        pass
    other = gen_secret()
    try:
        Webhook(other).verify(BODY, headers)
        raise AssertionError("standardwebhooks accepted a signature by another secret")
    except WebhookVerificationError:
        pass


def stale_timestamp_is_rejected_by_both_libraries():
    secret = gen_secret()
    headers = sign([secret], BODY, ts=int(time.time()) - 600)
    try:
        Webhook(secret).verify(BODY, headers)
        raise AssertionError("standardwebhooks accepted a 10-minute-old timestamp")
    except WebhookVerificationError:
        pass
    try:
        stripe.WebhookSignature.verify_header(BODY.decode(), headers["X-Webhook-Signature"], secret, tolerance=300)
        raise AssertionError("stripe accepted a 10-minute-old timestamp")
    except stripe.SignatureVerificationError:
        pass


def cli_verifies_standard_library_signature():
    secret = gen_secret()
    now = int(time.time())
    from datetime import datetime, timezone

    sig = Webhook(secret).sign("msg_from_python", datetime.fromtimestamp(now, tz=timezone.utc), BODY.decode())
    rc, out, err = cli(
        "verify", "--secret", secret,
        "--header", "webhook-id: msg_from_python",
        "--header", f"webhook-timestamp: {now}",
        "--header", f"webhook-signature: {sig}",
        body=BODY,
    )
    assert rc == 0, err
    assert json.loads(out)["scheme"] == "standard-webhooks"
    rc, _, err = cli(
        "verify", "--secret", secret,
        "--header", "webhook-id: msg_other",
        "--header", f"webhook-timestamp: {now}",
        "--header", f"webhook-signature: {sig}",
        body=BODY,
    )
    assert rc == 1 and "mismatch" in err, err


def cli_verifies_stripe_style_signature():
    # Stripe's library has no public signer; its scheme is HMAC-SHA256 over
    # "{t}.{payload}" keyed with the secret string, computed here by its helper.
    secret = gen_secret()
    now = int(time.time())
    payload = BODY.decode()
    mac = stripe.WebhookSignature._compute_signature(f"{now}.{payload}", secret)
    expected = hmac.new(secret.encode(), f"{now}.{payload}".encode(), hashlib.sha256).hexdigest()
    assert mac == expected
    rc, out, err = cli("verify", "--secret", secret, "--header", f"X-Webhook-Signature: t={now},v1={mac}", body=BODY)
    assert rc == 0, err
    assert json.loads(out)["scheme"] == "stripe-compatible"


def secret_format_matches_the_standard():
    secret = gen_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[len("whsec_"):])) >= 24


for fn in [
    published_vector,
    standard_library_verifies_cli,
    stripe_library_verifies_cli,
    rotation_verifies_with_either_secret,
    tampering_is_rejected_by_both_libraries,
    stale_timestamp_is_rejected_by_both_libraries,
    cli_verifies_standard_library_signature,
    cli_verifies_stripe_style_signature,
    secret_format_matches_the_standard,
]:
    check(fn.__name__, fn)

failed = sum(1 for _, e in results if e is not None)
print(f"interop: {len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
