// paged_np dashboard: draws the server's KV cache from GET /v1/cache (a snapshot) and
// GET /v1/cache/stream (server-sent events: one "snapshot", then "update"s with the
// pages that changed). No framework: one state object, one render() per animation frame.
"use strict";

const HISTORY_S = 300;                 // sparklines: the last five minutes, one point a second
const LIST_MAX = 60;                   // chips shown in the LRU and waiting lists

let snap = null;                       // the latest snapshot, updates applied
let points = [];                       // [{t, gen, used, prompt, hit}], t in seconds
let pendingHits = new Set();           // pages to flash at the next render
let pendingEvicted = new Set();        // pages evicted since the last render: a red flash
let cells = [];                        // the arena's <div>s, by page id
let es = null, pollTimer = null, frame = 0;

// ---- the API key (only with `serve --api-key`): posted once to /dashboard/login, which
// answers with a session cookie (HttpOnly: this script never sees it). The browser then
// sends the cookie with every read below; the key is kept nowhere and never in a URL.
function setStatus(s) { const el = byId("status"); el.textContent = s; el.dataset.status = s; }
function byId(id) { return document.getElementById(id); }

async function fetchSnapshot() {
  const r = await fetch("/v1/cache", { cache: "no-store" });
  if (r.status === 401) { const e = new Error("unauthorized"); e.status = 401; throw e; }
  if (!r.ok) throw new Error("GET /v1/cache: " + r.status);
  return r.json();
}

function askForKey(wrong) {
  setStatus("key needed");
  byId("key-dialog").hidden = false;
  byId("key-error").textContent = wrong ? "That key was refused; try again." : "";
  byId("api-key-input").focus();
}
byId("key-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const key = byId("api-key-input").value.trim();
  byId("api-key-input").value = "";
  let ok = false;
  try {
    const r = await fetch("/dashboard/login", { method: "POST",
                                                body: new URLSearchParams({ api_key: key }) });
    ok = r.ok;
  } catch (e) { /* the server is gone: ask again */ }
  if (!ok) { askForKey(true); return; }
  byId("key-dialog").hidden = true;
  start(true);
});

// ---- connecting: a snapshot first (it says whether a key is needed), then the stream
async function start(afterKey) {
  stopFeeds();
  try {
    setSnapshot(await fetchSnapshot());
  } catch (e) {
    if (e.status === 401) { askForKey(afterKey); return; }
    setStatus("error"); setTimeout(() => start(false), 2000); return;
  }
  if (!window.EventSource) { poll(); return; }
  es = new EventSource("/v1/cache/stream");      // the session cookie goes with it
  let opened = false;
  es.addEventListener("snapshot", (ev) => { opened = true; setStatus("live"); setSnapshot(JSON.parse(ev.data)); });
  es.addEventListener("update", (ev) => { opened = true; setStatus("live"); applyUpdate(JSON.parse(ev.data)); });
  es.onerror = () => {
    // A stream that never opened (no such endpoint, a proxy that buffers) or that the
    // server closed for good: read the snapshot once a second instead. A stream that
    // drops mid-way reconnects by itself (EventSource does), and its first event is a
    // fresh snapshot.
    if (!opened || es.readyState === EventSource.CLOSED) { es.close(); es = null; poll(); }
    else setStatus("reconnecting");
  };
}

function stopFeeds() {
  if (es) { es.close(); es = null; }
  if (pollTimer) { clearInterval(pollTimer); pollTimer = null; }
}

function poll() {
  setStatus("polling");
  pollTimer = setInterval(async () => {
    try { setSnapshot(await fetchSnapshot()); setStatus("polling"); }
    catch (e) {
      if (e.status === 401) { stopFeeds(); askForKey(true); } else setStatus("error");
    }
  }, 1000);
}

