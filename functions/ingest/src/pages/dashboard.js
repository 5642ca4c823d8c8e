// The dashboard's own script, served after common.js as `GET /dashboard/app.js`
// so the page's Content-Security-Policy can allow scripts from its own origin only.
"use strict";
auth.key = sessionStorage.getItem("hookline.key") || "";
const state = { app: sessionStorage.getItem("hookline.app") || "",
  cursor: null, items: [], selected: null, endpoints: new Map(), timer: null, admin: false };

const appPath = () => "/v1/apps/" + encodeURIComponent(state.app);


function filterQuery() {
  const q = new URLSearchParams();
  const status = $("f-status").value, ep = $("f-endpoint").value, type = $("f-type").value.trim(), after = $("f-after").value;
  if (status) q.set("status", status);
  if (ep) q.set("endpoint_id", ep);
  if (type) q.set("event_type", type);
  if (after) q.set("created_after", new Date(after).toISOString());
  return q;
}

function endpointLabel(id) {
  const ep = state.endpoints.get(id);
  if (!ep) return id;
  return ep.description ? ep.description + " · " + ep.url : ep.url;
}

function renderRows() {
  const body = $("rows");
  body.replaceChildren();
  if (state.items.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: "6", class: "empty", text: "No deliveries match." })));
  }
  for (const d of state.items) {
    const retry = d.status === "failed"
      ? el("button", { class: "ghost small retry", type: "button", "data-id": d.id, onclick: (e) => { e.stopPropagation(); retryDelivery(d.id); } }, "Retry")
      : d.status === "delivered"
        ? el("button", { class: "ghost small resend", type: "button", "data-id": d.id, title: "Send it again (same webhook-id)", onclick: (e) => { e.stopPropagation(); retryDelivery(d.id, true); } }, "Resend")
        : null;
    const row = el("tr", { class: "delivery" + (state.selected === d.id ? " selected" : ""), "data-id": d.id, "data-status": d.status, onclick: () => select(d.id) },
      el("td", {}, badge(d.status)),
      eventCell(d, d.id),
      el("td", { class: "mono ep", title: endpointLabel(d.endpoint_id), text: endpointLabel(d.endpoint_id) }),
      el("td", { title: d.total_attempts + " attempts in all", text: d.attempt_count + (d.manual_retries ? " · " + d.manual_retries + "× retried" : "") }),
      el("td", { class: "muted when", title: d.updated_at, text: ago(d.updated_at) }),
      el("td", { class: "act" }, retry));
    body.append(row);
  }
  $("page-info").textContent = state.items.length + " shown";
  $("more").disabled = !state.cursor;
}

async function loadDeliveries(append) {
  const q = filterQuery();
  q.set("limit", "50");
  if (append && state.cursor) q.set("cursor", state.cursor);
  const page = await api("GET", appPath() + "/deliveries?" + q.toString());
  state.items = append ? state.items.concat(page.items) : page.items;
  state.cursor = page.next_cursor;
  renderRows();
}

async function loadCounts() {
  for (const status of ["pending", "delivered", "failed"]) {
    const page = await api("GET", appPath() + "/deliveries?limit=500&status=" + status);
    $("count-" + status).textContent = page.items.length + (page.next_cursor ? "+" : "");
  }
}

async function loadDlq() {
  try {
    const dlq = await api("GET", "/v1/dlq");
    state.admin = true;
    $("dlq-depth").textContent = dlq.depth;
    $("redrive").disabled = false;
  } catch (e) {
    if (e.status !== 403) throw e;
    state.admin = false;
    $("dlq-depth").textContent = "admin only";
    $("redrive").disabled = true;
  }
}

async function loadEndpoints() {
  const list = await api("GET", appPath() + "/endpoints");
  state.endpoints = new Map(list.items.map((e) => [e.id, e]));
  const select = $("f-endpoint"), current = select.value;
  select.replaceChildren(el("option", { value: "" }, "any"),
    ...list.items.map((e) => el("option", { value: e.id }, e.url + (e.disabled ? " (disabled)" : ""))));
  select.value = current;
}

