// A run's live view (/ui/runs/{run_id}): its graph with each node's task counts, its steps,
// interrupts and output, all from the API.
//
// The run's record comes from /ui/api/runs/{id} (every 2 s until it has finished), its graph
// from /assistants/{graph}/graph, and everything live from its event stream
// (/threads/{t}/runs/{r}/stream, modes progress, values and updates), read from its start and
// resumed after the last event id when the connection drops. Progress events carry one
// step's counts, per node too; a node's counts over the run are the last event of each of
// its steps added up, and only the current step has tasks in flight. Once the stream has
// ended, /join gives the run's output.

import {
  ApiError, FINISHED, api, el, json, readEvents, seconds, sleep, statusOf, svg, when,
} from "./common.js";

const START = "__start__";
const END = "__end__";
const RECORD_EVERY_MS = 2000;
const MODES = ["progress", "values", "updates"];
const WIDTH = 100; // of the output's lines, where a value fits

const runId = decodeURIComponent(location.pathname.replace(/\/+$/, "").split("/").pop());

const state = {
  run: null, // the run's record (/ui/api/runs/{id})
  readAt: 0, // performance.now() when it was read, to count its duration on
  steps: new Map(), // step -> its last progress event
  interrupts: new Map(), // id -> interrupt
  error: null, // the stream's error event
  streamEnded: false,
  nodes: new Map(), // node id -> its SVG group
};

const $ = (id) => document.getElementById(id);

function notice(text) {
  $("notice").textContent = text;
  $("notice").hidden = !text;
}

function finished() {
  return state.run !== null && FINISHED.has(state.run.status);
}

// -- the record ----------------------------------------------------------------------------

async function readRecord() {
  state.run = await json(`/ui/api/runs/${encodeURIComponent(runId)}`);
  state.readAt = performance.now();
  showRecord();
  return state.run;
}

function showRecord() {
  const run = state.run;
  const status = statusOf(run);
  $("run-status").textContent = status;
  $("run-status").dataset.status = status;
  $("run-graph").textContent = run.graph_id;
  $("run-thread").textContent = run.thread_id;
  $("run-started").textContent = when(run.created_at);
  showDuration();
  document.title = `${status} · run ${run.run_id} · bulksync`;
  showInterrupts();
  showCounts(); // a finished run has nothing in flight any more
}

function showDuration() {
  if (!state.run) return;
  let value = state.run.duration_s;
  if (!finished()) value += (performance.now() - state.readAt) / 1000;
  $("run-duration").textContent = seconds(value);
}

async function followRecord() {
  while (!finished()) {
    await sleep(RECORD_EVERY_MS);
    try {
      await readRecord();
    } catch (error) {
      notice(`Could not read the run: ${error.message}`);
    }
  }
}

// -- the graph -----------------------------------------------------------------------------

const BOX = { width: 200, height: 78 };
const END_BOX = { width: 120, height: 34 };
const GAP = { x: 36, y: 64 };
const SIDE = 90; // room on the right for edges that go back up (loops)

