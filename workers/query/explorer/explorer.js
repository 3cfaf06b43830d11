// memstream explorer: asks the query worker's API (same origin) and shows what it answers.
// Every value from the API is put in the page as text (textContent, createElement): never as markup.
"use strict";

const KEY_STORE = "memstream.api_key";
const TENANT_STORE = "memstream.tenant";
const $ = (id) => document.getElementById(id);

// ---- small DOM helpers --------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}
function clear(node) { node.replaceChildren(); }
function score(value) { return typeof value === "number" ? value.toFixed(4) : ""; }

// ---- the API ------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function tenant() { return $("tenant").value.trim(); }
function withTenant(path) {
  const t = tenant();
  if (!t) return path;
  return path + (path.includes("?") ? "&" : "?") + "tenant=" + encodeURIComponent(t);
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers["Authorization"] = "Bearer " + key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const message = data && typeof data.error === "string" ? data.error : response.statusText;
    // refused (no key, a key not for this tenant): nothing answered before may stay in sight
    if (response.status === 401 || response.status === 403) { resetAnswer(); resetGlance(); }
    throw new ApiError(response.status, message);
  }
  return data;
}

function showError(err) {
  const box = $("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  const status = err instanceof ApiError ? err.status + ": " : "";
  let hint = "";
  if (err instanceof ApiError && err.status === 401) hint = " — enter an API key above";
  box.textContent = status + err.message + hint;
  box.hidden = false;
}

// ---- the key ------------------------------------------------------------------------------------
function showKeyState() {
  $("key-state").textContent = sessionStorage.getItem(KEY_STORE) ? "key set for this tab" : "no key";
}

// ---- Ask ----------------------------------------------------------------------------------------
let lastResult = null;

// Everything an answer put on screen, gone: under another tenant's name, or after a refusal,
// the previous tenant's passages, subgraph and evidence must not stay in sight.
function resetAnswer() {
  lastResult = null;
  for (const id of ["passages", "facts", "seeds", "path", "detail", "graph"]) clear($(id));
  graph = { nodes: new Map(), edges: new Map() };
  $("path-box").hidden = true;
  $("detail-box").hidden = true;
  for (const id of ["hover", "graph-state", "query-state"]) $(id).textContent = "";
}

function resetGlance() {
  for (const id of ["layers", "statuses", "standing", "conflicts", "newest"]) clear($(id));
}

async function runQuery(event) {
  event.preventDefault();
  const body = { query: $("query").value, mode: $("mode").value, top_k: Number($("top-k").value) || 5 };
  if (tenant()) body.tenant = tenant();
  const asOf = $("as-of").value.trim();
  if (asOf) body.as_of = asOf;
  $("query-state").textContent = "asking…";
  try {
    const result = await api("POST", "/v1/query", body);
    showError(null);
    lastResult = result;
    renderResult(result);
    const ms = result.timings_ms && result.timings_ms.total;
    $("query-state").textContent = result.passages.length + " passages, " + (result.facts || []).length + " facts" +
      (typeof ms === "number" ? ", " + ms.toFixed(1) + " ms" : "") + (result.warning ? " — " + result.warning : "") +
      (result.fallback ? " — fallback: " + result.fallback : "");
    await drawGraph(result);
  } catch (err) {
    $("query-state").textContent = "";
    showError(err);
  }
}

function factLabel(fact) {
  return [fact.head || "?", fact.relation || "?", fact.tail || "?"].join(" — ");
}

function factButton(fact) {
  const button = el("button", { type: "button", class: "fact-link", "data-fact": fact.id }, factLabel(fact));
  button.addEventListener("click", () => openEvidence(fact.id));
  return button;
}

function passageButton(id, label, cls) {
  const button = el("button", { type: "button", class: cls, "data-passage": id }, label);
  button.addEventListener("click", () => openPassage(id));
  return button;
}

function renderResult(result) {
  const passages = $("passages");
  clear(passages);
  for (const p of result.passages) {
    passages.append(el("li", { "data-passage": p.id },
      el("span", { class: "score" }, score(p.score)),
      passageButton(p.id, p.text, "passage-text passage-link"),
      el("span", { class: "doc" }, p.doc_id)));
  }
  const facts = $("facts");
  clear(facts);
  for (const f of result.facts || []) {
    facts.append(el("li", {}, el("span", { class: "score" }, score(f.score)), factButton(f),
      f.status ? el("span", { class: "status" }, f.status) : null));
  }
  const seeds = $("seeds");
  clear(seeds);
  const byId = new Map((result.facts || []).map((f) => [f.id, f]));
  const seeded = result.seeds ? result.seeds.facts : [];
  for (const s of seeded) {
    const fact = byId.get(s.id);
    seeds.append(el("li", {}, el("span", { class: "score" }, score(s.score)), fact ? factButton(fact) : s.id));
  }
  const noSeeds = result.seeds
    ? "(none)"
    : result.fallback
      ? "(nothing in memory was near enough to seed the walk: the first stage answered)"
      : "(this mode seeds no walk)";
  if (!seeded.length) seeds.append(el("li", {}, noSeeds));
  const path = $("path");
  clear(path);
  $("path-box").hidden = !result.path;
  // a passage read by a step, by its document (and the start of its text) rather than its hash
  const known = new Map(result.passages.map((p) => [p.id, p]));
  for (const step of result.path || []) {
    const cue = step.cue.name || step.cue.id || step.cue.kind;
    const read = step.content.passages.map((id) => {
      const p = known.get(id);
      return passageButton(id, p ? p.doc_id + ": " + p.text.slice(0, 60) : "passage " + id.slice(0, 8) + "…", "passage-link");
    });
    const tagScore = step.tag.fact_id ? step.tag.fact_score : step.tag.passage_score;
    const item = el("li", { class: "step" },
      "cue ", el("b", {}, cue), " (" + step.cue.kind + ") → tag ", el("b", {}, step.tag.text), " → content ");
    if (!read.length) item.append("(nothing)");
    read.forEach((button, i) => { if (i) item.append(", "); item.append(button); });
    // the tag's own similarity and its chain's: the step's score is capped by the branch that raised its cue
    item.append(" [" + step.content.tokens + " tokens; tag " + score(tagScore) + ", chain " + score(step.tag.chain_score) +
      ", step " + score(step.score) + "]");
    path.append(item);
  }
}

// ---- the subgraph -------------------------------------------------------------------------------
// nodes: {id, kind: entity|fact|passage, label, score, fact?}; edges: {a, b, kind: head|tail|evidence}
let graph = { nodes: new Map(), edges: new Map() };

function addNode(id, kind, label, value, extra) {
  const key = kind + ":" + id;
  const found = graph.nodes.get(key);
  if (found) {
    if (typeof value === "number" && (found.score === undefined || value > found.score)) found.score = value;
    return found;
  }
  const node = Object.assign({ key, id, kind, label, score: value }, extra || {});
  graph.nodes.set(key, node);
  return node;
}
function addEdge(a, b, kind) {
  graph.edges.set(a.key + ">" + b.key, { a, b, kind });
}
function addFact(fact, value) {
  const node = addNode(fact.id, "fact", factLabel(fact), value, { fact });
  if (fact.head_id) addEdge(node, addNode(fact.head_id, "entity", fact.head || fact.head_id), "head");
  if (fact.tail_id) addEdge(node, addNode(fact.tail_id, "entity", fact.tail || fact.tail_id), "tail");
  return node;
}

async function drawGraph(result) {
  graph = { nodes: new Map(), edges: new Map() };
  for (const e of result.entities || []) if (e.id) addNode(e.id, "entity", e.name || e.id, e.score);
  for (const p of result.passages) addNode(p.id, "passage", p.text.slice(0, 80), p.score, { doc: p.doc_id });
  const facts = (result.facts || []).slice(0, 15);
  for (const f of facts) addFact(f, f.score);
  // each fact's evidence: the passages it was extracted from
  const evidence = await Promise.all(facts.map((f) =>
    api("GET", withTenant("/v1/facts/" + encodeURIComponent(f.id) + "/evidence")).catch(() => null)));
  evidence.forEach((found, i) => {
    if (!found) return;
    const factNode = graph.nodes.get("fact:" + facts[i].id);
    for (const p of found.passages) addEdge(factNode, addNode(p.id, "passage", p.text.slice(0, 80), undefined, { doc: p.doc_id }), "evidence");
  });
  layout();
  render();
}

function layout() {
  const nodes = [...graph.nodes.values()];
  const edges = [...graph.edges.values()];
  const W = 800, H = 520;
  nodes.forEach((n, i) => {
    if (n.x === undefined) {
      const angle = (2 * Math.PI * i) / Math.max(1, nodes.length);
      n.x = W / 2 + 200 * Math.cos(angle); n.y = H / 2 + 180 * Math.sin(angle);
    }
  });
  for (let round = 0; round < 250; round++) {
    const cool = 1 - round / 250;
    for (const n of nodes) { n.dx = 0; n.dy = 0; }
    for (let i = 0; i < nodes.length; i++) {
      for (let j = i + 1; j < nodes.length; j++) {
        const a = nodes[i], b = nodes[j];
        let dx = a.x - b.x, dy = a.y - b.y;
        const d2 = Math.max(dx * dx + dy * dy, 1);
        const push = 9000 / (d2 * Math.sqrt(d2));  // 9000 / d², along the unit vector
        dx *= push; dy *= push;
        a.dx += dx; a.dy += dy; b.dx -= dx; b.dy -= dy;
      }
    }
    for (const { a, b } of edges) {
      const dx = b.x - a.x, dy = b.y - a.y;
      const d = Math.sqrt(dx * dx + dy * dy) || 1;
      const pull = (d - 70) * 0.1;  // a spring of rest length 70 px
      a.dx += (dx / d) * pull; a.dy += (dy / d) * pull; b.dx -= (dx / d) * pull; b.dy -= (dy / d) * pull;
    }
    for (const n of nodes) {
      n.dx += (W / 2 - n.x) * 0.02; n.dy += (H / 2 - n.y) * 0.02;
      const step = Math.sqrt(n.dx * n.dx + n.dy * n.dy) || 1;
      const limit = 12 * cool + 0.5;
      n.x = Math.min(W - 20, Math.max(20, n.x + (n.dx / step) * Math.min(step, limit)));
      n.y = Math.min(H - 20, Math.max(20, n.y + (n.dy / step) * Math.min(step, limit)));
    }
  }
}

function radius(node) {
  const scores = [...graph.nodes.values()].filter((n) => n.kind === node.kind && typeof n.score === "number").map((n) => n.score);
  const top = Math.max(...scores, 1e-9);
  const share = typeof node.score === "number" ? Math.max(0, node.score) / top : 0;
  return 5 + 11 * Math.sqrt(share);
}

function render() {
  const root = $("graph");
  clear(root);
  for (const { a, b, kind } of graph.edges.values()) {
    const line = svg("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y, class: kind });
    line.append(svgTitle(kind));
    root.append(line);
  }
  for (const node of graph.nodes.values()) {
    const group = svg("g", { "data-kind": node.kind, "data-id": node.id });
    const circle = svg("circle", { cx: node.x, cy: node.y, r: radius(node).toFixed(1), class: node.kind });
    circle.append(svgTitle(node.kind + ": " + node.label + (typeof node.score === "number" ? " (" + score(node.score) + ")" : "")));
    circle.addEventListener("mouseenter", () => { $("hover").textContent = node.kind + ": " + node.label; });
    circle.addEventListener("click", () => clickNode(node));
    group.append(circle);
    // an entity by its name, a passage by its document (its text is the hover and the title)
    const label = node.kind === "entity" ? node.label : node.kind === "passage" ? node.doc || node.label : "";
    if (label) {
      const text = svg("text", { x: node.x + radius(node) + 2, y: node.y + 3, class: node.kind });
      text.textContent = label.slice(0, 24);
      group.append(text);
    }
    root.append(group);
  }
}

function svgTitle(text) {
  const title = svg("title");
  title.textContent = text;
  return title;
}

async function clickNode(node) {
  if (node.kind === "fact") return openEvidence(node.id);
  if (node.kind === "passage") return openPassage(node.id);
  try {
    const found = await api("GET", withTenant("/v1/entities/" + encodeURIComponent(node.id) + "/facts?limit=20"));
    showError(null);
    for (const fact of found.facts) addFact(fact);
    layout();
    render();
    $("graph-state").textContent = "expanded " + found.entity.name + " — " + found.total + " facts";
  } catch (err) { showError(err); }
}

// ---- drill-down -----------------------------------------------------------------------------
async function openEvidence(factId) {
  try {
    const found = await api("GET", withTenant("/v1/facts/" + encodeURIComponent(factId) + "/evidence"));
    showError(null);
    const fact = found.fact;
    $("detail-title").textContent = "Evidence";
    const detail = $("detail");
    clear(detail);
    detail.append(el("p", { class: "fact-line" }, el("b", {}, factLabel(fact)), el("span", { class: "status" }, fact.status),
      el("span", { class: "doc" }, fact.category + " · " + fact.id)));
    const list = el("ol", { id: "evidence" });
    for (const p of found.passages) {
      list.append(el("li", { "data-passage": p.id }, el("span", { class: "passage-text" }, p.text), el("span", { class: "doc" }, p.doc_id)));
    }
    detail.append(list);
    $("detail-box").hidden = false;
  } catch (err) { showError(err); }
}

async function openPassage(passageId) {
  try {
    const p = await api("GET", withTenant("/v1/passages/" + encodeURIComponent(passageId)));
    showError(null);
    $("detail-title").textContent = "Passage";
    const detail = $("detail");
    clear(detail);
    detail.append(el("p", { class: "passage-text" }, p.text), el("p", { class: "doc" }, p.doc_ids.join(", ") + " · " + p.id));
    $("detail-box").hidden = false;
  } catch (err) { showError(err); }
}

// ---- the memory at a glance -----------------------------------------------------------------
function table(node, counts) {
  clear(node);
  for (const [name, n] of Object.entries(counts)) node.append(el("tr", {}, el("td", {}, name), el("td", { class: "n" }, n)));
}

function factList(node, facts, empty) {
  clear(node);
  for (const f of facts) {
    const when = typeof f.created_at === "number" ? new Date(f.created_at * 1000).toISOString().replace(".000Z", "Z") : "";
    node.append(el("li", {}, el("span", { class: "doc" }, when), " ", factButton(f), el("span", { class: "status" }, f.status),
      f.reason ? el("span", { class: "doc" }, f.reason) : null));
  }
  if (!facts.length) node.append(el("li", {}, empty));
}

async function refreshGlance() {
  try {
    const [overview, standing, newest, conflicts] = await Promise.all([
      api("GET", withTenant("/v1/overview")),
      api("GET", withTenant("/v1/facts?limit=20")),
      api("GET", withTenant("/v1/recent-facts?limit=10")),
      api("GET", withTenant("/v1/recent-facts?status=invalid&limit=10")),
    ]);
    table($("layers"), Object.assign({}, overview.layers, { "graph version": overview.graph_version }));
    table($("statuses"), overview.facts_by_status);
    const list = $("standing");
    clear(list);
    for (const f of standing.facts) list.append(el("li", {}, el("span", { class: "status" }, f.category), " ", factButton(f)));
    if (!standing.facts.length) list.append(el("li", {}, "(none: no constraint, rejected option or tool failure holds)"));
    factList($("newest"), newest.facts, "(no facts yet)");
    factList($("conflicts"), conflicts.facts, "(none)");
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) showError(err);
  }
}

// ---- wiring ---------------------------------------------------------------------------------
function start() {
  // ?tenant= in the address names the tenant (as the API's routes take it), else the tab's last one
  $("tenant").value = new URLSearchParams(location.search).get("tenant") || sessionStorage.getItem(TENANT_STORE) || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key").value.trim();
    if (key) sessionStorage.setItem(KEY_STORE, key);
    sessionStorage.setItem(TENANT_STORE, tenant());
    $("key").value = "";
    showKeyState();
    showError(null);
    refreshGlance();
  });
  $("forget-key").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); showKeyState(); });
  $("tenant").addEventListener("change", () => {
    sessionStorage.setItem(TENANT_STORE, tenant());
    resetAnswer();  // the answer shown was another tenant's
    resetGlance();
    showError(null);
    refreshGlance();
  });
  $("query-form").addEventListener("submit", runQuery);
  $("refresh").addEventListener("click", refreshGlance);
  showKeyState();
  refreshGlance();
  setInterval(() => { if (!document.hidden) refreshGlance(); }, 15000);
}

start();
