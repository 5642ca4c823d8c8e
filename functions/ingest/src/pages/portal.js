// The consumer portal's own script, served after common.js as
// `GET /portal/app.js`. A customer arrives by a portal session's link
// (`/portal#app=…&token=…`): the token is kept in this tab's session storage
// and taken out of the address bar at once; every call goes to the app's
// portal routes with it, and a 401 (expired or revoked) signs out.
"use strict";
const STORE = "hookline.portal";
// Why this tab was signed out, shown again after a reload.
const ENDED = "hookline.portal.ended";
const state = { app: "", endpoints: new Map(), catalog: [], cursor: null, items: [], selected: null,
  editing: null, timer: null, testFor: "" };

const appPath = () => "/v1/apps/" + encodeURIComponent(state.app);
const endpointPath = (id) => appPath() + "/endpoints/" + encodeURIComponent(id);

// A link to another app's portal met while this tab is signed in: held
// (never stored) until the user chooses, so a link cannot silently move
// the tab into someone else's app (where a customer would then register
// its receivers and credentials).
let pending = null;

function savedSession() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(STORE) || "null");
    return saved && saved.token && saved.app ? saved : null;
  } catch (_) { sessionStorage.removeItem(STORE); return null; }
}

// The link's fragment, once: removed from the address bar and history (so a
// copied address or a screenshot shows no token), then stored for this tab,
// unless the tab is signed in to another app: then the user is asked.
function signInFromLink() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = fragment.get("token"), app = fragment.get("app");
  if (token && app) {
    history.replaceState(null, "", location.pathname + location.search);
    const current = savedSession();
    if (current && current.app !== app) {
      pending = { token, app };
      $("switch-message").textContent = "This link opens the webhooks portal of \u201c" + app
        + "\u201d. This tab is signed in to \u201c" + current.app + "\u201d. Switch to \u201c" + app
        + "\u201d? Only switch if you expected this link.";
      $("switch").classList.remove("hidden");
    } else {
      sessionStorage.setItem(STORE, JSON.stringify({ token, app }));
      sessionStorage.removeItem(ENDED);
    }
  }
  const saved = savedSession();
  if (saved) { auth.key = saved.token; state.app = saved.app; }
}

function answerSwitch(accept) {
  const link = pending;
  pending = null;
  $("switch").classList.add("hidden");
  if (!accept || !link) return;
  sessionStorage.setItem(STORE, JSON.stringify(link));
  sessionStorage.removeItem(ENDED);
  // A fresh page for the other app: nothing of this one (a refresh in
  // flight, a selected delivery) carries over.
  location.reload();
}

function signOut(message) {
  clearInterval(state.timer);
  auth.key = ""; state.app = "";
  sessionStorage.removeItem(STORE);
  $("portal").classList.add("hidden");
  $("signout").classList.add("hidden");
  $("signin").classList.remove("hidden");
  $("app-name").textContent = "";
  if (message) {
    $("signin-message").textContent = message;
    sessionStorage.setItem(ENDED, message);
  }
  $("live-dot").className = "dot off";
  $("live-text").textContent = "signed out";
}

// A failed call: a dead session signs out; anything else is shown.
function failed(what, e) {
  if (e.status === 401) { signOut("This link has expired or was revoked. Ask for a new portal link."); return; }
  toast(what + ": " + e.message, true);
}

function endpointLabel(id) {
  const ep = state.endpoints.get(id);
  if (!ep) return id;
  return ep.description ? ep.description + " · " + ep.url : ep.url;
}

// Whether an endpoint's filters (exact names, `prefix.*`, `*`; none = all)
// admit a type, as the server decides.
function subscribes(ep, type) {
  return ep.event_types.length === 0 || ep.event_types.some((p) => p === "*" || p === type
    || (p.endsWith(".*") && type.length > p.length - 1 && type.startsWith(p.slice(0, -1))));
}

// ---- endpoints --------------------------------------------------------

