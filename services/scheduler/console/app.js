// The MARLaaS console's script. Every string that comes from a job (names, specs, samples,
// errors) reaches the page through textContent or attribute setters, never as HTML: no innerHTML
// anywhere. The page polls JSON endpoints every 1.5 s; the session is an HttpOnly cookie, and
// requests that change anything carry the session's CSRF token in X-CSRF-Token.
'use strict';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const POLL_MS = 1500;
let me = null;          // {tenant, admin, csrf}
let timer = null;
let jobsSort = {key: 'id', dir: 1};
let lastJobs = [];
const compareSel = new Set();

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

class HttpError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}
async function getJSON(path) {
  const r = await fetch(path, {credentials: 'same-origin', cache: 'no-store'});
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) { showLogin(); throw new HttpError(401, body.error || 'not logged in'); }
  if (!r.ok) throw new HttpError(r.status, body.error || r.statusText);
  return body;
}
async function post(path, body, headers) {
  const r = await fetch(path, {
    method: 'POST', credentials: 'same-origin', cache: 'no-store',
    headers: Object.assign({'Content-Type': 'application/x-www-form-urlencoded'}, headers || {}),
    body,
  });
  const out = await r.json().catch(() => ({}));
  if (!r.ok) throw new HttpError(r.status, out.error || r.statusText);
  return out;
}

// --- formatting ------------------------------------------------------------------------------
const fmt = (v, d = 3) => (v === undefined || v === null || Number.isNaN(v)) ? '' : Number(v).toFixed(d);
const pct = (v) => (v === undefined || v === null) ? '' : (100 * v).toFixed(1) + ' %';
function evalText(j) {
  if (j.eval_acc === undefined) return '';
  const before = j.eval_acc0 !== undefined ? pct(j.eval_acc0) + ' \u2192 ' : '';
  const ci = j.eval_lo !== undefined ? ' [' + pct(j.eval_lo) + ', ' + pct(j.eval_hi) + ']' : '';
  return before + pct(j.eval_acc) + ci;
}

// --- views -----------------------------------------------------------------------------------
const VIEWS = ['login', 'jobs', 'job', 'compare', 'cluster'];
function show(view) {
  for (const v of VIEWS) $('view-' + v).hidden = v !== view;
  $('nav').hidden = view === 'login';
}
function showLogin() {
  me = null;
  if (timer) { clearInterval(timer); timer = null; }
  show('login');
}

async function login(ev) {
  ev.preventDefault();
  $('login-error').textContent = '';
  const token = $('token').value;
  try {
    // the token travels in the POST body only, never in a URL
    me = await post('/api/login', 'token=' + encodeURIComponent(token), {'X-Marlaas-Console': '1'});
    $('token').value = '';
    start();
  } catch (e) {
    $('login-error').textContent = 'Login refused: ' + e.message;
  }
}

async function logout() {
  try { await post('/api/logout', '', {'X-CSRF-Token': me ? me.csrf : ''}); } catch (e) { /* gone anyway */ }
  showLogin();
}

