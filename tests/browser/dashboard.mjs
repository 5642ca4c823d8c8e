// The dashboard in a real browser (headless Debian Chromium, driven by
// playwright-core) against the whole local stack (`hookline-local up` on moto):
// it loads the page, connects with the admin key, filters to failed
// deliveries, retries one with a click, and watches it become delivered;
// endpoint health, the portal link, the catalog; then saves a screenshot of
// the real data. The page runs under its strict policy (no inline style or
// script): any violation is a console error, which fails the test.
//
//   node tests/browser/dashboard.mjs <hookline-local binary> <output dir>
//
// Everything runs on loopback; the processes started here are killed by PID
// (the stack stops its moto child itself on SIGTERM).
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { bound, check, client, launchBrowser, receiver as listen, run, startStack as start, until } from "./lib.mjs";

const [binary, outDir] = process.argv.slice(2);
if (!binary || !outDir) {
  console.error("usage: dashboard.mjs <hookline-local binary> <output dir>");
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });
const ADMIN_KEY = "browser-test-admin-key";
const APP = "shop";
bound(240_000); // the whole test is bounded

// A receiver on loopback: the "flaky" endpoint answers 503 until it is fixed.
async function receiver() {
  const state = { healthy: false, hits: 0 };
  const url = await listen(() => {
    state.hits += 1;
    return state.healthy ? { status: 200, body: "thanks" } : { status: 503, body: "down for maintenance" };
  });
  return { state, url };
}

function startStack() {
  return start(binary, {
    WEBHOOKS_ADMIN_KEY: ADMIN_KEY,
    WEBHOOKS_RETRY_SCHEDULE: "1s",
    WEBHOOKS_MAX_ATTEMPTS: "2",
    WEBHOOKS_DELIVERY_TIMEOUT: "2s",
  });
}

