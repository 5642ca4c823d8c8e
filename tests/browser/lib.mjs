// What the browser tests share: checks, bounded waits, the local stack
// (`hookline-local up` on moto) and headless Chromium. Everything runs on
// loopback; what a test starts is stopped by `cleanup()` (processes by
// PID: the stack stops its moto child itself on SIGTERM).
import { spawn } from "node:child_process";
import http from "node:http";
import { chromium } from "playwright-core";

const cleanups = [];
let deadline = Date.now() + 240_000;

/// Bounds the whole test: every `until` stops waiting at `ms` from now.
export function bound(ms) { deadline = Date.now() + ms; }

export function check(cond, message) {
  if (!cond) throw new Error("check failed: " + message);
  console.log("ok   " + message);
}

export async function until(what, fn, ms = 60_000) {
  const end = Math.min(Date.now() + ms, deadline);
  for (;;) {
    const v = await fn().catch(() => null);
    if (v) return v;
    if (Date.now() > end) throw new Error("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/// An HTTP server on loopback answering every request with `handler(req,
/// body)` -> `{status, body}`; closed by `cleanup()`.
export function receiver(handler) {
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const { status, body } = handler(req, Buffer.concat(chunks).toString("utf8"));
      res.writeHead(status, { "content-type": "text/plain" });
      res.end(body);
    });
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
    cleanups.push(() => server.close());
    resolve(`http://127.0.0.1:${server.address().port}/hook`);
  }));
}

/// Starts the local stack with `env` added; resolves to its API's base URL.
export function startStack(binary, env) {
  const child = spawn(binary, ["up", "--port", "0", "--template", "template.yaml"], {
    env: { ...process.env, WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS: "true", RUST_LOG: "warn", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  cleanups.push(() => new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    const kill = setTimeout(() => child.kill("SIGKILL"), 10_000);
    child.once("exit", () => { clearTimeout(kill); resolve(); });
    child.kill("SIGTERM");
  }));
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error("stack did not start: " + out)), 90_000);
    child.stdout.on("data", (chunk) => {
      out += chunk;
      const m = out.match(/API\s+(http:\/\/127\.0\.0\.1:\d+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.once("exit", (code) => reject(new Error(`stack exited (${code}): ${out}`)));
  });
}

/// A JSON API client for `base` with a bearer token.
export function client(base, token) {
  return async (method, p, body) => {
    const res = await fetch(base + p, {
      method,
      headers: { authorization: "Bearer " + token, "content-type": "application/json" },
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : null };
  };
}

/// Headless Chromium (Debian's, or $CHROMIUM), closed by `cleanup()` first.
export async function launchBrowser() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  cleanups.unshift(() => browser.close());
  return browser;
}

/// Runs `main`, cleans up, prints the verdict and exits with it.
export async function run(name, main) {
  let failed = false;
  try {
    await main();
  } catch (e) {
    failed = true;
    console.error("FAIL " + (e && e.stack || e));
  } finally {
    for (const c of cleanups) { try { await c(); } catch (_) { /* best effort */ } }
  }
  console.log(failed ? `${name}: FAILED` : `${name}: passed`);
  process.exit(failed ? 1 : 0);
}