async function loadEndpoints() {
  const list = await api("GET", appPath() + "/endpoints");
  state.endpoints = new Map(list.items.map((e) => [e.id, e]));
  const filter = $("f-endpoint"), current = filter.value;
  filter.replaceChildren(el("option", { value: "" }, "any"),
    ...list.items.map((e) => el("option", { value: e.id }, endpointLabel(e.id))));
  filter.value = state.endpoints.has(current) ? current : "";
  const target = $("test-endpoint"), chosen = target.value;
  target.replaceChildren(...list.items.map((e) => el("option", { value: e.id }, endpointLabel(e.id) + (e.disabled ? " (disabled)" : ""))));
  if (state.endpoints.has(chosen)) target.value = chosen;
  if (target.value !== chosen) fillTestTypes();
  $("test-send").disabled = list.items.length === 0;
}

async function loadEndpointHealth() {
  const eps = [...state.endpoints.values()];
  const stats = await Promise.all(eps.map((e) => api("GET", endpointPath(e.id) + "/stats").catch(() => null)));
  const body = $("endpoints");
  body.replaceChildren();
  if (eps.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: "6", class: "empty", text: "No endpoints yet: add one to start receiving webhooks." })));
  }
  eps.forEach((e, i) => {
    const s = stats[i] || { success_rate: null, latency_ms: {}, hours: [] };
    const label = endpointLabel(e.id);
    const button = (cls, text, onclick, title) =>
      el("button", { class: "ghost small " + cls, type: "button", "data-id": e.id, "aria-label": text + " " + label, title: title || text, onclick }, text);
    const windowSel = el("select", { class: "small replay-window", "aria-label": "Replay window for " + label },
      el("option", { value: "3600" }, "last hour"), el("option", { value: "86400" }, "last 24 h"),
      el("option", { value: "604800" }, "last 7 days"));
    const replay = button("replay", "Replay missed", () => replayMissed(e.id, Number(windowSel.value)),
      e.disabled ? "Enable the endpoint first" : "Send it the events of the window it never had");
    if (e.disabled) replay.disabled = true;
    body.append(el("tr", { class: "endpoint", "data-id": e.id, "data-disabled": String(e.disabled) },
      el("td", { class: "mono ep", title: e.url },
        el("div", { text: e.url }),
        e.description ? el("div", { class: "muted", text: e.description }) : null,
        el("div", { class: "muted", text: e.event_types.length ? e.event_types.join(", ") : "every event type" })),
      endpointState(e),
      el("td", { class: "rate", text: pct(s.success_rate) }),
      el("td", { class: "latency", text: ms(s.latency_ms.p50) + " / " + ms(s.latency_ms.p95) }),
      el("td", { class: "chart" }, hourChart(s)),
      el("td", { class: "actions" },
        button("edit", "Edit", () => openForm(e)), " ",
        button("test", "Test", () => chooseTest(e.id), "Send a test event to it"), " ",
        button("rotate", "Rotate secret", () => rotateSecret(e.id)), " ",
        button("toggle", e.disabled ? "Enable" : "Disable", () => setDisabled(e.id, !e.disabled)), " ",
        windowSel, " ", replay, " ",
        button("delete", "Delete", () => deleteEndpoint(e.id)))));
  });
}

// The add/edit form: `ep` null adds.
function openForm(ep) {
  state.editing = ep ? ep.id : null;
  $("ep-form-title").textContent = ep ? "Edit endpoint" : "Add an endpoint";
  $("ep-url").value = ep ? ep.url : "";
  $("ep-desc").value = ep && ep.description ? ep.description : "";
  const known = new Set(state.catalog.map((t) => t.name));
  const chosen = new Set(ep ? ep.event_types : []);
  $("ep-type-list").replaceChildren(...state.catalog.map((t) =>
    el("label", { class: "check" },
      el("input", { type: "checkbox", value: t.name, ...(chosen.has(t.name) ? { checked: "" } : {}) }),
      el("span", { class: "mono", text: t.name }))));
  $("ep-patterns").value = ep ? ep.event_types.filter((p) => !known.has(p)).join(", ") : "";
  $("ep-headers").value = ep ? Object.entries(ep.headers).map(([k, v]) => k + ": " + v).join("\n") : "";
  $("ep-rate").value = ep && ep.rate_limit ? String(ep.rate_limit) : "";
  $("ep-error").textContent = "";
  $("ep-form").classList.remove("hidden");
  $("ep-url").focus();
}