const JOB_COLUMNS = [
  ['id', 'Job'], ['name', 'Name'], ['tenant', 'Tenant'], ['status', 'Status'], ['task', 'Task'],
  ['step', 'Step'], ['reward', 'Reward'], ['eval_acc', 'Eval accuracy (before \u2192 now, 95 %)'],
  ['staleness', 'Staleness'], ['tokens', 'Tokens'], ['compute_s', 'Compute s'], ['cost_share', 'Cost share'],
];
function jobCell(j, key) {
  switch (key) {
    case 'step': return (j.step ?? '') + ' / ' + (j.max_steps ?? '');
    case 'reward': return fmt(j.reward);
    case 'eval_acc': return evalText(j);
    case 'staleness': return fmt(j.staleness, 1);
    case 'tokens': return j.tokens !== undefined ? String(j.tokens) : '';
    case 'compute_s': return fmt(j.compute_s, 1);
    case 'cost_share': return pct(j.cost_share);
    default: return j[key] ?? '';
  }
}
function jobNum(id) { const m = /^j-(\d+)$/.exec(id || ''); return m ? Number(m[1]) : 0; }
function sortJobs(jobs) {
  const {key, dir} = jobsSort;
  return jobs.slice().sort((a, b) => {
    let x = a[key], y = b[key];
    if (key === 'id') { x = jobNum(a.id); y = jobNum(b.id); }
    if (x === undefined) return 1;
    if (y === undefined) return -1;
    return (x < y ? -1 : x > y ? 1 : 0) * dir;
  });
}
function renderJobsHead() {
  const tr = document.querySelector('#jobs-table thead tr');
  clear(tr);
  for (const [key, label] of JOB_COLUMNS) {
    if (key === 'tenant' && !(me && me.admin)) continue;
    const th = el('th', {scope: 'col', 'data-key': key});
    if (jobsSort.key === key) th.setAttribute('aria-sort', jobsSort.dir > 0 ? 'ascending' : 'descending');
    const b = el('button', {type: 'button'}, label);   // a button: Tab reaches it, Enter sorts
    b.addEventListener('click', () => {
      jobsSort = {key, dir: jobsSort.key === key ? -jobsSort.dir : 1};
      renderJobsHead();
      renderJobs(lastJobs);
      // the header was rebuilt: keep the keyboard's place
      document.querySelector(`#jobs-table th[data-key="${key}"] button`).focus();
    });
    th.appendChild(b);
    tr.appendChild(th);
  }
}
function renderJobs(jobs) {
  lastJobs = jobs;
  const tb = document.querySelector('#jobs-table tbody');
  clear(tb);
  for (const j of sortJobs(jobs)) {
    const tr = el('tr', {'data-job': j.id});
    for (const [key] of JOB_COLUMNS) {
      if (key === 'tenant' && !(me && me.admin)) continue;
      const td = el('td', {'data-key': key});
      if (key === 'id') {
        const a = el('a', {href: '#/job/' + encodeURIComponent(j.id)}, j.id);
        td.appendChild(a);
      } else {
        td.textContent = String(jobCell(j, key));
        if (['name', 'status', 'task', 'tenant'].includes(key)) td.className = 'text';
      }
      tr.appendChild(td);
    }
    tb.appendChild(tr);
  }
}

