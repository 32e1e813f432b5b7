// Shared by every console page: DOM helpers, the admin key, the fetch helper, number formats.
// Plain browser JavaScript, no dependencies: the console must work with the network off.
"use strict";

const Console = (() => {
  const KEY_STORE = "recsys-console-admin-key";

  // el("td", {class: "num", dataset: {score: "1"}}, "text", childNode, ...)
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clear(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
    return node;
  }

  const $ = (selector, root) => (root || document).querySelector(selector);

  function adminKey() {
    return sessionStorage.getItem(KEY_STORE) || "";
  }

  // The API's error answer as one readable message: "401: missing or wrong X-API-Key".
  // FastAPI's 422 lists pydantic errors; each becomes "loc: msg" on its own line.
  function describeError(status, data) {
    let detail = data && data.detail !== undefined ? data.detail : data;
    if (Array.isArray(detail)) {
      detail = detail.map((e) => (e && e.loc ? `${e.loc.join(".")}: ${e.msg}` : JSON.stringify(e))).join("\n");
    } else if (detail && typeof detail === "object") {
      detail = JSON.stringify(detail);
    }
    return `${status}: ${detail || "no detail"}`;
  }

  // fetch wrapper: {ok, status, data, error}; never throws for HTTP errors or a dead server.
  async function api(method, path, options) {
    const opts = options || {};
    const headers = {};
    let body;
    if (opts.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.json);
    } else if (opts.text !== undefined) {
      headers["Content-Type"] = opts.contentType || "text/plain";
      body = opts.text;
    }
    if (opts.admin) headers["X-API-Key"] = adminKey();
    Object.assign(headers, opts.headers || {});
    let response;
    try {
      response = await fetch(path, { method, headers, body, cache: "no-store" });
    } catch (err) {
      return { ok: false, status: 0, data: null, error: `network error: ${err.message}` };
    }
    let data = null;
    if (opts.blob && response.ok) {
      data = await response.blob();
    } else {
      const text = await response.text();
      try {
        data = text ? JSON.parse(text) : null;
      } catch (_) {
        data = text;
      }
    }
    const error = response.ok ? null : describeError(response.status, data);
    return { ok: response.ok, status: response.status, data, error };
  }

  // The admin key form in the header of every page; `onChange` runs after a new key is set.
  function initKeyForm(onChange) {
    const form = $("#key-form");
    const input = $("#admin-key");
    const state = $("#key-state");
    const show = () => { state.textContent = adminKey() ? "key set for this tab" : "no admin key"; };
    input.value = adminKey();
    show();
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY_STORE, input.value.trim());
      show();
      if (onChange) onChange();
    });
  }

  function markReady() {
    performance.mark("console-ready");
    document.body.dataset.ready = "true";
  }

  function message(node, text, kind) {
    node.textContent = text || "";
    node.className = `message ${text ? kind || "info" : ""}`.trim();
  }

  function num(value, digits) {
    if (value === null || value === undefined) return "–";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    return value.toFixed(digits === undefined ? 4 : digits);
  }

  const pct = (value, digits) => (value === null || value === undefined ? "–" : `${(100 * value).toFixed(digits === undefined ? 2 : digits)}%`);
  const ci = (pair, fmt) => (Array.isArray(pair) ? `[${fmt(pair[0])}, ${fmt(pair[1])}]` : "–");
  const time = (unix) => (unix ? new Date(unix * 1000).toLocaleString("en-GB") : "–");

  function table(headers, rows, attrs) {
    return el("table", attrs || {},
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows));
  }

  return { el, clear, $, api, adminKey, describeError, initKeyForm, markReady, message, num, pct, ci, time, table };
})();