function closeForm() {
  state.editing = null;
  $("ep-form").classList.add("hidden");
  $("ep-error").textContent = "";
}

// The form's fields as an endpoint body; a malformed line throws.
function formBody() {
  const types = [...$("ep-type-list").querySelectorAll("input:checked")].map((c) => c.value);
  for (const p of $("ep-patterns").value.split(",")) if (p.trim()) types.push(p.trim());
  const headers = {};
  $("ep-headers").value.split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    const at = line.indexOf(":");
    if (at < 1) throw new Error("Custom headers, line " + (i + 1) + ": write it as Name: value");
    headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  });
  const rate = $("ep-rate").value.trim();
  if (rate && !/^[1-9][0-9]*$/.test(rate)) throw new Error("The rate limit is a whole number of requests per second (1 or more).");
  const body = { url: $("ep-url").value.trim(), event_types: types, headers,
    description: $("ep-desc").value.trim() };
  body.rate_limit = rate ? Number(rate) : null;
  return body;
}

async function saveEndpoint() {
  const error = $("ep-error");
  error.textContent = "";
  let body;
  try { body = formBody(); } catch (e) { error.textContent = e.message; return; }
  if (!body.url) { error.textContent = "The endpoint's URL is needed."; $("ep-url").focus(); return; }
  try {
    if (state.editing) {
      await api("PATCH", endpointPath(state.editing), body);
      toast("Saved " + body.url);
    } else {
      if (body.rate_limit === null) delete body.rate_limit;
      if (!body.description) delete body.description;
      const created = await api("POST", appPath() + "/endpoints", body);
      showSecret(created, "Endpoint created. Its requests are signed with this secret (Standard Webhooks); verify every one.");
      state.created = created.id;
    }
  } catch (e) {
    if (e.status === 401) return failed("Save", e);
    error.textContent = errorText(e);
    return;
  }
  closeForm();
  await refresh();
  if (state.created && state.endpoints.has(state.created)) {
    $("test-endpoint").value = state.created;
    fillTestTypes();
  }
  state.created = null;
}

function showSecret(ep, note) {
  $("secret-note").textContent = note + " (" + ep.url + ")";
  $("secret-value").value = ep.secret;
  $("secret-panel").classList.remove("hidden");
  $("secret-value").focus();
  $("secret-value").select();
}

async function rotateSecret(id) {
  if (!confirm("Rotate the signing secret of " + endpointLabel(id) + "? The current secret keeps signing alongside the new one for a while, so you can switch without missing a webhook.")) return;
  try {
    const ep = await api("POST", endpointPath(id) + "/rotate-secret");
    showSecret(ep, "New secret: webhooks are signed with it within a minute, and with the previous one too until the rotation overlap ends (a day by default): keep accepting both until you have switched");
  } catch (e) { failed("Rotate", e); }
}

async function setDisabled(id, disabled) {
  try {
    await api("PATCH", endpointPath(id), { disabled });
    toast((disabled ? "Disabled " : "Enabled ") + endpointLabel(id));
  } catch (e) { failed("Change", e); }
  await refresh();
}

async function deleteEndpoint(id) {
  if (!confirm("Delete the endpoint " + endpointLabel(id) + "? It receives nothing more.")) return;
  try {
    await api("DELETE", endpointPath(id));
    toast("Deleted " + endpointLabel(id));
  } catch (e) { failed("Delete", e); }
  await refresh();
}

async function replayMissed(id, seconds) {
  const since = new Date(Date.now() - seconds * 1000).toISOString();
  try {
    const r = await api("POST", endpointPath(id) + "/replay", { since });
    toast(r.complete
      ? "Replay: " + r.replayed + " replayed of " + r.scanned + " events"
      : "Replay running: " + r.replayed + " replayed so far");
  } catch (e) { failed("Replay", e); }
  await refresh();
}

