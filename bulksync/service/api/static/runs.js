// The runs list (/ui): recent runs of every thread, newest first, read again every 2 s.

import { el, json, seconds, statusOf, when } from "./common.js";

const EVERY_MS = 2000;
const LIMIT = 100;

const body = document.querySelector("#runs tbody");
const filter = document.getElementById("status-filter");
const notice = document.getElementById("notice");

function row(run) {
  const status = statusOf(run);
  const link = el("a", { href: `ui/runs/${encodeURIComponent(run.run_id)}` }, run.run_id);
  return el("tr", { "data-run-id": run.run_id, "data-status": status },
    el("td", {}, el("span", { class: "status", "data-status": status }, status)),
    el("td", { class: "mono" }, run.graph_id),
    el("td", { class: "mono" }, run.thread_id),
    el("td", {}, when(run.created_at)),
    el("td", { class: "num" }, seconds(run.duration_s)),
    el("td", { class: "mono" }, link));
}

async function refresh() {
  const query = new URLSearchParams({ limit: String(LIMIT) });
  if (filter.value) query.set("status", filter.value);
  try {
    const runs = await json(`/ui/api/runs?${query}`);
    body.replaceChildren(...runs.map(row));
    document.getElementById("empty").hidden = runs.length > 0;
    document.getElementById("refreshed").textContent =
      `${runs.length} runs · read ${new Date().toLocaleTimeString()}`;
    notice.hidden = true;
  } catch (error) {
    notice.textContent = `Could not read the runs: ${error.message}`;
    notice.hidden = false;
  }
}

async function loop() {
  for (;;) {
    await refresh();
    await new Promise((resolve) => setTimeout(resolve, EVERY_MS));
  }
}

filter.addEventListener("change", refresh);
loop();