/** Layers (longest path from __start__, back edges of cycles left out) and their order. */
function layout(graph) {
  const ids = graph.nodes.map((node) => node.id);
  const known = new Set(ids);
  const out = new Map(ids.map((id) => [id, []]));
  const edges = graph.edges.filter((e) => known.has(e.source) && known.has(e.target));
  for (const edge of edges) out.get(edge.source).push(edge.target);
  // Depth-first from __start__ (then from any node not reached): an edge to a node still
  // on the path closes a cycle, and is drawn going back up instead of counting for layers.
  const back = new Set();
  const mark = new Map();
  const visit = (node) => {
    mark.set(node, 1);
    for (const next of out.get(node)) {
      if (mark.get(next) === 1) back.add(`${node}\u0000${next}`);
      else if (!mark.has(next)) visit(next);
    }
    mark.set(node, 2);
  };
  for (const id of [START, ...ids]) if (known.has(id) && !mark.has(id)) visit(id);
  const forward = edges.filter((e) => !back.has(`${e.source}\u0000${e.target}`));
  // Longest path: Kahn's order over the forward edges.
  const layer = new Map(ids.map((id) => [id, 0]));
  const into = new Map(ids.map((id) => [id, 0]));
  for (const edge of forward) into.set(edge.target, into.get(edge.target) + 1);
  const ready = ids.filter((id) => into.get(id) === 0);
  while (ready.length) {
    const node = ready.shift();
    for (const edge of forward.filter((e) => e.source === node)) {
      layer.set(edge.target, Math.max(layer.get(edge.target), layer.get(node) + 1));
      into.set(edge.target, into.get(edge.target) - 1);
      if (into.get(edge.target) === 0) ready.push(edge.target);
    }
  }
  const layers = [];
  for (const id of ids) (layers[layer.get(id)] ||= []).push(id);
  // Within a layer, each node under the mean place of its predecessors (fewer crossings).
  const place = new Map();
  layers.forEach((row, depth) => {
    const mean = (id) => {
      const from = forward.filter((e) => e.target === id && place.has(e.source));
      if (!from.length) return Infinity;
      return from.reduce((sum, e) => sum + place.get(e.source), 0) / from.length;
    };
    if (depth > 0) row.sort((a, b) => mean(a) - mean(b));
    row.forEach((id, index) => place.set(id, index - (row.length - 1) / 2));
  });
  return { layers: layers.filter(Boolean), edges, back };
}

function drawGraph(graph) {
  const { layers, edges, back } = layout(graph);
  const size = (id) => (id === START || id === END ? END_BOX : BOX);
  const widest = Math.max(...layers.map((row) => row.length));
  const width = widest * (BOX.width + GAP.x) + SIDE;
  const where = new Map();
  let y = 16;
  for (const row of layers) {
    const tall = Math.max(...row.map((id) => size(id).height));
    const span = row.length * (BOX.width + GAP.x) - GAP.x;
    let x = (width - SIDE - span) / 2;
    for (const id of row) {
      const box = size(id);
      where.set(id, { cx: x + BOX.width / 2, y: y + (tall - box.height) / 2, ...box });
      x += BOX.width + GAP.x;
    }
    y += tall + GAP.y;
  }
  const drawing = svg("svg", {
    id: "graph-svg", width, height: y - GAP.y + 16, viewBox: `0 0 ${width} ${y - GAP.y + 16}`,
  });
  const defs = svg("defs");
  const marker = svg("marker", {
    id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7,
    orient: "auto-start-reverse",
  });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow-head" }));
  defs.append(marker);
  drawing.append(defs);
  for (const edge of edges) drawing.append(drawEdge(edge, where, back));
  for (const node of graph.nodes) drawing.append(drawNode(node.id, where.get(node.id)));
  $("graph").replaceChildren(drawing);
  showCounts();
}

function drawEdge(edge, where, back) {
  const from = where.get(edge.source);
  const to = where.get(edge.target);
  let d;
  let mid;
  if (back.has(`${edge.source}\u0000${edge.target}`)) {
    // Back up a cycle: out of the source's right side, round, into the target's right side.
    const x1 = from.cx + from.width / 2;
    const y1 = from.y + from.height / 2;
    const x2 = to.cx + to.width / 2;
    const y2 = to.y + to.height / 2;
    const bend = Math.max(x1, x2) + 60;
    const [a, b] = edge.source === edge.target ? [y1 - 12, y2 + 12] : [y1, y2];
    d = `M ${x1} ${a} C ${bend} ${a} ${bend} ${b} ${x2} ${b}`;
    mid = { x: (x1 + 3 * bend + 3 * bend + x2) / 8, y: (a + b) / 2 };
  } else {
    const x1 = from.cx;
    const y1 = from.y + from.height;
    const x2 = to.cx;
    const y2 = to.y;
    const pull = Math.max(24, (y2 - y1) / 2);
    d = `M ${x1} ${y1} C ${x1} ${y1 + pull} ${x2} ${y2 - pull} ${x2} ${y2}`;
    mid = { x: (x1 + x2) / 2, y: (y1 + y2) / 2 };
  }
  const group = svg("g", {
    class: edge.conditional ? "edge conditional" : "edge",
    "data-source": edge.source, "data-target": edge.target,
  });
  group.append(svg("path", { d, "marker-end": "url(#arrow)" }));
  if (edge.data !== undefined && edge.data !== null) {
    const label = svg("text", { x: mid.x + 4, y: mid.y, class: "edge-label" });
    label.textContent = typeof edge.data === "string" ? edge.data : JSON.stringify(edge.data);
    group.append(label);
  }
  return group;
}