// ---- catalog and test events -------------------------------------------

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
  state.catalog = items;
  const list = $("catalog");
  if (items.length === 0) {
    list.replaceChildren(el("div", { class: "empty", text: "No event types are listed: endpoints may subscribe to any type name." }));
    return;
  }
  list.replaceChildren(...items.map((t) => el("details", { class: "event-type", "data-name": t.name },
    el("summary", {}, el("span", { class: "mono", text: t.name }), t.description ? " — " + t.description : ""),
    el("h4", { text: "Schema" }),
    t.schema ? el("pre", { class: "schema", text: pretty(t.schema) }) : el("div", { class: "muted", text: "none: any JSON payload" }),
    el("h4", { text: "Example" }),
    t.example !== undefined && t.example !== null ? el("pre", { class: "example", text: pretty(t.example) }) : el("div", { class: "muted", text: "none" }))));
}

// The types the chosen endpoint receives (from the catalog); the type's
// example goes in the payload box when the endpoint or type changed (a
// refresh never overwrites what the customer typed).
function fillTestTypes() {
  const ep = state.endpoints.get($("test-endpoint").value);
  const select = $("test-type"), current = select.value;
  const names = ep ? state.catalog.map((t) => t.name).filter((n) => subscribes(ep, n)) : [];
  if (ep) for (const p of ep.event_types) if (p !== "*" && !p.endsWith(".*") && !names.includes(p)) names.push(p);
  select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (names.includes(current)) select.value = current;
  const key = (ep ? ep.id : "") + "|" + select.value;
  if (key !== state.testFor) fillTestPayload();
}

function fillTestPayload() {
  state.testFor = $("test-endpoint").value + "|" + $("test-type").value;
  const type = state.catalog.find((t) => t.name === $("test-type").value);
  $("test-payload").value = type && type.example !== undefined && type.example !== null ? pretty(type.example) : "";
  $("test-error").textContent = "";
}

function chooseTest(id) {
  $("test-endpoint").value = id;
  fillTestTypes();
  $("test-type").focus();
}

async function sendTest() {
  const error = $("test-error");
  error.textContent = "";
  const id = $("test-endpoint").value, type = $("test-type").value;
  if (!id) { error.textContent = "Add an endpoint first."; return; }
  if (!type) { error.textContent = "This endpoint receives no listed type: pick another endpoint or edit its types."; return; }
  const body = { event_type: type };
  const text = $("test-payload").value.trim();
  if (text) {
    try { body.payload = JSON.parse(text); } catch (e) { error.textContent = "The payload is not JSON: " + e.message; return; }
  }
  let sent;
  try { sent = await api("POST", endpointPath(id) + "/test", body); }
  catch (e) {
    if (e.status === 401) return failed("Test event", e);
    error.textContent = errorText(e);
    return;
  }
  toast("Test event sent: " + sent.event_id);
  $("f-endpoint").value = id;
  state.selected = sent.delivery_ids[0] || null;
  await refresh();
}

// ---- the delivery log ---------------------------------------------------

function renderRows() {
  const body = $("rows");
  body.replaceChildren();
  if (state.items.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: "5", class: "empty", text: "No deliveries yet." })));
  }
  for (const d of state.items) {
    const open = () => select(d.id);
    body.append(el("tr", { class: "delivery" + (state.selected === d.id ? " selected" : ""), "data-id": d.id,
      "data-status": d.status, tabindex: "0", "aria-label": d.event_type + " to " + endpointLabel(d.endpoint_id) + ": " + d.status,
      onclick: open, onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } } },
      el("td", {}, badge(d.status)),
      eventCell(d, d.event_id),
      el("td", { class: "mono ep", title: endpointLabel(d.endpoint_id), text: endpointLabel(d.endpoint_id) }),
      el("td", { text: String(d.total_attempts) }),
      el("td", { class: "muted when", title: d.updated_at, text: ago(d.updated_at) })));
  }
  $("page-info").textContent = state.items.length + " shown";
  $("more").disabled = !state.cursor;
}

