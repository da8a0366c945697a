// Orchard's dashboard. Everything the page shows comes from the API with
// the key the user typed; every value is written as text (never as HTML),
// since labels, page titles and task questions come from users and sites.
'use strict';

const keyName = 'orchard.api_key';
const refreshMS = 3000;
const viewWidth = 800;

const state = {
  key: sessionStorage.getItem(keyName) || '',
  timer: 0,
  armed: null,      // {id, until}: the delete waiting for its second click
  view: null,       // {id, abort: AbortController, url}
  console: null,    // the sandbox id the exec console runs in
  latest: null,     // {id, url, shown}: the running episode whose latest step is shown
};

const $ = (sel) => document.querySelector(sel);

// el builds an element; string children become text nodes.
function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'onclick') e.addEventListener('click', v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : String(k ?? ''));
  return e;
}

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// api calls the server with the key and turns an error body into its
// classified code and message.
async function api(path, opts = {}) {
  const res = await fetch(path, { ...opts, headers: { 'X-API-Key': state.key, ...(opts.headers || {}) } });
  if (!res.ok) {
    let msg = `${res.status} ${res.statusText}`;
    try {
      const b = await res.json();
      if (b.error) msg = `${b.error.code}: ${b.error.message}`;
      else if (b.detail) msg = typeof b.detail === 'string' ? b.detail : JSON.stringify(b.detail);
    } catch (_) { /* not JSON: keep the status line */ }
    throw new APIError(res.status, msg);
  }
  return res;
}
const getJSON = async (path) => (await api(path)).json();

function showError(msg) {
  const p = $('#error');
  p.textContent = msg || '';
  p.hidden = !msg;
}

function age(seconds) {
  if (!(seconds >= 0)) return '';
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${Math.round(seconds / 86400)} d`;
}
const since = (t) => age(Date.now() / 1000 - t);
const bytes = (n) => n >= 1 << 30 ? `${(n / (1 << 30)).toFixed(1)} GiB` : `${Math.round(n / (1 << 20))} MiB`;

function fill(section, rows, cols, empty) {
  const body = $(`#${section} tbody`);
  body.replaceChildren();
  if (rows.length === 0) {
    body.append(el('tr', null, el('td', { class: 'empty', colspan: String(cols) }, empty)));
    return;
  }
  for (const r of rows) body.append(r);
}

function renderResources(r) {
  const dl = $('#resources dl');
  dl.replaceChildren();
  const add = (k, v) => dl.append(el('dt', null, k), el('dd', null, v));
  add('status', r.status || '');
  if (r.total_allocatable) add('allocatable', `${r.total_allocatable.cpu} CPU, ${bytes(r.total_allocatable.memory_bytes)}`);
  if (r.total_requested) add('requested', `${r.total_requested.cpu} CPU, ${bytes(r.total_requested.memory_bytes)}`);
  if (r.available) add('available', `${r.available.cpu} CPU, ${bytes(r.available.memory_bytes)}`);
  add('sandboxes', String((r.sandbox_pods || []).length));
}