// ---- the data: a snapshot replaces everything; an update patches the changed pages
function setSnapshot(s) {
  const rebuild = !snap || !sameConfig(snap.config, s.config);
  snap = s;
  (s.hits || []).forEach((p) => pendingHits.add(p));
  (s.evicted || []).forEach((p) => pendingEvicted.add(p));
  if (rebuild) buildArena();
  record();
  schedule();
}

function sameConfig(a, b) { return JSON.stringify(a) === JSON.stringify(b); }

function applyUpdate(u) {
  if (!snap) return;
  const p = snap.pages, c = u.pages || { changed: [] };
  c.changed.forEach((id, i) => {
    p.state[id] = c.state[i]; p.ref_count[id] = c.ref_count[i]; p.owner[id] = c.owner[i];
  });
  for (const k of ["step", "time", "lru", "tree", "requests", "counters"]) if (k in u) snap[k] = u[k];
  (u.hits || []).forEach((id) => pendingHits.add(id));
  (u.evicted || []).forEach((id) => pendingEvicted.add(id));
  record();
  schedule();
}

// One point a second of the counters the sparklines need (all of them cumulative
// except pages in use), kept for HISTORY_S seconds.
function record() {
  const c = snap.counters || {}, t = Number(snap.time) || Date.now() / 1000;
  const pt = { t, gen: c.generated_tokens || 0, used: countState("in_use"),
               prompt: c.prompt_tokens || 0, hit: c.prefix_hit_tokens || 0 };
  const last = points[points.length - 1];
  if (last && t - last.t < 1) { last.used = Math.max(last.used, pt.used); return; }
  points.push(pt);
  while (points.length && t - points[0].t > HISTORY_S) points.shift();
}

function countState(s) { let n = 0; for (const x of snap.pages.state) if (x === s) n++; return n; }

// ---- drawing
function schedule() { if (!frame) frame = requestAnimationFrame(() => { frame = 0; render(); }); }

// A colour per request id, kept for the page's life: hues in order of first sight, each
// the golden angle (137.5 degrees) from the last, so requests side by side look unlike.
const hues = new Map();
function hue(rid) {
  if (!hues.has(rid)) hues.set(rid, (hues.size * 137.508 + 200) % 360);
  return hues.get(rid);
}
function reqColor(rid) { return `hsl(${hue(rid).toFixed(0)} 68% 46%)`; }

function buildArena() {
  const cfg = snap.config, n = snap.pages.state.length, arena = byId("arena");
  const cell = n <= 128 ? 40 : n <= 512 ? 30 : n <= 2048 ? 18 : 10;
  arena.style.setProperty("--cell", cell + "px");
  arena.replaceChildren();
  cells = [];
  for (let i = 0; i < n; i++) {
    const d = document.createElement("div");
    d.className = "page"; d.dataset.page = i;
    arena.appendChild(d); cells.push(d);
  }
  const mib = (cfg.bytes_per_page * cfg.num_pages) / 2 ** 20;
  byId("config").textContent =
    `${cfg.num_pages} pages × ${cfg.page_size} tokens = ${(cfg.num_pages * cfg.page_size).toLocaleString()} tokens, ` +
    `${mib >= 10 ? mib.toFixed(0) : mib.toFixed(1)} MiB · KV ${cfg.kv_cache_dtype} · ` +
    `prefix cache ${cfg.prefix_cache || "off"} · evict ${cfg.eviction_policy} · schedule ${cfg.schedule}` +
    (cfg.speculative ? " · speculative" : "");
  byId("config").dataset.kvDtype = cfg.kv_cache_dtype;
}

