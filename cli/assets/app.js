// pqmq serve's dashboard: polls /api/state and draws it. Every value from
// the queue (channel names, args, errors) goes into the page as text, never
// as markup. Retry, skip, pause and resume are POSTs carrying the page's token; a server
// started with --admin-token-file serves no token, and the page asks for it
// (kept for this tab only, in sessionStorage).
'use strict';

(function () {
  const served = document.querySelector('meta[name="pqmq-token"]').content;
  const TOKEN_KEY = 'pqmq-admin-token';
  function token() {
    if (served) return served;
    let t = sessionStorage.getItem(TOKEN_KEY);
    if (!t) {
      t = window.prompt('Admin token (the first line of the --admin-token-file):') || '';
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
    }
    return t;
  }
  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';
  let interval = 5;
  let timer = null;
  const RATE_WINDOW = 60; // seconds the rates of the cards and the table cover
  let seen = []; // readings seen by this page: { at, removed: Map channel -> removed }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmtInt(n) {
    return Number(n).toLocaleString('en-US');
  }

  // As pqmq status prints ages.
  function fmtAge(s) {
    if (!(s > 0)) return '–';
    if (s < 120) return s.toFixed(1) + ' s';
    if (s < 7200) return Math.round(s / 60) + ' min';
    if (s < 172800) return (s / 3600).toFixed(1) + ' h';
    return (s / 86400).toFixed(1) + ' d';
  }

  function fmtRate(r) {
    if (r === undefined || r === null) return '–';
    return r >= 100 ? Math.round(r).toLocaleString('en-US') : r.toFixed(1);
  }

  function show(id, text) {
    const e = $(id);
    e.textContent = text || '';
    e.hidden = !text;
  }

  // What a counter gained from a to b. It only grows; a lower reading is a
  // reset (the queue's counters truncated), counted from zero as Prometheus
  // does, never dropped.
  function gain(a, b) {
    return b >= a ? b - a : b;
  }

  // Completions per second between consecutive samples of the history.
  function rates(history) {
    const out = [];
    for (let i = 1; i < history.length; i++) {
      const dt = history[i][0] - history[i - 1][0];
      if (dt > 0) out.push([history[i][0], gain(history[i - 1][1], history[i][1]) / dt]);
    }
    return out;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function drawChart(st) {
    const chart = $('chart');
    while (chart.firstChild) chart.removeChild(chart.firstChild);
    const W = 900, H = 220, L = 48, R = 10, T = 10, B = 24;
    // The last history_seconds, or less while the history is shorter.
    const first = st.history.length ? st.history[0][0] : st.now;
    const span = Math.min(st.history_seconds, Math.max(120, st.now - first));
    const end = st.now, start = end - span;
    $('chart-span').textContent = '(last ' + Math.round(span / 60) + ' minutes)';
    const pts = rates(st.history).filter((p) => p[0] >= start);
    const max = niceMax(Math.max(0, ...pts.map((p) => p[1])));
    const x = (t) => L + ((t - start) / span) * (W - L - R);
    const y = (v) => T + (1 - v / max) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4;
      chart.appendChild(svg('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), class: 'grid' }));
      chart.appendChild(svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' },
        v >= 10 ? fmtInt(Math.round(v)) : String(Number(v.toFixed(2)))));
    }
    const minutes = Math.floor(span / 60), step = minutes > 6 ? 5 : 1;
    for (let m = 0; m <= minutes; m += step) {
      const t = end - m * 60;
      chart.appendChild(svg('text', { x: x(t), y: H - 6, 'text-anchor': m === 0 ? 'end' : 'middle',
        class: 'axis' }, m === 0 ? 'now' : '−' + m + ' min'));
    }
    if (pts.length < 2) {
      chart.appendChild(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'axis' },
        'collecting samples…'));
      return;
    }
    const line = pts.map((p, i) => (i ? 'L' : 'M') + x(p[0]).toFixed(1) + ' ' + y(p[1]).toFixed(1));
    const area = line.join(' ') + ' L' + x(pts[pts.length - 1][0]).toFixed(1) + ' ' + y(0) +
      ' L' + x(pts[0][0]).toFixed(1) + ' ' + y(0) + ' Z';
    chart.appendChild(svg('path', { d: area, class: 'area' }));
    chart.appendChild(svg('path', { d: line.join(' '), class: 'line' }));
  }

  // Keeps the readings of the last RATE_WINDOW seconds (and the one
  // before them), for each channel's completions per second.
  function remember(st) {
    if (!st.status || st.sampled_at === null) return;
    if (seen.length && st.sampled_at <= seen[seen.length - 1].at) return;
    seen.push({ at: st.sampled_at, removed: new Map(st.status.channels.map((c) => [c.channel, c.removed])) });
    while (seen.length > 2 && seen[1].at <= st.sampled_at - RATE_WINDOW) seen.shift();
  }

  function channelRate(name) {
    if (seen.length < 2) return null;
    const a = seen[0], b = seen[seen.length - 1];
    const before = a.removed.get(name), after = b.removed.get(name);
    if (after === undefined) return null;
    return gain(before === undefined ? 0 : before, after) / (b.at - a.at);
  }

  // Completions per second over the last RATE_WINDOW seconds of the history.
  function recentRate(history) {
    if (history.length < 2) return null;
    const end = history[history.length - 1];
    let i = history.length - 2;
    while (i > 0 && history[i][0] > end[0] - RATE_WINDOW) i--;
    let d = 0;
    for (let k = i + 1; k < history.length; k++) d += gain(history[k - 1][1], history[k][1]);
    const dt = end[0] - history[i][0];
    return dt > 0 ? d / dt : null;
  }

  function renderCards(st) {
    const t = st.status ? st.status.total : null;
    for (const k of ['ready', 'in_flight', 'scheduled', 'waiting', 'dead', 'blocked_chains']) {
      const e = $('total-' + k);
      e.textContent = t ? fmtInt(t[k]) : '–';
      e.parentElement.classList.toggle('nonzero', !!(t && t[k] > 0));
    }
    $('total-oldest').textContent = t ? fmtAge(t.oldest_ready_age_seconds) : '–';
    $('total-rate').textContent = fmtRate(recentRate(st.history));
  }

  function renderChannels(st) {
    const body = $('channels').tBodies[0];
    body.textContent = '';
    const chans = st.status ? st.status.channels : [];
    for (const c of chans) {
      const tr = el('tr', null, c.paused ? 'paused' : '');
      tr.dataset.channel = c.channel;
      // Its dead and waiting messages: story.js's #channel/ page.
      const name = tr.appendChild(el('td'));
      name.appendChild(el('a', c.channel === '' ? '(empty name)' : c.channel)).href =
        '#channel/' + encodeURIComponent(c.channel);
      if (c.paused) name.appendChild(el('span', 'paused', 'badge paused'));
      for (const k of ['ready', 'in_flight', 'scheduled', 'uncommitted', 'waiting', 'dead', 'blocked_chains']) {
        const td = el('td', fmtInt(c[k]), 'n' + ((k === 'dead' || k === 'blocked_chains') && c[k] > 0 ? ' hot' : ''));
        td.dataset.col = k;
        tr.appendChild(td);
      }
      const age = el('td', fmtAge(c.oldest_ready_age_seconds), 'n');
      age.dataset.col = 'oldest_ready';
      tr.appendChild(age);
      const rate = el('td', fmtRate(channelRate(c.channel)), 'n');
      rate.dataset.col = 'rate';
      tr.appendChild(rate);
      const acts = el('td', null, 'actions');
      if (st.admin) acts.appendChild(pauseButton(c));
      tr.appendChild(acts);
      body.appendChild(tr);
    }
    $('channels-empty').hidden = chans.length > 0 || !st.status;
  }

  // The runners (pqmq_runner registers and heartbeats; gone: no heartbeat
  // lately).
  function renderWorkers(st) {
    const body = $('workers').tBodies[0];
    body.textContent = '';
    const ws = st.workers || [];
    let live = 0;
    for (const w of ws) {
      const tr = el('tr', null, w.state === 'live' ? '' : 'gone');
      tr.dataset.worker = String(w.id);
      live += w.state === 'live' ? 1 : 0;
      tr.appendChild(el('td', w.host));
      tr.appendChild(el('td', w.pid, 'n'));
      tr.appendChild(el('td', w.state, w.state === 'live' ? '' : 'hot'));
      tr.appendChild(el('td', new Date(w.started_at * 1000).toLocaleString('en-GB')));
      tr.appendChild(el('td', fmtAge(w.seen_ago_seconds) + ' ago', 'n'));
      tr.appendChild(el('td', fmtInt(w.jobs_done), 'n'));
      tr.appendChild(el('td', fmtInt(w.jobs_failed), 'n'));
      tr.appendChild(el('td', fmtInt(w.in_flight), 'n'));
      tr.appendChild(el('td', w.threads, 'n'));
      tr.appendChild(el('td', w.version));
      tr.appendChild(el('td', w.channels === null ? '(all)' : w.channels.join(', ')));
      body.appendChild(tr);
    }
    $('workers-count').textContent = st.workers ? '(' + live + ' live of ' + ws.length + ')' : '';
    $('workers-empty').hidden = ws.length > 0 || !st.workers;
  }

  // Pause (no poll delivers the channel's messages) or resume a channel.
  function pauseButton(c) {
    const action = c.paused ? 'resume' : 'pause';
    const b = el('button', c.paused ? 'Resume' : 'Pause', action);
    b.dataset.action = action;
    b.dataset.channel = c.channel;
    b.title = c.paused ? 'deliver its messages again'
      : 'stop delivering its messages (in flight ones can still complete)';
    b.addEventListener('click', () => post(action, { channel: c.channel }, c.channel, b));
    return b;
  }

  function actionButton(st, action, d) {
    const b = el('button', action === 'retry' ? 'Retry' : 'Skip', action);
    b.dataset.action = action;
    b.dataset.id = d.id;
    b.title = action === 'retry'
      ? 'deliver it again (one more attempt)'
      : 'move it out of its chain; the next message of the chain is released';
    b.addEventListener('click', () => act(action, d.id, b));
    return b;
  }

  function deadRow(st, d, blockedTable) {
    const tr = el('tr', null, d.blocking ? 'blocking' : '');
    tr.dataset.id = d.id;
    const cells = blockedTable
      ? [[d.channel], [d.args, 'mono'], [d.id, 'mono'], [d.name], [d.error, 'err']]
      : [[d.id, 'mono'], [d.channel], [d.args, 'mono'], [d.name], [fmtInt(d.deliveries), 'n'],
        [d.error, 'err']];
    for (const [v, cls] of cells) {
      const td = tr.appendChild(el('td', v === d.id ? null : v === null ? '' : v, cls));
      // The id opens the message's story (story.js's #message/ page).
      if (v === d.id) td.appendChild(el('a', d.id)).href = '#message/' + d.id;
    }
    const act = el('td', null, 'actions');
    if (st.admin) {
      act.appendChild(actionButton(st, 'retry', d));
      if (d.blocking) act.appendChild(actionButton(st, 'skip', d));
    }
    tr.appendChild(act);
    return tr;
  }

  let deadShown = null;

  // Redrawn only when the list changed, so a button does not move away
  // under the pointer at each poll.
  function renderDead(st) {
    const key = JSON.stringify([st.admin, st.dead, st.status && st.status.total.dead]);
    if (key === deadShown) return;
    deadShown = key;
    const dead = $('dead').tBodies[0], blocked = $('blocked').tBodies[0];
    dead.textContent = '';
    blocked.textContent = '';
    for (const d of st.dead) {
      dead.appendChild(deadRow(st, d, false));
      if (d.blocking) blocked.appendChild(deadRow(st, d, true));
    }
    const total = st.status ? st.status.total.dead : st.dead.length;
    $('dead-count').textContent = total > st.dead.length
      ? '(the oldest ' + st.dead.length + ' of ' + fmtInt(total) + ')' : '';
    $('dead-empty').hidden = st.dead.length > 0;
    $('blocked-empty').hidden = blocked.rows.length > 0;
  }

  function render(st) {
    interval = st.interval;
    $('schema').textContent = 'schema ' + st.schema;
    const mode = $('mode');
    mode.textContent = st.admin ? 'admin' : 'read-only';
    mode.classList.toggle('admin', st.admin);
    $('updated').textContent = st.sampled_at === null ? 'no reading yet'
      : 'read ' + new Date(st.sampled_at * 1000).toLocaleTimeString('en-GB');
    show('error', st.error ? 'Cannot read the queue: ' + st.error +
      (st.sampled_at === null ? '' : ' (showing the last good reading)') : '');
    remember(st);
    renderCards(st);
    drawChart(st);
    renderChannels(st);
    renderWorkers(st);
    renderDead(st);
    $('footer').textContent = 'pqmq ' + st.version + ' · the queue is read every ' + st.interval +
      ' s · metrics for Prometheus at /metrics';
    document.body.dataset.sampledAt = st.sampled_at === null ? '' : String(st.sampled_at);
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const r = await fetch('/api/state', { cache: 'no-store' });
      if (!r.ok) throw new Error('HTTP ' + r.status);
      render(await r.json());
    } catch (e) {
      show('error', 'Cannot reach pqmq serve: ' + e.message);
    }
    timer = setTimeout(refresh, interval * 1000);
  }

  const VERBS = { retry: ['Retry', 'Retried '], skip: ['Skip', 'Skipped '],
    pause: ['Pause', 'Paused '], resume: ['Resume', 'Resumed '] };

  function act(action, id, button) {
    return post(action, { id: id }, id, button);
  }

  // POSTs an action's form (fields) about what (a message id or a channel).
  async function post(action, fields, what, button) {
    button.disabled = true;
    let text;
    try {
      const r = await fetch('/api/' + action, {
        method: 'POST',
        headers: { 'X-Pqmq-Token': token() },
        body: new URLSearchParams(fields),
      });
      const j = await r.json();
      if (r.status === 403 && !served) sessionStorage.removeItem(TOKEN_KEY); // ask again
      if (!r.ok) text = VERBS[action][0] + ' refused: ' + j.error;
      else if (j.done === 0) text = what + ': nothing to ' + action + (action === 'pause'
        ? ' (already paused?)' : action === 'resume' ? ' (not paused?)' : ' (already moved on?)');
      else text = VERBS[action][1] + what;
      document.body.dataset.lastAction = r.status + ' ' + action + ' ' + what;
    } catch (e) {
      text = action + ' failed: ' + e.message;
    }
    show('notice', text);
    button.disabled = false;
    refresh();
  }

  refresh();
})();