async function select(id) {
  state.selected = id;
  renderRows();
  await renderDetail();
}

async function renderDetail() {
  const panel = $("detail");
  if (!state.selected) return;
  let d;
  try { d = await api("GET", appPath() + "/deliveries/" + encodeURIComponent(state.selected)); }
  catch (e) { panel.replaceChildren(el("div", { class: "empty", text: e.message })); return; }
  panel.replaceChildren(...deliveryDetail(d, endpointLabel, retryDelivery));
}

async function retryDelivery(id, resend) {
  const what = resend ? "Resend" : "Retry";
  try {
    await api("POST", appPath() + "/deliveries/" + encodeURIComponent(id) + "/retry");
    toast(what + " queued for " + id);
  } catch (e) { toast(what + " failed: " + e.message, true); }
  await refresh();
}


async function loadEndpointHealth() {
  const eps = [...state.endpoints.values()].slice(0, 20);
  const stats = await Promise.all(eps.map((e) =>
    api("GET", appPath() + "/endpoints/" + encodeURIComponent(e.id) + "/stats").catch(() => null)));
  const body = $("endpoints");
  body.replaceChildren();
  if (eps.length === 0) body.append(el("tr", {}, el("td", { colspan: "7", class: "empty", text: "No endpoints." })));
  eps.forEach((e, i) => {
    const s = stats[i] || { success_rate: null, latency_ms: {}, pending: null, hours: [] };
    const toggle = el("button", { class: "ghost small toggle", type: "button", "data-id": e.id,
      onclick: () => setDisabled(e.id, !e.disabled) }, e.disabled ? "Enable" : "Disable");
    body.append(el("tr", { class: "endpoint", "data-id": e.id, "data-disabled": String(e.disabled) },
      el("td", { class: "mono ep", title: e.url, text: endpointLabel(e.id) }),
      endpointState(e),
      el("td", { class: "rate", text: pct(s.success_rate) }),
      el("td", { class: "latency", text: ms(s.latency_ms.p50) + " / " + ms(s.latency_ms.p95) }),
      el("td", { class: "waiting", text: s.pending === null ? "–" : String(s.pending) }),
      el("td", { class: "chart" }, hourChart(s)),
      el("td", { class: "act" }, toggle, " ", replayControls(e))));
  });
}

// "Replay missed": the events of the chosen window this endpoint never had.
function replayControls(e) {
  const label = "Replay window for " + endpointLabel(e.id);
  const windowSel = el("select", { class: "small replay-window", "aria-label": label },
    el("option", { value: "3600" }, "last hour"),
    el("option", { value: "86400" }, "last 24 h"),
    el("option", { value: "604800" }, "last 7 days"));
  const button = el("button", { class: "ghost small replay", type: "button", "data-id": e.id,
    title: e.disabled ? "Enable the endpoint first" : "Send it the events of the window it never had",
    onclick: () => replayMissed(e.id, Number(windowSel.value)) }, "Replay missed");
  if (e.disabled) button.disabled = true;
  return el("span", { class: "replay-controls" }, windowSel, " ", button);
}

async function replayMissed(id, seconds) {
  const since = new Date(Date.now() - seconds * 1000).toISOString();
  try {
    const r = await api("POST", appPath() + "/endpoints/" + encodeURIComponent(id) + "/replay", { since });
    toast(r.complete
      ? "Replay: " + r.replayed + " replayed of " + r.scanned + " events"
      : "Replay running in the background: " + r.replayed + " replayed so far");
    if (!r.complete) followReplay(r.status_url, 0);
  } catch (e) { toast("Replay failed: " + e.message, true); }
  await refresh();
}

