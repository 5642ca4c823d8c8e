"""Assertions of the sam local test, on function outputs and on moto's state.

Usage: python check.py COMMAND ARGS...   (exits non-zero with a message on failure)
"""

import json
import sys

import boto3


def last_json(path):
    """The function result: the last stdout line that parses as JSON."""
    for line in reversed(open(path, encoding="utf-8").read().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    sys.exit(f"no JSON result in {path}")


def client(kind, endpoint):
    return boto3.client(kind, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")


def delivery_item(ddb, table, delivery_id):
    """The delivery's item (in its app's partition, sorted by its id), if any."""
    kwargs = {"TableName": table, "FilterExpression": "SK = :id AND #k = :kind", "ExpressionAttributeNames": {"#k": "kind"},
              "ExpressionAttributeValues": {":id": {"S": delivery_id}, ":kind": {"S": "delivery"}}}
    while True:
        page = ddb.scan(**kwargs)
        if page["Items"]:
            return page["Items"][0]
        if not page.get("LastEvaluatedKey"):
            return None
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "http":  # OUT STATUS [FIELD] -> prints FIELD of the JSON body
        result = last_json(args[0])
        status = result.get("statusCode")
        if str(status) != args[1]:
            sys.exit(f"expected HTTP {args[1]}, got {status}: {result}")
        if len(args) > 2 and args[2].startswith("="):  # a plain-text body is expected
            if result.get("body") != args[2][1:]:
                sys.exit(f"expected body {args[2][1:]!r}: {result}")
        elif len(args) > 2:
            value = json.loads(result.get("body") or "null")
            for part in args[2].split("."):
                value = value[int(part)] if isinstance(value, list) else value[part]
            print(value)
    elif cmd == "no-failures":  # OUT
        result = last_json(args[0])
        if result.get("batchItemFailures"):
            sys.exit(f"batch item failures: {result}")
    elif cmd == "field":  # OUT KEY EXPECTED
        result = last_json(args[0])
        if str(result.get(args[1])) != args[2]:
            sys.exit(f"expected {args[1]}={args[2]}: {result}")
    elif cmd == "items":  # ENDPOINT TABLE KIND MIN
        ddb = client("dynamodb", args[0])
        items = ddb.scan(TableName=args[1])["Items"]
        n = sum(1 for i in items if i.get("kind", {}).get("S") == args[2])
        if n < int(args[3]):
            sys.exit(f"expected >= {args[3]} {args[2]} items, found {n}")
        print(n)
    elif cmd == "status":  # ENDPOINT TABLE DELIVERY_ID EXPECTED
        ddb = client("dynamodb", args[0])
        item = delivery_item(ddb, args[1], args[2])
        if item and not item["PK"]["S"].startswith("DLA#"):
            sys.exit(f"delivery {args[2]} is not in its app's partition: {item['PK']}")
        status = item and item["status"]["S"]
        if status != args[3]:
            sys.exit(f"delivery {args[2]}: expected {args[3]}, got {status}")
    elif cmd == "listed":  # ENDPOINT TABLE EVENT_ID DELIVERY_ID: listed on its event, no item yet
        ddb = client("dynamodb", args[0])
        if delivery_item(ddb, args[1], args[3]):
            sys.exit(f"delivery {args[3]} has an item before its first attempt")
        # The event's item is in its creation day's partition, sorted by its id.
        found = ddb.scan(TableName=args[1], FilterExpression="SK = :id",
                         ExpressionAttributeValues={":id": {"S": args[2]}})["Items"]
        event = found[0] if found else None
        if event and not event["PK"]["S"].startswith("EVD#"):
            sys.exit(f"event {args[2]} is not in a day partition: {event['PK']}")
        targets = event and event.get("targets", {}).get("L")
        if not targets:
            sys.exit(f"event {args[2]} lists no fan-out: {event}")
        print(len(targets))
    elif cmd == "queue-depth":  # ENDPOINT QUEUE_URL EXPECTED_MIN [EXPECTED_MAX]
        sqs = client("sqs", args[0])
        attrs = sqs.get_queue_attributes(QueueUrl=args[1], AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        n = int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])
        hi = int(args[3]) if len(args) > 3 else 1 << 30
        if not (int(args[2]) <= n <= hi):
            sys.exit(f"queue {args[1]}: {n} messages, expected {args[2]}..{hi}")
        print(n)
    elif cmd == "dlq-copy":  # ENDPOINT DLQ_URL DELIVERY_ID ENDPOINT_ID
        sqs = client("sqs", args[0])
        body = {"delivery_id": args[2], "attempt": 1, "not_before": "2026-01-01T00:00:00Z", "app_id": "demo", "endpoint_id": args[3], "event_type": "order.paid", "failure": "HTTP 503"}
        sqs.send_message(QueueUrl=args[1], MessageBody=json.dumps(body))
    elif cmd == "resign":  # EVENT HEADERS_JSON OUT [TAMPER]: put fresh signed headers into the event
        event = json.load(open(args[0]))
        for k, v in json.load(open(args[1])).items():
            event["headers"][k.lower()] = v
        if len(args) > 3:
            event["body"] = event["body"].replace("4990", "1")
        json.dump(event, open(args[2], "w"))
    elif cmd == "body":  # EVENT OUT: the event's body, raw
        open(args[1], "w", encoding="utf-8").write(json.load(open(args[0]))["body"])
    elif cmd == "seen":  # ENDPOINT TABLE MESSAGE_ID: the receiver marked it processed
        item = client("dynamodb", args[0]).get_item(TableName=args[1], Key={"PK": {"S": "SEEN#" + args[2]}}).get("Item")
        if not item or item["state"]["S"] != "processed":
            sys.exit(f"{args[2]} not marked processed in {args[1]}: {item}")
    elif cmd == "purge":  # ENDPOINT QUEUE_URL
        client("sqs", args[0]).purge_queue(QueueUrl=args[1])
    elif cmd == "records":  # EVENT_FILE MIN
        n = len(json.load(open(args[0]))["Records"])
        if n < int(args[1]):
            sys.exit(f"{args[0]}: {n} records, expected >= {args[1]}")
        print(n)
    elif cmd == "received":  # JSONL MIN
        lines = [json.loads(l) for l in open(args[0], encoding="utf-8") if l.strip()]
        if len(lines) < int(args[1]):
            sys.exit(f"receiver got {len(lines)} requests, expected >= {args[1]}")
        last = lines[-1]
        json.dump(last["headers"], open(args[0] + ".headers.json", "w"))
        open(args[0] + ".body", "w", encoding="utf-8").write(last["body"])
        print(len(lines))
    else:
        sys.exit(f"unknown check {cmd}")


main()
