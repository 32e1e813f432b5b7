// Experiments: the configured experiment (variants, shares, overrides) and the latest stored
// analysis of `recsys ab analyze` (rates with CIs, comparisons with lift, sample-ratio check)
// with its plots. Both need the admin key: the API does not publish them either.
"use strict";

(() => {
  const { el, clear, $, api, num, pct, ci, message } = Console;
  const plotUrls = [];

  function configView(cfg) {
    const lines = el("p", {}, `${cfg.name}: `, el("strong", {}, cfg.enabled ? "enabled" : "disabled"),
      ` · control ${cfg.control} · holdout ${pct(cfg.holdout, 1)}`);
    const rows = cfg.variants.map((v) => el("tr", { dataset: { variant: v.name } },
      el("td", {}, el("code", {}, v.name)), el("td", { class: "num" }, pct(v.share, 1)),
      el("td", {}, Object.keys(v.overrides).length ? el("code", {}, JSON.stringify(v.overrides)) : "none")));
    return [lines, Console.table(["variant", "share of users", "overrides"], rows, { class: "variants" })];
  }

  const rate = (r) => (r ? `${num(r.rate, 5)} ${ci(r.ci95, (v) => num(v, 5))}` : "–");

  function analysisView(found) {
    const r = found.report;
    const parts = [el("p", { class: "muted" }, `${found.file}, written ${Console.time(found.modified)} · `,
      `${num(r.n_events)} events (${num(r.events_without_variant)} without a variant) · control `, el("strong", {}, r.control))];
    for (const w of r.warnings || []) parts.push(el("p", { class: "message warn" }, w));
    parts.push(el("h3", {}, "Arms"), Console.table(
      ["arm", "impressions", "clicks", "CTR [95% CI]", "users exposed", "converted", "conversion [95% CI]"],
      Object.entries(r.arms).map(([arm, a]) => el("tr", { dataset: { arm } },
        el("td", {}, el("code", {}, arm)), el("td", { class: "num" }, num(a.impressions)), el("td", { class: "num" }, num(a.clicks)),
        el("td", { class: "num" }, rate(a.ctr)), el("td", { class: "num" }, num(a.users_exposed)),
        el("td", { class: "num" }, num(a.users_converted)), el("td", { class: "num" }, rate(a.conversion)))),
      { class: "arms" }));
    const comparisons = [];
    for (const [arm, metrics] of Object.entries(r.comparisons)) {
      for (const [metric, c] of Object.entries(metrics)) {
        if (!c) continue;
        comparisons.push(el("tr", { dataset: { arm, metric } }, el("td", {}, arm), el("td", {}, metric),
          el("td", { class: "num" }, num(c.diff, 6)), el("td", { class: "num" }, ci(c.ci95, (v) => num(v, 6))),
          el("td", { class: "num" }, num(c.z, 3)), el("td", { class: "num" }, num(c.p_value, 4)),
          el("td", { class: "num" }, c.relative_lift === null ? "–" : pct(c.relative_lift, 2))));
      }
    }
    parts.push(el("h3", {}, `Against ${r.control}`), Console.table(["arm", "metric", "diff", "95% CI", "z", "p", "lift"],
      comparisons, { class: "comparisons" }));
    const srm = r.srm;
    parts.push(el("h3", {}, "Sample ratio"), srm
      ? el("p", { class: srm.mismatch ? "message error" : "", id: "srm" },
        `users per arm ${JSON.stringify(srm.observed)} vs expected ${JSON.stringify(Object.fromEntries(
          Object.entries(srm.expected).map(([k, v]) => [k, Math.round(v * 10) / 10])))}: chi2 ${num(srm.chi2, 3)}, `,
        `p ${num(srm.p_value, 4)} → `, el("strong", {}, srm.mismatch ? "MISMATCH" : "no mismatch"), ` (threshold ${srm.alpha})`)
      : el("p", { class: "muted", id: "srm" }, "No configured shares were given to the analysis: no sample-ratio check."));
    return parts;
  }

  async function loadPlots(names) {
    plotUrls.splice(0).forEach((u) => URL.revokeObjectURL(u));
    const figures = [];
    for (const name of names) {
      const answer = await api("GET", `/console/api/experiments/plots/${encodeURIComponent(name)}`, { admin: true, blob: true });
      if (!answer.ok) {
        figures.push(el("p", { class: "message error" }, `${name}: ${answer.error}`));
        continue;
      }
      const url = URL.createObjectURL(answer.data);
      plotUrls.push(url);
      figures.push(el("figure", {}, el("img", { src: url, alt: name, dataset: { plot: name } }), el("figcaption", {}, name)));
    }
    clear($("#plots"), figures);
  }

  async function load() {
    message($("#message"), "");
    clear($("#config"));
    clear($("#analysis"));
    clear($("#plots"));
    if (!Console.adminKey()) {
      message($("#message"), "Enter the admin key (top right) to see the experiment and its analyses.", "info");
      return;
    }
    const answer = await api("GET", "/console/api/experiments", { admin: true });
    if (!answer.ok) {
      message($("#message"), answer.error, "error");
      return;
    }
    clear($("#config"), configView(answer.data.config));
    const found = answer.data.analysis;
    if (!found) {
      clear($("#analysis"), el("p", { class: "muted", id: "no-analysis" },
        `No analysis found (looked in ${answer.data.analyses_dir}). Write one with `,
        el("code", {}, "recsys ab analyze ... --out <artifacts>/<dataset>/ab/online.json --report-dir <artifacts>/<dataset>/ab"), "."));
      return;
    }
    clear($("#analysis"), analysisView(found));
    if (found.plots.length) await loadPlots(found.plots);
    else clear($("#plots"), el("p", { class: "muted" }, "No plots beside this analysis."));
  }

  Console.initKeyForm(load);
  load().then(Console.markReady);
})();