// Polls a running replay's status until it is complete (bounded).
async function followReplay(url, polls) {
  if (polls > 100) return;
  await new Promise((r) => setTimeout(r, 3000));
  try {
    const r = await api("GET", url);
    if (r.complete) toast("Replay done: " + r.replayed + " replayed of " + r.scanned + " events" + (r.stopped ? " (" + r.stopped + ")" : ""));
    else followReplay(url, polls + 1);
  } catch (e) { toast("Replay status failed: " + e.message, true); }
}

async function setDisabled(id, disabled) {
  try {
    await api("PATCH", appPath() + "/endpoints/" + encodeURIComponent(id), { disabled });
    toast((disabled ? "Disabled " : "Enabled ") + endpointLabel(id));
  } catch (e) { toast("Change failed: " + e.message, true); }
  await loadEndpoints();
  await refresh();
}

async function redrive() {
  try {
    const r = await api("POST", "/v1/dlq/redrive", { max_messages: 1000 });
    toast("Redrive: " + r.redriven + " restarted, " + r.requeued + " requeued, " + r.received + " looked at");
  } catch (e) { toast("Redrive failed: " + e.message, true); }
  await refresh();
}

// The event-type catalog: read with any key, changed with the admin key.
// Loaded on connect and after a change (not on every refresh).

function fillCatalogForm(t) {
  $("ct-name").value = t ? t.name : "";
  $("ct-desc").value = t && t.description ? t.description : "";
  $("ct-schema").value = t ? pretty(t.schema) : "";
  $("ct-example").value = t ? pretty(t.example) : "";
  $("ct-error").textContent = "";
  if (t) $("ct-name").focus();
}

async function loadCatalog() {
  const items = [];
  let cursor = null;
  do {
    const q = new URLSearchParams({ limit: "100" });
    if (cursor) q.set("cursor", cursor);
    const page = await api("GET", "/v1/event-types?" + q.toString());
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < 1000);
  const body = $("catalog");
  body.replaceChildren();
  if (items.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: "5", class: "empty", text: "No event types yet: any type is accepted." })));
  }
  for (const t of items) {
    const actions = state.admin
      ? [el("button", { class: "ghost small edit", type: "button", onclick: () => fillCatalogForm(t) }, "Edit"), " ",
         el("button", { class: "ghost small delete", type: "button", onclick: () => deleteEventType(t.name) }, "Delete")]
      : [];
    body.append(el("tr", { class: "event-type", "data-name": t.name },
      el("td", { class: "mono", text: t.name }),
      el("td", { text: t.description || "" }),
      el("td", { class: "muted", title: t.schema ? pretty(t.schema) : "", text: t.schema ? "JSON Schema" + (t.example ? " + example" : "") : "none" }),
      el("td", { class: "muted when", title: t.updated_at, text: ago(t.updated_at) }),
      el("td", { class: "act" }, ...actions)));
  }
  $("catalog-form").classList.toggle("hidden", !state.admin);
}

function parseJsonField(id, label) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  try { return JSON.parse(text); } catch (e) { throw new Error(label + " is not JSON: " + e.message); }
}

async function saveEventType() {
  const name = $("ct-name").value.trim();
  const error = $("ct-error");
  error.textContent = "";
  if (!name) { error.textContent = "A name is needed (e.g. order.paid)."; $("ct-name").focus(); return; }
  let body;
  try {
    body = { schema: parseJsonField("ct-schema", "The schema"), example: parseJsonField("ct-example", "The example") };
  } catch (e) { error.textContent = e.message; return; }
  const description = $("ct-desc").value.trim();
  if (description) body.description = description;
  try {
    await api("PUT", "/v1/event-types/" + encodeURIComponent(name), body);
  } catch (e) {
    error.textContent = errorText(e);
    return;
  }
  toast("Saved " + name);
  fillCatalogForm(null);
  await loadCatalog().catch((e) => toast(e.message, true));
}