function drawNode(id, at) {
  const x = at.cx - at.width / 2;
  const group = svg("g", {
    class: id === START || id === END ? "node terminal" : "node",
    "data-node": id, "data-state": "idle",
    "data-queued": 0, "data-running": 0, "data-done": 0, "data-failed": 0, "data-total": 0,
  });
  const tip = svg("title");
  tip.textContent = id;
  group.append(tip);
  const round = id === START || id === END ? 17 : 8;
  group.append(svg("rect", {
    x, y: at.y, width: at.width, height: at.height, rx: round, class: "box",
  }));
  const name = svg("text", { x: x + 10, y: at.y + 20, class: "node-name" });
  name.textContent = id.length > 24 ? `${id.slice(0, 23)}…` : id;
  if (id === START || id === END) {
    name.setAttribute("x", at.cx);
    name.setAttribute("text-anchor", "middle");
    group.append(name);
    state.nodes.set(id, group);
    return group;
  }
  group.append(name);
  const total = svg("text", { x: x + at.width - 10, y: at.y + 20, class: "node-total" });
  total.setAttribute("text-anchor", "end");
  group.append(total);
  ["queued", "running", "done", "failed"].forEach((kind, index) => {
    const cx = x + 10 + index * 46;
    const label = svg("text", { x: cx, y: at.y + 38, class: "count-label" });
    label.textContent = kind;
    const value = svg("text", { x: cx, y: at.y + 55, class: `count ${kind}`, "data-count": kind });
    value.textContent = "0";
    group.append(label, value);
  });
  // A bar of the node's tasks: done, failed, running, queued, in proportion.
  const bar = svg("g", { class: "bar", transform: `translate(${x + 10} ${at.y + 63})` });
  bar.append(svg("rect", { width: at.width - 20, height: 6, rx: 3, class: "bar-bg" }));
  for (const kind of ["done", "failed", "running", "queued"]) {
    bar.append(svg("rect", { height: 6, width: 0, class: `bar-${kind}`, "data-bar": kind }));
  }
  group.append(bar);
  state.nodes.set(id, group);
  return group;
}

// -- counts from progress events -------------------------------------------------------------

/** Per node: done and failed over all its steps, queued and running in the current one. */
function counts() {
  const steps = [...state.steps.values()].sort((a, b) => a.step - b.step);
  const current = steps.at(-1);
  const found = new Map();
  for (const event of steps) {
    for (const [name, c] of Object.entries(event.nodes || {})) {
      if (!found.has(name)) {
        found.set(name, { total: 0, done: 0, failed: 0, queued: 0, running: 0 });
      }
      const sum = found.get(name);
      sum.total += c.total || 0;
      sum.done += c.done || 0;
      sum.failed += c.failed || 0;
      if (event !== current || finished()) continue;
      const flying = Math.max(0, (c.total || 0) - (c.done || 0) - (c.failed || 0));
      if ("queued" in c || "running" in c) {
        // The coordinator's last look may be older than the last task to finish: what it
        // saw never counts for more than is still in flight, the rest counts as running.
        const queued = Math.min(c.queued || 0, flying);
        sum.queued += queued;
        sum.running += flying - queued;
      } else {
        sum.running += flying; // not looked at yet: in flight, queued or running
      }
    }
  }
  return found;
}

