// Try a request: POST /v1/recommend for two users side by side, the answer stage by stage.
// Everything shown comes from the API's answer (with debug: per-stage scores and removals).
// Debug answers need the admin key (sent as X-API-Key); every request says it comes from the
// console (X-Recsys-Origin), so the server never logs what it shows here as experiment impressions.
"use strict";

(() => {
  const { el, clear, $, api, num } = Console;
  const RECENT = "recsys-console-recent-users";
  const KNOWN_KEYS = new Set(["request_id", "user_id", "cold_start", "items", "stages", "versions", "fallbacks",
    "path", "route", "degraded", "total_ms", "experiment", "variant", "impressions_logged", "debug",
    "complete", "short_by", "short_reason"]);
  const KNOWN_DEBUG = new Set(["order_by", "history_len", "removed", "item_scores", "handoffs"]);

  function body(userId) {
    const out = { user_id: userId, k: Number($("#opt-k").value) || 10, debug: $("#opt-debug").checked };
    if ($("#opt-explain").checked) out.explain = true;
    const llm = $("#opt-llm").value;
    if (llm) out.llm = llm === "true";
    const context = $("#opt-context").value.trim();
    if (context) out.context = JSON.parse(context); // a parse error is reported by the caller
    return out;
  }

  function remember(userId) {
    const recent = [userId, ...JSON.parse(localStorage.getItem(RECENT) || "[]").filter((u) => u !== userId)];
    localStorage.setItem(RECENT, JSON.stringify(recent.slice(0, 20)));
    showRecent();
  }

  function showRecent() {
    const recent = JSON.parse(localStorage.getItem(RECENT) || "[]");
    clear($("#recent-users"), recent.map((u) => el("option", { value: u })));
  }

  // The reason the answer is short, whatever the API calls the field next to `complete`.
  function shortReason(data) {
    for (const key of ["short_reason", "incomplete_reason", "complete_reason", "reason"]) {
      if (data[key]) return String(data[key]);
    }
    return "";
  }

  function chips(data) {
    const items = [
      ["path", data.path], ["route", data.route], ["cold start", data.cold_start ? "yes" : "no"],
      ["degraded", data.degraded ? "yes (Redis down)" : "no"],
    ];
    if ("complete" in data) {
      const text = data.complete ? "yes" : `no, short by ${data.short_by ?? "?"}`;
      items.push(["complete", shortReason(data) ? `${text} (${shortReason(data)})` : text]);
    }
    if (data.experiment) items.push(["variant", `${data.experiment}: ${data.variant}`]);
    items.push(["total", `${num(data.total_ms, 2)} ms`]);
    return el("dl", { class: "chips" }, items.map(([k, v]) =>
      el("div", { class: `chip chip-${k.replace(/ /g, "-")}`, dataset: { field: k } }, el("dt", {}, k), el("dd", {}, v))));
  }

  // An explain answer's reason and who wrote it: the LLM (checked against the history and catalog) or a template.
  function reasonCell(item) {
    if (!item.reason) return el("td", { class: "reason muted" }, "–");
    const source = item.reason_source || "";
    return el("td", { class: "reason", dataset: { source } },
      el("span", { class: `badge reason-source source-${source}` }, source), " ", el("span", { class: "reason-text" }, item.reason));
  }

  function servedList(data) {
    const explained = data.items.some((item) => item.reason);
    const rows = data.items.map((item) => el("tr", { dataset: { item: item.id } },
      el("td", { class: "num" }, item.rank),
      el("td", {}, el("span", { class: "title" }, item.title), " ", el("code", {}, item.id)),
      el("td", { class: "num", dataset: { score: item.score === null ? "" : String(item.score) } }, num(item.score)),
      el("td", {}, item.disclaimers.map((d) => el("span", { class: "disclaimer" }, d))),
      explained ? reasonCell(item) : null));
    if (!rows.length) return el("p", { class: "muted" }, "No items served.");
    const head = ["#", "item", "score", "disclaimers", ...(explained ? ["reason"] : [])];
    return Console.table(head, rows, { class: "served" });
  }

  // Rank of each item within one score column (1 = highest; unscored items unranked).
  function ranksBy(scores, column) {
    const scored = Object.entries(scores).filter(([, s]) => s[column] !== null && s[column] !== undefined);
    scored.sort((a, b) => b[1][column] - a[1][column]);
    return Object.fromEntries(scored.map(([id], i) => [id, i + 1]));
  }

  function stageCards(data, titles) {
    const scores = data.debug ? data.debug.item_scores : null;
    const columns = scores ? [...new Set(Object.values(scores).flatMap((s) => Object.keys(s)))] : [];
    return el("ol", { class: "stages" }, data.stages.map((stage) => {
      const card = el("li", { class: `stage status-${stage.status}`, dataset: { stage: stage.name } },
        el("div", { class: "stage-head" },
          el("strong", {}, stage.name), el("span", { class: "badge" }, stage.status),
          el("span", { class: "num" }, `${num(stage.ms, 2)} ms`),
          el("span", { class: "flow", dataset: { nIn: stage.n_in, nOut: stage.n_out } }, `${stage.n_in} in → ${stage.n_out} out`)),
        stage.reason ? el("div", { class: "muted" }, stage.reason) : null);
      const handoff = data.debug && data.debug.handoffs ? data.debug.handoffs.find((h) => h.stage === stage.name) : null;
      if (handoff) card.append(handoffBlock(handoff));
      if (scores && columns.includes(stage.name)) {
        const ranks = ranksBy(scores, stage.name);
        const ordered = Object.keys(ranks).sort((a, b) => ranks[a] - ranks[b]);
        card.append(el("div", { class: "muted small" }, "served items in this stage's order (its score, its rank among them):"),
          el("ol", { class: "stage-items" }, ordered.map((id) => el("li", { dataset: { item: id, score: String(scores[id][stage.name]) } },
            el("code", {}, id), " ", titles[id] || "", " ", el("span", { class: "num" }, num(scores[id][stage.name]))))));
      }
      return card;
    }));
  }

  // What one stage handed on (debug answers): every item in order, its own score, the channels that found it.
  function handoffBlock(handoff) {
    const parts = [];
    if (handoff.fusion_weights) {
      const weights = Object.entries(handoff.fusion_weights).map(([k, v]) => `${k} ${num(v)}`).join(" · ");
      parts.push(el("div", { class: "fusion-weights", dataset: { weights: JSON.stringify(handoff.fusion_weights) } },
        `fusion weights: ${weights || "none (current order kept)"}`));
    }
    const rows = handoff.items.map((item, i) => el("tr", { dataset: { item: item.id, score: item.score === null ? "" : String(item.score) } },
      el("td", { class: "num" }, String(i + 1)), el("td", {}, el("code", {}, item.id)),
      el("td", { class: "num" }, num(item.score)), el("td", { class: "channels" }, item.channels.join(", "))));
    const shown = handoff.items.length < handoff.n ? ` (first ${handoff.items.length})` : "";
    parts.push(el("details", { class: "handoff", dataset: { stage: handoff.stage, n: String(handoff.n) } },
      el("summary", {}, `handed on ${handoff.n} items${shown}, ordered by ${handoff.order_by || "arrival"}`),
      Console.table(["#", "item", "score", "channels"], rows, { class: "handoff-items" })));
    return el("div", {}, parts);
  }

  function scoreMatrix(data) {
    const scores = data.debug.item_scores;
    const columns = [...new Set(Object.values(scores).flatMap((s) => Object.keys(s)))];
    const ranks = Object.fromEntries(columns.map((c) => [c, ranksBy(scores, c)]));
    const rows = data.items.map((item) => el("tr", { dataset: { item: item.id } },
      el("td", {}, el("code", {}, item.id)),
      columns.map((c) => {
        const v = (scores[item.id] || {})[c];
        const missing = v === null || v === undefined;
        return el("td", { class: "num", dataset: { stage: c, score: missing ? "" : String(v) } },
          missing ? "–" : `${num(v)} (#${ranks[c][item.id]})`);
      })));
    const head = ["item", ...columns.map((c) => (c === data.debug.order_by ? `${c} (orders the list)` : c))];
    return Console.table(head, rows, { class: "matrix" });
  }

  function removedList(data) {
    const removed = data.debug.removed;
    if (!removed.length) return el("p", { class: "muted" }, "No item was removed by a rule.");
    return Console.table(["item", "removed by"], removed.map((r) => el("tr", { dataset: { item: r.id } },
      el("td", {}, el("code", {}, r.id)), el("td", { class: "rule" }, r.reason))), { class: "removed" });
  }

  function extras(object, known) {
    const rest = Object.fromEntries(Object.entries(object).filter(([k]) => !known.has(k)));
    return Object.keys(rest).length ? el("pre", { class: "code" }, JSON.stringify(rest, null, 2)) : null;
  }

  function render(pane, data) {
    const titles = Object.fromEntries(data.items.map((i) => [i.id, i.title]));
    const versions = Object.entries(data.versions).map(([k, v]) => `${k} ${v}`).join(" · ");
    const parts = [
      el("h3", {}, `${data.user_id}`, el("span", { class: "muted small" }, ` request ${data.request_id}`)),
      chips(data),
      el("p", { class: "muted small versions" }, `versions: ${versions}`),
      data.fallbacks.length ? el("p", { class: "message warn" }, `fallbacks: ${data.fallbacks.join(", ")}`) : null,
      el("h4", {}, "Served list"), servedList(data),
      el("h4", {}, "Stage by stage"), stageCards(data, titles),
    ];
    if (data.debug) {
      parts.push(el("h4", {}, "Scores by stage"), scoreMatrix(data),
        el("h4", {}, "Removed by rules"), removedList(data),
        el("p", { class: "muted small" }, `history length ${data.debug.history_len}`));
      const moreDebug = extras(data.debug, KNOWN_DEBUG);
      if (moreDebug) parts.push(el("h4", {}, "Other debug fields"), moreDebug);
    } else {
      parts.push(el("p", { class: "muted" }, "debug off: the answer carries no per-stage scores or removals."));
    }
    const more = extras(data, KNOWN_KEYS);
    if (more) parts.push(el("h4", {}, "Other fields"), more);
    clear(pane.querySelector(".result"), parts);
  }

  async function tryPane(pane) {
    const result = pane.querySelector(".result");
    const userId = pane.querySelector(".user-id").value.trim();
    if (!userId) return;
    let request;
    try {
      request = body(userId);
    } catch (err) {
      clear(result, el("p", { class: "message error" }, `context is not valid JSON: ${err.message}`));
      return;
    }
    pane.dataset.state = "loading";
    const answer = await api("POST", "/v1/recommend",
      { json: request, admin: request.debug || request.explain, headers: { "X-Recsys-Origin": "console" } });
    if (answer.ok) {
      render(pane, answer.data);
      remember(userId);
    } else {
      clear(result, el("p", { class: "message error" }, answer.error));
    }
    pane.dataset.state = "done";
  }

  const panes = [$("#pane-a"), $("#pane-b")];
  for (const pane of panes) {
    pane.querySelector(".user-form").addEventListener("submit", (event) => {
      event.preventDefault();
      tryPane(pane);
    });
  }
  $("#options").addEventListener("submit", (event) => {
    event.preventDefault();
    panes.forEach(tryPane);
  });
  Console.initKeyForm();
  showRecent();
  Console.markReady();
})();
