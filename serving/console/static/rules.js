// Rules & prompts: versions, a version's document, the diff of two, publish and roll back.
// Reads and writes go through /admin (and /console/api for documents and diffs) with the
// admin key; every refusal is shown as the API words it (status and detail).
"use strict";

(() => {
  const { el, clear, $, api, message } = Console;
  let kind = "rules";
  let listing = null;

  const say = (text, level) => message($("#message"), text, level);

  function selectKind(next) {
    kind = next;
    for (const tab of document.querySelectorAll("#kinds .tab")) {
      tab.setAttribute("aria-selected", String(tab.dataset.kind === kind));
    }
    clear($("#viewer"));
    $("#viewer-title").textContent = "Document";
    return loadVersions();
  }

  function versionRow(v) {
    const isServing = listing.serving === v.version;
    return el("tr", { dataset: { version: v.version, active: String(v.active) } },
      el("td", {}, el("code", {}, v.version)),
      el("td", {}, Console.time(v.created_at)),
      el("td", {}, v.active ? el("span", { class: "badge ok" }, "active") : "", isServing ? " serving here" : ""),
      el("td", {},
        el("button", { type: "button", class: "small view", onclick: () => showDocument(v.version) }, "view"), " ",
        v.active ? null : el("button", { type: "button", class: "small rollback", onclick: () => rollback(v.version) },
          "roll back to this")));
  }

  function fillDiffSelectors() {
    const versions = listing.versions.map((v) => v.version);
    for (const [id, pick] of [["#diff-base", versions.length - 2], ["#diff-head", versions.length - 1]]) {
      clear($(id), versions.map((v, i) => el("option", { value: v, selected: i === Math.max(pick, 0) }, v)));
    }
  }

  async function loadVersions() {
    listing = null;
    clear($("#versions"));
    $("#serving-line").textContent = "";
    if (!Console.adminKey()) {
      say("Enter the admin key (top right) to see and change versions.", "info");
      return;
    }
    const answer = await api("GET", `/admin/${kind}/versions`, { admin: true });
    if (!answer.ok) {
      say(answer.error, "error");
      return;
    }
    listing = answer.data;
    $("#serving-line").textContent = `active: ${listing.active ?? "none"} · this worker serves: ${listing.serving ?? "none"}`;
    clear($("#versions"), Console.table(["version", "published", "", ""], listing.versions.map(versionRow), { class: "versions" }));
    fillDiffSelectors();
  }

  async function showDocument(version) {
    const answer = await api("GET", `/console/api/${kind}/versions/${encodeURIComponent(version)}`, { admin: true });
    if (!answer.ok) return say(answer.error, "error");
    $("#viewer-title").textContent = `${kind} ${version}`;
    clear($("#viewer"), answer.data.document);
    return answer.data.document;
  }

  async function showDiff(event) {
    event.preventDefault();
    const base = $("#diff-base").value;
    const head = $("#diff-head").value;
    if (!base || !head) return;
    const query = `base=${encodeURIComponent(base)}&head=${encodeURIComponent(head)}`;
    const answer = await api("GET", `/console/api/${kind}/diff?${query}`, { admin: true });
    if (!answer.ok) return say(answer.error, "error");
    $("#viewer-title").textContent = `diff ${base} → ${head}`;
    clear($("#viewer"), answer.data.lines.map(([op, line]) =>
      el("span", { class: op === "+" ? "add" : op === "-" ? "del" : "same" }, `${op} ${line}\n`)));
  }

  async function publish() {
    const text = $("#publish-text").value;
    if (!text.trim()) return say("Nothing to publish: the document is empty.", "error");
    const answer = await api("PUT", `/admin/${kind}`, { admin: true, text, contentType: "application/yaml" });
    if (!answer.ok) return say(answer.error, "error");
    say(`published ${kind} ${answer.data.version} (${answer.data.status}); active: ${answer.data.active}`, "ok");
    await loadVersions();
  }

  // A rollback that drops gates the served rule set enforces is refused with their names (docs/rules.md):
  // ask, and send it again acknowledging exactly those gates.
  function droppedGates(error) {
    const found = /acknowledge_dropped_gates: (\[[^\]]*\])/.exec(error || "");
    return found ? JSON.parse(found[1]) : null;
  }

  async function rollback(version, acknowledge) {
    const json = acknowledge ? { version, acknowledge_dropped_gates: acknowledge } : { version };
    const answer = await api("POST", `/admin/${kind}/rollback`, { admin: true, json });
    const gates = answer.ok || acknowledge ? null : droppedGates(answer.error);
    if (gates && window.confirm(`${answer.error}\n\nRoll back anyway, dropping ${gates.join(", ")}?`)) {
      return rollback(version, gates);
    }
    if (!answer.ok) return say(answer.error, "error");
    say(`rolled back: ${kind} ${answer.data.version} is active`, "ok");
    await loadVersions();
  }

  async function copyActive() {
    if (!listing || !listing.active) return say("No active version to start from.", "error");
    const doc = await showDocument(listing.active);
    if (doc) $("#publish-text").value = doc;
  }

  for (const tab of document.querySelectorAll("#kinds .tab")) {
    tab.addEventListener("click", () => { say(""); selectKind(tab.dataset.kind); });
  }
  $("#reload-versions").addEventListener("click", () => { say(""); loadVersions(); });
  $("#diff-form").addEventListener("submit", showDiff);
  $("#publish").addEventListener("click", publish);
  $("#copy-active").addEventListener("click", copyActive);
  Console.initKeyForm(() => { say(""); loadVersions(); });
  selectKind("rules").then(Console.markReady);
})();