function showCounts() {
  if (!state.nodes.size) return;
  const found = counts();
  const started = state.steps.size > 0 || (state.run && state.run.status !== "pending");
  for (const [id, group] of state.nodes) {
    if (id === START || id === END) {
      const over = id === START ? started : state.run && state.run.status === "success";
      group.dataset.state = over ? "done" : "idle";
      continue;
    }
    const c = found.get(id) || { total: 0, done: 0, failed: 0, queued: 0, running: 0 };
    for (const kind of ["queued", "running", "done", "failed", "total"]) {
      group.setAttribute(`data-${kind}`, c[kind]);
    }
    for (const text of group.querySelectorAll("[data-count]")) {
      text.textContent = String(c[text.dataset.count]);
    }
    const tasks = c.total === 1 ? "1 task" : `${c.total} tasks`;
    group.querySelector(".node-total").textContent = c.total ? tasks : "";
    let active = "idle";
    if (c.queued + c.running > 0) active = "active";
    else if (c.failed > 0) active = "failed";
    else if (c.done > 0) active = "done";
    group.dataset.state = active;
    group.classList.toggle("has-failed", c.failed > 0);
    const full = Number(group.querySelector(".bar-bg").getAttribute("width"));
    let offset = 0;
    for (const kind of ["done", "failed", "running", "queued"]) {
      const part = c.total ? (full * c[kind]) / c.total : 0;
      const rect = group.querySelector(`[data-bar="${kind}"]`);
      rect.setAttribute("x", offset);
      rect.setAttribute("width", part);
      offset += part;
    }
  }
}

function showSteps() {
  const rows = [...state.steps.values()].sort((a, b) => a.step - b.step).map((event) => {
    const nodes = Object.entries(event.nodes || {})
      .map(([name, c]) => `${name} ×${c.total}`).join(", ");
    const failed = Object.values(event.nodes || {}).reduce((n, c) => n + (c.failed || 0), 0);
    const over = event.done >= event.total || finished();
    return el("tr", { "data-step": event.step, "data-state": over ? "done" : "active" },
      el("td", { class: "num" }, String(event.step)),
      el("td", { class: "mono" }, nodes),
      el("td", { class: "num", "data-cell": "tasks" }, `${event.done} / ${event.total}`),
      el("td", { class: "num" }, String(failed)),
      el("td", { class: "num", "data-cell": "elapsed" }, seconds(event.elapsed_s)));
  });
  document.querySelector("#steps tbody").replaceChildren(...rows);
  $("no-steps").hidden = rows.length > 0;
  const last = [...state.steps.values()].sort((a, b) => a.step - b.step).at(-1);
  if (!last) return;
  $("run-step").textContent =
    `${last.step}: ${last.done} of ${last.total} tasks done in ${seconds(last.elapsed_s)}`;
  const workers = Object.entries(last.workers || {});
  $("run-workers").textContent = workers.length
    ? workers.map(([w, s]) => `${w} (${s.tasks} running, longest ${s.longest_s} s)`).join(", ")
    : "–";
  const waiting = (last.done < last.total && !finished() && last.waiting) || [];
  $("run-waiting").hidden = waiting.length === 0;
  $("run-waiting").textContent = waiting.map((w) =>
    `${w.tasks} tasks of ${w.nodes.join(", ")} have waited ${w.seconds} s on queue ` +
    `'${w.queue}' and no worker has started them: is a worker consuming that queue?`).join(" ");
}

// -- interrupts, errors, output ----------------------------------------------------------------

function addInterrupts(found) {
  for (const item of Array.isArray(found) ? found : [found]) {
    const key = item && item.id ? item.id : JSON.stringify(item);
    state.interrupts.set(key, item);
  }
  showInterrupts();
}

function showInterrupts() {
  const paused = state.run && state.run.status === "interrupted" &&
    state.run.bulksync_status !== "cancelled";
  $("interrupts-section").hidden = !paused && state.interrupts.size === 0;
  $("interrupt-note").textContent = paused
    ? "The run is waiting: resume it with a run whose command answers each interrupt " +
      "(command={\"resume\": ...}) on this thread."
    : "";
  const items = [...state.interrupts.entries()].map(([key, item]) =>
    el("li", { "data-interrupt-id": key },
      el("span", { class: "mono muted" }, item && item.id ? item.id : ""),
      el("pre", {}, pretty(item && "value" in item ? item.value : item))));
  $("run-interrupts").replaceChildren(...items);
}