function render() {
  const p = snap.pages, c = snap.counters || {};
  let used = 0, cached = 0, free = 0, maxRef = 0;
  for (let i = 0; i < cells.length; i++) {
    const d = cells[i], st = p.state[i], ref = p.ref_count[i] || 0, owner = p.owner[i];
    if (st === "in_use") used++; else if (st === "cached") cached++; else free++;
    if (ref > maxRef) maxRef = ref;
    const o = owner == null ? "" : String(owner);
    if (d.dataset.state === st && d.dataset.ref === String(ref) && d.dataset.owner === o) continue;
    d.dataset.state = st; d.dataset.ref = ref; d.dataset.owner = o;
    d.style.background = st === "in_use" && o ? reqColor(o) : "";
    d.classList.toggle("shared", ref > 1);
    d.textContent = ref > 1 ? ref : "";
    d.title = `page ${i}: ${st}` + (o ? `, ${o}` : "") + (ref ? `, read by ${ref}` : "");
  }
  flash(pendingHits, "hit");
  flash(pendingEvicted, "evicted");

  byId("step").textContent = snap.step;
  byId("pages-in-use").textContent = used;
  byId("pages-cached").textContent = cached;
  byId("pages-free").textContent = free;
  byId("max-ref-count").textContent = maxRef;
  byId("evictions").textContent = c.evictions ?? 0;
  byId("preemptions").textContent = c.preemptions ?? 0;
  byId("hit-rate").textContent = pct(c.prefix_hit_rate);
  const spec = snap.config.speculative;
  byId("spec-stat").hidden = !spec;
  if (spec) byId("spec-acceptance").textContent = pct(c.spec_acceptance_rate);

  renderRequests();
  renderTiers(c.tiers || {});
  renderLru();
  renderTree();
  renderSparks();
}

// (Re)start a CSS flash on each page of the set, then empty it.
function flash(ids, cls) {
  for (const id of ids) {
    const d = cells[id]; if (!d) continue;
    d.classList.remove("hit", "evicted"); void d.offsetWidth; d.classList.add(cls);
  }
  ids.clear();
}

// One row per tier below the arena (host memory, disk): what it holds and serves.
function renderTiers(tiers) {
  const names = Object.keys(tiers);
  byId("tiers-panel").hidden = names.length === 0;
  const body = byId("tiers");
  body.replaceChildren(...names.map(name => {
    const t = tiers[name], tr = document.createElement("tr");
    tr.dataset.tier = name;
    for (const v of [name, t.pages, t.hits, t.loaded_tokens, t.stores, t.evictions, t.faults]) {
      const td = document.createElement("td");
      td.textContent = typeof v === "number" ? v.toLocaleString() : String(v ?? 0);
      tr.appendChild(td);
    }
    return tr;
  }));
}

function pct(x) { return x == null || isNaN(x) ? "–" : (100 * x).toFixed(0) + "%"; }

function renderRequests() {
  const rq = snap.requests || { running: [], waiting: [] };
  const body = byId("running");
  const rows = rq.running.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.request = r.id;
    tr.innerHTML = `<td class="sw-cell"><i class="sw" style="background:${reqColor(String(r.id))}"></i></td>` +
      `<td class="rid"></td><td>${r.num_tokens}</td><td>${r.num_computed_tokens}</td>` +
      `<td>${r.num_pages}</td><td>${r.cached_prompt_tokens}</td>`;
    tr.children[1].textContent = shortId(r.id);
    tr.children[1].title = r.id + (r.status ? " (" + r.status + ")" : "");
    return tr;
  });
  if (!rows.length) {
    const tr = document.createElement("tr"); tr.className = "none";
    tr.innerHTML = '<td colspan="6">no request running: send one with any OpenAI client</td>';
    rows.push(tr);
  }
  body.replaceChildren(...rows);
  byId("num-waiting").textContent = rq.waiting.length;
  byId("waiting").replaceChildren(...rq.waiting.slice(0, LIST_MAX).map((r) => {
    const s = document.createElement("span"); s.className = "chip req";
    s.style.background = reqColor(String(r.id)); s.textContent = shortId(r.id);
    s.title = `${r.id}: ${r.num_tokens} tokens` + (r.status ? ` (${r.status})` : "");
    return s;
  }));
}

// "chatcmpl-3f2a9c...": the prefix says the endpoint; 6 hex digits tell requests apart.
function shortId(id) { const s = String(id), i = s.lastIndexOf("-"); return i < 0 ? s.slice(0, 10) : s.slice(0, i + 7); }

