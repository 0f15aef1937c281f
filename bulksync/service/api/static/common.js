// What both pages of the run view share: the API's address, the key, reading JSON and
// server-sent events, and formatting. No library: the pages must work with no network but
// this server's.

// The API's root: the page's address up to its /ui (so a server behind a path prefix works).
export const ROOT = location.pathname.replace(/\/ui(\/.*)?$/, "");

const KEY_ITEM = "bulksync.apiKey";

/** An answer of the API that is not a success, with its status and its `detail`. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY_ITEM) || "";
}

let asking = null; // the pending key form's promise, shared by every call refused meanwhile

/** Show a form asking for the API key; resolve once the user has given one. */
function askKey(reason) {
  if (asking) return asking;
  asking = new Promise((resolve) => {
    const form = el("form", { id: "key-form", class: "key-form" },
      el("p", {}, "This server asks for an API key (one of BULKSYNC_API_KEYS). ",
        el("span", { class: "muted" }, reason)),
      el("input", { id: "key-input", type: "password", placeholder: "x-api-key",
        autocomplete: "off", required: "" }),
      el("button", { type: "submit" }, "Use key"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      localStorage.setItem(KEY_ITEM, form.querySelector("input").value.trim());
      form.remove();
      asking = null;
      resolve();
    });
    document.querySelector("main").prepend(form);
    form.querySelector("input").focus();
  });
  return asking;
}

/** fetch() of an API path with the key; a 401 asks for the key and tries again. */
export async function api(path, options = {}) {
  for (;;) {
    const headers = { ...(options.headers || {}) };
    if (apiKey()) headers["x-api-key"] = apiKey();
    const response = await fetch(ROOT + path, { ...options, headers });
    if (response.status !== 401) return response;
    await askKey(await detailOf(response));
  }
}

/** The JSON an API path answers; an ApiError (with the server's detail) otherwise. */
export async function json(path) {
  const response = await api(path);
  if (!response.ok) throw new ApiError(response.status, await detailOf(response));
  return response.json();
}

async function detailOf(response) {
  try {
    const body = await response.json();
    return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch {
    return `HTTP ${response.status}`;
  }
}

/**
 * Read a response of server-sent events to its end, calling onEvent({event, data, id}) for
 * each. EventSource cannot send the key, so the lines are parsed here: `event:`, `data:`
 * (several join with newlines), `id:`, comments (`:` keep-alives) skipped; a blank line ends
 * an event.
 */
export async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let name = "";
  let data = [];
  let id = null;
  const line = (text) => {
    if (text === "") {
      if (data.length) onEvent({ event: name || "message", data: data.join("\n"), id });
      name = "";
      data = [];
      id = null;
      return;
    }
    if (text.startsWith(":")) return;
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
    else if (field === "id") id = value;
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    for (;;) {
      const end = /\r\n|\r|\n/.exec(buffer);
      // A "\r" last in the buffer may be the first half of a "\r\n": wait for the rest.
      if (!end || (end[0] === "\r" && end.index === buffer.length - 1)) break;
      line(buffer.slice(0, end.index));
      buffer = buffer.slice(end.index + end[0].length);
    }
  }
}

/** A DOM element: el("td", {class: "x", "data-y": 1}, "text", child, ...). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

/** An SVG element with its attributes. */
export function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

export const FINISHED = new Set(["success", "error", "timeout", "interrupted"]);

/** The status a run shows: bulksync's own "cancelled" rather than the API's "interrupted". */
export function statusOf(run) {
  return run.bulksync_status === "cancelled" ? "cancelled" : run.status;
}

export function seconds(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value < 60) return `${value.toFixed(value < 10 ? 2 : 1)} s`;
  const minutes = Math.floor(value / 60);
  const rest = Math.floor(value % 60).toString().padStart(2, "0");
  if (minutes < 60) return `${minutes} m ${rest} s`;
  return `${Math.floor(minutes / 60)} h ${(minutes % 60).toString().padStart(2, "0")} m`;
}

export function when(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
