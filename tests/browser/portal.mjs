// The consumer portal in a real browser (headless Debian Chromium, driven by
// playwright-core) against the whole local stack on moto, as an app's
// customer uses it: the operator opens a portal session; the customer opens
// its link, which signs in (and leaves no token in the address bar), reads
// the catalog, creates an endpoint (bad input refused in the form), sends a
// test event that a loopback receiver gets and verifies with the secret the
// page showed once, sees it in the delivery log with its attempt, rotates
// the secret (both secrets sign during the overlap), resends, edits; once
// the operator revokes the session the page signs out and the token is
// refused. Screenshots of the live portal and of the signed-out page are
// saved. The page runs under its strict policy: a violation or any console
// error other than the refusals the test provokes fails it.
//
//   node tests/browser/portal.mjs <hookline-local binary> <output dir>
import crypto from "node:crypto";
import { isDeepStrictEqual } from "node:util";
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { bound, check, client, launchBrowser, receiver, run, startStack, until } from "./lib.mjs";

const [binary, outDir] = process.argv.slice(2);
if (!binary || !outDir) {
  console.error("usage: portal.mjs <hookline-local binary> <output dir>");
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });
const ADMIN_KEY = "portal-test-admin-key";
const APP = "shop";
bound(240_000); // the whole test is bounded

// Standard Webhooks: v1 = base64(HMAC-SHA256(key, "id.timestamp.body")),
// key = the base64 after `whsec_`; the header lists one per signing secret.
function signedWith(secret, h, body) {
  const key = Buffer.from(secret.slice("whsec_".length), "base64");
  const mac = crypto.createHmac("sha256", key)
    .update(`${h["webhook-id"]}.${h["webhook-timestamp"]}.${body}`).digest("base64");
  return (h["webhook-signature"] || "").split(" ").includes("v1," + mac);
}