function sandboxQuery() {
  const q = new URLSearchParams();
  for (const [k, id] of [['kind', '#f-kind'], ['status', '#f-status'], ['labels', '#f-labels']]) {
    const v = $(id).value.trim();
    if (v) q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

// deleteButton asks for a second click before it deletes. The armed id
// lives in state, so a refresh that redraws the table keeps it armed.
function deleteButton(id) {
  const armed = state.armed && state.armed.id === id && Date.now() < state.armed.until;
  const b = el('button', { type: 'button', 'data-delete': id, class: armed ? 'confirm' : '' }, armed ? 'confirm delete' : 'delete');
  b.addEventListener('click', async () => {
    if (!(state.armed && state.armed.id === id && Date.now() < state.armed.until)) {
      state.armed = { id, until: Date.now() + 10000 };
      for (const o of document.querySelectorAll('button.confirm[data-delete]')) { o.textContent = 'delete'; o.classList.remove('confirm'); }
      b.textContent = 'confirm delete';
      b.classList.add('confirm');
      return;
    }
    state.armed = null;
    b.disabled = true;
    try {
      await api(`/sandboxes/${encodeURIComponent(id)}`, { method: 'DELETE' });
      if (state.view && state.view.id === id) closeView();
      refresh();
    } catch (e) {
      showError(`delete ${id}: ${e.message}`);
      b.disabled = false;
    }
  });
  return b;
}

function renderSandboxes(list) {
  const now = Date.now() / 1000;
  const rows = list.map((s) => {
    const labels = Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');
    const status = el('td', { class: `status-${s.status}` }, s.status);
    if (s.fault) status.append(el('span', { class: 'fault' }, `${s.fault.code}: ${s.fault.message || ''}`));
    else if (s.status === 'failed' && s.status_message) status.append(el('span', { class: 'fault' }, s.status_message));
    const actions = el('td');
    if ((s.kind === 'browser' || s.kind === 'desktop') && s.status === 'ready') {
      actions.append(el('button', { type: 'button', 'data-view': s.sandbox_id, onclick: () => openView(s.sandbox_id, s.kind) }, 'view'), ' ');
    }
    if (s.status === 'ready') {
      actions.append(el('button', { type: 'button', 'data-exec': s.sandbox_id, onclick: () => openConsole(s.sandbox_id) }, 'exec'), ' ');
    }
    actions.append(deleteButton(s.sandbox_id));
    return el('tr', { 'data-id': s.sandbox_id },
      el('td', { class: 'mono' }, s.sandbox_id), el('td', null, s.kind || 'shell'), status,
      el('td', null, s.image), el('td', null, `${s.cpu || ''} / ${s.memory || ''}`), el('td', { class: 'mono' }, labels),
      el('td', null, since(s.created_at)), el('td', null, s.expires_at ? age(s.expires_at - now) : ''), actions);
  });
  fill('sandboxes', rows, 9, 'no sandboxes');
}

function renderEpisodes(list) {
  fill('episodes', list.map((e) => {
    const acts = el('td');
    if (e.status === 'running') {
      acts.append(el('button', { type: 'button', 'data-latest': e.episode_id, onclick: () => openLatest(e.episode_id) }, 'latest'), ' ');
      if (e.sandbox_id && (e.kind === 'browser' || e.kind === 'desktop')) {
        acts.append(el('button', { type: 'button', 'data-live': e.episode_id, onclick: () => openView(e.sandbox_id, e.kind) }, 'live view'));
      }
    }
    return el('tr', { 'data-episode': e.episode_id },
      el('td', { class: 'mono' }, e.episode_id), el('td', null, e.task_id || ''), el('td', { class: 'mono' }, e.sandbox_id || ''),
      el('td', null, e.kind || ''), el('td', null, e.status || ''), el('td', { class: 'steps' }, String(e.steps ?? '')),
      el('td', { class: `outcome-${e.outcome || ''}` }, e.outcome || ''), el('td', null, e.created_at ? since(Date.parse(e.created_at) / 1000) : ''), acts);
  }), 9, 'no episodes');
}

// The latest step of a running episode, refreshed with the tables: the
// screenshot its last action was chosen from, with that action drawn (an
// action's coordinates are pixels of the previous step's screenshot).
function openLatest(id) {
  closeLatest();
  state.latest = { id, url: '', shown: '' };
  $('#latest').hidden = false;
  $('#latest-id').textContent = id;
  $('#latest-status').textContent = 'loading…';
  refreshLatest();
}

function closeLatest() {
  if (state.latest && state.latest.url) URL.revokeObjectURL(state.latest.url);
  state.latest = null;
  $('#latest').hidden = true;
  $('#latest img').removeAttribute('src');
  $('#latest svg').replaceChildren();
}

async function refreshLatest() {
  const l = state.latest;
  if (!l) return;
  try {
    const ep = await getJSON(`/episodes/${encodeURIComponent(l.id)}`);
    if (!ep.recording_id) { $('#latest-status').textContent = 'the episode is not recorded'; return; }
    const rec = await getJSON(`/recordings/${encodeURIComponent(ep.recording_id)}`);
    const steps = rec.steps || [];
    const last = steps[steps.length - 1];
    if (!last) { $('#latest-status').textContent = 'no step yet'; return; }
    // The screenshot the last action was chosen from; the last step's
    // own when it is the first.
    let shot = [...steps].reverse().find((st) => st.screenshot && (st.n < last.n || last.n === 0));
    const key = `${ep.recording_id}/${last.n}`;
    if (!shot || state.latest !== l || l.shown === key) return;
    const blob = await (await api(`/recordings/${encodeURIComponent(ep.recording_id)}/steps/${shot.n}/screenshot`)).blob();
    if (state.latest !== l) return;
    if (l.url) URL.revokeObjectURL(l.url);
    l.url = URL.createObjectURL(blob);
    l.shown = key;
    const img = $('#latest img');
    img.src = l.url;
    img.dataset.step = String(shot.n);
    // A step without width and height: the image's own size.
    if (!shot.width || !shot.height) {
      try { await img.decode(); } catch (_) { /* drawn without a size: nothing */ }
      shot = { ...shot, width: img.naturalWidth, height: img.naturalHeight };
    }
    drawAction($('#latest svg'), shot, last.n > shot.n ? last : null);
    const err = last.error ? ` — error ${last.error.code} (${last.error.category}, ${last.error.source})` : '';
    $('#latest-status').textContent = `step ${last.n}${last.step_ms ? ` (${Math.round(last.step_ms)} ms)` : ''}${err}; ${ep.status}`;
  } catch (e) {
    $('#latest-status').textContent = e.message;
  }
}

// drawAction draws next's action over shot's screenshot in an SVG whose
// viewBox is the screenshot's pixels.
function drawAction(svgEl, shot, next) {
  svgEl.replaceChildren();
  const w = shot.width || 0;
  const h = shot.height || 0;
  if (!next || !w || !h) { svgEl.removeAttribute('data-kind'); return; }
  svgEl.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svgEl.setAttribute('preserveAspectRatio', 'none');
  const ns = 'http://www.w3.org/2000/svg';
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text) e.textContent = text;
    svgEl.append(e);
  };
  const acts = Array.isArray(next.action) ? next.action : [next.action || {}];
  const sw = w / 300;
  svgEl.dataset.kind = acts[0].type || '';
  const elements = ((shot.result || {}).observation || {}).elements || [];
  acts.forEach((a) => {
    if (typeof a.x === 'number' && typeof a.y === 'number') {
      add('circle', { class: 'click', cx: a.x, cy: a.y, r: w / 80, 'stroke-width': sw });
      if (a.type === 'scroll' && (a.dx || a.dy)) add('line', { class: 'scroll', x1: a.x, y1: a.y, x2: a.x + (a.dx || 0), y2: a.y + (a.dy || 0), 'stroke-width': sw });
    }
    const box = (elements.find((e) => e.id === a.element) || {}).bbox;
    if (box) add('rect', { class: 'box', x: box[0], y: box[1], width: box[2], height: box[3], 'stroke-width': sw });
    if (Array.isArray(a.path) && a.path.length > 1) add('polyline', { class: 'drag', points: a.path.map((p) => p.join(',')).join(' '), 'stroke-width': sw });
    const caption = a.text ? `${a.type} "${a.text}"` : a.keys ? `key ${a.keys}` : '';
    if (caption) add('text', { class: 'typed', x: w / 100, y: h - h / 50, 'font-size': w / 40 }, caption);
  });
}

