// moot viewer: no build step, no dependencies. The debate page is built from the debate's own
// event stream (/v1/debates/{id}/events, read with fetch: readEvents), which replays what already happened.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function fmtTime(s) { return (s || 0).toFixed(1) + " s"; }
function fmtInt(n) { return (n || 0).toLocaleString("en-US"); }

// ------------------------------------------------------------------------------------ the API

// The server's clock against this one (its Date header, to the second): the elapsed time of a
// debate that started before the page opened.
const serverClock = { skew: 0 };

// The session token (POST /v1/session) is this tab's, in sessionStorage, which is this origin's
// alone (scheme, host and port), and is sent as the bearer; a cookie would reach every other service
// on the same host name, whatever its port.
const SESSION = "moot.session";

function authHeaders() {
  const token = sessionStorage.getItem(SESSION);
  return token ? { Authorization: "Bearer " + token } : {};
}

async function api(path, options) {
  const given = options || {};
  const headers = Object.assign(authHeaders(), given.headers || {});
  const response = await fetch(path, Object.assign({ credentials: "omit" }, given, { headers }));
  const date = Date.parse(response.headers.get("Date") || "");
  if (!Number.isNaN(date)) serverClock.skew = date - Date.now();
  if (response.status === 401) {
    sessionStorage.removeItem(SESSION); // expired, or its key revoked: ask for the key again
    showAuth();
    const error = new Error("this server needs its API key");
    error.status = 401;
    throw error;
  }
  const body = response.status === 204 ? null : await response.json();
  if (!response.ok) {
    const error = new Error(body && body.error ? body.error.message : response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function showAuth() {
  const box = $("auth");
  if (!box || !box.hidden) return;
  box.hidden = false;
  $("auth-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const response = await fetch("/v1/session", {
      method: "POST",
      credentials: "omit",
      headers: { Authorization: "Bearer " + $("auth-key").value },
    });
    if (response.ok) {
      const session = await response.json();
      if (session.token) sessionStorage.setItem(SESSION, session.token);
      location.reload();
    } else { $("auth-error").hidden = false; $("auth-error").textContent = "wrong key"; }
  });
}

// A server-sent event stream read with fetch, which sends the session's bearer (EventSource cannot
// send a header): each event to on(name, data); reconnected after a drop with Last-Event-ID, as
// EventSource does (no gap, no repeat), until stop() says the stream is done. A server that is busy
// (429, 503) is asked again after its Retry-After, longer each time; an answer that another try
// cannot change (a debate deleted meanwhile: 404) ends it, said on the page.
async function readEvents(path, on, stop) {
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  let last = null;
  let retry = 1000; // the server's retry: field, else 1 s (as EventSource)
  let wait = retry;
  while (!stop()) {
    let response = null;
    try {
      const headers = authHeaders();
      if (last !== null) headers["Last-Event-ID"] = last;
      response = await fetch(path, { headers, credentials: "omit", cache: "no-store" });
    } catch (err) {
      console.warn("the event stream could not be reached; trying again", err); // (the tests fail on errors)
    }
    if (response !== null && response.status === 401) {
      sessionStorage.removeItem(SESSION);
      showAuth();
      return;
    }
    if (response !== null && [408, 429, 502, 503, 504].includes(response.status)) {
      const after = Number(response.headers.get("Retry-After"));
      await sleep(after > 0 ? after * 1000 : wait);
      wait = Math.min(wait * 2, 30000);
      continue;
    }
    if (response !== null && (!response.ok || !response.body)) {
      addProblem(`the debate's events could not be read (${response.status} ${response.statusText})`);
      return;
    }
    if (response !== null) {
      wait = retry;
      try {
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          // Line ends read as LF; a CR that ends a piece may be half of a CRLF: kept for the next.
          let text = buffer + value;
          const held = text.endsWith("\r") ? "\r" : "";
          text = (held ? text.slice(0, -1) : text).replace(/\r\n?/g, "\n");
          let end;
          while ((end = text.indexOf("\n\n")) !== -1) {
            const block = text.slice(0, end);
            text = text.slice(end + 2);
            let name = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line === "" || line.startsWith(":")) continue; // a comment: the keepalive
              const colon = line.indexOf(":");
              const field = colon === -1 ? line : line.slice(0, colon);
              const said = colon === -1 ? "" : line.slice(colon + 1).replace(/^ /, "");
              if (field === "event") name = said;
              else if (field === "data") data.push(said);
              else if (field === "id") last = said;
              else if (field === "retry" && /^\d+$/.test(said)) retry = wait = Number(said);
            }
            if (data.length) on(name, data.join("\n")); // (on reports its own failures: the stream goes on)
          }
          buffer = text + held;
        }
      } catch (err) {
        console.warn("the event stream dropped; reconnecting", err);
      }
    }
    if (!stop()) await sleep(wait);
  }
}