function renderLru() {
  const lru = snap.lru || [];
  const chips = lru.slice(0, LIST_MAX).map((id, i) => {
    const s = document.createElement("span"); s.className = "chip" + (i === 0 ? " first" : "");
    s.textContent = id; s.dataset.page = id; return s;
  });
  if (lru.length > LIST_MAX) chips.push(more(lru.length - LIST_MAX));
  if (!lru.length) chips.push(more("none cached yet"));
  byId("lru").replaceChildren(...chips);
}

function more(n) { const s = document.createElement("span"); s.className = "more";
  s.textContent = typeof n === "number" ? `+${n} more` : n; return s; }

function renderTree() {
  const t = snap.tree;
  byId("tree-panel").hidden = !t;
  if (!t) return;
  const kids = new Map();
  for (const n of t.nodes) {
    const k = n.parent == null ? "root" : n.parent;
    if (!kids.has(k)) kids.set(k, []);
    kids.get(k).push(n);
  }
  let shown = 0;
  const list = (nodes) => {
    const ul = document.createElement("ul");
    for (const n of nodes) {
      if (shown++ > 200) break;
      const li = document.createElement("li"), span = document.createElement("span");
      const pages = n.pages || [];
      span.className = "node" + (n.lock_ref > 0 ? " locked" : "");
      span.textContent = `${n.num_tokens} tokens · pages ${pages.slice(0, 8).join(" ")}` +
        (pages.length > 8 ? " …" : "") + (n.lock_ref > 0 ? ` · read by ${n.lock_ref}` : "");
      li.appendChild(span);
      const ch = kids.get(n.id);
      if (ch) li.appendChild(list(ch));
      ul.appendChild(li);
    }
    return ul;
  };
  // The index's nodes have no root entry: their parents are null at the top.
  const root = document.createElement("span");
  root.className = "node"; root.textContent = `root (${t.nodes.length} nodes)`;
  byId("tree").replaceChildren(root, list(kids.get("root") || []));
}

function renderSparks() {
  const h = points, tps = [], used = [], hit = [];
  for (let i = 1; i < h.length; i++) {
    const dt = h[i].t - h[i - 1].t;
    tps.push(dt > 0 ? (h[i].gen - h[i - 1].gen) / dt : 0);
    used.push(h[i].used);
    const dp = h[i].prompt - h[i - 1].prompt;
    hit.push(dp > 0 ? (h[i].hit - h[i - 1].hit) / dp : null);   // no new prompt: no point
  }
  const now = tps.length ? tps[tps.length - 1] : 0;
  byId("tokens-per-s").textContent = now.toFixed(0);
  spark("spark-tps", tps, null); byId("spark-tps-v").textContent = now.toFixed(0);
  spark("spark-used", used, snap.config.num_pages);
  byId("spark-used-v").textContent = `${h.length ? h[h.length - 1].used : 0}/${snap.config.num_pages}`;
  spark("spark-hit", hit, 1);
  const c = snap.counters || {};
  byId("spark-hit-v").textContent = pct(c.prefix_hit_rate);
}

// A polyline, one point a second, from 0 to max (or the data's own max). The time axis
// spans a minute at first and grows to HISTORY_S seconds.
function spark(id, ys, max) {
  const svg = byId(id), n = Math.min(HISTORY_S, Math.max(60, ys.length));
  const top = max || Math.max(1, ...ys.filter((y) => y != null));
  const pts = [];
  ys.slice(-n).forEach((y, i, a) => {
    if (y == null) return;
    const x = ((n - a.length + i) / (n - 1)) * 300, yy = 38 - (36 * y) / top;
    pts.push(x.toFixed(1) + "," + yy.toFixed(1));
  });
  svg.innerHTML = pts.length ? `<polyline points="${pts.join(" ")}"/>` : "";
}

start(false);