function renderSiteHealth(hosts) {
  fill('sitehealth', hosts.map((h) => el('tr', null,
    el('td', { class: 'mono' }, h.host), el('td', { class: `state-${h.state}` }, h.state), el('td', null, String(h.failures)),
    el('td', null, String(h.requests)), el('td', null, String(h.rejected)), el('td', null, h.last_error || ''))),
  6, 'no site has been visited');
}

function replayButton(id) {
  return el('button', {
    type: 'button', 'data-replay': id, onclick: async () => {
      // Downloaded, not opened here: the replay is a page of its own and
      // must not run with this page's origin (and key).
      try {
        const blob = await (await api(`/recordings/${encodeURIComponent(id)}/export?format=html`)).blob();
        const a = el('a', { href: URL.createObjectURL(blob), download: `${id}.html` });
        a.click();
        setTimeout(() => URL.revokeObjectURL(a.href), 10000);
      } catch (e) { showError(`replay ${id}: ${e.message}`); }
    },
  }, 'replay');
}

function renderRecordings(list) {
  fill('recordings', list.map((r) => el('tr', null,
    el('td', { class: 'mono' }, r.id), el('td', null, r.task_id || ''), el('td', null, r.kind || ''), el('td', null, String(r.steps)),
    el('td', { class: `outcome-${r.outcome || ''}` }, r.outcome || ''), el('td', null, r.reward ?? ''),
    el('td', null, r.created_at ? since(Date.parse(r.created_at) / 1000) : ''), el('td', null, replayButton(r.id)))),
  8, 'no recordings');
}