async function main() {
  const got = [];
  const hookUrl = await receiver((req, body) => {
    got.push({ headers: req.headers, body });
    return { status: 200, body: "received" };
  });
  const base = await startStack(binary, {
    WEBHOOKS_ADMIN_KEY: ADMIN_KEY,
    WEBHOOKS_RETRY_SCHEDULE: "1s",
    WEBHOOKS_MAX_ATTEMPTS: "2",
    WEBHOOKS_DELIVERY_TIMEOUT: "2s",
    // deliver keeps endpoints (their secrets) this long
    WEBHOOKS_ENDPOINT_CACHE_TTL: "1s",
  });
  console.log("stack at " + base);
  const admin = client(base, ADMIN_KEY);

  // The provider's catalog, and an endpoint of another app the customer
  // must never see.
  const example = { order_id: "ord_1001", total: 1999, currency: "EUR" };
  const put = await admin("PUT", "/v1/event-types/order.paid", {
    description: "An order was paid",
    schema: { type: "object", required: ["order_id", "total"],
      properties: { order_id: { type: "string" }, total: { type: "integer" }, currency: { type: "string" } } },
    example,
  });
  check(put.status === 201, "catalog type order.paid with a schema and an example");
  await admin("PUT", "/v1/event-types/invoice.created", { description: "An invoice was issued", example: { invoice: "inv_7" } });
  const other = await admin("POST", "/v1/apps/other/endpoints", { url: hookUrl, description: "another customer" });
  check(other.status === 201, "another app's endpoint exists");

  const session = await admin("POST", `/v1/apps/${APP}/portal-sessions`, { expires_in_seconds: 3600 });
  check(session.status === 201 && session.body.url === `${base}/portal#app=${APP}&token=${session.body.token}`,
    "the operator opens a portal session: its link is this API's /portal");

  const browser = await launchBrowser();
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const consoleErrors = [];
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  const dialogs = [];
  page.on("dialog", (d) => { dialogs.push(d.message()); d.accept(); });

  // Sign in by the link.
  await page.goto(session.body.url);
  await page.waitForSelector("#portal:not(.hidden)");
  check(await page.title() === "hookline · webhooks portal", "the link opens the portal, signed in");
  check(page.url() === base + "/portal", "the token is taken out of the address bar: " + page.url());
  check(await page.textContent("#app-name") === APP, "it names the app");
  // The portal shows itself before its endpoint list has loaded.
  await page.waitForFunction(() => document.querySelector("#endpoints").textContent.trim() !== "", null, { timeout: 15_000 });
  check((await page.textContent("#endpoints")).includes("No endpoints yet"), "the app's endpoints: none yet (not the other app's)");

  // The catalog, with schemas and examples.
  const types = await page.$$eval("#catalog details.event-type", (d) => d.map((x) => x.dataset.name));
  check(types.join(",") === "invoice.created,order.paid", "the catalog lists both types: " + types);
  await page.click('#catalog details[data-name="order.paid"] summary');
  check((await page.textContent('#catalog details[data-name="order.paid"] pre.schema')).includes('"order_id"'), "its schema is shown");
  check((await page.textContent('#catalog details[data-name="order.paid"] pre.example')).includes("ord_1001"), "its example is shown");

  // Create an endpoint; bad input is refused in the form with the reason.
  await page.click("#ep-add");
  await page.fill("#ep-url", "not a url");
  await page.click("#ep-save");
  await page.waitForFunction(() => document.querySelector("#ep-error").textContent.length > 0);
  check(true, "a bad URL is refused in the form: " + await page.textContent("#ep-error"));
  await page.fill("#ep-url", hookUrl);
  await page.fill("#ep-desc", "orders");
  await page.fill("#ep-patterns", "order.payed");
  await page.click("#ep-save");
  await page.waitForFunction(() => document.querySelector("#ep-error").textContent.includes("order.paid"));
  check(true, "a type not in the catalog is refused with the closest name: " + await page.textContent("#ep-error"));
  await page.fill("#ep-patterns", "");
  await page.check('#ep-type-list input[value="order.paid"]');
  await page.fill("#ep-headers", "X-Customer: 42\nAuthorization: Bearer customer-token");
  await page.click("#ep-save");
  await page.waitForSelector("#secret-panel:not(.hidden)");
  const secret = await page.inputValue("#secret-value");
  check(/^whsec_[A-Za-z0-9+/=]{32,}$/.test(secret), "the signing secret is shown once");
  await page.click("#secret-done");
  check(await page.inputValue("#secret-value") === "", "and cleared when done");
  const listed = await admin("GET", `/v1/apps/${APP}/endpoints`);
  check(listed.body.items.length === 1, "the API has the new endpoint");
  const ep = listed.body.items[0];
  check(ep.url === hookUrl && ep.description === "orders" && ep.event_types.join() === "order.paid"
    && ep.headers["X-Customer"] === "42" && ep.headers.Authorization === "********",
    "with its types and headers (the credential masked in answers)");
  const row = `#endpoints tr.endpoint[data-id="${ep.id}"]`;
  await page.waitForSelector(row);

  // A test event: the form offers the endpoint's types, prefilled with the
  // catalog's example; a payload breaking the schema is refused.
  const offered = await page.$$eval("#test-type option", (o) => o.map((x) => x.value));
  check(offered.join() === "order.paid", "the test form offers the types the endpoint receives: " + offered);
  check(JSON.parse(await page.inputValue("#test-payload")).order_id === "ord_1001", "prefilled with the example");
  await page.fill("#test-payload", '{"order_id": 5, "total": 1}');
  await page.click("#test-send");
  await page.waitForFunction(() => document.querySelector("#test-error").textContent.startsWith("payload_schema_mismatch"), null, { timeout: 10_000 })
    .catch(async (e) => { throw new Error(e.message + "; the form says: " + await page.textContent("#test-error") + "; toast: " + await page.textContent("#toast")); });
  check((await page.textContent("#test-error")).includes("/order_id"), "a payload breaking the schema is refused where it breaks: " + await page.textContent("#test-error"));
  await page.selectOption("#test-type", "order.paid"); // refills the example
  await page.click("#test-send");
  const first = await until("the test event to arrive", async () => got[0], 30_000);
  check(signedWith(secret, first.headers, first.body), "the receiver verifies its signature with the secret the page showed");
  const envelope = JSON.parse(first.body);
  check(envelope.type === "order.paid" && isDeepStrictEqual(envelope.data, example), "its data is the catalog example");
  check(first.headers["x-customer"] === "42" && first.headers.authorization === "Bearer customer-token",
    "the custom headers arrive");

  // The delivery log: the test event, delivered, its attempt with the 200.
  await page.waitForFunction(() => document.querySelector("#detail .badge")?.textContent === "delivered", null, { timeout: 30_000 });
  check((await page.textContent("#timeline")).includes("200"), "the log shows it delivered, attempt 1 answered 200");
  check((await page.textContent("#detail")).includes(first.headers["webhook-id"]), "with the webhook-id the receiver got");
  check(await page.locator("#rows tr.delivery").count() === 1, "one delivery in the log (nothing of the other app)");
  await page.waitForFunction((r) => document.querySelector(r + " td.rate")?.textContent === "100%", row, { timeout: 30_000 });
  check(await page.locator(`${row} svg.chart rect.ok`).count() === 1, "the endpoint's health: 100%, one green bar");

  // Rotate the secret: the new one is shown once; during the overlap both sign.
  await page.click(`${row} button.rotate`);
  await page.waitForSelector("#secret-panel:not(.hidden)");
  const rotated = await page.inputValue("#secret-value");
  check(dialogs.at(-1).startsWith("Rotate the signing secret") && rotated.startsWith("whsec_") && rotated !== secret,
    "rotated after a confirmation: a new secret shown");
  await page.click("#secret-done");
  await new Promise((r) => setTimeout(r, 1500)); // past deliver's endpoint cache
  await page.click(`${row} button.test`);
  await page.click("#test-send");
  const second = await until("the second test event", async () => got[1], 30_000);
  check(signedWith(rotated, second.headers, second.body) && signedWith(secret, second.headers, second.body),
    "the next webhook is signed with the new secret and, during the overlap, the old one");

  // Resend from the log, by keyboard: same webhook-id.
  await page.waitForFunction(() => document.querySelectorAll("#rows tr.delivery").length === 2);
  const oldest = `#rows tr.delivery >> nth=1`;
  await page.focus(oldest);
  await page.keyboard.press("Enter");
  await page.waitForFunction((id) => document.querySelector("#detail")?.textContent.includes(id), first.headers["webhook-id"]);
  check(true, "a delivery opens from the keyboard (Enter)");
  await page.click("#detail-resend");
  const third = await until("the resend", async () => got[2], 30_000);
  check(third.headers["webhook-id"] === first.headers["webhook-id"] && signedWith(rotated, third.headers, third.body),
    "resent by a click: the same webhook-id, signed with the current secret");

  // Edit: a rate limit; the stored credential header is kept.
  await page.click(`${row} button.edit`);
  check((await page.inputValue("#ep-headers")).includes("Authorization: ********"), "the edit form shows the credential masked");
  await page.fill("#ep-rate", "5");
  await page.click("#ep-save");
  await page.waitForFunction((r) => document.querySelector(r + " .rate-limit")?.textContent === "≤ 5 req/s", row);
  check(true, "edited: the row shows the rate limit");
  await page.click(`${row} button.test`);
  await page.click("#test-send");
  const fourth = await until("the webhook after the edit", async () => got[3], 30_000);
  check(fourth.headers.authorization === "Bearer customer-token", "the masked credential kept its stored value");

  // Disable, miss an event, enable, replay what was missed: it arrives once.
  await page.click(`${row} button.toggle`);
  await page.waitForFunction((r) => document.querySelector(r)?.dataset.disabled === "true", row);
  check(await page.isDisabled(`${row} button.replay`), "disabled by a click; replay waits for it to be enabled");
  const missed = await admin("POST", `/v1/apps/${APP}/events`, { event_type: "order.paid", payload: { order_id: "ord_missed", total: 5 } });
  check(missed.status === 202 && missed.body.delivery_ids.length === 0, "an event sent meanwhile goes nowhere");
  await page.click(`${row} button.toggle`);
  await page.waitForFunction((r) => document.querySelector(r)?.dataset.disabled === "false", row);
  await page.selectOption(`${row} select.replay-window`, "3600");
  await page.click(`${row} button.replay`);
  await page.waitForFunction(() => /^Replay: 1 replayed/.test(document.querySelector("#toast").textContent));
  const replayed = await until("the replayed event", async () => got[4], 30_000);
  check(JSON.parse(replayed.body).data.order_id === "ord_missed" && signedWith(rotated, replayed.headers, replayed.body),
    "replay missed by a click: the event sent while disabled arrives, signed");
  await page.click(`${row} button.replay`);
  await page.waitForFunction(() => /^Replay: 0 replayed/.test(document.querySelector("#toast").textContent));
  check(got.length === 5, "a second replay sends nothing more (test events are never replayed)");

  await page.waitForFunction(() => document.querySelectorAll('#rows tr.delivery[data-status="delivered"]').length === 4
    && document.querySelector("#detail .badge")?.textContent === "delivered", null, { timeout: 30_000 });
  check(true, "the log lists the 3 test events and the replayed event, delivered");
  const shot = path.join(outDir, "portal.png");
  await page.screenshot({ path: shot, fullPage: true });
  check(true, "screenshot saved: " + shot);

  // A link to another app's portal does not move this tab there by itself:
  // the page asks; staying keeps this app's session; switching needs the
  // click. (A customer could otherwise be sent into someone else's app.)
  const otherSession = await admin("POST", "/v1/apps/other/portal-sessions", {});
  check(otherSession.status === 201, "a portal session of another app");
  const switchAsked = async () => {
    await page.goto(otherSession.body.url);
    await page.waitForSelector("#switch:not(.hidden)", { timeout: 10_000 });
    check(page.url() === base + "/portal", "the other link's token is taken out of the address bar");
    check((await page.textContent("#switch-message")).includes("\u201cother\u201d")
      && await page.textContent("#app-name") === APP, "the page asks before switching, still on " + APP);
  };
  await switchAsked();
  await page.click("#switch-no");
  await page.waitForSelector("#switch", { state: "hidden" });
  const kept = await page.evaluate(() => JSON.parse(sessionStorage.getItem("hookline.portal")).app);
  check(kept === APP && await page.textContent("#app-name") === APP, "staying keeps this tab's session: " + kept);
  await switchAsked();
  await page.click("#switch-yes");
  await page.waitForFunction(() => document.querySelector("#app-name").textContent === "other"
    && document.querySelector("#endpoints").textContent.includes("another customer"), null, { timeout: 15_000 });
  check(true, "switching takes the click: the other app's endpoints are shown");
  // Back to this app the same way.
  await page.goto(session.body.url);
  await page.waitForSelector("#switch:not(.hidden)", { timeout: 10_000 });
  await page.click("#switch-yes");
  await page.waitForFunction((app) => document.querySelector("#app-name").textContent === app, APP, { timeout: 15_000 });

  // Revoked by the operator: the page signs out on its next refresh, the
  // token is refused.
  const revoked = await admin("DELETE", `/v1/apps/${APP}/portal-sessions/${session.body.id}`);
  check(revoked.status === 204, "the operator revokes the session");
  await page.waitForSelector("#signin:not(.hidden)", { timeout: 15_000 });
  check((await page.textContent("#signin-message")).includes("expired or was revoked"), "the page signs out and says why");
  const refused = await client(base, session.body.token)("GET", `/v1/apps/${APP}/endpoints`);
  check(refused.status === 401, "the token is refused (401)");
  await page.reload();
  check(await page.isVisible("#signin") && !(await page.isVisible("#portal"))
    && (await page.textContent("#signin-message")).includes("expired or was revoked"),
    "a reload stays signed out (no token kept) and still says why");
  const shot2 = path.join(outDir, "portal-signed-out.png");
  await page.screenshot({ path: shot2 });

  // The refusals this test provoked (the bad URL, the unknown type, the
  // schema mismatch: 400; the revoked session: 401) are the only console errors.
  const unexpected = consoleErrors.filter((m) => !/status of 40[01]/.test(m));
  const refusals = consoleErrors.length - unexpected.length;
  check(unexpected.length === 0 && refusals >= 4 && refusals <= 8,
    `no console errors but the ${refusals} provoked refusals` + (unexpected.length ? ": " + unexpected.join("; ") : ""));
  writeFileSync(path.join(outDir, "portal.txt"),
    `portal browser test: signed in by the link (token out of the address bar), catalog with schema and example, endpoint created by the form (bad URL and unknown type refused), secret shown once, test event received and verified by a loopback receiver (example body, custom headers), log shows it delivered with its attempt, health 100%, secret rotated (both sign during the overlap), resent by keyboard + click (same webhook-id), edited (rate limit, masked credential kept), disabled + enabled, replay missed (1 then 0), another app's link asks before switching (stay keeps the session, switch takes the click), revoked by the operator -> signed out, token 401; screenshots ${shot}, ${shot2}\n`);
}

await run("portal", main);
