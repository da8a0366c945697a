// Runs: the summaries `orchard run --json FILE` writes, opened from disk.
// A file is read in the page and never sent anywhere; the charts are SVG
// the page draws itself. Two summaries of the same suite are compared
// task by task. Uses el and $ from app.js.
'use strict';

const svgNS = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, ...kids) {
  const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const k of kids) e.append(k instanceof Node ? k : String(k ?? ''));
  return e;
}

// wilson is the 95% Wilson score interval of s successes in n: it stays
// inside [0, 1] and is honest about 0/n and n/n, which small suites hit.
function wilson(s, n, z = 1.96) {
  if (!(n > 0)) return [0, 1];
  const p = s / n;
  const d = 1 + (z * z) / n;
  const c = (p + (z * z) / (2 * n)) / d;
  const h = (z * Math.sqrt((p * (1 - p)) / n + (z * z) / (4 * n * n))) / d;
  return [Math.max(0, c - h), Math.min(1, c + h)];
}

const pct = (f) => `${(100 * f).toFixed(1)}%`;

// barChart draws labelled horizontal bars scaled to the largest value
// (labels get 250 units: causes read "env_error unavailable/site.http_503");
// each bar's label and value are data attributes, so tests read them back.
function barChart(items, fmt = String) {
  const top = Math.max(0, ...items.map((i) => i.value));
  const s = svg('svg', { class: 'chart', viewBox: `0 0 520 ${22 * items.length + 4}`, role: 'img' });
  items.forEach((it, i) => {
    const w = top > 0 ? (200 * it.value) / top : 0;
    s.append(svg('g', { 'data-label': it.label, 'data-value': fmt(it.value) },
      svg('text', { x: 0, y: 22 * i + 15 }, it.label),
      svg('rect', { class: `bar ${it.cls || ''}`, x: 250, y: 22 * i + 3, width: w.toFixed(2), height: 16 }),
      svg('text', { class: 'v', x: 255 + w, y: 22 * i + 15 }, fmt(it.value))));
  });
  return s;
}

function rateChart(rate, lo, hi) {
  const x = (f) => 20 + 400 * f;
  return svg('svg', { class: 'chart', viewBox: '0 0 440 44', role: 'img' },
    svg('line', { class: 'axis', x1: 20, y1: 20, x2: 420, y2: 20 }),
    svg('rect', { class: 'bar success', x: 20, y: 12, width: 400 * rate, height: 16 }),
    svg('line', { class: 'ci', x1: x(lo), y1: 20, x2: x(hi), y2: 20 }),
    svg('line', { class: 'ci', x1: x(lo), y1: 8, x2: x(lo), y2: 32 }),
    svg('line', { class: 'ci', x1: x(hi), y1: 8, x2: x(hi), y2: 32 }),
    svg('text', { class: 'v', x: 20, y: 43 }, '0%'), svg('text', { class: 'v', x: 395, y: 43 }, '100%'));
}

const episodesOf = (s) => (s.tasks || []).flatMap((t) => t.episodes || []);

// causes counts the episodes that ended env_error or error by their
// attribution's category and code.
function causes(s) {
  const m = new Map();
  for (const e of episodesOf(s)) {
    if (e.outcome !== 'env_error' && e.outcome !== 'error') continue;
    const a = e.attribution || {};
    const k = `${e.outcome} ${a.category || '?'}/${a.code || '?'}`;
    m.set(k, (m.get(k) || 0) + 1);
  }
  return [...m].sort((a, b) => b[1] - a[1]).map(([label, value]) => ({ label, value, cls: label.split(' ')[0] }));
}

// perMinute is episodes per minute in up to 12 equal slices of the run,
// placed by each episode's end (started_at + duration_ms).
function perMinute(s) {
  const ends = episodesOf(s).filter((e) => e.started_at && !e.started_at.startsWith('0001'))
    .map((e) => [Date.parse(e.started_at), Date.parse(e.started_at) + (e.duration_ms || 0)]);
  if (ends.length === 0) return [];
  const first = Math.min(...ends.map((e) => e[0]));
  const last = Math.max(...ends.map((e) => e[1]));
  const span = Math.max((last - first) / 12 + 1, 1000);
  const counts = new Array(12).fill(0);
  for (const [, end] of ends) counts[Math.min(Math.floor((end - first) / span), 11)]++;
  return counts.map((n, i) => ({ label: `+${Math.round((i * span) / 1000)} s`, value: n / (span / 60000) }));
}

function card(id, title, ...kids) {
  return el('div', { class: 'card', id }, el('h3', null, title), ...kids);
}