// optional: a part of the server that is not configured (501) shows as
// empty rather than as an error.
async function optional(path, pick) {
  try { return pick(await getJSON(path)); } catch (e) {
    if (e.status === 501) return [];
    throw e;
  }
}

async function refresh() {
  clearTimeout(state.timer);
  if (!state.key) return;
  try {
    const [res, sbx, eps, sites, recs] = await Promise.all([
      getJSON('/resources'), getJSON(`/sandboxes${sandboxQuery()}`),
      optional('/episodes', (b) => b.episodes || []), optional('/sitehealth', (b) => b.hosts || []),
      optional('/recordings', (b) => b.recordings || []),
    ]);
    $('#login').hidden = true;
    $('#main').hidden = false;
    $('#logout').hidden = false;
    renderResources(res);
    renderSandboxes(sbx.sandboxes || []);
    renderEpisodes(eps);
    renderSiteHealth(sites);
    renderRecordings(recs);
    refreshLatest();
    $('#updated').textContent = `updated ${new Date().toLocaleTimeString()}`;
    showError('');
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      forget();
      showError(e.message);
      return;
    }
    showError(e.message);
  }
  state.timer = setTimeout(refresh, refreshMS);
}

// Live view. A browser sandbox streams MJPEG; it needs the key header, so
// the page reads the multipart stream itself rather than pointing an img
// at it. A desktop sandbox's screen is polled.
function openView(id, kind) {
  closeView();
  const abort = new AbortController();
  state.view = { id, abort, url: '' };
  $('#viewer').hidden = false;
  $('#viewer-id').textContent = id;
  $('#viewer-status').textContent = 'connecting…';
  const img = $('#viewer img');
  img.dataset.frames = '0';
  const run = kind === 'browser' ? streamBrowser : pollDesktop;
  run(id, abort.signal).then(
    () => { if (!abort.signal.aborted) $('#viewer-status').textContent = 'stream ended'; },
    (e) => { if (!abort.signal.aborted) $('#viewer-status').textContent = e.message; });
}

function closeView() {
  if (!state.view) return;
  state.view.abort.abort();
  if (state.view.url) URL.revokeObjectURL(state.view.url);
  state.view = null;
  $('#viewer').hidden = true;
  const img = $('#viewer img');
  img.removeAttribute('src');
  img.dataset.frames = '0';
}

function showFrame(blob) {
  const v = state.view;
  if (!v) return;
  const img = $('#viewer img');
  const old = v.url;
  v.url = URL.createObjectURL(blob);
  img.src = v.url;
  img.dataset.frames = String(Number(img.dataset.frames) + 1);
  $('#viewer-status').textContent = '';
  if (old) setTimeout(() => URL.revokeObjectURL(old), 1000);
}

function indexOf(buf, pat) {
  outer: for (let i = 0; i <= buf.length - pat.length; i++) {
    for (let j = 0; j < pat.length; j++) if (buf[i + j] !== pat[j]) continue outer;
    return i;
  }
  return -1;
}

const headEnd = [13, 10, 13, 10];
const maxPart = 16 << 20;