async function deleteEventType(name) {
  if (!confirm("Delete the event type " + name + "? Its events are then accepted without a schema check.")) return;
  try {
    await api("DELETE", "/v1/event-types/" + encodeURIComponent(name));
    toast("Deleted " + name);
  } catch (e) { toast("Delete failed: " + e.message, true); }
  await loadCatalog().catch((e) => toast(e.message, true));
}

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    await loadEndpoints();
    await Promise.all([loadDeliveries(false), loadCounts(), loadDlq(), loadEndpointHealth()]);
    if (state.selected) await renderDetail();
    $("live-dot").className = "dot";
    $("live-text").textContent = "live · updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("live-dot").className = "dot off";
    $("live-text").textContent = "error: " + e.message;
    if (e.status === 401) signOut("The API key was refused.");
  } finally { refreshing = false; }
}

// A portal session for this app's customers: the link is shown once.
async function createPortalLink() {
  const seconds = Number($("portal-ttl").value);
  const s = await api("POST", appPath() + "/portal-sessions", { expires_in_seconds: seconds });
  state.portalSession = s.id;
  $("portal-url").value = s.url;
  $("portal-out").classList.remove("hidden");
  $("portal-expiry").textContent = "Works until " + new Date(s.expires_at).toLocaleString() + " (session " + s.id + ").";
}

async function revokePortalLink() {
  if (!state.portalSession) return;
  await api("DELETE", appPath() + "/portal-sessions/" + encodeURIComponent(state.portalSession));
  $("portal-expiry").textContent = "Revoked: the link no longer works.";
  $("portal-url").value = "";
  $("portal-out").classList.add("hidden");
  state.portalSession = null;
}

async function connect() {
  try {
    await loadEndpoints();
  } catch (e) {
    $("login-error").textContent = e.status === 401 ? "That API key was refused." : e.status === 403 ? "That key is for another app." : e.message;
    auth.key = ""; sessionStorage.removeItem("hookline.key");
    return;
  }
  sessionStorage.setItem("hookline.key", auth.key);
  sessionStorage.setItem("hookline.app", state.app);
  $("login").classList.add("hidden");
  $("app").classList.remove("hidden");
  $("logout").classList.remove("hidden");
  await refresh();
  await loadCatalog().catch((e) => toast("Event types: " + e.message, true));
  clearInterval(state.timer);
  state.timer = setInterval(refresh, 3000);
}

function signOut(message) {
  clearInterval(state.timer);
  auth.key = ""; sessionStorage.removeItem("hookline.key");
  $("app").classList.add("hidden");
  $("logout").classList.add("hidden");
  $("login").classList.remove("hidden");
  $("login-error").textContent = message || "";
  $("live-dot").className = "dot off";
  $("live-text").textContent = "not connected";
}

$("login-form").addEventListener("submit", (e) => {
  e.preventDefault();
  state.app = $("login-app").value.trim();
  auth.key = $("login-key").value.trim();
  $("login-key").value = "";
  connect();
});
$("filters").addEventListener("submit", (e) => { e.preventDefault(); state.selected = null; refresh(); });
$("f-status").addEventListener("change", () => refresh());
$("f-endpoint").addEventListener("change", () => refresh());
$("f-clear").addEventListener("click", () => { $("filters").reset(); refresh(); });
$("more").addEventListener("click", () => loadDeliveries(true).catch((e) => toast(e.message, true)));
$("redrive").addEventListener("click", redrive);
$("catalog-form").addEventListener("submit", (e) => { e.preventDefault(); saveEventType(); });
$("ct-clear").addEventListener("click", () => fillCatalogForm(null));
$("logout").addEventListener("click", () => signOut());
$("portal-link").addEventListener("click", () => createPortalLink().catch((e) => toast("Portal link: " + e.message, true)));
$("portal-revoke").addEventListener("click", () => revokePortalLink().catch((e) => toast("Revoke: " + e.message, true)));
$("portal-copy").addEventListener("click", () => {
  $("portal-url").select();
  navigator.clipboard.writeText($("portal-url").value).then(() => toast("Link copied"), () => toast("Select the link and copy it", true));
});
$("login-app").value = state.app;
if (auth.key && state.app) connect();
