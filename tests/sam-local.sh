#!/usr/bin/env bash
# `sam validate --lint`, cfn-lint, `sam build` (x86_64) and `sam local invoke`
# of EVERY function with the files in events/, against a moto server on
# loopback (--docker-network host), asserting on each function's output and on
# the resulting state in moto:
#   ingest   -> endpoint + event items in the table (the delivery listed on its event)
#   dispatch -> messages in the delivery queue (fixtures and the real stream record)
#   deliver  -> the loopback receiver got a POST whose signatures verify
#   retry    -> the DLQ is drained
#   reconcile -> a pending delivery whose stream record was never dispatched
#               is queued again once overdue
# Without a Docker API it says so and skips (exit 0), unless
# HOOKLINE_REQUIRE_SAM_LOCAL=1 (.ci/run sets it, and sets up the API): then a
# missing Docker API fails the run, so CI cannot pass without a single invoke.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

docker_api() {
  local host="${DOCKER_HOST:-unix:///var/run/docker.sock}"
  case "$host" in
    unix://*) curl -sf --max-time 5 --unix-socket "${host#unix://}" http://d/_ping >/dev/null 2>&1 ;;
    *) curl -sf --max-time 5 "${host/tcp:/http:}/_ping" >/dev/null 2>&1 ;;
  esac
}
if ! docker_api; then
  if [ "${HOOKLINE_REQUIRE_SAM_LOCAL:-0}" = 1 ]; then
    echo "sam local: FAILED - HOOKLINE_REQUIRE_SAM_LOCAL=1 but no Docker API at ${DOCKER_HOST:-unix:///var/run/docker.sock}" >&2
    exit 1
  fi
  echo "sam local: SKIPPED - no Docker API at ${DOCKER_HOST:-unix:///var/run/docker.sock} (run ../shared/sam-local/container-runtime.sh, or start Docker)"
  exit 0
fi

sam_venv="$(infra/bin/venv sam infra/sam/requirements.txt)"
moto_venv="$(infra/bin/venv moto tests/requirements-moto.txt)"
export PATH="$sam_venv/bin:$PATH"
export SAM_CLI_TELEMETRY=0 AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "${HOOKLINE_KEEP_SAM_WORK:-0}" = 1 ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
check() { "$moto_venv/bin/python" tests/sam/check.py "$@"; }
passed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }

echo "== sam validate --lint"
sam validate --lint --template template.yaml
ok "sam validate --lint"
echo "== cfn-lint"
"$sam_venv/bin/cfn-lint" template.yaml
ok "cfn-lint: no errors or warnings"

echo "== sam build (x86_64, debug profile for local invokes)"
SAM_BUILD_MODE=debug sam build --parameter-overrides Architecture=x86_64 DeployExampleReceiver=true --build-dir .aws-sam/build >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
for f in IngestFunction DispatchFunction DeliverFunction RetryFunction ReconcileFunction ExampleReceiverFunction; do
  test -x ".aws-sam/build/$f/bootstrap" || { echo "no bootstrap for $f"; exit 1; }
done
ok "sam build: 6 bootstrap binaries"

# The shared base image is a Debian minbase rootfs without CA certificates (the
# real provided.al2023 image has them, and the SDK's TLS setup requires some):
# add the host's bundle in a derived image, built locally without any pull.
invoke_image=localhost/hookline-lambda-base:al2023
if ! curl -sf --unix-socket "${DOCKER_HOST#unix://}" "http://d/v1.41/images/$invoke_image/json" >/dev/null 2>&1; then
  ctx="$work/image"
  mkdir -p "$ctx"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
  printf 'FROM localhost/lambda-base:al2023\nCOPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n' > "$ctx/Dockerfile"
  tar -C "$ctx" -cf "$work/image.tar" Dockerfile ca-certificates.crt
  curl -sf --unix-socket "${DOCKER_HOST#unix://}" -X POST -H "Content-Type: application/x-tar" \
    --data-binary "@$work/image.tar" "http://d/v1.41/build?t=$invoke_image&pull=0" >"$work/image.log" \
    || { cat "$work/image.log"; exit 1; }
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$moto_venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
pids+=($!)
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 tests/sam/receiver.py "$rport" "$work/received.jsonl" &
pids+=($!)
moto="http://127.0.0.1:$port"
for _ in $(seq 1 100); do curl -sf "$moto/moto-api/" >/dev/null 2>&1 && break; sleep 0.2; done

