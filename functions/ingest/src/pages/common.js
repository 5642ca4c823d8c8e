// What the dashboard and the portal share, served ahead of each page's own
// script (one file per page; see pages.rs). Nothing here parses HTML: text
// is always set as text (response bodies come from receivers and may
// contain anything).
"use strict";
const $ = (id) => document.getElementById(id);
// The bearer token of this tab: an API key (dashboard) or a portal
// session's token (portal).
const auth = { key: "" };

// Builds DOM nodes: `on*` props become listeners, `text` the text content,
// anything else an attribute.
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}

// SVG nodes (namespaced; attributes set one by one, never parsed).
function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = v; else node.setAttribute(k, String(v));
  }
  for (const c of children) if (c) node.append(c);
  return node;
}

function toast(message, isError) {
  const t = $("toast");
  t.textContent = message;
  t.className = "toast show" + (isError ? " error" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = "toast"; }, 3500);
}

// Calls the API with this tab's token; a non-2xx answer throws an Error
// carrying the API's `status`, `code` and `location`.
async function api(method, path, body) {
  const res = await fetch(path, {
    method, headers: { "Authorization": "Bearer " + auth.key, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!res.ok) {
    const detail = data && data.error;
    const err = new Error((detail && detail.message) || res.statusText);
    err.status = res.status; err.code = detail && detail.code; err.location = detail && detail.location;
    throw err;
  }
  return data;
}

// "code: message (at /where)" for a form's error line.
function errorText(e) {
  const where = e.location && !e.message.includes(e.location) ? " (at " + e.location + ")" : "";
  return (e.code ? e.code + ": " : "") + e.message + where;
}

function ago(iso) {
  if (!iso) return "–";
  const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 5) return "just now";
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.round(s / 60) + "m ago";
  if (s < 86400) return Math.round(s / 3600) + "h ago";
  return new Date(iso).toLocaleString();
}

function badge(status) { return el("span", { class: "badge " + status, text: status }); }

// An endpoint's state cell: enabled, disabled (with why), or unreachable
// (its circuit open: deliveries wait, budgets kept, until one probe
// answers); its rate limit.
function endpointState(e) {
  const c = e.circuit;
  const state = e.disabled ? "disabled" : c ? "unreachable" : "enabled";
  const circuit = !e.disabled && c ? el("div", { class: "muted circuit",
    title: "Deliveries wait without an attempt (their budgets kept); one probe goes after this time and any HTTP answer closes the circuit.",
    text: "since " + ago(c.opened_at) + (c.last_error ? " (" + c.last_error + ")" : "") +
      (c.probing ? "; probing now" : "; next try " + new Date(c.open_until).toLocaleTimeString()) }) : null;
  return el("td", { title: e.disabled_reason || "" }, badge(state),
    e.disabled_reason ? el("div", { class: "muted reason", text: e.disabled_reason }) : null,
    circuit,
    e.rate_limit ? el("div", { class: "muted rate-limit", text: "≤ " + e.rate_limit + " req/s" }) : null);
}
function pct(rate) { return rate === null || rate === undefined ? "–" : (Math.round(rate * 1000) / 10) + "%"; }
function ms(v) { return v === null || v === undefined ? "–" : v + " ms"; }
function pretty(v) { return v === null || v === undefined ? "" : JSON.stringify(v, null, 2); }

// 24 bars, one per hour (oldest left): delivered stacked on failed.
function hourChart(stats) {
  const W = 192, H = 36, n = 24, bw = W / n;
  const now = Date.now(), hour = 3600_000;
  const start = Math.floor(now / hour) * hour - (n - 1) * hour;
  const byHour = new Map((stats.hours || []).map((h) => [new Date(h.hour).getTime(), h]));
  const rows = [...Array(n).keys()].map((i) => byHour.get(start + i * hour) || { delivered: 0, failed: 0 });
  const max = Math.max(1, ...rows.map((h) => h.delivered + h.failed));
  const bars = [];
  rows.forEach((h, i) => {
    const x = i * bw + 1, w = bw - 2;
    const hf = (h.failed / max) * (H - 2), hd = (h.delivered / max) * (H - 2);
    bars.push(svg("rect", { class: "base", x, y: H - 1, width: w, height: 1 }));
    if (h.failed) bars.push(svg("rect", { class: "bad", x, y: H - 1 - hf, width: w, height: hf },
      svg("title", { text: h.failed + " failed" })));
    if (h.delivered) bars.push(svg("rect", { class: "ok", x, y: H - 1 - hf - hd, width: w, height: hd },
      svg("title", { text: h.delivered + " delivered" })));
  });
  const total = rows.reduce((a, h) => [a[0] + h.delivered, a[1] + h.failed], [0, 0]);
  return svg("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `last 24 hours: ${total[0]} delivered, ${total[1]} failed` }, ...bars);
}

// A delivery's detail: its ids, state and attempts (newest first), with a
// retry (failed) or resend (delivered) button calling `retry(id, resend)`.
function deliveryDetail(d, endpointLabel, retry) {
  const attempts = (d.attempts || []).slice().reverse();
  const timeline = el("ol", { class: "timeline", id: "timeline" }, ...attempts.map((a) => {
    const ok = a.status_code !== null && a.status_code >= 200 && a.status_code < 300;
    return el("li", { class: ok ? "ok" : "" },
      el("div", { class: "head" },
        el("span", { class: "code " + (ok ? "ok" : "bad"), text: a.status_code === null ? "no response" : String(a.status_code) }),
        el("span", { text: a.latency_ms + " ms" }),
        el("span", { class: "muted", text: "attempt " + a.attempt + " · " + new Date(a.at).toLocaleString() })),
      a.error ? el("div", { class: "muted", text: a.error }) : null,
      a.response_body ? el("pre", { text: a.response_body }) : null);
  }));
  return [
    el("div", { class: "row head-row" },
      el("h3", { class: "flush", text: d.event_type }), badge(d.status)),
    el("dl", { class: "kv" },
      el("dt", {}, "Delivery"), el("dd", { class: "mono", text: d.id }),
      el("dt", {}, "Message id"), el("dd", { class: "mono", text: d.message_id }),
      el("dt", {}, "Event"), el("dd", { class: "mono", text: d.event_id }),
      el("dt", {}, "Endpoint"), el("dd", { class: "mono", text: endpointLabel(d.endpoint_id) }),
      el("dt", {}, "Attempts"), el("dd", { text: d.attempt_count + " now, " + d.total_attempts + " in all" }),
      el("dt", {}, "Next attempt"), el("dd", { text: d.next_attempt_at ? new Date(d.next_attempt_at).toLocaleString() : "–" }),
      el("dt", {}, "Ordering key"), el("dd", { class: "mono", id: "detail-key", text: d.ordering_key || "–" }),
      d.blocked_by ? el("dt", {}, "Waits for") : null,
      d.blocked_by ? el("dd", { class: "mono", id: "detail-blocked", title: "The previous delivery of this key to this endpoint: this one goes when it ends", text: d.blocked_by }) : null),
    d.status === "failed" ? el("button", { type: "button", id: "detail-retry", onclick: () => retry(d.id) }, "Retry this delivery") : null,
    d.status === "delivered" ? el("button", { type: "button", class: "ghost", id: "detail-resend", onclick: () => retry(d.id, true) }, "Resend (same webhook-id)") : null,
    el("h4", { text: "Attempts (newest first)" }),
    attempts.length ? timeline : el("div", { class: "empty", text: "No attempt yet." }),
  ].filter(Boolean);
}

// The event cell of a delivery row: its type, its id, and its ordering key
// (with "waiting" while the key's previous delivery has not ended).
function eventCell(d, id) {
  return el("td", {}, el("div", { text: d.event_type }), el("div", { class: "mono muted", text: id }),
    d.ordering_key ? el("div", { class: "mono muted key", title: d.blocked_by ? "waits for " + d.blocked_by : "ordering key", text: "key " + d.ordering_key + (d.blocked_by ? " · waiting" : "") }) : null);
}
