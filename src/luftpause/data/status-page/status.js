// luftpause live status page (S12). Polls the scheduler's /status every 2 s and, with
// ?runtime=URL, the runtime's run tree through the scheduler (/ui/runtime-status?url=URL).
//
// Token (X2): the page never puts it in a URL it requests. Give it in the token form, or once
// in the fragment (/#token=...: a fragment is never sent to a server); it is kept in this
// tab's sessionStorage and sent as "Authorization: Bearer" to /status and to
// /ui/runtime-status, which forwards it to the runtime.
"use strict";

(() => {
  const POLL_MS = 2000;
  const FETCH_TIMEOUT_MS = 5000;
  const TOKEN_KEY = "luftpause.token";
  const HIDE_KEY = "luftpause.hideFinished";
  const TERMINAL = new Set(["Completed", "Failed", "Cancelled"]);
  const CLASSES = ["interactive", "batch"];

  const $ = (id) => document.getElementById(id);
  let memoryToken = null; // when sessionStorage is unavailable
  let lastGood = null; // time of the last /status answer
  let lastTree = null;

  // ---- small helpers -------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function fill(tbody, rows, columns, emptyText) {
    tbody.replaceChildren(...rows);
    if (rows.length === 0) {
      tbody.append(el("tr", { class: "empty" }, el("td", { colspan: columns, text: emptyText })));
    }
  }

  function seconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 60) return `${s.toFixed(1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m${String(Math.round(s % 60)).padStart(2, "0")}s`;
    return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
  }

  function count(n) {
    if (n === null || n === undefined) return "–";
    if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
    if (n >= 1e4) return `${(n / 1e3).toFixed(1)}k`;
    return String(n);
  }

  // ---- token ---------------------------------------------------------------------------------

  function getToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || memoryToken;
    } catch {
      return memoryToken;
    }
  }

  function setToken(value) {
    memoryToken = value || null;
    try {
      if (value) sessionStorage.setItem(TOKEN_KEY, value);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch {
      /* memoryToken holds it */
    }
    showTokenState();
  }

  function tokenFromFragment() {
    if (!location.hash) return;
    const frag = new URLSearchParams(location.hash.slice(1));
    if (!frag.has("token")) return;
    setToken(frag.get("token"));
    frag.delete("token");
    const rest = frag.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }

  function showTokenState() {
    $("token-state").textContent = getToken() ? "token set (this tab only)" : "no token";
    $("token-toggle").classList.toggle("on", Boolean(getToken()));
  }

  function askForToken(why) {
    $("token-form").hidden = false;
    $("token-state").textContent = why;
  }

  function headers() {
    const t = getToken();
    return t ? { Authorization: `Bearer ${t}` } : {};
  }

  async function getJson(url) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const resp = await fetch(url, { headers: headers(), cache: "no-store", signal: ctl.signal });
      let body = null;
      try {
        body = await resp.json();
      } catch {
        /* not JSON: reported below */
      }
      return { status: resp.status, body };
    } catch (err) {
      const reason = err && err.name === "AbortError" ? "no answer within 5 s" : String(err);
      return { status: 0, body: null, reason };
    } finally {
      clearTimeout(timer);
    }
  }

  function errorText(what, res) {
    if (res.status === 0) return `${what} unreachable (${res.reason})`;
    const msg = res.body && (res.body.error?.message || res.body.error);
    if (res.status === 401) return `${what}: ${msg || "a bearer token is needed"}`;
    return `${what}: HTTP ${res.status}${msg ? ` – ${msg}` : ""}`;
  }

  // ---- scheduler -----------------------------------------------------------------------------

  function renderSummary(s) {
    const lost = Object.keys(s.dataplanes_lost || {}).length;
    const cards = [
      ["turns in flight", s.in_flight_total],
      ["turns held", s.held_total],
      ["runs", s.runs_total],
      ["replicas healthy", `${s.replicas.filter((r) => r.healthy).length}/${s.replicas.length}`],
    ];
    if (lost) cards.push(["dataplanes lost", lost]);
    if (s.interactive_target && s.interactive_target !== "off") {
      const kept = s.batch_withheld_by_target || 0;
      cards.push([`interactive target ${s.interactive_target}: batch slots withheld`, kept]);
    }
    $("summary").replaceChildren(
      ...cards.map(([label, value]) =>
        el("div", { class: "card", "data-card": label }, el("b", { text: value }), label),
      ),
    );
  }

  function capacityCell(r) {
    const cap = r.capacity;
    const label = cap === null || cap === undefined ? `${r.in_flight} / –` : `${r.in_flight} / ${cap}`;
    const td = el("td", { class: "num", title: cap == null ? "no cap: the engine has no queue" : null });
    td.append(el("span", { class: "capacity", text: label }));
    if (cap) {
      const pct = Math.min(100, Math.round((100 * r.in_flight) / cap));
      const bar = el("span", { class: "bar" }, el("span", { class: pct >= 100 ? "full" : "" }));
      bar.firstChild.style.width = `${pct}%`;
      td.append(bar);
    }
    return td;
  }

  function healthCell(r) {
    // B11: a draining or leaving replica takes no new runs, whatever its health
    const member = r.membership && r.membership !== "serving"
      ? el("span", { class: "badge unknown", text: r.membership })
      : null;
    if (r.probed_s_ago === null) {
      return el("td", {}, el("span", { class: "badge unknown", text: "not probed" }), member);
    }
    return el("td", {}, el("span", {
      class: r.healthy ? "badge ok" : "badge down",
      text: r.healthy ? "healthy" : "down",
    }), member);
  }

  // The interactive target (B7): the batch limit its decode pace sets, and the batch
  // slots that limit keeps empty (what meeting the target costs batch work now).
  function targetCell(r) {
    const limit = r.batch_limit_from_pace;
    const kept = r.batch_withheld_by_target;
    const ms = (v) => (v == null ? "–" : `${Math.round(v * 10000) / 10} ms`);
    return el("td", {
      class: "num",
      text: limit == null ? "–" : kept ? `${limit} (−${kept})` : `${limit}`,
      title: `batch turns taken while an interactive run lives here; ` +
        `replies ${ms(r.pace_s_per_token)} per token, target ${ms(r.target_pace_s_per_token)}, ` +
        `floor ${ms(r.best_pace_s_per_token)}; (−N): batch slots the limit keeps empty`,
    });
  }

  function renderReplicas(s) {
    const rows = s.replicas.map((r) =>
      el(
        "tr",
        { "data-replica": r.name, class: r.healthy ? null : "unhealthy" },
        el("td", {}, el("b", { text: r.name }), el("div", { class: "muted small", text: r.models.join(", ") })),
        el("td", { text: r.kind === "single_pass" ? "single-pass" : r.kind }),
        healthCell(r),
        capacityCell(r),
        el("td", { class: "num", text: r.engine_running ?? "–" }),
        el("td", { class: "num", text: r.engine_waiting ?? "–" }),
        el("td", { class: "num", text: r.kv_usage == null ? "–" : `${Math.round(r.kv_usage * 100)}%` }),
        el("td", {
          class: "num",
          text: r.runs_lapsed ? `${r.runs_pinned ?? 0} (+${r.runs_lapsed} lapsed)` : r.runs_pinned ?? 0,
          title: `run limit ${r.run_limit ?? "–"} (new batch runs wait while the runs here reach it); ` +
            "lapsed: paused on a tool past its lease, not counted",
        }),
        el("td", { class: "num", text: r.reserved_for_interactive ?? 0 }),
        targetCell(r),
        el("td", { class: "num", text: r.probed_s_ago == null ? "never" : `${seconds(r.probed_s_ago)} ago` }),
      ),
    );
    fill($("replicas").tBodies[0], rows, 11, "no replicas configured");
  }

  function renderHeld(s) {
    const rows = [];
    for (const cls of Object.keys(s.held).sort((a, b) => CLASSES.indexOf(a) - CLASSES.indexOf(b))) {
      for (const [caller, h] of Object.entries(s.held[cls])) {
        rows.push(
          el(
            "tr",
            { "data-held-class": cls, "data-caller": caller },
            el("td", {}, el("span", { class: `cls ${cls}`, text: cls })),
            el("td", { text: caller }),
            el("td", { class: "num", text: h.held }),
            el("td", {
              class: "num",
              text: seconds(h.oldest_wait_s),
              title: h.oldest_trace_id ? `trace ${h.oldest_trace_id}` : null,
            }),
          ),
        );
      }
    }
    $("held-total").textContent = s.held_total;
    fill($("held").tBodies[0], rows, 4, "no turns held");
  }

  function renderRuns(s) {
    const rows = Object.entries(s.runs).map(([phase, byClass]) => {
      const total = Object.values(byClass).reduce((a, b) => a + b, 0);
      return el(
        "tr",
        { "data-phase": phase },
        el("td", { text: phase.replaceAll("_", " ") }),
        ...CLASSES.map((c) => el("td", { class: "num", text: byClass[c] ?? 0 })),
        el("td", { class: "num", text: total }),
      );
    });
    $("runs-total").textContent = s.runs_total;
    fill($("runs").tBodies[0], rows, 4, "no runs");
    const callers = Object.entries(s.callers_in_flight || {}).map(([caller, n]) =>
      el("tr", { "data-caller": caller }, el("td", { text: caller }), el("td", { class: "num", text: n })),
    );
    fill($("callers").tBodies[0], callers, 2, "none");
  }

  // B13: the configured callers ([[callers]]); the section stays hidden without them.
  function limitCell(used, limit) {
    return limit === null || limit === undefined ? count(used) : `${count(used)} / ${count(limit)}`;
  }

  function renderCallers(s) {
    const callers = s.callers || [];
    $("callers-box").hidden = callers.length === 0;
    const rows = callers.map((c) => {
      const subs = c.sub_callers.map((x) => `${x.name} ${x.in_flight}+${x.held}`);
      if (c.sub_callers_more) subs.push(`+${c.sub_callers_more} more`);
      const refused = c.refused.tokens_per_minute + c.refused.daily_tokens;
      return el(
        "tr",
        { "data-configured-caller": c.name },
        el("td", { text: c.name }),
        el("td", { class: "num", text: c.weight }),
        el("td", { class: "num", text: limitCell(c.in_flight, c.max_in_flight) }),
        el("td", { class: "num", text: c.held }),
        el("td", {
          class: "num",
          text: c.tokens_per_minute === null ? "–" : `${count(c.tokens_per_minute_left)} / ${count(c.tokens_per_minute)}`,
        }),
        el("td", { class: "num", text: limitCell(c.tokens_today, c.daily_tokens) }),
        el("td", {
          class: "num",
          text: refused,
          title: `tokens_per_minute ${c.refused.tokens_per_minute}, daily_tokens ${c.refused.daily_tokens}`,
        }),
        el("td", { class: "task", text: subs.join(", ") || "–", title: subs.join(", ") || null }),
      );
    });
    fill($("configured-callers").tBodies[0], rows, 8, "none");
    const other = s.unconfigured_callers;
    $("callers-other").textContent =
      other && other.callers
        ? `others: ${other.callers} callers, ${other.in_flight} in flight, ${other.held} held`
        : "";
  }

  function renderCounters(s) {
    const rows = Object.entries(s.counters || {}).map(([k, v]) =>
      el("tr", {}, el("td", { text: k }), el("td", { class: "num", text: v })),
    );
    fill($("counters").tBodies[0], rows, 2, "none yet");
  }

  function renderMeta(s) {
    const bits = [`updated ${new Date().toLocaleTimeString()}`];
    if (s.uptime_s !== undefined) bits.push(`up ${seconds(s.uptime_s)}`);
    if (s.grpc_port !== undefined) bits.push(`gRPC :${s.grpc_port}`);
    bits.push(`polling every ${POLL_MS / 1000} s`);
    $("meta").textContent = bits.join(" · ");
  }

  function banner(text) {
    const b = $("banner");
    b.hidden = !text;
    b.textContent = text || "";
    document.body.classList.toggle("stale", Boolean(text) && lastGood !== null);
  }

  async function pollScheduler() {
    const res = await getJson("/status");
    if (res.status === 200 && res.body && Array.isArray(res.body.replicas)) {
      lastGood = Date.now();
      banner(null);
      const s = res.body;
      renderMeta(s);
      renderSummary(s);
      renderReplicas(s);
      renderHeld(s);
      renderRuns(s);
      renderCallers(s);
      renderCounters(s);
      return;
    }
    if (res.status === 401) askForToken("the scheduler needs a token");
    let text = errorText("scheduler status", res);
    if (res.status === 200) text = "scheduler status: the answer is not a luftpause /status";
    text += ` – retrying every ${POLL_MS / 1000} s`;
    if (lastGood !== null) text += `; the numbers below are from ${seconds((Date.now() - lastGood) / 1000)} ago`;
    banner(text);
  }

  // ---- runtime -------------------------------------------------------------------------------

  function finished(node) {
    if (isSession(node)) return (node.children || []).every(finished);
    if (!TERMINAL.has(node.state)) return false;
    return (node.children || []).every((c) => typeof c === "string" || finished(c));
  }

  function usageCells(u) {
    u = u || {};
    const tokens = (u.promptTokens || 0) + (u.completionTokens || 0);
    return [
      el("td", { class: "num", text: u.turns ?? 0 }),
      el("td", { class: "num", text: u.toolCalls ?? 0 }),
      el("td", { class: u.failedToolCalls ? "num bad" : "num", text: u.failedToolCalls ?? 0 }),
      el("td", {
        class: "num",
        text: count(tokens),
        title: `prompt ${u.promptTokens || 0} + completion ${u.completionTokens || 0}`,
      }),
      el("td", { class: "num", text: seconds(u.turnSeconds ?? 0) }),
      el("td", { class: "num", text: seconds(u.toolSeconds ?? 0) }),
    ];
  }

  // An agent harness's session (#38): the runs its tool calls spawned, grouped under it.
  function isSession(node) {
    return typeof node === "object" && node.session !== undefined && node.handle === undefined;
  }

  function sessionRows(node, out) {
    const blank = () => Array.from({ length: 6 }, () => el("td", { class: "num", text: "" }));
    out.push(
      el(
        "tr",
        { "data-session": node.session, class: finished(node) ? "session done" : "session live" },
        el("td", { class: "handle" }, el("span", { class: "glyph", text: "session " }), el("code", { text: node.session })),
        el("td", {}, el("span", { class: "small", text: "agent harness" })),
        el("td", {}),
        ...blank(),
        ...usageCells(node.subtree).map((td) => { td.classList.add("sub"); return td; }),
        el("td", { class: "task", text: `${node.runs ?? 0} sub-agent run(s) it spawned` }),
      ),
    );
    const kids = node.children || [];
    kids.forEach((c, i) => treeRows(c, 1, "", i === kids.length - 1, out));
  }

  function treeRows(node, depth, prefix, last, out) {
    if (isSession(node)) {
      sessionRows(node, out);
      return;
    }
    if (typeof node === "string") {
      out.push(el("tr", { "data-run": node, class: "cut" },
        el("td", { colspan: 16, text: `${prefix}${last ? "└─ " : "├─ "}${node} (deeper than 64 levels)` })));
      return;
    }
    const glyph = depth === 0 ? "" : last ? "└─ " : "├─ ";
    const stateClass = `state ${node.state.toLowerCase()}`;
    const stateCell = el("span", { class: stateClass, text: node.state });
    const extra = [];
    if (node.pendingApproval) extra.push(el("div", { class: "small warn", text: "awaiting approval" }));
    if (node.budget?.exceeded) extra.push(el("div", { class: "small bad", text: "budget exceeded" }));
    if (node.error) extra.push(el("div", { class: "small bad", text: node.error, title: node.error }));
    out.push(
      el(
        "tr",
        { "data-run": node.handle, "data-parent": node.parent, "data-depth": depth, class: TERMINAL.has(node.state) ? "done" : "live" },
        el("td", { class: "handle" }, el("span", { class: "glyph", text: prefix + glyph }), el("code", { text: node.handle })),
        el("td", {}, stateCell, ...extra),
        el("td", {}, el("span", { class: `cls ${node.serviceClass}`, text: node.serviceClass })),
        ...usageCells(node.own),
        ...usageCells(node.subtree).map((td) => { td.classList.add("sub"); return td; }),
        el("td", { class: "task", text: node.task, title: node.task }),
      ),
    );
    const kids = node.children || [];
    const childPrefix = depth === 0 ? "" : prefix + (last ? "   " : "│  ");
    kids.forEach((c, i) => treeRows(c, depth + 1, childPrefix, i === kids.length - 1, out));
  }

  function renderTree(rt) {
    lastTree = rt;
    const counts = Object.entries(rt.byState || {}).map(([k, v]) => `${k} ${v}`).join(" · ");
    $("runtime-counts").textContent = `${rt.runs} runs${counts ? ` – ${counts}` : ""}`;
    const hide = $("hide-finished").checked;
    const rows = [];
    for (const root of rt.tree || []) {
      if (hide && finished(root)) continue;
      treeRows(root, 0, "", true, rows);
    }
    fill($("run-tree").tBodies[0], rows, 16, hide && rt.runs ? "every run has finished" : "no runs");
  }

  function runtimeBanner(text) {
    const b = $("runtime-banner");
    b.hidden = !text;
    b.textContent = text || "";
  }

  async function pollRuntime(runtime) {
    const res = await getJson(`/ui/runtime-status?url=${encodeURIComponent(runtime)}`);
    if (res.status === 200 && res.body && Array.isArray(res.body.tree)) {
      runtimeBanner(null);
      renderTree(res.body);
      return;
    }
    if (res.status === 401) askForToken("the runtime needs the token");
    let text = errorText("runtime", res);
    if (lastTree) text += " – showing the last tree it sent";
    runtimeBanner(text);
  }

  // ---- wiring --------------------------------------------------------------------------------

  function normalRuntime(url) {
    let u = url.trim();
    if (!u) return "";
    if (!/^https?:\/\//i.test(u)) u = `http://${u}`;
    return u.replace(/\/+$/, "").replace(/\/(mcp|status)$/, "");
  }

  function start() {
    tokenFromFragment();
    showTokenState();
    const params = new URLSearchParams(location.search);
    const runtime = normalRuntime(params.get("runtime") || "");
    $("runtime-input").value = runtime;
    if (runtime) {
      $("runtime").hidden = false;
      $("runtime-url").textContent = runtime;
    }
    try {
      $("hide-finished").checked = sessionStorage.getItem(HIDE_KEY) === "1";
    } catch {
      /* default: show everything */
    }
    $("hide-finished").addEventListener("change", () => {
      try {
        sessionStorage.setItem(HIDE_KEY, $("hide-finished").checked ? "1" : "0");
      } catch {
        /* not kept */
      }
      if (lastTree) renderTree(lastTree);
    });
    $("runtime-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const next = new URLSearchParams(location.search);
      const value = normalRuntime($("runtime-input").value);
      if (value) next.set("runtime", value);
      else next.delete("runtime");
      const q = next.toString();
      location.href = location.pathname + (q ? `?${q}` : "");
    });
    $("token-toggle").addEventListener("click", () => {
      $("token-form").hidden = !$("token-form").hidden;
      showTokenState();
    });
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      setToken($("token-input").value.trim());
      $("token-input").value = "";
      poll();
    });
    $("token-forget").addEventListener("click", () => {
      setToken(null);
      poll();
    });

    let timer = null;
    let running = false;
    async function poll() {
      if (running) return;
      running = true;
      clearTimeout(timer);
      const started = Date.now();
      try {
        await Promise.all([pollScheduler(), runtime ? pollRuntime(runtime) : null]);
      } finally {
        running = false;
        timer = setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
      }
    }
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