async function loadDeliveries(append) {
  const q = new URLSearchParams({ limit: "25" });
  if ($("f-endpoint").value) q.set("endpoint_id", $("f-endpoint").value);
  if ($("f-status").value) q.set("status", $("f-status").value);
  if (append && state.cursor) q.set("cursor", state.cursor);
  const page = await api("GET", appPath() + "/deliveries?" + q.toString());
  state.items = append ? state.items.concat(page.items) : page.items;
  state.cursor = page.next_cursor;
  renderRows();
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
  catch (e) {
    if (e.status === 401) throw e;
    panel.replaceChildren(el("div", { class: "empty", text: e.message }));
    return;
  }
  panel.replaceChildren(...deliveryDetail(d, endpointLabel, retryDelivery));
}

async function retryDelivery(id, resend) {
  const what = resend ? "Resend" : "Retry";
  try {
    await api("POST", appPath() + "/deliveries/" + encodeURIComponent(id) + "/retry");
    toast(what + " queued");
  } catch (e) { failed(what, e); }
  await refresh();
}

// ---- refresh and sign-in -------------------------------------------------

let refreshing = false;
async function refresh() {
  if (refreshing || !auth.key) return;
  refreshing = true;
  try {
    await loadEndpoints();
    await Promise.all([loadEndpointHealth(), loadDeliveries(false)]);
    await renderDetail();
    $("live-dot").className = "dot";
    $("live-text").textContent = "live · updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("live-dot").className = "dot off";
    $("live-text").textContent = "error: " + e.message;
    if (e.status === 401) failed("Refresh", e);
  } finally { refreshing = false; }
}

async function start() {
  signInFromLink();
  if (!auth.key) {
    const ended = sessionStorage.getItem(ENDED);
    if (ended) $("signin-message").textContent = ended;
    return;
  }
  try {
    await loadCatalog();
    await loadEndpoints();
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      signOut("This link has expired or was revoked. Ask for a new portal link.");
    } else {
      $("signin-message").textContent = "The portal could not load: " + e.message;
    }
    return;
  }
  $("app-name").textContent = state.app;
  $("signin").classList.add("hidden");
  $("portal").classList.remove("hidden");
  $("signout").classList.remove("hidden");
  fillTestTypes();
  await refresh();
  clearInterval(state.timer);
  state.timer = setInterval(refresh, 4000);
}

$("ep-add").addEventListener("click", () => openForm(null));
$("ep-cancel").addEventListener("click", closeForm);
$("ep-form").addEventListener("submit", (e) => { e.preventDefault(); saveEndpoint(); });
$("secret-done").addEventListener("click", () => {
  $("secret-value").value = "";
  $("secret-panel").classList.add("hidden");
});
$("secret-copy").addEventListener("click", () => {
  $("secret-value").select();
  navigator.clipboard.writeText($("secret-value").value).then(() => toast("Secret copied"), () => toast("Select the secret and copy it", true));
});
$("test-endpoint").addEventListener("change", fillTestTypes);
$("test-type").addEventListener("change", fillTestPayload);
$("test-form").addEventListener("submit", (e) => { e.preventDefault(); sendTest(); });
$("f-endpoint").addEventListener("change", () => { state.selected = null; refresh(); });
$("f-status").addEventListener("change", () => { state.selected = null; refresh(); });
$("filters").addEventListener("submit", (e) => e.preventDefault());
$("more").addEventListener("click", () => loadDeliveries(true).catch((e) => failed("Load more", e)));
$("signout").addEventListener("click", () => signOut("Signed out. Open the portal link again to come back."));
$("switch-no").addEventListener("click", () => answerSwitch(false));
$("switch-yes").addEventListener("click", () => answerSwitch(true));
window.addEventListener("hashchange", () => { if (location.hash.includes("token=")) start(); });
start();
