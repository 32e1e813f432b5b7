// Health: readiness, Redis, request and per-stage latency percentiles over the last minutes,
// result-cache hit rate, fallbacks and errors, all from GET /console/api/health (which reads
// the app's own /metrics). Refreshes every 5 seconds.
"use strict";

(() => {
  const { el, clear, $, api, num, pct, message } = Console;
  const REFRESH_MS = 5000;

  const card = (label, value, level, id) => el("div", { class: `card ${level || ""}`, id },
    el("div", { class: "card-label" }, label), el("div", { class: "card-value" }, value));

  function latencyTable(rows, label) {
    if (!rows.length) return el("p", { class: "muted" }, "No requests in this window.");
    return Console.table([label, "count", "p50 ms", "p95 ms", "p99 ms"], rows.map(([name, p]) =>
      el("tr", { dataset: { name } }, el("td", {}, name), el("td", { class: "num" }, num(p.count)),
        el("td", { class: "num" }, num(p.p50, 3)), el("td", { class: "num" }, num(p.p95, 3)),
        el("td", { class: "num" }, num(p.p99, 3)))));
  }

  const counts = (obj, label) => {
    const rows = Object.entries(obj);
    if (!rows.length) return el("p", { class: "muted" }, `no ${label}`);
    return Console.table([label, "count"], rows.map(([k, v]) =>
      el("tr", { dataset: { name: k } }, el("td", {}, k), el("td", { class: "num" }, num(v)))));
  };

  function render(h) {
    const m = h.metrics;
    clear($("#status-cards"),
      card("readiness", h.ready ? "ready" : h.status, h.ready ? "ok" : "bad", "card-ready"),
      card("Redis", h.redis === null ? "not started" : h.redis ? "up" : "down (degraded answers)", h.redis ? "ok" : "bad", "card-redis"),
      card("requests", num(m.requests.latency_ms.count), "", "card-requests"),
      card("cache hit rate", pct(m.cache.hit_rate, 1), "", "card-cache"),
      card("fallbacks", num(m.fallbacks_total), m.fallbacks_total ? "warn" : "", "card-fallbacks"));
    if (h.detail) message($("#message"), h.detail, "error");
    else message($("#message"), "");
    $("#window").textContent = (m.window.since_start
      ? "Window: since this worker started (no snapshot 5 minutes old yet)"
      : `Window: the last ${num(m.window.seconds, 0)} s`) +
      ` · versions: ${Object.entries(h.versions).map(([k, v]) => `${k} ${v}`).join(", ") || "none"}` +
      ` · updated ${new Date().toLocaleTimeString("en-GB")}`;
    const all = m.requests.latency_ms.count ? [["all", m.requests.latency_ms]] : [];
    clear($("#requests"), latencyTable([...all, ...Object.entries(m.requests.by_path)], "path"));
    clear($("#stages"), latencyTable(Object.entries(m.stages), "stage"));
    clear($("#cache"), Console.table(["hits", "misses", "hit rate"], [el("tr", {},
      el("td", { class: "num" }, num(m.cache.hits)), el("td", { class: "num" }, num(m.cache.misses)),
      el("td", { class: "num", id: "hit-rate" }, pct(m.cache.hit_rate, 1)))]));
    clear($("#trouble"), counts(m.fallbacks, "stage fallbacks"), counts(m.errors, "errors"),
      el("p", {}, `degraded requests (no Redis): ${num(m.degraded_requests)} · Redis errors: ${num(m.redis_errors)}`));
    clear($("#routes"), counts(m.routes, "route reason"));
  }

  async function refresh() {
    const answer = await api("GET", "/console/api/health");
    if (answer.ok) render(answer.data);
    else message($("#message"), answer.error, "error");
  }

  Console.initKeyForm();
  refresh().then(Console.markReady);
  setInterval(refresh, REFRESH_MS);
})();