async function streamBrowser(id, signal) {
  const res = await api(`/sandboxes/${encodeURIComponent(id)}/browser/stream?fps=5&width=${viewWidth}`, { signal });
  const reader = res.body.getReader();
  const text = new TextDecoder();
  let buf = new Uint8Array(0);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const next = new Uint8Array(buf.length + value.length);
    next.set(buf);
    next.set(value, buf.length);
    buf = next;
    // Each part: "--boundary", its headers with a Content-Length, a blank
    // line, the JPEG, CRLF.
    for (;;) {
      const he = indexOf(buf, headEnd);
      if (he < 0) break;
      const m = /content-length:\s*(\d+)/i.exec(text.decode(buf.subarray(0, he)));
      if (!m) throw new Error('live view: a part without Content-Length');
      const n = Number(m[1]);
      if (n > maxPart) throw new Error('live view: frame too large');
      const start = he + 4;
      if (buf.length < start + n) break;
      showFrame(new Blob([buf.slice(start, start + n)], { type: 'image/jpeg' }));
      buf = buf.slice(start + n);
    }
  }
}

async function pollDesktop(id, signal) {
  while (!signal.aborted) {
    const t0 = Date.now();
    const res = await api(`/sandboxes/${encodeURIComponent(id)}/desktop/screenshot?format=jpeg&quality=60&width=${viewWidth}`, { signal });
    showFrame(await res.blob());
    await new Promise((r) => setTimeout(r, Math.max(0, 500 - (Date.now() - t0))));
  }
}

// The exec console runs one command at a time in a sandbox (bash -c, as
// every exec) and shows its output; the command runs with the key's rights,
// as it would from any client.
function openConsole(id) {
  state.console = id;
  $('#console').hidden = false;
  $('#console-id').textContent = id;
  $('#console-out').replaceChildren();
  $('#console-cmd').focus();
}

function closeConsole() {
  state.console = null;
  $('#console').hidden = true;
}

async function runConsole(ev) {
  ev.preventDefault();
  const id = state.console;
  const input = $('#console-cmd');
  const cmd = input.value;
  if (!id || !cmd.trim()) return;
  const out = $('#console-out');
  out.append(el('div', { class: 'cmd' }, `$ ${cmd}`));
  input.disabled = true;
  try {
    const job = await (await api(`/sandboxes/${encodeURIComponent(id)}/exec`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ command: cmd, wait: true, timeout_seconds: 120 }),
    })).json();
    if (job.stdout) out.append(el('div', { class: 'stdout' }, job.stdout));
    if (job.stderr) out.append(el('div', { class: 'stderr' }, job.stderr));
    const fault = job.fault ? ` ${job.fault.code}: ${job.fault.message}` : '';
    out.append(el('div', { class: 'exit', 'data-exit': String(job.exit_code) }, `exit ${job.exit_code}${fault}`));
    input.value = '';
  } catch (e) {
    out.append(el('div', { class: 'stderr' }, e.message));
  }
  input.disabled = false;
  input.focus();
  out.scrollTop = out.scrollHeight;
}

function forget() {
  state.key = '';
  sessionStorage.removeItem(keyName);
  closeView();
  closeLatest();
  clearTimeout(state.timer);
  $('#main').hidden = true;
  $('#logout').hidden = true;
  $('#login').hidden = false;
  $('#key').focus();
}

async function banner() {
  try {
    const b = await (await fetch('/')).json();
    $('#banner').textContent = `${b.service || ''} ${b.version || ''}`;
  } catch (_) { /* the banner is decoration */ }
}

document.addEventListener('DOMContentLoaded', () => {
  banner();
  $('#login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    state.key = $('#key').value.trim();
    $('#key').value = '';
    sessionStorage.setItem(keyName, state.key);
    refresh();
  });
  $('#logout').addEventListener('click', () => { forget(); showError(''); });
  $('#viewer-close').addEventListener('click', closeView);
  $('#console-close').addEventListener('click', closeConsole);
  $('#latest-close').addEventListener('click', closeLatest);
  $('#console-form').addEventListener('submit', runConsole);
  $('#filter').addEventListener('change', refresh);
  $('#filter').addEventListener('submit', (ev) => { ev.preventDefault(); refresh(); });
  if (state.key) refresh(); else forget();
});