// ---------------------------------------------------------------------------------- the list

const listState = { cursor: null, timer: null };

async function loadOptions() {
  const [protocols, models] = await Promise.all([api("/v1/protocols"), api("/v1/models")]);
  const select = $("protocol");
  for (const p of protocols.protocols) {
    const option = el("option", { value: p.name, text: `${p.name} (${p.calls} calls)` });
    option.dataset.description = p.description;
    select.append(option);
  }
  select.value = "affirmative-critical";
  const describe = () => {
    const chosen = select.selectedOptions[0];
    $("protocol-description").textContent = chosen ? chosen.dataset.description : "";
  };
  select.addEventListener("change", describe);
  describe();
  for (const m of models.backends) $("model").append(el("option", { value: m, text: m }));
}

async function startDebate(e) {
  e.preventDefault();
  const error = $("start-error");
  error.hidden = true;
  const body = { protocol: $("protocol").value, question: $("question").value.trim() };
  const context = $("context").value.split(/\n\s*\n/).map((s) => s.trim()).filter(Boolean);
  if (context.length) body.context = context;
  if ($("model").value) body.model = $("model").value;
  if ($("rounds").value) body.rounds = parseInt($("rounds").value, 10);
  // The budget: each field left empty keeps the protocol's own (the server caps every one).
  const budget = {};
  if ($("timeout").value) budget.timeout_s = parseFloat($("timeout").value);
  if ($("max-calls").value) budget.max_calls = parseInt($("max-calls").value, 10);
  if ($("max-tokens").value) budget.max_tokens_per_turn = parseInt($("max-tokens").value, 10);
  if (Object.keys(budget).length) body.budget = budget;
  $("start").disabled = true;
  try {
    const created = await api("/v1/debates", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    location.href = created.links.viewer;
  } catch (err) {
    error.textContent = err.message;
    error.hidden = false;
    $("start").disabled = false;
  }
}

function debateRow(d) {
  const link = el("a", { href: d.links.viewer, text: d.question });
  const started = d.started_at || d.created_at;
  return el(
    "tr", { "data-id": d.id, "data-status": d.status },
    el("td", {}, el("span", { class: "badge " + d.status, text: d.status })),
    el("td", { text: d.protocol }),
    el("td", { class: "q" }, link, d.error ? el("div", { class: "hint error", text: d.error }) : null),
    el("td", { class: "num", text: fmtInt(d.calls) }),
    el("td", { class: "num", text: fmtInt(d.tokens) }),
    el("td", { class: "num", text: fmtTime(d.elapsed_s) }),
    el("td", { class: "hint", text: new Date(started).toLocaleString() }),
  );
}

async function loadList(append) {
  const params = new URLSearchParams({ limit: "25" });
  if ($("status-filter").value) params.set("status", $("status-filter").value);
  if (append && listState.cursor) params.set("cursor", listState.cursor);
  const page = await api("/v1/debates?" + params);
  const rows = $("debate-rows");
  if (!append) rows.replaceChildren();
  for (const d of page.debates) rows.append(debateRow(d));
  listState.cursor = page.next_cursor;
  $("older").hidden = !page.next_cursor;
  $("empty").hidden = rows.children.length > 0;
  const live = page.debates.some((d) => d.status === "running" || d.status === "queued");
  clearTimeout(listState.timer);
  if (live && !append) listState.timer = setTimeout(() => loadList(false), 2000);
}

function indexPage() {
  $("start-form").addEventListener("submit", startDebate);
  $("status-filter").addEventListener("change", () => loadList(false));
  $("older").addEventListener("click", () => loadList(true));
  loadOptions().catch((err) => { $("start-error").textContent = err.message; $("start-error").hidden = false; });
  loadList(false).catch(() => {});
}

// -------------------------------------------------------------------------------- one debate

const view = {
  id: null, participants: [], columns: {}, rows: {}, cells: {}, decisionBlocks: {}, ended: false, live: false,
  // The last totals the server sent, and the turns in flight: key -> the tokens they streamed so far.
  totals: null, open: {},
};

function cellKey(speaker, round) { return speaker + "@" + round; }

// The badge's text, and its class (the status itself, or a one-word class for a text with spaces).
function setStatus(status, cls) {
  const badge = $("status");
  badge.textContent = status;
  badge.className = "badge " + (cls || status);
  view.live = status === "running" || status === "queued";
  $("cancel").hidden = !view.live;
}

// The debate's start on this page's clock (performance.now()), once known: from its started_at when
// the page opens on a running debate, else when its debate_started event comes.
const clock = { origin: null, timer: null };

function startClock(secondsAgo) {
  if (clock.origin === null) clock.origin = performance.now() - 1000 * Math.max(0, secondsAgo);
}

// A rough count of the tokens in streamed text (moot's approx_tokens: words and punctuation marks).
function approxTokens(text) {
  const pieces = text.match(/[\p{L}\p{N}\p{M}_]+|[^\p{L}\p{N}\p{M}_\s]/gu);
  return pieces ? pieces.length : 0;
}

function setTotals(t) {
  if (!t) return;
  view.totals = t;
  // The server's elapsed time is when it sent these totals: the clock never shows less.
  if (view.live && clock.origin !== null) clock.origin = Math.min(clock.origin, performance.now() - 1000 * t.elapsed_s);
  showTotals();
}

// Calls, tokens and time as they grow: the finished turns' totals from the server, plus the turns
// in flight (each is a call under way, and its streamed tokens count as they come).
function showTotals() {
  const t = view.totals || { calls: 0, total_tokens: 0, elapsed_s: 0 };
  const open = Object.values(view.open);
  const running = view.live ? open.length : 0;
  $("calls").textContent = fmtInt(t.calls);
  $("calls-running").textContent = running ? ` +${running} running` : "";
  $("tokens").textContent = fmtInt(t.total_tokens + (view.live ? open.reduce((a, b) => a + b, 0) : 0));
  if (!view.live || clock.origin === null) $("elapsed").textContent = fmtTime(t.elapsed_s);
  else tick();
}

// While the debate runs, the elapsed time keeps counting between the events that report it.
function tick() {
  if (!view.live || clock.origin === null) return;
  $("elapsed").textContent = fmtTime((performance.now() - clock.origin) / 1000);
}

// A value of a typed turn or a decision, readable: lists one item a line, objects as key: value.
function formatValue(v) {
  if (typeof v === "string") return v;
  if (Array.isArray(v)) return v.map(formatValue).join("\n");
  if (v && typeof v === "object") {
    return Object.entries(v).map(([k, x]) => `${k}: ${typeof x === "object" ? JSON.stringify(x) : x}`).join(", ");
  }
  return JSON.stringify(v);
}

function addProblem(text) {
  $("problems").hidden = false;
  const list = $("problem-list");
  for (const li of list.children) if (li.textContent === text) return;
  list.append(el("li", { text }));
}

function onStarted(d) {
  setStatus("running");
  startClock(0);
  $("question").textContent = d.question;
  document.title = "moot · " + d.question;
  $("protocol").textContent = `${d.protocol} · up to ${d.rounds} round${d.rounds === 1 ? "" : "s"} · decision: ${d.decision}`;
  $("context-count").textContent = d.context_passages ? `${d.context_passages} context passage(s)` : "";
  view.participants = d.participants;
  $("grid").style.setProperty("--speakers", String(Math.max(1, d.participants.length)));
  $("download").hidden = false;
  const head = $("grid-head");
  head.replaceChildren(el("th", { class: "round-col", text: "round" }));
  for (const p of d.participants) {
    head.append(el("th", { "data-speaker": p.id },
      el("span", { class: "who", text: p.name }),
      el("span", { class: "role", text: [p.role, p.stance].filter(Boolean).join(" · ") }),
      el("span", { class: "model", text: p.model })));
  }
}

function roundRow(round) {
  if (view.rows[round]) return view.rows[round];
  const tr = el("tr", { "data-round": String(round) }, el("td", { class: "round-col", text: "round " + round }));
  for (const p of view.participants) {
    const td = el("td", { class: "empty", "data-speaker": p.id, text: "" });
    tr.append(td);
  }
  const foot = el("tr", { class: "round-foot", "data-round-foot": String(round) },
    el("td", {}), el("td", { colspan: String(Math.max(1, view.participants.length)) }));
  $("grid-body").append(tr, foot);
  view.rows[round] = { tr, foot };
  return view.rows[round];
}

function turnCell(speaker, round) {
  const key = cellKey(speaker, round);
  if (view.cells[key]) return view.cells[key];
  const row = roundRow(round).tr;
  let td = row.querySelector(`td[data-speaker="${CSS.escape(speaker)}"]`);
  if (!td) { td = el("td", { "data-speaker": speaker }); row.append(td); }
  td.className = "turn";
  td.replaceChildren();
  const text = el("div", { class: "text" });
  td.append(text);
  view.cells[key] = { td, text };
  return view.cells[key];
}

function decisionBlock(name, round, key) {
  $("decision").hidden = false;
  if (view.decisionBlocks[key]) return view.decisionBlocks[key];
  const block = el("div", { class: "turn-block" }, el("b", { text: name }));
  const text = el("div", { class: "text" });
  block.append(text);
  $("decision-turns").append(block);
  view.decisionBlocks[key] = { td: block, text };
  return view.decisionBlocks[key];
}

let decisionCount = 0;

function onTurnStarted(d) {
  view.open[cellKey(d.speaker, d.round)] = 0;
  showTotals();
  if (d.kind === "decision") {
    decisionCount += 1;
    const cell = decisionBlock(d.name, d.round, "decision#" + decisionCount);
    cell.td.classList.add("streaming");
    view.cells[cellKey(d.speaker, d.round)] = cell;
    return;
  }
  const cell = turnCell(d.speaker, d.round);
  cell.td.classList.add("streaming");
  cell.text.textContent = "";
}

function onToken(d) {
  const key = cellKey(d.speaker, d.round);
  const cell = view.cells[key];
  if (cell) cell.text.textContent += d.text;
  if (key in view.open) {
    view.open[key] += approxTokens(d.text);
    showTotals();
  }
}

function onRetry(d) {
  const key = cellKey(d.speaker, d.round);
  if (key in view.open) view.open[key] = 0;
  const cell = view.cells[key];
  if (!cell) return;
  cell.text.textContent = "";
  cell.td.append(el("span", { class: "flag warn", text: `retry ${d.attempt}: ${d.error}` }));
}

function fieldsList(parsed) {
  const dl = el("dl", { class: "fields" });
  for (const [k, v] of Object.entries(parsed)) {
    dl.append(el("dt", { text: k }), el("dd", { text: formatValue(v) }));
  }
  return dl;
}

function onTurnDone(d) {
  const t = d.turn;
  delete view.open[cellKey(t.speaker, t.round)];
  setTotals(d.totals);
  let cell = view.cells[cellKey(t.speaker, t.round)];
  if (t.kind === "decision") {
    if (!cell) { decisionCount += 1; cell = decisionBlock(t.name, t.round, "decision#" + decisionCount); }
  } else if (!cell) {
    cell = turnCell(t.speaker, t.round);
  }
  const td = cell.td;
  td.classList.remove("streaming");
  td.querySelectorAll(".foot, .answer").forEach((n) => n.remove());
  if (t.parsed) cell.text.replaceChildren(fieldsList(t.parsed));
  else cell.text.textContent = t.text || "";
  const flags = [];
  if (t.error) { td.classList.add("failed"); flags.push(["bad", "failed: " + t.error]); }
  if (t.parse_failure) { td.classList.add("failed"); flags.push(["bad", "unparsed: " + t.parse_failure.error]); }
  if (t.trimmed) flags.push(["warn", "trimmed to budget"]);
  // The model stopped at max_tokens: the text may end mid-sentence (the result's warnings say so too).
  if (t.finish_reason === "length") flags.push(["warn", "cut at its token limit"]);
  if (t.carried) flags.push(["info", "kept its answer (no call)"]);
  if (t.parse_failure && t.parse_failure.raw && !t.text) cell.text.textContent = t.parse_failure.raw;
  const foot = el("div", { class: "foot" },
    `${fmtInt(t.usage.completion_tokens)} tokens out · ${fmtTime(t.latency_s)} · ${t.model}`);
  for (const [kind, text] of flags) foot.append(el("span", { class: "flag " + kind, text }));
  td.append(foot);
  td.dataset.done = "true";
  if (t.error) addProblem(`${t.name}, round ${t.round}: ${t.error}`);
}

const held = {};

function onRoundDone(d) {
  setTotals(d.totals);
  const row = roundRow(d.round);
  for (const [speaker, answer] of Object.entries(d.answers)) {
    const cell = view.cells[cellKey(speaker, d.round)];
    if (!cell || answer === null) continue;
    const line = el("div", { class: "answer", text: "holds: " + answer });
    if (held[speaker] !== undefined && held[speaker] !== answer) {
      line.append(el("span", { class: "flag warn", text: "changed from " + held[speaker] }));
    }
    cell.td.append(line);
    held[speaker] = answer;
  }
  const parts = [];
  if (d.agreement !== null && d.agreement !== undefined) {
    parts.push(`agreement ${Math.round(d.agreement * 100)}% on “${d.majority}”`);
  }
  if (d.round > 1 && d.agreement !== null) parts.push(`${d.changed} changed answer${d.changed === 1 ? "" : "s"}`);
  if (d.errors) parts.push(`${d.errors} failed`);
  if (d.parse_failures) parts.push(`${d.parse_failures} unparsed`);
  row.foot.lastChild.textContent = parts.length ? parts.join(" · ") : `round ${d.round} done`;
  for (const w of d.warnings) addProblem(w);
}

// A turn the debate's end cut short (its timeout, a cancel, the server stopping): the engine
// started it and never finished it, so no turn_done came. Flagged as a failure, with the reason.
function markCut(cell, reason) {
  const td = cell.td;
  td.classList.remove("streaming");
  td.classList.add("failed");
  td.dataset.cut = "true";
  td.querySelectorAll(".foot.cut").forEach((n) => n.remove());
  td.append(el("div", { class: "foot cut" }, el("span", { class: "flag bad", text: "cut short: " + reason })));
}

function unfinishedCells() {
  return Object.values(view.cells).filter((c) => c.td.dataset.done !== "true" && c.td.dataset.cut !== "true");
}

// The turns the debate's end cut short. debate_done does not list them; the stored result does
// (each with its error) when the engine recorded them (a timeout, a cancel, a clean stop). A server
// that was killed never wrote them: their cells are flagged with the debate's own error.
async function flagCutTurns(d) {
  if (d.status === "complete" && unfinishedCells().length === 0) return;
  let result = null;
  try { result = (await api(`/v1/debates/${view.id}`)).result; } catch (err) { addProblem(err.message); }
  const turns = result ? [...(result.rounds || []).flatMap((r) => r.turns), ...(result.decision_turns || [])] : [];
  for (const t of turns) {
    if (!t.error) continue;
    let cell = view.cells[cellKey(t.speaker, t.round)];
    if (cell && cell.td.dataset.done === "true") continue; // its turn_done showed the error
    if (!cell && t.kind === "decision") {
      decisionCount += 1;
      cell = decisionBlock(t.name, t.round, "decision#" + decisionCount);
      view.cells[cellKey(t.speaker, t.round)] = cell;
    } else if (!cell) {
      cell = turnCell(t.speaker, t.round);
    }
    markCut(cell, t.error);
  }
  const reason = d.error || `the debate ended (${d.status}) during this turn`;
  for (const cell of unfinishedCells()) markCut(cell, reason);
  for (const [round, row] of Object.entries(view.rows)) {
    const foot = row.foot.lastChild;
    if (!foot.textContent && row.tr.querySelector("td[data-cut]")) foot.textContent = `round ${round} cut short (${d.status})`;
  }
}

// What the debate cost: money at the server's prices (or why not), and against a single call.
function describeCost(cost) {
  let money;
  if (cost.unpriced && cost.unpriced.length) money = "tokens only: no price for " + cost.unpriced.join(", ");
  else if (cost.usd === null || cost.usd === undefined) money = "no price";
  else if (cost.usd === 0) money = "$0";
  else money = "$" + (cost.usd < 0.01 ? cost.usd.toFixed(6) : cost.usd.toFixed(4));
  const byMoney = cost.ratio_to_single_usd !== null && cost.ratio_to_single_usd !== undefined;
  const ratio = byMoney ? cost.ratio_to_single_usd : cost.ratio_to_single_tokens;
  if (ratio === null || ratio === undefined) return money;
  return `${money} · ${ratio.toFixed(1)}x a single call's ${byMoney ? "cost" : "tokens"}`;
}

// A decision turn whose text is the final answer (a synthesis) is not printed twice: its block
// keeps its name and numbers, and points to the answer.
function foldIntoFinal(answer) {
  const blocks = Object.values(view.decisionBlocks);
  const last = blocks[blocks.length - 1];
  if (!last || last.text.textContent.trim() !== answer.trim()) return;
  last.text.hidden = true;
  last.td.dataset.final = "true";
  last.td.insertBefore(el("div", { class: "hint", text: "its text is the final answer below" }), last.text);
}

async function onDone(d) {
  setStatus(d.status);
  view.open = {};
  setTotals(d.totals);
  $("stop-reason").textContent = d.stop_reason ? "stopped: " + d.stop_reason : "";
  if (d.cost) {
    $("cost").textContent = describeCost(d.cost);
    $("cost-wrap").hidden = false;
  }
  view.ended = true;
  for (const c of Object.values(view.cells)) c.td.classList.remove("streaming");
  if (d.final_answer !== null && d.final_answer !== undefined) {
    $("decision").hidden = false;
    $("final").hidden = false;
    $("final-answer").textContent = d.final_answer;
    foldIntoFinal(d.final_answer);
    const fields = $("decision-fields");
    fields.replaceChildren();
    if (d.decision) {
      $("decision-kind").textContent = "(" + (d.decision.kind || "") + ")";
      for (const [k, v] of Object.entries(d.decision)) {
        if (k === "kind") continue;
        fields.append(el("dt", { text: k }), el("dd", { text: formatValue(v) }));
      }
    }
    if (d.quality) {
      // Seed 004's quality, when the debate asked for it: each measured dimension, and why others are not.
      for (const [k, q] of Object.entries(d.quality.scores || {})) {
        fields.append(el("dt", { text: k }), el("dd", { text: q.value.toFixed(2) + " (" + q.method + ")" }));
      }
      for (const [k, why] of Object.entries(d.quality.unmeasured || {})) {
        fields.append(el("dt", { text: k }), el("dd", { text: "not measured: " + why }));
      }
    }
  }
  if (d.error) addProblem(d.error);
  for (const w of d.warnings || []) addProblem(w);
  try { await flagCutTurns(d); } finally { document.body.dataset.done = d.status; }
}

function follow() {
  const handlers = {
    debate_started: onStarted,
    turn_started: onTurnStarted,
    token: onToken,
    turn_retry: onRetry,
    turn_done: onTurnDone,
    round_done: onRoundDone,
    debate_done: onDone,
  };
  const on = (name, data) => {
    if (name === "debate_done") view.ended = true; // the stream ends with it: not reconnected
    const fn = handlers[name];
    if (!fn) return;
    const failed = (err) => {
      console.error(err); // still seen by the browser tests, which fail on console errors
      addProblem("the viewer failed: " + err.message);
    };
    // A handler's failure, thrown at once or later, is said on the page; the stream goes on.
    try { Promise.resolve(fn(JSON.parse(data))).catch(failed); } catch (err) { failed(err); }
  };
  readEvents(`/v1/debates/${view.id}/events`, on, () => view.ended === true);
}

// The transcript's JSON, downloaded with the session's bearer (a link cannot send one).
async function download(e) {
  e.preventDefault();
  try {
    const response = await fetch(`/v1/debates/${view.id}/result`, { headers: authHeaders(), credentials: "omit" });
    if (response.status === 401) {
      sessionStorage.removeItem(SESSION);
      showAuth();
      return;
    }
    if (!response.ok) throw new Error(`the transcript could not be downloaded (${response.status})`);
    const url = URL.createObjectURL(await response.blob());
    const link = el("a", { href: url, download: `moot-${view.id}.json` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  } catch (err) { addProblem(err.message); }
}

async function debatePage() {
  view.id = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
  $("permalink").href = `/debates/${view.id}`;
  $("download").href = `/v1/debates/${view.id}/result`;
  $("download").addEventListener("click", download);
  $("cancel").addEventListener("click", async () => {
    $("cancel").disabled = true;
    try { await api(`/v1/debates/${view.id}/cancel`, { method: "POST" }); }
    catch (err) { addProblem(err.message); }
  });
  try {
    const info = await api(`/v1/debates/${view.id}`);
    setStatus(info.status);
    if (view.live && info.started_at) startClock((Date.now() + serverClock.skew - Date.parse(info.started_at)) / 1000);
    $("question").textContent = info.question;
    $("protocol").textContent = info.protocol;
    $("download").hidden = !info.result; // nothing to download before it starts (or if it never did)
  } catch (err) {
    // An unknown id (404), a key to give (401), or a server that does not answer: say so, offer no download.
    $("question").textContent = err.message;
    $("download").hidden = true;
    if (err.status === 404) setStatus("not found", "notfound");
    else if (err.status === 401) setStatus("needs key", "locked");
    else setStatus("error", "failed");
    document.title = "moot · " + $("status").textContent;
    return;
  }
  follow();
  clock.timer = setInterval(tick, 200);
}

if (document.body.dataset.page === "index") indexPage();
else if (document.body.dataset.page === "debate") debatePage();
