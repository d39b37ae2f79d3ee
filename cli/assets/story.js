// pqmq serve's pages about messages, beside the dashboard (app.js):
//   #message/ID      one message's story (GET /api/message): state, channel
//                    and chain, attempts and their errors, and on an --admin
//                    server the start of its payload
//   #channel/NAME    a channel's dead messages and those waiting in their
//                    chains (GET /api/messages), filtered by message name,
//                    with Retry / Skip of the ones ticked or of the whole
//                    channel (POST /api/retry, /api/skip), each after an
//                    in-page confirmation
// Every value from the queue goes into the page as text, never as markup.
'use strict';

(function () {
  const served = document.querySelector('meta[name="pqmq-token"]').content;
  const TOKEN_KEY = 'pqmq-admin-token'; // as app.js keeps it
  function token() {
    if (served) return served;
    let t = sessionStorage.getItem(TOKEN_KEY);
    if (!t) {
      t = window.prompt('Admin token (the first line of the --admin-token-file):') || '';
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
    }
    return t;
  }

  const dash = document.querySelector('main');
  const view = document.createElement('main');
  view.id = 'story';
  view.hidden = true;
  dash.after(view);

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function link(href, text, cls) {
    const a = el('a', text, cls);
    a.href = href;
    return a;
  }

  const messageHref = (id) => '#message/' + id;
  const channelHref = (name) => '#channel/' + encodeURIComponent(name);

  function when(ts) {
    return ts ? new Date(ts).toLocaleString('en-GB') : '–';
  }

  function panel(title) {
    const p = el('section', null, 'panel');
    p.appendChild(el('h2', title));
    view.appendChild(p);
    return p;
  }

  function notice(text) {
    const n = document.getElementById('notice');
    n.textContent = text || '';
    n.hidden = !text;
  }

  async function getJSON(url) {
    const r = await fetch(url, { cache: 'no-store' });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error || 'HTTP ' + r.status);
    return j;
  }

  async function isAdmin() {
    try {
      return (await getJSON('/api/state')).admin === true;
    } catch (e) {
      return false;
    }
  }

  async function post(action, fields) {
    const r = await fetch('/api/' + action, {
      method: 'POST',
      headers: { 'X-Pqmq-Token': token() },
      body: new URLSearchParams(fields),
    });
    const j = await r.json();
    if (r.status === 403 && !served) sessionStorage.removeItem(TOKEN_KEY); // ask again
    return { status: r.status, body: j };
  }

  // An in-page confirmation (a dialog the page draws, so nothing blocks the
  // tab): resolves true for the confirm button, false for Cancel.
  function confirmInPage(text, yes) {
    return new Promise((resolve) => {
      const box = el('div', null, 'confirm');
      box.id = 'confirm';
      box.setAttribute('role', 'dialog');
      box.appendChild(el('p', text));
      const ok = el('button', yes, 'skip');
      ok.id = 'confirm-yes';
      const no = el('button', 'Cancel');
      no.id = 'confirm-no';
      const done = (v) => {
        box.remove();
        resolve(v);
      };
      ok.addEventListener('click', () => done(true));
      no.addEventListener('click', () => done(false));
      box.appendChild(ok);
      box.appendChild(no);
      view.prepend(box);
      no.focus();
    });
  }

  // --- a message's story -----------------------------------------------------

  async function showMessage(id) {
    view.textContent = '';
    view.appendChild(link('#', '← dashboard', 'back'));
    let m;
    try {
      m = await getJSON('/api/message?id=' + encodeURIComponent(id));
    } catch (e) {
      panel('Message ' + id).appendChild(el('p', e.message, 'empty'));
      document.body.dataset.story = 'missing ' + id;
      return;
    }
    const p = panel('Message ');
    p.firstChild.appendChild(el('span', m.id, 'mono'));
    const state = el('span', m.state.replace('_', ' '), 'badge state-' + m.state);
    state.id = 'story-state';
    p.firstChild.appendChild(document.createTextNode(' '));
    p.firstChild.appendChild(state);
    const dl = el('dl', null, 'story');
    const row = (label, value) => {
      dl.appendChild(el('dt', label));
      const dd = el('dd');
      if (value instanceof Node) dd.appendChild(value);
      else dd.textContent = value === null || value === undefined || value === '' ? '–' : value;
      dl.appendChild(dd);
      return dd;
    };
    row('Channel', link(channelHref(m.channel), m.channel === '' ? '(empty name)' : m.channel));
    row('Args', m.args === '' ? '""' : m.args).className = 'mono';
    row('Name', m.name);
    if (m.ordered) {
      const dd = el('span');
      if (m.chain_ahead === 0) dd.textContent = 'ordered: the head of its chain';
      else {
        dd.textContent = 'ordered: ' + m.chain_ahead + ' ahead of it, the head is ';
        dd.appendChild(link(messageHref(m.chain_head), m.chain_head, 'mono'));
      }
      row('Chain', dd).id = 'story-chain';
    } else {
      row('Chain', 'unordered').id = 'story-chain';
    }
    row('Priority', m.priority);
    row('Created', when(m.created_at));
    row(m.state === 'in_flight' ? 'Lease ends' : 'Ready at', when(m.ready_at));
    if (m.dead_since) row('Dead since', when(m.dead_since));
    row('Attempts', m.attempts_used + ' used, ' + m.attempts_left + ' left');
    row('Last error', m.last_error).classList.add('err');
    p.appendChild(dl);

    const h = panel('Failed attempts (the last five)');
    if (!m.history.length) h.appendChild(el('p', 'No attempt has failed.', 'empty'));
    else {
      const t = el('table');
      t.id = 'story-history';
      const head = el('tr');
      for (const c of ['Attempt', 'At', 'Error']) head.appendChild(el('th', c));
      t.appendChild(el('thead')).appendChild(head);
      const body = t.appendChild(el('tbody'));
      for (const a of m.history) {
        const tr = el('tr');
        tr.appendChild(el('td', a.attempt, 'n'));
        tr.appendChild(el('td', when(a.at)));
        tr.appendChild(el('td', a.error, 'err'));
        body.appendChild(tr);
      }
      h.appendChild(t);
    }

    const pl = panel('Payload');
    if (!('payload' in m)) {
      pl.appendChild(el('p', 'The payload is shown on a server started with --admin only.',
        'empty'));
    } else if (m.payload.json_bytes === null && m.payload.binary_bytes === null) {
      pl.appendChild(el('p', 'No payload.', 'empty'));
    } else {
      if (m.payload.json_bytes !== null) {
        pl.appendChild(el('p', 'JSON, ' + m.payload.json_bytes + ' bytes' +
          (m.payload.json_bytes > 4096 ? ' (the start)' : '') + ':', 'muted'));
        const pre = el('pre', m.payload.json_preview, 'payload');
        pre.id = 'story-payload';
        pl.appendChild(pre);
      }
      if (m.payload.binary_bytes !== null) {
        pl.appendChild(el('p', 'Bytes, ' + m.payload.binary_bytes + ' (as hex' +
          (m.payload.binary_bytes > 4096 ? ', the start' : '') + '):', 'muted'));
        pl.appendChild(el('pre', m.payload.binary_preview_hex, 'payload'));
      }
    }
    document.body.dataset.story = m.id;
  }

  // --- a channel's dead and waiting messages ---------------------------------

  async function showChannel(name) {
    view.textContent = '';
    view.appendChild(link('#', '← dashboard', 'back'));
    const admin = await isAdmin();
    const top = panel('Channel ');
    top.firstChild.appendChild(el('span', name === '' ? '(empty name)' : name));
    const label = el('label', 'Message name ');
    const filter = el('input');
    filter.id = 'name-filter';
    filter.type = 'search';
    filter.placeholder = 'all names';
    label.appendChild(filter);
    top.appendChild(label);
    const apply = el('button', 'Filter');
    apply.id = 'name-apply';
    top.appendChild(apply);
    const lists = { dead: panel('Dead'), waiting: panel('Waiting in their chains') };
    lists.dead.id = 'list-dead';
    lists.waiting.id = 'list-waiting';

    async function load(kind) {
      const box = lists[kind];
      while (box.childNodes.length > 1) box.removeChild(box.lastChild);
      const q = new URLSearchParams({ channel: name, kind: kind });
      if (filter.value) q.set('name', filter.value);
      let list;
      try {
        list = await getJSON('/api/messages?' + q.toString());
      } catch (e) {
        box.appendChild(el('p', e.message, 'empty'));
        return;
      }
      box.firstChild.textContent = (kind === 'dead' ? 'Dead' : 'Waiting in their chains') +
        ' (' + list.count + ')';
      const t = el('table');
      const head = el('tr');
      const all = el('input');
      all.type = 'checkbox';
      all.className = 'all';
      all.title = 'tick every row';
      const th = el('th');
      th.appendChild(all);
      head.appendChild(th);
      const cols = kind === 'dead'
        ? ['Id', 'Name', 'Args', 'Deliveries', 'Last error']
        : ['Id', 'Name', 'Args', 'Ahead', 'Head'];
      for (const c of cols) head.appendChild(el('th', c));
      t.appendChild(el('thead')).appendChild(head);
      const body = t.appendChild(el('tbody'));
      for (const m of list.messages) {
        const tr = el('tr', null, (kind === 'dead' ? m.blocking : m.head_dead) ? 'blocking' : '');
        tr.dataset.id = m.id;
        const tick = el('input');
        tick.type = 'checkbox';
        tick.className = 'pick';
        tick.value = m.id;
        tr.appendChild(el('td')).appendChild(tick);
        tr.appendChild(el('td', null, 'mono')).appendChild(link(messageHref(m.id), m.id));
        tr.appendChild(el('td', m.name));
        tr.appendChild(el('td', m.args, 'mono'));
        if (kind === 'dead') {
          tr.appendChild(el('td', m.deliveries, 'n'));
          tr.appendChild(el('td', m.error === null ? '' : m.error, 'err'));
        } else {
          tr.appendChild(el('td', m.chain_ahead, 'n'));
          const hd = tr.appendChild(el('td', null, 'mono'));
          hd.appendChild(link(messageHref(m.chain_head), m.chain_head));
          if (m.head_dead) hd.appendChild(el('span', ' (dead)', 'hot'));
        }
        body.appendChild(tr);
      }
      all.addEventListener('change', () => {
        for (const b of body.querySelectorAll('input.pick')) b.checked = all.checked;
      });
      if (!list.messages.length) box.appendChild(el('p', 'None.', 'empty'));
      else box.appendChild(t);
      if (!admin || !list.messages.length) return;
      const bar = el('div', null, 'bulk');
      const picked = () => [...body.querySelectorAll('input.pick:checked')].map((b) => b.value);
      const who = filter.value ? ' named "' + filter.value + '"' : '';
      const button = (text, action, cls, ask, fields) => {
        const b = el('button', text, cls);
        b.dataset.bulk = kind + ' ' + action + ' ' + (fields ? 'all' : 'selected');
        b.addEventListener('click', async () => {
          const ids = fields ? null : picked();
          if (ids && !ids.length) {
            notice('Tick the messages first.');
            return;
          }
          const what = ids ? ids.length + ' ticked message' + (ids.length === 1 ? '' : 's')
            : ask;
          if (!(await confirmInPage(text + ': ' + what + '?', text))) return;
          const form = fields || ids.map((id) => ['id', id]);
          let text2;
          try {
            const r = await post(action, form);
            text2 = r.status === 200
              ? text + ': ' + r.body.done + ' done'
              : text + ' refused: ' + r.body.error;
            document.body.dataset.lastBulk = r.status + ' ' + action + ' ' + (r.body.done ?? '');
          } catch (e) {
            text2 = text + ' failed: ' + e.message;
          }
          notice(text2);
          load('dead');
          load('waiting');
        });
        bar.appendChild(b);
      };
      const whole = (all) => {
        const f = [['channel', name], ['all', all]];
        if (filter.value) f.push(['name', filter.value]);
        return f;
      };
      if (kind === 'dead') {
        button('Retry ticked', 'retry', 'retry', '', null);
        button('Skip ticked', 'skip', 'skip', '', null);
        button('Retry all dead', 'retry', 'retry',
          'every dead message' + who + ' of this channel', whole('dead'));
        button('Skip all blocking', 'skip', 'skip',
          'every dead chain head' + who + ' of this channel (its chain moves on)', whole('dead'));
      } else {
        button('Skip ticked', 'skip', 'skip', '', null);
        button('Skip all waiting', 'skip', 'skip',
          'every waiting message' + who + ' of this channel (moved to the dead letters)',
          whole('waiting'));
      }
      box.appendChild(bar);
    }

    const reload = () => Promise.all([load('dead'), load('waiting')]).then(() => {
      document.body.dataset.channel = name;
    });
    apply.addEventListener('click', reload);
    filter.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') reload();
    });
    await reload();
  }

  async function route() {
    const h = location.hash;
    delete document.body.dataset.story;
    delete document.body.dataset.channel;
    if (h.startsWith('#message/')) {
      dash.hidden = true;
      view.hidden = false;
      notice('');
      await showMessage(decodeURIComponent(h.slice(9)));
    } else if (h.startsWith('#channel/')) {
      dash.hidden = true;
      view.hidden = false;
      notice('');
      await showChannel(decodeURIComponent(h.slice(9)));
    } else {
      view.hidden = true;
      view.textContent = '';
      dash.hidden = false;
    }
  }

  window.addEventListener('hashchange', route);
  route();
})();