/** JSON on one line, a space after each comma and colon. */
function oneLine(value) {
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? "null";
  if (Array.isArray(value)) return `[${value.map(oneLine).join(", ")}]`;
  const parts = Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${oneLine(v)}`);
  return `{${parts.join(", ")}}`;
}

/** JSON indented by two, but each list or object that fits on one line kept on one. */
function pretty(value, indent = "") {
  const flat = oneLine(value);
  if (value === null || typeof value !== "object" || indent.length + flat.length <= WIDTH) {
    return flat;
  }
  const inner = `${indent}  `;
  const parts = Array.isArray(value)
    ? value.map((item) => inner + pretty(item, inner))
    : Object.entries(value).map(([k, v]) => `${inner}${JSON.stringify(k)}: ${pretty(v, inner)}`);
  const [open, close] = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
  return `${open}\n${parts.join(",\n")}\n${indent}${close}`;
}

async function showOutput() {
  const run = state.run;
  const path = `/threads/${encodeURIComponent(run.thread_id)}` +
    `/runs/${encodeURIComponent(run.run_id)}/join`;
  const out = $("run-output");
  try {
    const response = await api(path);
    const text = (await response.text()).trim(); // a long wait starts with keep-alive newlines
    if (!response.ok) throw new ApiError(response.status, text);
    const value = JSON.parse(text);
    if (value && typeof value === "object" && "__interrupt__" in value) {
      addInterrupts(value.__interrupt__);
    }
    out.textContent = pretty(value);
    out.className = value && typeof value === "object" && "__error__" in value
      ? "output error" : "output";
  } catch (error) {
    out.textContent = `could not read the output: ${error.message}`;
    out.className = "output error";
  }
}

// -- the stream --------------------------------------------------------------------------------

function onEvent(event) {
  const [mode, ...namespace] = event.event.split("|");
  let data;
  try {
    data = JSON.parse(event.data);
  } catch {
    return;
  }
  if (mode === "progress" && data && typeof data.step === "number") {
    state.steps.set(data.step, data);
    if (state.run && state.run.status === "pending") {
      state.run = { ...state.run, status: "running", bulksync_status: "running" };
      showRecord();
    }
    showCounts();
    showSteps();
  } else if ((mode === "values" || mode === "updates") && namespace.length === 0) {
    if (data && typeof data === "object" && "__interrupt__" in data) {
      addInterrupts(data.__interrupt__);
    }
  } else if (mode === "error") {
    state.error = data;
    $("run-error").textContent = `${data.error}: ${data.message}`;
    $("run-error").hidden = false;
  }
}

async function followStream() {
  const run = state.run;
  const query = MODES.map((m) => `stream_mode=${m}`).join("&");
  const path = `/threads/${encodeURIComponent(run.thread_id)}` +
    `/runs/${encodeURIComponent(run.run_id)}/stream?${query}`;
  let lastId = null;
  let failures = 0;
  for (;;) {
    try {
      $("stream-state").textContent = lastId ? "reconnected to the run's events" :
        "following the run's events";
      const headers = lastId ? { "Last-Event-ID": lastId } : {};
      const response = await api(path, { headers });
      if (!response.ok) throw new ApiError(response.status, await response.text());
      await readEvents(response, (event) => {
        if (event.id) lastId = event.id;
        failures = 0;
        onEvent(event);
      });
      await readRecord(); // the stream ends with the run: check it did
      if (finished()) break;
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) throw error;
      $("stream-state").textContent = `lost the run's events (${error.message}); reconnecting…`;
    }
    failures += 1;
    await sleep(Math.min(5000, 250 * 2 ** failures));
  }
  $("stream-state").textContent = state.steps.size ? "" :
    "no progress events: the run's events have expired, or it ran no task";
  showCounts();
  showSteps();
}

async function main() {
  $("run-id").textContent = runId;
  try {
    await readRecord();
  } catch (error) {
    notice(error.status === 404 ? `No run '${runId}' here.` : `Could not read the run: ${error.message}`);
    $("run-status").textContent = "unknown";
    return;
  }
  setInterval(showDuration, 500);
  json(`/assistants/${encodeURIComponent(state.run.graph_id)}/graph`)
    .then(drawGraph)
    .catch((error) => {
      $("graph").replaceChildren(el("p", { class: "notice" },
        `Could not draw the graph: ${error.message}`));
    });
  followRecord();
  try {
    await followStream();
  } catch (error) {
    notice(`Could not follow the run: ${error.message}`);
    while (!finished()) await sleep(RECORD_EVERY_MS); // the record still says when it ends
  }
  await showOutput();
}

main();