function renderRun(s, name) {
  const n = (s.success || 0) + (s.failure || 0) + (s.error || 0);
  const [lo, hi] = wilson(s.success || 0, n);
  const rate = n > 0 ? s.success / n : 0;
  const cards = [
    card('run-rate', 'Success rate', el('div', { class: 'big', 'data-rate': pct(rate) }, pct(rate)),
      el('div', { class: 'hint' }, `95% Wilson interval ${pct(lo)} – ${pct(hi)} over ${n} tasks`), rateChart(rate, lo, hi)),
    card('run-outcomes', 'Outcomes', barChart(['success', 'failure', 'env_error', 'error', 'canceled']
      .map((k) => ({ label: k, value: s[k] || 0, cls: k })))),
  ];
  const c = causes(s);
  if (c.length) cards.push(card('run-causes', 'env_error and error by category/code', barChart(c)));
  const l = s.step_latency || {};
  cards.push(card('run-latency', 'Step latency', barChart([['p50', l.p50_ms], ['p90', l.p90_ms], ['p99', l.p99_ms], ['max', l.max_ms]]
    .map(([label, value]) => ({ label, value: value || 0 })), (v) => `${Math.round(v)} ms`)));
  const pm = perMinute(s);
  if (pm.length) cards.push(card('run-per-minute', 'Episodes per minute', barChart(pm, (v) => `${v.toFixed(1)}/min`)));
  const pk = s.pass_at_k || {};
  const ks = Object.keys(pk).sort((a, b) => Number(a.split('@')[1]) - Number(b.split('@')[1]));
  if (ks.length) cards.push(card('run-pass-at-k', 'pass@k', barChart(ks.map((k) => ({ label: k, value: pk[k] })), (v) => v.toFixed(2))));
  $('#run-charts').replaceChildren(el('p', { class: 'hint' },
    `${name}: ${s.total} tasks, ${s.episodes} episodes (${s.requeued || 0} re-queued), ${s.steps} steps, ${(s.episodes_per_minute || 0).toFixed(1)} episodes/min`),
  el('div', { class: 'cards' }, ...cards));
}

// change names how a task moved from run a to run b.
function change(a, b) {
  if (!a) return 'added';
  if (!b) return 'removed';
  if (a.outcome === b.outcome) return 'same';
  if (a.outcome === 'env_error' || b.outcome === 'env_error') return 'env_error';
  if (b.outcome === 'success') return 'improved';
  if (a.outcome === 'success') return 'regressed';
  return 'changed';
}

function renderCompare(a, b, an, bn) {
  const ta = new Map((a.tasks || []).map((t) => [t.task_id, t]));
  const tb = new Map((b.tasks || []).map((t) => [t.task_id, t]));
  const ids = [...new Set([...ta.keys(), ...tb.keys()])].sort();
  const counts = {};
  const rows = ids.map((id) => {
    const x = ta.get(id);
    const y = tb.get(id);
    const c = change(x, y);
    counts[c] = (counts[c] || 0) + 1;
    const cause = (t) => (t && t.attribution ? ` (${t.attribution.code})` : '');
    return el('tr', { 'data-task': id, 'data-change': c, class: `change-${c}` },
      el('td', { class: 'mono' }, id), el('td', { class: `outcome-${x ? x.outcome : ''}` }, x ? x.outcome + cause(x) : ''),
      el('td', { class: `outcome-${y ? y.outcome : ''}` }, y ? y.outcome + cause(y) : ''), el('td', null, c === 'same' ? '' : c));
  });
  $('#run-compare').replaceChildren(
    el('h3', null, `${an} → ${bn}`),
    el('p', { class: 'hint', id: 'run-compare-counts' }, ['improved', 'regressed', 'env_error', 'changed', 'added', 'removed', 'same']
      .filter((k) => counts[k]).map((k) => `${counts[k]} ${k}`).join(', ')),
    el('table', null, el('thead', null, el('tr', null, el('th', null, 'task'), el('th', null, an), el('th', null, bn), el('th', null, 'change'))),
      el('tbody', null, ...rows)));
}

// loaded holds the run shown and the baseline it is compared with, each
// [file name, summary].
const loaded = { run: null, base: null };

async function openRun(which, input) {
  const f = input.files[0];
  if (!f) return;
  try {
    const s = JSON.parse(await f.text());
    if (!Array.isArray(s.tasks)) throw new Error(`${f.name}: not a run summary (no "tasks")`);
    loaded[which] = [f.name, s];
    if (loaded.run) renderRun(loaded.run[1], loaded.run[0]);
    if (loaded.run && loaded.base) renderCompare(loaded.base[1], loaded.run[1], loaded.base[0], loaded.run[0]);
    showError('');
  } catch (e) {
    showError(`runs: ${e.message}`);
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('#run-file').addEventListener('change', (ev) => openRun('run', ev.target));
  $('#run-base').addEventListener('change', (ev) => openRun('base', ev.target));
});
