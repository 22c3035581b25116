// moot view: a run's items with filters, each item's transcripts, two protocols side by side.
// Built on moot.js's helpers (el, api, fieldsList, formatValue, describeCost, fmtInt, fmtTime).
// Everything the run holds (questions, model text) is set as text (textContent, attributes),
// never parsed as HTML.
"use strict";

(() => {
  const byId = (id) => document.getElementById(id);
  const BOXES = [
    ["both_right", "both right"],
    ["only_a", "only A right"],
    ["only_b", "only B right"],
    ["both_wrong", "both wrong"],
    ["disagree", "answers differ"],
  ];

  const state = { info: null, a: "", b: "" };

  function short(text, n) {
    const s = String(text);
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  function pct(k, n) { return n ? (100 * k / n).toFixed(1) + "%" : "–"; }

  function outcomeOf(cell) {
    if (!cell) return "none";
    if (cell.status !== "ok") return "failed";
    if (cell.correct === true) return "right";
    if (cell.correct === false) return "wrong";
    return "ok";
  }

  const BADGE = { right: "complete", wrong: "failed", failed: "cancelled", ok: "", none: "" };

  function outcomeBadge(cell) {
    const kind = outcomeOf(cell);
    return el("span", { class: "badge outcome " + BADGE[kind], "data-outcome": kind, text: kind === "none" ? "no result" : kind });
  }

  function flipFlag(cell) {
    if (!cell || !cell.flips) return null;
    const parts = [`${cell.flips} answer change${cell.flips === 1 ? "" : "s"} between rounds`];
    if (cell.right_to_wrong) parts.push(`${cell.right_to_wrong} right to wrong`);
    if (cell.wrong_to_right) parts.push(`${cell.wrong_to_right} wrong to right`);
    return el("span", { class: "flag warn flipped", title: parts.join("; "), text: `flipped ×${cell.flips}` });
  }

  function showError(box, err) {
    box.textContent = err.message;
    box.hidden = false;
  }

  // The options of a protocol <select>: "" first when given a label for it.
  function fillProtocols(select, protocols, none) {
    select.replaceChildren();
    if (none !== undefined) select.append(el("option", { value: "", text: none }));
    for (const p of protocols) select.append(el("option", { value: p, text: p }));
  }

  // ------------------------------------------------------------------------- paired counts

  async function showPairCounts(box, a, b, onPick, active) {
    const note = byId("pair-test");
    if (!a || !b || a === b || !state.info.gold) {
      box.hidden = true;
      box.replaceChildren();
      note.textContent = "";
      return;
    }
    const c = await api("/v1/view/pair?" + new URLSearchParams({ a, b }));
    box.hidden = false;
    box.replaceChildren();
    const names = { only_a: `only ${a} right`, only_b: `only ${b} right` };
    for (const [key, label] of BOXES) {
      const button = el("button", { type: "button", class: "pair-box " + key, "data-pair": key },
        el("span", { class: "n", text: fmtInt(c[key]) }),
        el("span", { class: "what", text: names[key] || label }));
      if (key === active) button.classList.add("active");
      if (onPick) button.addEventListener("click", () => onPick(key));
      else button.disabled = true;
      box.append(button);
    }
    const diff = c.paired ? ((c.only_b - c.only_a) / c.paired) * 100 : 0;
    note.textContent = `${fmtInt(c.paired)} paired items · B − A ${diff >= 0 ? "+" : ""}${diff.toFixed(1)} points · ` +
      `exact McNemar p = ${c.p_value < 0.001 ? c.p_value.toExponential(1) : c.p_value.toFixed(3)}`;
    box.dataset.ready = "true";
  }

  // ------------------------------------------------------------------------------ the run page

  function filtersFromPage() {
    const f = {};
    if (byId("f-protocol").value) f.protocol = byId("f-protocol").value;
    if (byId("f-outcome").value) f.outcome = byId("f-outcome").value;
    if (byId("f-pair").value && state.a && state.b) f.pair = byId("f-pair").value;
    if (byId("f-flipped").checked) f.flipped = "true";
    if (byId("f-q").value.trim()) f.q = byId("f-q").value.trim();
    return f;
  }

  function pageParams() {
    const p = new URLSearchParams(filtersFromPage());
    if (state.a) p.set("a", state.a);
    if (state.b) p.set("b", state.b);
    return p;
  }

  function statsRow(s, gold) {
    const link = el("a", { href: "#", text: s.protocol });
    link.addEventListener("click", (e) => {
      e.preventDefault();
      byId("f-protocol").value = s.protocol;
      reload();
    });
    return el("tr", { "data-protocol": s.protocol },
      el("td", {}, link),
      el("td", { class: "num", text: fmtInt(s.results) }),
      gold ? el("td", { class: "num", text: fmtInt(s.correct) }) : null,
      gold ? el("td", { class: "num", text: pct(s.correct, s.results) }) : null,
      el("td", { class: "num", text: fmtInt(s.failed) }),
      el("td", { class: "num", text: fmtInt(s.flipped) }),
      el("td", { class: "num", text: s.mean_calls.toFixed(1) }),
      el("td", { class: "num", text: fmtInt(Math.round(s.mean_tokens)) }));
  }

  function cellTd(cell, role) {
    if (!cell) return el("td", { class: "cell hint", "data-role": role, text: "–" });
    const answer = cell.answer === null || cell.answer === undefined ? "(no answer)" : short(cell.answer, 80);
    return el("td", { class: "cell", "data-role": role, "data-outcome": outcomeOf(cell) },
      el("span", { class: "ans", title: cell.answer || "", text: answer }), " ", outcomeBadge(cell), flipFlag(cell));
  }

  function dots(row, protocols) {
    const td = el("td", { class: "dots" });
    for (const p of protocols) {
      const cell = row.cells[p];
      const kind = outcomeOf(cell);
      const answer = cell && cell.answer !== null ? cell.answer : "no answer";
      td.append(el("span", { class: "dot " + kind, title: `${p}: ${cell ? short(answer, 60) + " (" + kind + ")" : "no result"}` }));
    }
    return td;
  }

  function itemsHead(info) {
    const head = byId("items-head");
    head.replaceChildren(el("th", { class: "num", text: "#" }), el("th", { text: "item" }),
      el("th", { text: info.kind === "eval" ? "gold" : "reference" }));
    const shown = columns(info);
    for (const [role, p] of shown) head.append(el("th", { "data-role": role, text: `${role}: ${p}` }));
    if (info.protocols.length > 1) head.append(el("th", { text: "every protocol" }));
  }

  // The protocols whose answers get a column: A and B (or the one the filter picks, or the only one).
  function columns(info) {
    const shown = [];
    if (state.a) shown.push(["A", state.a]);
    if (state.b && state.b !== state.a) shown.push(["B", state.b]);
    if (!shown.length && info.protocols.length) shown.push(["A", info.protocols[0]]);
    return shown;
  }

  function itemRow(row, info) {
    const params = pageParams();
    params.set("id", row.item.id);
    const link = el("a", { href: "/item?" + params, class: "qtext", text: row.item.question });
    const tr = el("tr", { "data-id": row.item.id },
      el("td", { class: "num hint", text: String(row.item.index + 1) }),
      el("td", { class: "q" }, link, el("div", { class: "hint", text: row.item.id })),
      el("td", { class: "gold", text: row.item.gold === null ? "" : short(row.item.gold, 40) }));
    for (const [role, p] of columns(info)) tr.append(cellTd(row.cells[p], role));
    if (info.protocols.length > 1) tr.append(dots(row, info.protocols));
    return tr;
  }

  let loading = 0;

  async function reload() {
    const mine = ++loading;
    const error = byId("filter-error");
    error.hidden = true;
    document.body.dataset.loaded = "false";
    history.replaceState(null, "", "/?" + pageParams());
    try {
      const [page] = await Promise.all([
        api("/v1/view/items?" + pageParams()),
        showPairCounts(byId("pair-counts"), state.a, state.b, pickPair, byId("f-pair").value),
      ]);
      if (mine !== loading) return;
      itemsHead(state.info);
      const body = byId("item-rows");
      body.replaceChildren(...page.rows.map((row) => itemRow(row, state.info)));
      byId("shown").textContent = `${fmtInt(page.rows.length)} of ${fmtInt(page.total)}`;
      byId("empty").hidden = page.rows.length > 0;
    } catch (err) {
      showError(error, err);
    } finally {
      if (mine === loading) document.body.dataset.loaded = "true";
    }
  }

  function pickPair(key) {
    byId("f-pair").value = byId("f-pair").value === key ? "" : key;
    reload();
  }

  async function runsPage() {
    let info;
    try {
      info = await api("/v1/view/run");
    } catch (err) {
      byId("title").textContent = err.message;
      return;
    }
    state.info = info;
    document.body.dataset.kind = info.kind;
    document.body.classList.toggle("no-gold", !info.gold);
    const title = info.kind === "eval" ? info.dataset : info.kind === "batch" ? "batch run" : "transcript";
    byId("title").textContent = title;
    document.title = "moot · " + title;
    byId("kind").textContent = info.kind;
    byId("source").textContent = info.source;
    byId("model").textContent = info.model ? "model " + info.model : "";
    byId("item-count").textContent = fmtInt(info.items);
    byId("protocol-count").textContent = fmtInt(info.protocols.length);
    byId("stats-body").replaceChildren(...info.stats.map((s) => statsRow(s, info.gold)));
    for (const th of document.querySelectorAll("#stats th.gold-only")) th.hidden = !info.gold;
    for (const option of document.querySelectorAll("option.gold-only")) option.disabled = !info.gold;
    fillProtocols(byId("f-protocol"), info.protocols, "any");

    const q = new URLSearchParams(location.search);
    const known = (p) => (info.protocols.includes(p) ? p : "");
    state.a = known(q.get("a") || "") || info.protocols[0] || "";
    state.b = q.has("b") ? known(q.get("b")) : (info.protocols.find((p) => p !== state.a) || "");
    if (state.b === state.a) state.b = "";
    const two = info.protocols.length > 1;
    byId("compare").hidden = !two;
    byId("f-pair-wrap").hidden = !two;
    if (two) {
      fillProtocols(byId("pick-a"), info.protocols);
      fillProtocols(byId("pick-b"), info.protocols, "none");
      byId("pick-a").value = state.a;
      byId("pick-b").value = state.b;
      const picked = () => {
        state.a = byId("pick-a").value;
        state.b = byId("pick-b").value === state.a ? "" : byId("pick-b").value;
        byId("pick-b").value = state.b;
        reload();
      };
      byId("pick-a").addEventListener("change", picked);
      byId("pick-b").addEventListener("change", picked);
    }
    byId("f-protocol").value = known(q.get("protocol") || "");
    byId("f-outcome").value = q.get("outcome") || "";
    byId("f-pair").value = q.get("pair") || "";
    byId("f-flipped").checked = q.get("flipped") === "true";
    byId("f-q").value = q.get("q") || "";
    for (const id of ["f-protocol", "f-outcome", "f-pair", "f-flipped"]) byId(id).addEventListener("change", reload);
    let typing = null;
    byId("f-q").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(reload, 250); });
    byId("filters").addEventListener("submit", (e) => { e.preventDefault(); reload(); });
    byId("f-clear").addEventListener("click", () => {
      for (const id of ["f-protocol", "f-outcome", "f-pair", "f-q"]) byId(id).value = "";
      byId("f-flipped").checked = false;
      reload();
    });
    await reload();
    // A protocol the link names that this run does not have: said, not dropped without a word.
    const asked = q.get("protocol");
    if (asked && !known(asked)) {
      showError(byId("filter-error"), { message: `no protocol '${asked}' in this run: showing every protocol's items` });
    }
  }

  // ----------------------------------------------------------------------------- a transcript

  function turnCard(t, answer, before) {
    const failed = Boolean(t.error || t.parse_failure);
    const card = el("div", { class: "turn-card" + (failed ? " failed" : ""), "data-speaker": t.speaker, "data-round": String(t.round) });
    card.append(el("div", { class: "who" }, el("b", { text: t.name }),
      el("span", { class: "hint", text: " " + [t.role, t.model].filter(Boolean).join(" · ") })));
    const body = el("div", { class: "text" });
    if (t.parsed) body.append(fieldsList(t.parsed));
    else body.textContent = t.text || (t.parse_failure && t.parse_failure.raw) || t.raw || "";
    card.append(body);
    if (answer !== null && answer !== undefined) {
      const line = el("div", { class: "answer", text: "answer: " + answer });
      if (before !== undefined && before !== answer) line.append(el("span", { class: "flag warn", text: "changed from " + before }));
      card.append(line);
    }
    const flags = [];
    if (t.error) flags.push(["bad", "failed: " + t.error]);
    if (t.parse_failure) flags.push(["bad", "unparsed: " + t.parse_failure.error]);
    if (t.trimmed) flags.push(["warn", "trimmed to budget"]);
    if (t.finish_reason === "length") flags.push(["warn", "cut at its token limit"]);
    if (t.carried) flags.push(["info", "kept its answer (no call)"]);
    if (t.cached_calls) flags.push(["info", `${t.cached_calls} cached call(s)`]);
    const usage = t.usage || { prompt_tokens: 0, completion_tokens: 0 };
    const foot = el("div", { class: "foot" },
      `${t.calls} call${t.calls === 1 ? "" : "s"} · ${fmtInt(usage.prompt_tokens)} tokens in, ` +
      `${fmtInt(usage.completion_tokens)} out · ${fmtTime(t.latency_s)}`);
    for (const [kind, text] of flags) foot.append(el("span", { class: "flag " + kind, text }));
    card.append(foot);
    return card;
  }

  function renderSide(section, role, protocol, cell, result) {
    section.replaceChildren();
    section.dataset.protocol = protocol;
    section.dataset.role = role;
    section.append(el("div", { class: "title-row" },
      el("h2", { class: "side-title", text: `${role}: ${protocol}` }), outcomeBadge(cell), flipFlag(cell)));
    if (!cell) {
      section.append(el("p", { class: "hint", text: "This protocol has no result for this item." }));
      return;
    }
    const meta = el("div", { class: "meta" },
      el("span", {}, "answer ", el("b", { class: "side-answer", text: cell.answer === null ? "(none)" : cell.answer })),
      el("span", {}, "calls ", el("b", { text: fmtInt(cell.calls) })),
      el("span", {}, "tokens ", el("b", { text: fmtInt(cell.tokens) })),
      el("span", {}, "time ", el("b", { text: fmtTime(cell.latency_s) })),
      cell.stop_reason ? el("span", { text: "stopped: " + cell.stop_reason }) : null,
      result && result.cost ? el("span", { text: "cost " + describeCost(result.cost) }) : null);
    section.append(meta);
    if (cell.error) section.append(el("p", { class: "error", text: cell.error }));
    if (!result) {
      section.append(el("p", { class: "hint", text: "No transcript is stored for this result." }));
      return;
    }
    const dyn = (result.dynamics && result.dynamics.rounds) || [];
    const held = {};
    for (const r of result.rounds) {
      const d = dyn.find((x) => x.round === r.index);
      const parts = [];
      if (d && d.agreement !== null && d.agreement !== undefined) parts.push(`agreement ${Math.round(d.agreement * 100)}% on “${d.majority}”`);
      if (d && r.index > 1 && d.agreement !== null) parts.push(`${d.changed} changed answer${d.changed === 1 ? "" : "s"}`);
      const block = el("div", { class: "round", "data-round": String(r.index) },
        el("h3", { text: `Round ${r.index}` }), el("span", { class: "hint round-note", text: parts.join(" · ") }));
      const turns = el("div", { class: "turns" });
      for (const t of r.turns) {
        const answer = d ? d.answers[t.speaker] : undefined;
        turns.append(turnCard(t, answer, held[t.speaker]));
        if (answer !== null && answer !== undefined) held[t.speaker] = answer;
      }
      block.append(turns);
      section.append(block);
    }
    if ((result.decision_turns || []).length || result.final_answer !== null) {
      const block = el("div", { class: "round decision-part" }, el("h3", { text: "Decision" }));
      if (result.decision && result.decision.kind) block.append(el("span", { class: "hint", text: result.decision.kind }));
      const turns = el("div", { class: "turns" });
      for (const t of result.decision_turns || []) turns.append(turnCard(t));
      block.append(turns);
      if (result.final_answer !== null && result.final_answer !== undefined) {
        block.append(el("div", { class: "final-answer", text: result.final_answer }));
      }
      if (result.decision) {
        const fields = el("dl", { class: "fields" });
        for (const [k, v] of Object.entries(result.decision)) {
          if (k !== "kind") fields.append(el("dt", { text: k }), el("dd", { text: formatValue(v) }));
        }
        block.append(fields);
      }
      section.append(block);
    }
    const problems = [...(result.error ? [result.error] : []), ...(result.warnings || [])];
    if (problems.length) {
      section.append(el("ul", { class: "problems" }, ...problems.map((p) => el("li", { text: p }))));
    }
  }

  async function itemPage() {
    const q = new URLSearchParams(location.search);
    const id = q.get("id") || "";
    const back = new URLSearchParams(q);
    back.delete("id");
    byId("back").href = "/?" + back;
    let info;
    let detail;
    try {
      [info, detail] = await Promise.all([api("/v1/view/run"), api("/v1/view/item?" + new URLSearchParams({ id }))]);
    } catch (err) {
      byId("question").textContent = err.message;
      document.body.dataset.loaded = "error";
      return;
    }
    state.info = info;
    const item = detail.item;
    byId("question").textContent = item.question;
    document.title = "moot · " + short(item.question, 60);
    byId("item-id").textContent = item.id;
    if (item.gold !== null) {
      byId("gold-wrap").hidden = false;
      byId("gold-label").textContent = info.kind === "eval" ? "gold answer" : "reference";
      byId("gold").textContent = item.gold;
    }
    if (item.choices.length) {
      const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
      byId("choices").hidden = false;
      byId("choices").replaceChildren(...item.choices.map((c, n) =>
        el("li", { class: letters[n] === item.gold ? "gold" : "", text: c })));
    }
    if (item.context.length) {
      byId("context-wrap").hidden = false;
      byId("context").replaceChildren(...item.context.map((c) => el("p", { text: c })));
    }
    const present = info.protocols.filter((p) => detail.cells[p]);
    byId("cell-rows").replaceChildren(...info.protocols.map((p) => {
      const c = detail.cells[p];
      const tr = el("tr", { "data-protocol": p, class: c ? "pick" : "" },
        el("td", { text: p }),
        el("td", { text: c ? (c.answer === null ? "(none)" : short(c.answer, 80)) : "–" }),
        el("td", {}, outcomeBadge(c), flipFlag(c)),
        el("td", { class: "num", text: c ? String(c.rounds) : "" }),
        el("td", { class: "num", text: c ? String(c.flips) : "" }),
        el("td", { class: "num", text: c ? fmtInt(c.calls) : "" }),
        el("td", { class: "num", text: c ? fmtInt(c.tokens) : "" }),
        el("td", { class: "num", text: c ? fmtTime(c.latency_s) : "" }),
        el("td", { class: "hint", text: c && c.stop_reason ? c.stop_reason : "" }));
      if (c) tr.addEventListener("click", () => { byId("pick-a").value = p; picked(); });
      return tr;
    }));

    const known = (p) => (info.protocols.includes(p) ? p : "");
    fillProtocols(byId("pick-a"), info.protocols);
    fillProtocols(byId("pick-b"), info.protocols, "none: A alone");
    byId("pick-a").value = known(q.get("a") || "") || present[0] || info.protocols[0];
    byId("pick-b").value = known(q.get("b") || "");

    async function picked() {
      const a = byId("pick-a").value;
      let b = byId("pick-b").value;
      if (b === a) { b = ""; byId("pick-b").value = ""; }
      const params = new URLSearchParams(location.search);
      params.set("a", a);
      if (b) params.set("b", b); else params.delete("b");
      history.replaceState(null, "", "/item?" + params);
      const backParams = new URLSearchParams(params);
      backParams.delete("id");
      byId("back").href = "/?" + backParams;
      document.body.dataset.loaded = "false";
      byId("sides").style.setProperty("--sides", b ? "2" : "1");
      renderSide(byId("side-a"), "A", a, detail.cells[a], detail.transcripts[a]);
      byId("side-b").hidden = !b;
      if (b) renderSide(byId("side-b"), "B", b, detail.cells[b], detail.transcripts[b]);
      else byId("side-b").replaceChildren();
      for (const tr of byId("cell-rows").children) tr.classList.toggle("chosen", tr.dataset.protocol === a || tr.dataset.protocol === b);
      try {
        await showPairCounts(byId("pair-counts"), a, b, null, null);
      } finally {
        document.body.dataset.loaded = "true";
      }
    }

    byId("pick-a").addEventListener("change", picked);
    byId("pick-b").addEventListener("change", picked);
    await picked();
  }

  const run = (fn) => fn().catch((err) => {
    console.error(err); // the browser tests fail on console errors
    document.body.dataset.loaded = "error";
  });
  if (document.body.dataset.page === "runs") run(runsPage);
  else if (document.body.dataset.page === "runs-item") run(itemPage);
})();