async function main() {
  const flaky = await receiver();
  const healthy = await receiver();
  healthy.state.healthy = true;
  const base = await startStack();
  console.log("stack at " + base);
  const call = client(base, ADMIN_KEY);
  const flakyEp = await call("POST", `/v1/apps/${APP}/endpoints`, { url: flaky.url, description: "billing" });
  check(flakyEp.status === 201, "endpoint created on the local stack");
  await call("POST", `/v1/apps/${APP}/endpoints`, { url: healthy.url, event_types: ["order.*"] });

  for (const [i, type] of ["order.paid", "order.shipped", "user.created"].entries()) {
    const r = await call("POST", `/v1/apps/${APP}/events`, { event_type: type, payload: { n: i, total: 1999 }, ordering_key: `order-${i}` });
    check(r.status === 202, `event ${type} accepted`);

  }
  await until("the flaky endpoint's deliveries to fail", async () => {
    const r = await call("GET", `/v1/apps/${APP}/deliveries?status=failed`);
    return r.body.items.length === 3;
  });
  console.log("ok   3 deliveries failed (2 attempts each), 2 delivered");
  flaky.state.healthy = true; // the receiver is fixed: a retry will succeed

  const browser = await launchBrowser();
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const consoleErrors = [];
  // The wrong-key step's 401 is expected; any other console error is not.
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().includes("status of 401")) consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));

  await page.goto(base + "/dashboard");
  check(await page.title() === "hookline · deliveries", "dashboard loads");
  await page.fill("#login-app", APP);
  await page.fill("#login-key", "wrong-key");
  await page.click("#connect");
  await page.waitForFunction(() => document.querySelector("#login-error").textContent.includes("refused"));
  check(true, "a wrong key is refused");
  await page.fill("#login-key", ADMIN_KEY);
  await page.click("#connect");
  await page.waitForSelector("#rows tr.delivery");
  check(await page.locator("#rows tr.delivery").count() === 5, "all 5 deliveries listed");
  await page.waitForFunction(() => /^\d+$/.test(document.querySelector("#dlq-depth").textContent));
  check(true, "DLQ depth shown: " + await page.textContent("#dlq-depth"));

  await page.selectOption("#f-status", "failed");
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll("#rows tr.delivery")];
    return rows.length === 3 && rows.every((r) => r.dataset.status === "failed");
  });
  check(true, "filtered to the 3 failed deliveries");
  const target = await page.getAttribute("#rows tr.delivery >> nth=0", "data-id");
  await page.click(`#rows tr.delivery[data-id="${target}"]`);
  await page.waitForSelector("#timeline li");
  const attemptsBefore = await page.locator("#timeline li").count();
  check(attemptsBefore === 2, "timeline shows the 2 failed attempts");
  check((await page.textContent("#timeline")).includes("503"), "timeline shows the status codes");
  check(/^order-\d$/.test(await page.textContent("#detail-key")), "the detail shows the delivery's ordering key");
  check((await page.textContent(`#rows tr.delivery[data-id="${target}"]`)).includes("key order-"), "the row shows its ordering key");
  await page.click(`#rows button.retry[data-id="${target}"]`);
  await page.waitForFunction(
    (id) => !document.querySelector(`#rows tr.delivery[data-id="${id}"]`), target, { timeout: 30_000 });
  check(true, "retried delivery leaves the failed list");
  await page.waitForFunction(() => {
    const badge = document.querySelector("#detail .badge");
    return badge && badge.textContent === "delivered";
  }, null, { timeout: 60_000 });
  check(true, "the retried delivery becomes delivered (live refresh)");
  check((await page.textContent("#timeline")).includes("200"), "timeline shows the 200");
  const api = await call("GET", `/v1/apps/${APP}/deliveries/${target}`);
  check(api.body.status === "delivered" && api.body.manual_retries === 1, "the API agrees");

  await page.selectOption("#f-status", "");
  await page.waitForFunction(() => document.querySelectorAll("#rows tr.delivery").length === 5);
  await page.waitForFunction(() => document.querySelector("#count-delivered").textContent === "3");

  // Endpoint health: per endpoint its state, success rate and a chart of
  // the last 24 hours, from the stats route.
  const flakyId = flakyEp.body.id;
  const row = `#endpoints tr.endpoint[data-id="${flakyId}"]`;
  await page.waitForFunction((r) => {
    const rate = document.querySelector(r + " td.rate");
    return rate && rate.textContent === "25%";
  }, row, { timeout: 30_000 });
  check(true, "the flaky endpoint's success rate: 25% (3 failed, then 1 delivered)");
  await page.waitForFunction(() => [...document.querySelectorAll("#endpoints td.rate")].some((t) => t.textContent === "100%"));
  check(true, "the healthy endpoint's success rate: 100%");
  const bars = await page.locator(`${row} svg.chart rect.bad`).count();
  check(bars >= 1, "the chart shows the failures (" + bars + " red bar)");
  check((await page.textContent(row + " td.latency")).includes("ms"), "latency p50 / p95 shown: " + await page.textContent(row + " td.latency"));
  const stats = await call("GET", `/v1/apps/${APP}/endpoints/${flakyId}/stats`);
  check(stats.body.failed === 3 && stats.body.delivered === 1 && stats.body.attempts === 7,
    "the stats route agrees (3 failed, 1 delivered, 7 requests)");

  // Disable and enable with a click.
  await page.click(`${row} button.toggle`);
  await page.waitForFunction((r) => document.querySelector(r)?.dataset.disabled === "true", row);
  check((await page.textContent(row)).includes("disabled by an operator"), "disabled by a click, reason shown");
  check((await call("GET", `/v1/apps/${APP}/endpoints/${flakyId}`)).body.disabled === true, "the API agrees it is disabled");
  await page.click(`${row} button.toggle`);
  await page.waitForFunction((r) => document.querySelector(r)?.dataset.disabled === "false", row);
  check((await call("GET", `/v1/apps/${APP}/endpoints/${flakyId}`)).body.disabled === false, "enabled again by a click");

  // A rate limit set through the API shows in its row.
  const limited = await call("PATCH", `/v1/apps/${APP}/endpoints/${flakyId}`, { rate_limit: 5 });
  check(limited.status === 200 && limited.body.rate_limit === 5, "rate limit set by PATCH");
  await page.waitForFunction((r) => document.querySelector(r + " .rate-limit")?.textContent === "≤ 5 req/s", row);
  check(true, "the endpoint's row shows its rate limit");

  // Resend a delivered delivery (same webhook-id) with a click.
  const hitsBefore = flaky.state.hits;
  await page.click(`#rows button.resend[data-id="${target}"]`);
  await until("the resend to arrive", async () => flaky.state.hits > hitsBefore, 30_000);
  const resent = await until("the resend to be recorded", async () => {
    const r = await call("GET", `/v1/apps/${APP}/deliveries/${target}`);
    return r.body.status === "delivered" && r.body.manual_retries === 2 ? r.body : null;
  }, 30_000);
  check(resent.total_attempts === 4, "resent by a click: attempt 4 of its life, delivered again");
  await page.waitForFunction(() => document.querySelector("#detail .badge")?.textContent === "delivered");

  // Replay missed: an event sent while the endpoint was disabled reaches
  // it with a click once it is enabled again, once.
  await page.click(`${row} button.toggle`);
  await page.waitForFunction((r) => document.querySelector(r)?.dataset.disabled === "true", row);
  check(await page.isDisabled(`${row} button.replay`), "replay is off while the endpoint is disabled");
  const missed = await call("POST", `/v1/apps/${APP}/events`, { event_type: "order.paid", payload: { missed: true } });
  check(missed.status === 202 && missed.body.delivery_ids.length === 1,
    "an event sent while it was disabled went to the other endpoint only");
  await page.click(`${row} button.toggle`);
  await page.waitForFunction((r) => document.querySelector(r)?.dataset.disabled === "false", row);
  const hitsBeforeReplay = flaky.state.hits;
  await page.selectOption(`${row} select.replay-window`, "3600");
  await page.click(`${row} button.replay`);
  await page.waitForFunction(() => /Replay: 1 replayed of \d+ events/.test(document.querySelector("#toast").textContent));
  check(true, "replay by a click: " + await page.textContent("#toast"));
  await until("the replayed event to arrive", async () => flaky.state.hits > hitsBeforeReplay, 30_000);
  await page.click(`${row} button.replay`);
  await page.waitForFunction(() => /Replay: 0 replayed/.test(document.querySelector("#toast").textContent));
  check(flaky.state.hits === hitsBeforeReplay + 1, "a second replay sends nothing more");

  // The customer portal link: a session for this app, shown once; its token
  // manages the app's endpoints but may not send events; revoked by a click.
  await page.selectOption("#portal-ttl", "14400");
  await page.click("#portal-link");
  await page.waitForSelector("#portal-out:not(.hidden)");
  const link = await page.inputValue("#portal-url");
  check(/\/portal#app=shop&token=key_[0-9a-z]{26}\.[A-Za-z0-9_-]{43}$/.test(link), "portal link created by a click: " + link.replace(/\.[^.]*$/, ".…"));
  check((await page.textContent("#portal-expiry")).startsWith("Works until"), "its end is shown: " + await page.textContent("#portal-expiry"));
  const portalToken = new URLSearchParams(new URL(link).hash.slice(1)).get("token");
  const asCustomer = (method, p, body) => fetch(base + p, {
    method,
    headers: { authorization: "Bearer " + portalToken, "content-type": "application/json" },
    body: body ? JSON.stringify(body) : undefined,
  }).then((r) => r.status);
  check(await asCustomer("GET", `/v1/apps/${APP}/endpoints`) === 200, "the link's token lists the app's endpoints");
  check(await asCustomer("POST", `/v1/apps/${APP}/events`, { event_type: "order.paid", payload: {} }) === 403,
    "but may not send events (403)");
  check(await asCustomer("GET", "/v1/apps/other/endpoints") === 403, "nor reach another app (403)");
  await page.click("#portal-revoke");
  await page.waitForFunction(() => document.querySelector("#portal-expiry").textContent.startsWith("Revoked"));
  check(await asCustomer("GET", `/v1/apps/${APP}/endpoints`) === 401, "revoked by a click: the token is refused (401)");

  // The event-type catalog: a bad schema is refused with its reason shown
  // next to the form; a good one is listed, and its schema holds at ingest.
  await page.waitForSelector("#catalog-form:not(.hidden)");
  const errorsBefore = consoleErrors.length;
  await page.fill("#ct-name", "order.shipped");
  await page.fill("#ct-desc", "An order left the warehouse");
  await page.fill("#ct-schema", '{"type": 5}');
  await page.click("#ct-save");
  await page.waitForFunction(() => document.querySelector("#ct-error").textContent.startsWith("invalid_schema"));
  check(true, "a bad schema is refused in the form: " + (await page.textContent("#ct-error")).slice(0, 80));
  await page.fill("#ct-schema", "{not json");
  await page.click("#ct-save");
  await page.waitForFunction(() => document.querySelector("#ct-error").textContent.includes("not JSON"));
  check(true, "text that is not JSON is caught before sending");
  await page.fill("#ct-schema", JSON.stringify({ type: "object", required: ["tracking"], properties: { tracking: { type: "string" } } }));
  await page.fill("#ct-example", '{"tracking": 42}');
  await page.click("#ct-save");
  await page.waitForFunction(() => document.querySelector("#ct-error").textContent.startsWith("example_schema_mismatch"));
  check(true, "an example breaking the schema is refused: " + (await page.textContent("#ct-error")).slice(0, 80));
  // The browser logs each refused PUT (400) as a console error: exactly
  // those two are expected here, nothing else.
  const refusedPuts = consoleErrors.splice(errorsBefore);
  check(refusedPuts.length === 2 && refusedPuts.every((m) => m.includes("status of 400")),
    "the console shows only the 2 refused saves");
  await page.fill("#ct-example", '{"tracking": "BR123"}');
  await page.click("#ct-save");
  await page.waitForSelector('#catalog tr.event-type[data-name="order.shipped"]');
  check((await page.textContent('#catalog tr.event-type[data-name="order.shipped"]')).includes("JSON Schema + example"),
    "the saved type is listed with its schema and example");
  const refused = await call("POST", `/v1/apps/${APP}/events`, { event_type: "order.shipped", payload: { tracking: 7 } });
  check(refused.status === 400 && refused.body.error.code === "payload_schema_mismatch" && refused.body.error.location === "/tracking",
    "ingest holds the schema saved from the dashboard (400 at /tracking)");
  await page.click('#catalog tr.event-type[data-name="order.shipped"] button.edit');
  check(await page.inputValue("#ct-name") === "order.shipped" && (await page.inputValue("#ct-schema")).includes("tracking"),
    "edit fills the form with the stored type");

  const shot = path.join(outDir, "dashboard.png");
  await page.screenshot({ path: shot, fullPage: true });
  check(true, "screenshot saved: " + shot);
  page.once("dialog", (d) => d.accept());
  await page.click('#catalog tr.event-type[data-name="order.shipped"] button.delete');
  await page.waitForFunction(() => !document.querySelector('#catalog tr.event-type[data-name="order.shipped"]'));
  check((await call("GET", "/v1/event-types/order.shipped")).status === 404, "deleted by a click (the API agrees: 404)");
  check(consoleErrors.length === 0, "no console errors" + (consoleErrors.length ? ": " + consoleErrors.join("; ") : ""));
  writeFileSync(path.join(outDir, "dashboard.txt"),
    `browser test: 5 deliveries listed, 3 failed filtered, 1 retried by click -> delivered; endpoint health (success 25% / 100%, chart, latency), disable + enable by click, rate limit shown, resend by click, replay missed by click (1 replayed, then 0), portal link created (token: own endpoints 200, events 403, other app 403) and revoked by click (401), event-type catalog (bad schema and example refused in the form, saved, held at ingest, edited, deleted); screenshot ${shot}\n`);
}

await run("browser", main);
