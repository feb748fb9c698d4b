"use strict";
// agentboost view: everything from the data is inserted with textContent, never parsed as HTML.
(function () {
  const PAGE_SIZE = 100;
  const data = JSON.parse(document.getElementById("summary").textContent);
  const rows = data.rows;
  const vocab = data.vocab || {};
  const $ = (id) => document.getElementById(id);
  const state = { key: "i", dir: 1, page: 0, filtered: rows, selected: null };

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [name, value] of Object.entries(props)) {
        if (name === "text") node.textContent = value;
        else if (name === "cls") node.className = value;
        else node.setAttribute(name, value);
      }
    }
    for (const child of children) if (child != null) node.appendChild(child);
    return node;
  }
  const fmtReward = (v) => (v === null || v === undefined ? "n/a" : v.toFixed(3));
  const fmt = (v) => (v === null || v === undefined ? "n/a" : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : String(v));

  // --- overview: summary, statistics tables, reward histogram ---------------------------------
  $("summary-line").textContent = data.summary_line;
  for (const table of Object.values(data.stats.tables)) {
    const t = el("table", null, el("caption", { text: table.title }));
    const head = el("tr");
    for (const column of table.columns) head.appendChild(el("th", { text: column }));
    t.appendChild(el("thead", null, head));
    const body = el("tbody");
    for (const row of table.rows) {
      const tr = el("tr");
      for (const cell of row) tr.appendChild(el("td", { text: fmt(cell) }));
      body.appendChild(tr);
    }
    if (!table.rows.length) body.appendChild(el("tr", null, el("td", { text: "(none)" })));
    t.appendChild(body);
    if (table.note) t.appendChild(el("tfoot", null, el("tr", null, el("td", { colspan: String(table.columns.length), text: table.note }))));
    $("stats").appendChild(t);
  }

  function histogram() {
    const NS = "http://www.w3.org/2000/svg";
    const scored = rows.map((r) => r.reward).filter((r) => r !== null);
    const unscored = rows.length - scored.length;
    const distinct = [...new Set(scored)].sort((a, b) => a - b);
    let bins = [];
    if (distinct.length <= 12) {
      bins = distinct.map((v) => ({ label: fmt(v), count: scored.filter((r) => r === v).length }));
    } else {
      const lo = distinct[0], hi = distinct[distinct.length - 1], n = 10, width = (hi - lo) / n;
      bins = Array.from({ length: n }, (_, i) => ({ label: fmt(lo + i * width), count: 0 }));
      for (const r of scored) bins[Math.min(n - 1, Math.floor((r - lo) / width))].count += 1;
    }
    if (unscored) bins.push({ label: "unscored", count: unscored });
    const W = 340, H = 150, pad = 24, top = Math.max(1, ...bins.map((b) => b.count));
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H + 2 * pad);
    const bw = (W - 2 * pad) / Math.max(1, bins.length);
    bins.forEach((bin, i) => {
      const h = (bin.count / top) * H;
      const rect = document.createElementNS(NS, "rect");
      rect.setAttribute("x", pad + i * bw + 2); rect.setAttribute("y", pad + H - h);
      rect.setAttribute("width", Math.max(1, bw - 4)); rect.setAttribute("height", h);
      rect.setAttribute("fill", bin.label === "unscored" ? "#aaa" : "#4c72b0");
      svg.appendChild(rect);
      const count = document.createElementNS(NS, "text");
      count.setAttribute("x", pad + i * bw + bw / 2); count.setAttribute("y", pad + H - h - 3);
      count.setAttribute("text-anchor", "middle"); count.textContent = String(bin.count);
      svg.appendChild(count);
      const label = document.createElementNS(NS, "text");
      label.setAttribute("x", pad + i * bw + bw / 2); label.setAttribute("y", pad + H + 14);
      label.setAttribute("text-anchor", "middle"); label.textContent = bin.label;
      svg.appendChild(label);
    });
    $("histogram").appendChild(svg);
  }
  histogram();

  // --- the list: filters, sorting, pages --------------------------------------------------------
  function options(select, values) {
    for (const value of [...values].sort()) select.appendChild(el("option", { value, text: value }));
  }
  options($("f-end"), new Set(rows.map((r) => r.end)));
  options($("f-tool"), new Set(rows.flatMap((r) => r.tools.map((t) => t.slice(0, t.lastIndexOf(":"))))));
  options($("f-status"), new Set(rows.flatMap((r) => r.tools.map((t) => t.slice(t.lastIndexOf(":") + 1)))));

  const num = (id) => ($(id).value === "" ? null : Number($(id).value));
  function applyFilters() {
    const task = $("f-task").value.toLowerCase(), end = $("f-end").value;
    const tool = $("f-tool").value, status = $("f-status").value;
    const rmin = num("f-rmin"), rmax = num("f-rmax"), turns = num("f-turns"), calls = num("f-calls");
    const unscored = $("f-unscored").checked, perr = $("f-perr").checked;
    state.filtered = rows.filter((r) => {
      if (task && !r.task.toLowerCase().includes(task)) return false;
      if (end && r.end !== end) return false;
      if (unscored && r.reward !== null) return false;
      if ((rmin !== null || rmax !== null) && r.reward === null) return false;
      if (rmin !== null && r.reward < rmin) return false;
      if (rmax !== null && r.reward > rmax) return false;
      if (turns !== null && r.turns < turns) return false;
      if (calls !== null && r.calls < calls) return false;
      if (perr && !r.perr) return false;
      if (tool || status) {
        const hit = r.tools.some((t) => {
          const cut = t.lastIndexOf(":");
          return (!tool || t.slice(0, cut) === tool) && (!status || t.slice(cut + 1) === status);
        });
        if (!hit) return false;
      }
      return true;
    });
    sortRows();
    state.page = 0;
    renderList();
  }
  function sortRows() {
    const { key, dir } = state;
    state.filtered = [...state.filtered].sort((a, b) => {
      const x = a[key], y = b[key];
      if (x === y) return a.i - b.i;
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : 1) * dir;
    });
  }
  function renderList() {
    const body = $("rows").tBodies[0];
    const start = state.page * PAGE_SIZE;
    const shown = state.filtered.slice(start, start + PAGE_SIZE);
    const fragment = document.createDocumentFragment();
    for (const r of shown) {
      const reward = el("td", { text: fmtReward(r.reward), cls: r.reward === null ? "na" : r.reward >= data.threshold ? "good" : "bad" });
      const tr = el("tr", { "data-index": String(r.i) },
        el("td", { text: String(r.i) }), el("td", { text: r.task, title: r.task }), el("td", { text: String(r.sample) }),
        reward, el("td", { text: r.end }), el("td", { text: String(r.turns) }), el("td", { text: String(r.calls) }),
        el("td", { text: String(r.perr), cls: r.perr ? "bad" : "" }), el("td", { text: String(r.gen) }),
        el("td", { text: r.drift ? String(r.drift) : "", cls: r.drift ? "bad" : "" }));
      if (r.i === state.selected) tr.classList.add("selected");
      tr.addEventListener("click", () => open(r.i));
      fragment.appendChild(tr);
    }
    body.replaceChildren(fragment);
    const total = state.filtered.length;
    $("count").textContent = `${total} rollouts` + (total !== rows.length ? ` (filtered from ${rows.length})` : "") +
      (total ? `, showing ${start + 1}-${start + shown.length}` : "");
    const pages = Math.max(1, Math.ceil(total / PAGE_SIZE));
    $("page").textContent = `page ${state.page + 1} of ${pages}`;
    $("prev").disabled = state.page === 0;
    $("next").disabled = state.page >= pages - 1;
  }
  for (const th of document.querySelectorAll("#rows th")) {
    th.addEventListener("click", () => {
      const key = th.dataset.key;
      state.dir = state.key === key ? -state.dir : key === "reward" ? -1 : 1;
      state.key = key;
      for (const other of document.querySelectorAll("#rows th")) other.classList.remove("asc", "desc");
      th.classList.add(state.dir === 1 ? "asc" : "desc");
      sortRows();
      renderList();
    });
  }
  $("filters").addEventListener("input", applyFilters);
  $("filters").addEventListener("submit", (event) => event.preventDefault());
  $("f-reset").addEventListener("click", () => setTimeout(applyFilters, 0));
  $("prev").addEventListener("click", () => { state.page -= 1; renderList(); });
  $("next").addEventListener("click", () => { state.page += 1; renderList(); });

  // --- one rollout: conversation and tokens (parsed only when opened) ---------------------------
  function pre(text) { return el("pre", { text: text == null ? "" : String(text) }); }
  // A forked gateway session has several training rows (detail.forked, then detail itself) and a
  // drift record: {reason, position, row, turn, policy} per request that did not extend its row.
  const trainingRows = (detail) => [...detail.forked, detail];
  const driftText = (e) => `${e.policy} at message ${e.position}: ${e.reason} (after ${e.turn} turns)`;
  function renderConversation(detail) {
    const box = $("conversation");
    const fragment = document.createDocumentFragment();
    if (detail.drift.length) {
      fragment.appendChild(el("div", { cls: "drift" },
        el("div", { cls: "head", text: `history drift: ${detail.drift.length === 1 ? "a request" : `${detail.drift.length} requests`} did not extend what the session served` }),
        ...detail.drift.map((e) => el("div", { cls: "drift-event", text: driftText(e) }))));
    }
    const all = trainingRows(detail);
    all.forEach((row, k) => {
      if (all.length > 1) fragment.appendChild(el("div", { cls: "row-mark", text: `training row ${k + 1} of ${all.length}` }));
      for (const e of detail.drift.filter((e) => e.policy === "reset" && e.row === k)) {
        fragment.appendChild(el("div", { cls: "drift-note", text: `started after a reset (the previous row was dropped): ${driftText(e)}` }));
      }
      renderMessages(row, fragment, detail.drift.find((e) => e.policy === "fork" && e.row === k && k < all.length - 1));
    });
    box.replaceChildren(fragment);
  }
  function renderMessages(row, fragment, forkedAt) {
    // the drift position counts the request's messages, which leave out the system prompt
    const offset = row.messages.length && row.messages[0].role === "system" ? 1 : 0;
    const at = forkedAt ? (["system_changed", "tools_changed"].includes(forkedAt.reason) ? 0 : forkedAt.position + offset) : -1;
    const note = () => el("div", { cls: "drift-note", text: `the next request changed history here; the session forked: ${driftText(forkedAt)}` });
    const turnErrors = row.segments.filter((s) => s[0] === "assistant").map((s) => s[5]);
    let assistantTurn = 0;
    row.messages.forEach((message, index) => {
      const role = message.role;
      const head = el("div", { cls: "head" }, el("span", { text: role }));
      const node = el("div", { cls: `msg role-${role}` }, head);
      if (role === "assistant") {
        const errors = turnErrors[assistantTurn] || [];
        assistantTurn += 1;
        if (message.reasoning_content) {
          node.appendChild(el("details", { cls: "reasoning" }, el("summary", { text: "reasoning" }), pre(message.reasoning_content)));
        }
        if (message.content) node.appendChild(pre(message.content));
        for (const call of message.tool_calls || []) {
          const fn = call.function || {};
          node.appendChild(el("div", { cls: "call" }, pre(`${fn.name}(${JSON.stringify(fn.arguments)})`)));
        }
        for (const kind of errors) node.appendChild(el("div", { cls: "parse-error", text: `parse error: ${kind}` }));
        if (errors.length) node.classList.add("has-parse-error");
      } else if (role === "tool") {
        const meta = message.metadata || {};
        head.appendChild(el("span", { cls: "badge", text: message.name == null ? "malformed call" : message.name }));
        const status = meta.status != null ? String(meta.status) : message.error ? "error" : "ok";
        head.appendChild(el("span", { cls: `badge ${message.error || (meta.status && meta.status !== "passed" && meta.status !== "ok") ? "err" : "ok"}`, text: status }));
        node.appendChild(pre(message.content));
        if (message.name == null) node.appendChild(el("div", { cls: "parse-error", text: "the model's tool call could not be parsed" }));
      } else {
        node.appendChild(pre(message.content));
      }
      if (index === at) { node.classList.add("drift-at"); node.appendChild(note()); }
      fragment.appendChild(node);
    });
    if (forkedAt && at >= row.messages.length) fragment.appendChild(note());
  }
  function renderTokens(detail) {
    const fragment = document.createDocumentFragment();
    const all = trainingRows(detail);
    all.forEach((row, k) => {
      if (all.length > 1) fragment.appendChild(el("span", { cls: "row-mark", text: `training row ${k + 1} of ${all.length}` }));
      rowTokens(row, fragment);
    });
    $("token-stream").replaceChildren(fragment);
  }
  function rowTokens(detail, fragment) {
    const starts = new Map(detail.segments.map((s) => [s[1], s]));
    detail.ids.forEach((id, position) => {
      const segment = starts.get(position);
      if (segment) {
        const label = `${segment[0]} ${segment[3]}` + (segment[5] && segment[5].length ? ` ! ${segment[5].join(", ")}` : "");
        fragment.appendChild(el("span", { cls: "seg-mark", text: label }));
      }
      const piece = Object.prototype.hasOwnProperty.call(vocab, id) ? vocab[id] : `[${id}]`;
      const span = el("span", { cls: "tok", text: piece });
      const trained = detail.mask[position] === 1;
      const lp = detail.lp[position];
      if (!trained) span.classList.add("mask0");
      else if (lp !== null) {
        const p = Math.exp(lp); // green when likely, red when unlikely
        span.style.background = `hsl(${Math.round(120 * p)}, 75%, ${80 + Math.round(5 * p)}%)`;
      }
      span.title = `id ${id} | ${trained ? "trained" : "no loss"}` + (lp !== null ? ` | logprob ${lp}` : "");
      fragment.appendChild(span);
    });
  }
  function open(index) {
    state.selected = index;
    for (const tr of $("rows").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.index === String(index));
    const r = rows[index];
    const detail = JSON.parse(document.getElementById(`r${index}`).textContent);
    $("detail-empty").hidden = true;
    $("detail").hidden = false;
    $("detail-title").textContent = `${r.task} / sample ${r.sample}`;
    const why = detail.reward_info.reason || (r.reward === null ? detail.reward_error : null);
    const facts = [`reward ${fmtReward(r.reward)}` + (why ? ` (${why})` : ""), `termination ${r.end}` + (detail.detail ? ` (${detail.detail})` : ""),
      `${r.turns} turns`, `${r.calls} tool calls`, `${r.perr} parse errors`, `${detail.ids.length} tokens (${r.gen} generated)`];
    if (Object.keys(detail.breakdown).length) facts.push(`breakdown ${JSON.stringify(detail.breakdown)}`);
    if (Object.keys(detail.reward_info).length) facts.push(`reward info ${JSON.stringify(detail.reward_info)}`);
    if (detail.reward_error) facts.push(`reward error: ${detail.reward_error}`);
    if (detail.forked.length) facts.push(`${detail.forked.length + 1} training rows (the session forked)`);
    if (detail.drift.length) facts.push(`${detail.drift.length} drift event${detail.drift.length === 1 ? "" : "s"}`);
    $("detail-facts").textContent = facts.join(" | ");
    renderConversation(detail);
    renderTokens(detail);
  }
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => {
      for (const other of document.querySelectorAll("#tabs button")) other.classList.toggle("active", other === button);
      $("conversation").hidden = button.dataset.tab !== "conversation";
      $("tokens").hidden = button.dataset.tab !== "tokens";
    });
  }
  applyFilters();
})();