cargo build --quiet -p hookline-local
local_bin="${CARGO_TARGET_DIR:-$root/target}/debug/hookline-local"
"$local_bin" setup --endpoint-url "$moto" > "$work/setup.json"
table=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["table"])' "$work/setup.json")
queue=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["queue_url"])' "$work/setup.json")
dlq=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dlq_url"])' "$work/setup.json")
sed "s#127.0.0.1:5000#127.0.0.1:$port#g" events/env.local.json > "$work/env.json"

invoke() { # FUNCTION EVENT_FILE OUT
  PYTHONPATH="$root/tests/sam/hostnet" sam local invoke "$1" -e "$2" --template .aws-sam/build/template.yaml --env-vars "$work/env.json" \
    --parameter-overrides Architecture=x86_64 DeployExampleReceiver=true \
    --skip-pull-image --invoke-image "$invoke_image" --docker-network host \
    >"$3" 2>"$3.err" || { echo "sam local invoke $1 failed"; grep -v "^  " "$3.err" | tail -40; cat "$3"; exit 1; }
}

echo "== IngestFunction"
invoke IngestFunction events/api-health.json "$work/health.out"
check http "$work/health.out" 200
ok "ingest: GET /health -> 200"
invoke IngestFunction events/api-put-event-type.json "$work/etype.out"
check http "$work/etype.out" 201 name >/dev/null
ok "ingest: PUT /v1/event-types/order.paid -> 201 (its schema checks the events below)"
sed "s#127.0.0.1:9911#127.0.0.1:$rport#g" events/api-create-endpoint.json > "$work/create.json"
invoke IngestFunction "$work/create.json" "$work/create.out"
endpoint_id=$(check http "$work/create.out" 201 id)
secret=$(check http "$work/create.out" 201 secret)
ok "ingest: POST endpoints -> 201 ($endpoint_id)"
invoke IngestFunction events/api-post-event.json "$work/event.out"
delivery_id=$(check http "$work/event.out" 202 delivery_ids.0)
event_id=$(check http "$work/event.out" 202 event_id)
check items "$moto" "$table" event 1 >/dev/null
check listed "$moto" "$table" "$event_id" "$delivery_id" >/dev/null
ok "ingest: POST events -> 202, one event item listing delivery $delivery_id (no delivery item before its first attempt)"
invoke IngestFunction events/api-post-event.json "$work/event2.out"
test "$(check http "$work/event2.out" 202 delivery_ids.0)" = "$delivery_id"
check items "$moto" "$table" event 1 >/dev/null
ok "ingest: same Idempotency-Key -> same answer"
invoke IngestFunction events/api-list-endpoints.json "$work/list.out"
check http "$work/list.out" 200 items.0.id >/dev/null
if grep -qF "$secret" "$work/list.out"; then echo "secret leaked in a list response"; exit 1; fi
ok "ingest: GET endpoints -> 200 without secrets"
invoke IngestFunction events/api-openapi.json "$work/openapi.out"
check http "$work/openapi.out" 200 openapi >/dev/null
ok "ingest: GET /openapi.json (no key) -> 200, OpenAPI document"
invoke IngestFunction events/api-create-api-key.json "$work/key.out"
app_key=$(check http "$work/key.out" 201 key)
sed "s#Bearer local-admin-key#Bearer $app_key#" events/api-list-endpoints.json > "$work/list-as-app.json"
invoke IngestFunction "$work/list-as-app.json" "$work/list-as-app.out"
check http "$work/list-as-app.out" 200 items.0.id >/dev/null
sed "s#/v1/apps/demo/#/v1/apps/other/#g" "$work/list-as-app.json" > "$work/list-other.json"
invoke IngestFunction "$work/list-other.json" "$work/list-other.out"
check http "$work/list-other.out" 403 >/dev/null
ok "ingest: app-scoped key created (stored hashed in the table), works on its app, 403 on another"

echo "== DispatchFunction"
invoke DispatchFunction events/stream-insert-delivery.json "$work/d1.out"
check no-failures "$work/d1.out"
invoke DispatchFunction events/stream-modify-delivery.json "$work/d2.out"
check no-failures "$work/d2.out"
invoke DispatchFunction events/stream-insert-event.json "$work/d2e.out"
check no-failures "$work/d2e.out"
check queue-depth "$moto" "$queue" 4 >/dev/null
ok "dispatch: delivery INSERT and MODIFY fixtures, a listed event INSERT (2 endpoints) -> 4 messages queued"
# Drop the fixtures' messages (their delivery is not in this table).
check purge "$moto" "$queue"
"$local_bin" stream-event --endpoint-url "$moto" --checkpoint-file "$work/ckpt.json" > "$work/stream.json"
check records "$work/stream.json" 1 >/dev/null
invoke DispatchFunction "$work/stream.json" "$work/d3.out"
check no-failures "$work/d3.out"
ok "dispatch: the table's real stream record -> queued"