// --- charts ----------------------------------------------------------------------------------
const COLORS = ['#3069d6', '#d65a30', '#2a9d5c', '#9c3fc4', '#c4a000', '#3fb4c4', '#c43f7a', '#666'];
// series: [{name, color, points: [[x, y]], band: [[x, lo, hi]]}]
function chart(title, key, series) {
  const W = 360, H = 180, L = 58, R = 8, T = 8, B = 22;   // L fits a label like -3.95e-12
  const box = el('div', {class: 'chart', 'data-chart': key});
  box.appendChild(el('h4', {}, title));
  const svg = svgEl('svg', {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title});
  let xs = [], ys = [];
  for (const s of series) {
    for (const p of s.points) { xs.push(p[0]); ys.push(p[1]); }
    for (const b of s.band || []) { ys.push(b[1], b[2]); }
  }
  const n = series.reduce((a, s) => a + s.points.length, 0);
  svg.setAttribute('data-points', n);
  if (!xs.length) {
    const t = svgEl('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle'});
    t.textContent = 'no data yet';
    svg.appendChild(t);
    box.appendChild(svg);
    return box;
  }
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  svg.appendChild(svgEl('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: '#aab'}));
  svg.appendChild(svgEl('line', {x1: L, y1: T, x2: L, y2: H - B, stroke: '#aab'}));
  const label = (x, y, s, anchor) => {
    const t = svgEl('text', {x, y, 'text-anchor': anchor});
    t.textContent = s;
    svg.appendChild(t);
  };
  label(L - 4, T + 8, Number(y1.toPrecision(3)), 'end');
  label(L - 4, H - B, Number(y0.toPrecision(3)), 'end');
  label(L, H - 6, x0, 'start');
  label(W - R, H - 6, x1, 'end');
  for (const [i, s] of series.entries()) {
    const color = s.color || COLORS[i % COLORS.length];
    if (s.band && s.band.length) {
      const up = s.band.map((b) => `${sx(b[0]).toFixed(1)},${sy(b[2]).toFixed(1)}`);
      const down = s.band.slice().reverse().map((b) => `${sx(b[0]).toFixed(1)},${sy(b[1]).toFixed(1)}`);
      svg.appendChild(svgEl('polygon', {points: up.concat(down).join(' '), fill: color, 'fill-opacity': 0.15, stroke: 'none'}));
    }
    const pts = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ');
    const line = svgEl('polyline', {points: pts, fill: 'none', stroke: color, 'stroke-width': 1.5, 'data-series': s.name});
    svg.appendChild(line);
    if (s.points.length === 1) {
      svg.appendChild(svgEl('circle', {cx: sx(s.points[0][0]), cy: sy(s.points[0][1]), r: 2.5, fill: color}));
    }
  }
  box.appendChild(svg);
  if (series.length > 1) {
    const lg = el('div', {class: 'legend'});
    for (const [i, s] of series.entries()) {
      const sp = el('span', {}, '\u25A0 ' + s.name);
      sp.style.color = s.color || COLORS[i % COLORS.length];   // CSSOM, allowed by the CSP
      lg.appendChild(sp);
    }
    box.appendChild(lg);
  }
  return box;
}

const STEP_CURVES = [
  ['kl', 'KL'], ['entropy', 'Entropy'], ['clip_frac', 'Clip fraction'],
  ['staleness', 'Staleness'], ['mismatch', 'Rollout/trainer mismatch'],
];
function stepSeries(metrics, key) {
  return metrics.filter((e) => e.step !== undefined && e[key] !== undefined).map((e) => [e.step, e[key]]);
}
function tokensPerS(metrics) {
  const steps = metrics.filter((e) => e.step !== undefined && e.tokens !== undefined && e.time !== undefined);
  const out = [];
  for (let i = 1; i < steps.length; i++) {
    const dt = steps[i].time - steps[i - 1].time;
    if (dt > 0) out.push([steps[i].step, steps[i].tokens / dt]);
  }
  return out;
}
function evalSeries(metrics) {
  const ev = metrics.filter((e) => e.eval_step !== undefined && e.eval_acc !== undefined);
  return {points: ev.map((e) => [e.eval_step, e.eval_acc]),
          band: ev.filter((e) => e.eval_lo !== undefined).map((e) => [e.eval_step, e.eval_lo, e.eval_hi])};
}

// --- the job page ----------------------------------------------------------------------------
async function renderJob(id) {
  const d = await getJSON('/api/job?id=' + encodeURIComponent(id));
  const j = d.job || {}, m = d.metrics || [];
  const spec = j.spec || {};
  $('job-title').textContent = id + (spec.name ? ' \u2014 ' + spec.name : '');
  $('job-summary').textContent = `${j.status || ''} \u00B7 task ${spec.task || ''} \u00B7 step ${j.step ?? 0} / ${spec.max_steps ?? ''}` +
    (j.eval_acc !== undefined ? ' \u00B7 eval ' + evalText(j) : '') + (j.error ? ' \u00B7 error: ' + j.error : '');
  const cancellable = !me.admin && (j.status === 'queued' || j.status === 'running');
  $('cancel').hidden = !cancellable;
  $('cancel').dataset.job = id;
  const charts = $('job-charts');
  clear(charts);
  // the step's mean reward with the spread of its samples' rewards (mean +- one standard deviation)
  const rw = m.filter((e) => e.step !== undefined && e.reward !== undefined);
  charts.appendChild(chart('Reward (mean \u00B1 std)', 'reward', [{name: 'reward', points: rw.map((e) => [e.step, e.reward]),
    band: rw.filter((e) => e.reward_std !== undefined).map((e) => [e.step, e.reward - e.reward_std, e.reward + e.reward_std])}]));
  for (const [key, title] of STEP_CURVES) {
    if (key === 'mismatch' && !m.some((e) => e.mismatch !== undefined)) continue;
    charts.appendChild(chart(title, key, [{name: key, points: stepSeries(m, key)}]));
  }
  const ev = evalSeries(m);
  charts.appendChild(chart('Eval accuracy (95 % interval)', 'eval_acc', [{name: 'eval_acc', points: ev.points, band: ev.band}]));
  charts.appendChild(chart('Tokens / s', 'tokens_per_s', [{name: 'tokens_per_s', points: tokensPerS(m)}]));
  const ul = $('job-adapters');
  clear(ul);
  if (j.best_version !== undefined) {
    const li = el('li', {id: 'job-best'});
    li.appendChild(el('a', {href: '/api/adapter?id=' + encodeURIComponent(id) + '&best=1', download: ''},
                        'best evaluated: version ' + j.best_version));
    li.appendChild(document.createTextNode(` (eval accuracy ${pct(j.best_acc)} [${pct(j.best_lo)}, ${pct(j.best_hi)}]` +
                                           ` at step ${j.best_step})`));
    ul.appendChild(li);
  }
  for (const v of d.adapters || []) {
    const li = el('li');
    const a = el('a', {href: '/api/adapter?id=' + encodeURIComponent(id) + '&version=' + v, download: ''},
                 'version ' + v + (v === j.adapter_version ? ' (current)' : ''));
    li.appendChild(a);
    ul.appendChild(li);
  }
  const sm = $('job-samples');
  clear(sm);
  if (!(d.samples && d.samples.length)) {
    sm.appendChild(el('p', {class: 'muted'}, 'No sample completions are recorded for this job.'));
  } else {
    for (const s of d.samples) {
      const box = el('div', {class: 'sample'});
      box.appendChild(el('div', {}, `adapter version ${s.version ?? ''} \u00B7 reward ${fmt(s.reward)}` +
        ` (best of its group of ${s.group_size ?? '?'})`));
      if (s.prompt !== undefined) {
        box.appendChild(el('div', {class: 'muted'}, 'prompt'));
        box.appendChild(el('pre', {class: 'prompt'}, s.prompt));
      }
      box.appendChild(el('div', {class: 'muted'}, 'completion'));
      box.appendChild(el('pre', {class: 'completion'}, s.completion || ''));
      sm.appendChild(box);
    }
  }
  $('job-spec').textContent = JSON.stringify(spec, null, 2);
}

async function cancelJob() {
  const id = $('cancel').dataset.job;
  $('cancel-msg').textContent = '';
  try {
    const r = await post('/api/cancel', 'id=' + encodeURIComponent(id), {'X-CSRF-Token': me.csrf});
    $('cancel-msg').textContent = 'status: ' + r.status;
  } catch (e) {
    $('cancel-msg').textContent = 'cancel refused: ' + e.message;
  }
}

// --- compare ---------------------------------------------------------------------------------
async function renderCompare() {
  const {jobs} = await getJSON('/api/jobs');
  const pick = $('compare-pick');
  const have = new Set([...pick.querySelectorAll('input')].map((i) => i.value));
  const ids = jobs.map((j) => j.id).sort((a, b) => jobNum(a) - jobNum(b));
  if (ids.join() !== [...have].join()) {
    for (const l of [...pick.querySelectorAll('label')]) pick.removeChild(l);
    for (const j of jobs.slice().sort((a, b) => jobNum(a.id) - jobNum(b.id))) {
      const lab = el('label');
      const cb = el('input', {type: 'checkbox', value: j.id});
      cb.checked = compareSel.has(j.id);
      cb.addEventListener('change', () => {
        if (cb.checked) compareSel.add(j.id); else compareSel.delete(j.id);
        refresh();
      });
      lab.appendChild(cb);
      lab.appendChild(document.createTextNode(' ' + j.id + (j.name ? ' ' + j.name : '') + ' '));
      pick.appendChild(lab);
    }
  }
  const sel = ids.filter((id) => compareSel.has(id));
  const data = await Promise.all(sel.map((id) => getJSON('/api/metrics?id=' + encodeURIComponent(id))
    .then((d) => [id, d.metrics || []]).catch(() => [id, []])));
  const charts = $('compare-charts');
  clear(charts);
  charts.appendChild(chart('Reward (mean)', 'reward', data.map(([id, m]) => ({name: id, points: stepSeries(m, 'reward')}))));
  charts.appendChild(chart('Eval accuracy', 'eval_acc', data.map(([id, m]) => ({name: id, points: evalSeries(m).points}))));
  charts.appendChild(chart('KL', 'kl', data.map(([id, m]) => ({name: id, points: stepSeries(m, 'kl')}))));
  charts.appendChild(chart('Tokens / s', 'tokens_per_s', data.map(([id, m]) => ({name: id, points: tokensPerS(m)}))));
}

// --- cluster ---------------------------------------------------------------------------------
const CLUSTER_COLUMNS = [['key', 'Replica'], ['service', 'Service'], ['age_s', 'Heartbeat age s'],
  ['busy_fraction', 'Busy'], ['queue', 'Queue'], ['pending', 'Pending'], ['tokens', 'Tokens'],
  ['tokens_per_s', 'Tokens/s'], ['steps', 'Steps'], ['active_jobs', 'Active jobs'],
  ['received', 'Received'], ['rejected', 'Rejected'], ['up_s', 'Up s']];
// tokens/s of a rollout replica: its heartbeat's token counter over the last 10 s of polls
const tokenHist = new Map();
function tokenRate(s) {
  if (typeof s.tokens !== 'number' || typeof s.time !== 'number') return undefined;
  const h = tokenHist.get(s.key) || [];
  if (!h.length || h[h.length - 1][0] !== s.time) h.push([s.time, s.tokens]);
  while (h.length > 2 && h[h.length - 1][0] - h[0][0] > 10) h.shift();
  tokenHist.set(s.key, h);
  const [t0, k0] = h[0], [t1, k1] = h[h.length - 1];
  return t1 > t0 ? (k1 - k0) / (t1 - t0) : undefined;
}
async function renderCluster() {
  const {services} = await getJSON('/api/cluster');
  const tr = document.querySelector('#cluster-table thead tr');
  clear(tr);
  for (const [, label] of CLUSTER_COLUMNS) tr.appendChild(el('th', {scope: 'col'}, label));
  const tb = document.querySelector('#cluster-table tbody');
  clear(tb);
  services.sort((a, b) => String(a.key).localeCompare(String(b.key)));
  for (const s of services) {
    s.tokens_per_s = tokenRate(s);
    const row = el('tr', {'data-service': s.service ?? ''});
    for (const [key] of CLUSTER_COLUMNS) {
      let v = s[key];
      if (key === 'busy_fraction') v = pct(v);
      else if (typeof v === 'number' && !Number.isInteger(v)) v = v.toFixed(1);
      row.appendChild(el('td', {class: key === 'key' || key === 'service' ? 'text' : '', 'data-key': key}, v ?? ''));
    }
    tb.appendChild(row);
  }
}

// --- routing and polling -----------------------------------------------------------------------
let busy = false;
async function refresh() {
  if (!me || busy) return;
  busy = true;
  const h = location.hash || '#/jobs';
  try {
    let m;
    if ((m = /^#\/job\/(.+)$/.exec(h))) { show('job'); await renderJob(decodeURIComponent(m[1])); }
    else if (h === '#/compare') { show('compare'); await renderCompare(); }
    else if (h === '#/cluster' && me.admin) { show('cluster'); await renderCluster(); }
    else { show('jobs'); const d = await getJSON('/api/jobs'); renderJobs(d.jobs || []); }
  } catch (e) {
    if (e.status !== 401) {
      const v = VIEWS.find((x) => !$('view-' + x).hidden);
      if (v === 'job') {
        // nothing of an earlier job stays on the page
        for (const id of ['job-charts', 'job-adapters', 'job-samples']) clear($(id));
        $('job-title').textContent = '';
        $('job-spec').textContent = '';
        $('cancel').hidden = true;
        $('job-summary').textContent = 'error: ' + e.message;
      }
    }
  } finally {
    busy = false;
  }
}
function start() {
  $('who').textContent = me.admin ? 'admin (read-only)' : 'tenant ' + me.tenant;
  $('nav-cluster').hidden = !me.admin;
  renderJobsHead();
  refresh();
  if (!timer) timer = setInterval(refresh, POLL_MS);
}

document.addEventListener('DOMContentLoaded', async () => {
  $('login-form').addEventListener('submit', login);
  $('logout').addEventListener('click', logout);
  $('cancel').addEventListener('click', cancelJob);
  window.addEventListener('hashchange', refresh);
  try { me = await getJSON('/api/me'); start(); } catch (e) { showLogin(); }
});