echo "== DeliverFunction"
"$local_bin" queue-event --endpoint-url "$moto" --wait-secs 5 > "$work/sqs.json"
check records "$work/sqs.json" 1 >/dev/null
invoke DeliverFunction "$work/sqs.json" "$work/deliver.out"
check no-failures "$work/deliver.out"
check received "$work/received.jsonl" 1 >/dev/null
cargo build --quiet -p hookline-cli
"${CARGO_TARGET_DIR:-$root/target}/debug/hookline" verify --secret "$secret" --headers-file "$work/received.jsonl.headers.json" --body-file "$work/received.jsonl.body" >/dev/null
check status "$moto" "$table" "$delivery_id" delivered
ok "deliver: the loopback receiver got a POST whose signature verifies; delivery delivered"
invoke DeliverFunction events/sqs-deliver.json "$work/deliver2.out"
check no-failures "$work/deliver2.out"
ok "deliver: fixture message for an unknown delivery acked"

echo "== RetryFunction"
check dlq-copy "$moto" "$dlq" "$delivery_id" "$endpoint_id"
invoke RetryFunction events/retry-dry-run.json "$work/r1.out"
check field "$work/r1.out" already_delivered 1
check queue-depth "$moto" "$dlq" 1 1 >/dev/null
invoke RetryFunction events/retry.json "$work/r2.out"
check field "$work/r2.out" already_delivered 1
check queue-depth "$moto" "$dlq" 0 0 >/dev/null
ok "retry: dry run counts, real run drains the DLQ"

echo "== ReconcileFunction"
invoke ReconcileFunction events/reconcile.json "$work/rc0.out"
check field "$work/rc0.out" requeued 0
check field "$work/rc0.out" listed_requeued 0
# (No second purge here: SQS allows one PurgeQueue per minute per queue.)
before=$(check queue-depth "$moto" "$queue" 0)
sed 's/"order-1042-paid"/"order-1042-reconcile"/' events/api-post-event.json > "$work/event3.json"
invoke IngestFunction "$work/event3.json" "$work/event3.out"
lost_id=$(check http "$work/event3.out" 202 delivery_ids.0)
lost_event=$(check http "$work/event3.out" 202 event_id)
check listed "$moto" "$table" "$lost_event" "$lost_id" >/dev/null
# Its stream record is never dispatched (lost). Once overdue
# (WEBHOOKS_RECONCILE_AFTER in events/env.local.json), the reconciler queues it.
after=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ReconcileFunction"]["WEBHOOKS_RECONCILE_AFTER"].rstrip("s"))' events/env.local.json)
sleep $((after + 1))
invoke ReconcileFunction events/reconcile.json "$work/rc1.out"
check field "$work/rc1.out" listed_requeued 1
check status "$moto" "$table" "$lost_id" pending
check queue-depth "$moto" "$queue" $((before + 1)) $((before + 1)) >/dev/null
ok "reconcile: nothing overdue -> 0; a listed delivery whose stream record was lost -> written pending and re-queued"

echo "== ExampleReceiverFunction (receiver kit)"
receiver_secret=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ExampleReceiverFunction"]["WEBHOOKS_RECEIVER_SECRETS"])' events/env.local.json)
check body events/receiver-webhook.json "$work/rbody.json"
"${CARGO_TARGET_DIR:-$root/target}/debug/hookline" sign --secret "$receiver_secret" --id msg_01m8vgw5r0fd5bkndpb8a897m8 --body-file "$work/rbody.json" > "$work/rheaders.json"
check resign events/receiver-webhook.json "$work/rheaders.json" "$work/receiver.json"
invoke ExampleReceiverFunction "$work/receiver.json" "$work/rec1.out"
check http "$work/rec1.out" 200 "=processed"
invoke ExampleReceiverFunction "$work/receiver.json" "$work/rec2.out"
check http "$work/rec2.out" 200 "=already processed"
check seen "$moto" hookline-ReceiverSeenTable msg_01m8vgw5r0fd5bkndpb8a897m8
check resign events/receiver-webhook.json "$work/rheaders.json" "$work/tampered.json" tamper
invoke ExampleReceiverFunction "$work/tampered.json" "$work/rec3.out"
check http "$work/rec3.out" 401
ok "example receiver: signed -> 200 processed, again -> 200 already processed, tampered -> 401"

echo "sam local: $passed passed, 0 failed"
