// Herald's dashboard: a single-page app with hash routes, in plain
// JavaScript so that building Herald needs no Node. Its data comes from the
// session-authenticated /ui/api routes (the /v1 handlers mounted a second
// time), so no API key is ever in the browser. Every state-changing call
// carries the session's CSRF token in the X-CSRF-Token header.
'use strict';

(() => {
  const ui = {
    csrf: '',
    // generation increases on every route change; a poll loop whose
    // generation is stale stops, so only the visible page polls.
    generation: 0,
  };

  // ---- DOM helpers: text is always set as text, never parsed as HTML, so
  // that ids, reasons and error messages cannot inject markup.

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      // Through the CSSOM, which the page's Content-Security-Policy allows,
      // unlike style attributes.
      else if (k === 'style') el.style.cssText = v;
      else el.setAttribute(k, v === true ? '' : v);
    }
    for (const kid of kids.flat()) {
      if (kid === undefined || kid === null || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    for (const kid of kids) el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    return el;
  }

  function replace(id, ...kids) {
    const el = document.getElementById(id);
    if (el) el.replaceChildren(...kids.flat());
  }

  function flash(message, ok) {
    const el = document.getElementById('flash');
    el.textContent = message;
    el.className = ok ? 'flash ok' : 'flash';
    el.hidden = !message;
  }

  const pad = (n) => String(n).padStart(2, '0');

  // fmtTime shows an RFC 3339 instant in the browser's zone, to the second.
  function fmtTime(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function fmtRel(iso) {
    if (!iso) return '';
    const s = Math.round((new Date(iso) - Date.now()) / 1000);
    const a = Math.abs(s);
    const span = a < 60 ? `${a} s` : a < 3600 ? `${Math.round(a / 60)} min` : a < 86400 ? `${Math.round(a / 3600)} h` : `${Math.round(a / 86400)} d`;
    return s >= 0 ? `in ${span}` : `${span} ago`;
  }

  const fmtMs = (ms) => (ms === null || ms === undefined ? '—' : ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`);
  const fmtNum = (n) => Number(n || 0).toLocaleString('en');

  function randomKey() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }

  // ---- The API.

  async function api(method, path, body, headers) {
    const opts = { method, credentials: 'same-origin', headers: { Accept: 'application/json', ...headers } };
    if (method !== 'GET') opts.headers['X-CSRF-Token'] = ui.csrf;
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const res = await fetch('/ui/api' + path, opts);
    if (res.status === 401) {
      location.href = '/login?next=' + encodeURIComponent('/' + location.hash);
      throw new Error('the session has ended; sign in again');
    }
    const data = res.status === 204 ? null : await res.json().catch(() => null);
    if (!res.ok) {
      const err = new Error((data && data.error && data.error.message) || `${res.status} ${res.statusText}`);
      err.status = res.status;
      err.data = data;
      throw err;
    }
    return data;
  }

  // poll calls fn now and then every ms milliseconds until the route changes
  // or fn returns false. One call finishes before the next is scheduled, so a
  // slow answer never piles requests up.
  function poll(ms, fn) {
    const gen = ui.generation;
    const tick = async () => {
      if (gen !== ui.generation) return;
      let again = true;
      try {
        again = (await fn()) !== false;
      } catch (e) {
        flash(e.message);
      }
      if (again && gen === ui.generation) setTimeout(tick, ms);
    };
    tick();
  }

  // ---- Shared pieces.

  const badge = (state) => h('span', { class: `badge ${state}` }, state.replace('_', ' '));
  // content shows what a message says: its title and body, or what kind of
  // push it is when it has neither.
  const content = (p) => {
    p = p || {};
    if (p.silent) return h('span', { class: 'muted' }, 'silent push');
    if (!p.title && !p.body) return h('span', { class: 'muted' }, 'data only');
    return [p.title ? h('b', { class: 'title' }, p.title) : null, p.body ? h('div', { class: 'muted body' }, p.body) : null].filter(Boolean);
  };

  const settledKinds = ['accepted', 'failed', 'expired', 'cancelled'];

  function progress(d) {
    const total = d.total || 0;
    return h('div', { class: 'progress', title: `${total - d.pending} of ${total} settled` },
      settledKinds.map((k) => (total && d[k] ? h('span', { class: k, style: `width:${(100 * d[k]) / total}%` }) : null)));
  }

  // ---- Messages.

  const messageStates = ['', 'scheduled', 'dispatching', 'dispatched', 'cancelled', 'expired'];

  function messagesPage(params) {
    const state = params.get('state') || '';
    const scheduleID = params.get('schedule_id') || '';
    // cursors holds the cursor of every page shown before this one, so that
    // "Newer" can go back; paging is keyset, newest first.
    const cursors = [];
    let cursor = '';
    const filter = h('select', { id: 'state-filter', onchange: (e) => {
      const q = new URLSearchParams();
      if (e.target.value) q.set('state', e.target.value);
      if (scheduleID) q.set('schedule_id', scheduleID);
      location.hash = '#/messages' + (q.toString() ? '?' + q : '');
    } }, messageStates.map((s) => h('option', { value: s, selected: s === state }, s || 'all states')));
    replace('view',
      h('div', { class: 'toolbar' },
        h('h1', { class: 'grow' }, 'Messages', scheduleID ? h('span', { class: 'muted' }, ` of schedule ${scheduleID}`) : null),
        h('label', { class: 'inline' }, 'State ', filter)),
      h('div', { class: 'panel slo', id: 'slo' }),
      h('div', { class: 'panel' },
        h('table', { id: 'messages' },
          h('thead', {}, h('tr', {},
            h('th', {}, 'Message'), h('th', {}, 'Content'), h('th', {}, 'State'), h('th', {}, 'Dispatch at'), h('th', {}, 'Priority'),
            ['Devices', 'Accepted', 'Failed', 'Expired', 'Cancelled', 'Pending'].map((c) => h('th', { class: 'num' }, c)),
            h('th', {}, 'Progress'), h('th', { class: 'num', title: 'The latest any device was answered after its time; within the SLO at 1 s or less' }, 'Max skew'))),
          h('tbody', { id: 'messages-body' })),
        h('div', { class: 'toolbar', style: 'margin-top:12px' },
          h('span', { class: 'grow muted' }, 'Refreshes every 2 s.'),
          h('button', { class: 'secondary', id: 'newer', disabled: true, onclick: () => { cursor = cursors.pop() || ''; load(); } }, '‹ Newer'),
          h('button', { class: 'secondary', id: 'older', disabled: true, onclick: () => { cursors.push(cursor); cursor = next; load(); } }, 'Older ›'))));
    let next = '';
    const load = async () => {
      const q = new URLSearchParams({ limit: '25' });
      if (state) q.set('state', state);
      if (scheduleID) q.set('schedule_id', scheduleID);
      if (cursor) q.set('cursor', cursor);
      const [page, slo] = await Promise.all([api('GET', '/messages?' + q), api('GET', '/slo')]);
      replace('slo', sloShare(slo));
      next = page.next_cursor || '';
      document.getElementById('older').disabled = !next;
      document.getElementById('newer').disabled = cursors.length === 0 && !cursor;
      replace('messages-body', page.items.length ? page.items.map((m) => {
        const d = m.deliveries;
        return h('tr', { 'data-message-id': m.message_id, 'data-state': m.state },
          h('td', {}, h('a', { href: `#/messages/${m.message_id}`, class: 'mono' }, m.message_id)),
          h('td', { class: 'content' }, content(m.payload)),
          h('td', {}, badge(m.state)),
          h('td', { title: m.dispatch_at }, fmtTime(m.dispatch_at), h('div', { class: 'muted' }, fmtRel(m.dispatch_at))),
          h('td', {}, m.priority),
          ['total', 'accepted', 'failed', 'expired', 'cancelled', 'pending'].map((k) => h('td', { class: `num ${k}` }, fmtNum(d[k]))),
          h('td', {}, progress(d)),
          h('td', { class: `num max-skew${m.slo_skew_ms > slo.slo_ms ? ' late' : ''}` }, fmtMs(m.slo_skew_ms)));
      }) : h('tr', {}, h('td', { colspan: 13, class: 'muted' }, 'No messages.')));
    };
    poll(2000, load);
  }

  // sloShare is the share of the last day's settled messages whose
  // maximum skew was within the SLO, for every lane and each.
  function sloShare(slo) {
    const share = (within, n) => (n ? `${(Math.floor((1000 * within) / n) / 10).toFixed(1)}%` : '—');
    const all = slo.lanes.reduce((a, l) => ({ messages: a.messages + l.messages, within_slo: a.within_slo + l.within_slo }), { messages: 0, within_slo: 0 });
    const item = (id, label, l) => h('div', { class: 'counter', id },
      h('b', {}, share(l.within_slo, l.messages)),
      h('span', {}, `${label}: ${fmtNum(l.within_slo)} of ${fmtNum(l.messages)}`));
    return [h('div', { class: 'muted' }, `Messages within the SLO (every device within ${fmtMs(slo.slo_ms)}), settled over the last ${slo.window_hours} h`),
      h('div', { class: 'counters' }, item('slo-all', 'all', all),
        slo.lanes.map((l) => item(`slo-${l.priority}`, l.priority, l)))];
  }

  function counters(d) {
    return ['total', 'accepted', 'failed', 'expired', 'cancelled', 'pending'].map((k) =>
      h('div', { class: `counter ${k}`, id: `counter-${k}` }, h('b', {}, fmtNum(d[k])), h('span', {}, k)));
  }

  // withheldCounters are the deliveries withheld for their users' sake,
  // each also among the counters above: opted out and capped among the
  // cancelled, quiet hours among the cancelled and expired, held (by quiet
  // hours, until they end) among the pending.
  const withheldKinds = [
    ['opted_out', 'opted out', 'cancelled: the user opted out of the category'],
    ['capped', 'capped', "cancelled: the category's cap for the user was reached"],
    ['quiet_hours', 'quiet hours', "skipped (cancelled) or expired in the user's quiet hours"],
    ['held', 'held', "pending until the user's quiet hours end"],
  ];
  function withheldCounters(d) {
    return withheldKinds.map(([k, label, title]) =>
      h('div', { class: `counter withheld ${k}`, id: `counter-${k}`, title }, h('b', {}, fmtNum(d[k])), h('span', {}, label)));
  }

  // receiptCounters are what the devices said: deliveries confirmed by a
  // delivered receipt, opened, and accepted but never confirmed.
  function receiptCounters(r) {
    return ['confirmed', 'opened', 'unconfirmed'].map((k) =>
      h('div', { class: `counter ${k}`, id: `receipts-${k}` }, h('b', {}, fmtNum(r[k])), h('span', {}, k)));
  }

  // skewTable sets the providers' acceptance skew beside the devices'
  // confirmed skew: the difference is the way from the provider to the phone.
  function skewTable(accepted, confirmed) {
    const row = (name, id, sk, title) => h('tr', { id }, h('td', { title }, name),
      ['p50', 'p95', 'p99', 'max'].map((k) => h('td', { class: `num ${k}` }, fmtMs(sk ? sk[k] : null))));
    return h('table', {},
      h('thead', {}, h('tr', {}, h('th', {}, 'Skew'), ['p50', 'p95', 'p99', 'max'].map((k) => h('th', { class: 'num' }, k)))),
      h('tbody', {},
        row('accepted', 'skew-accepted', accepted, 'the provider took the push, less its due time'),
        row('confirmed', 'skew-confirmed', confirmed, 'the device said it arrived, less its due time')));
  }

  function timeline(m) {
    const step = (what, at, note) => h('li', { class: at ? 'done' : '' },
      h('span', { class: 'dot' }), h('span', { class: 'what' }, what),
      h('span', {}, fmtTime(at), ' ', h('span', { class: 'muted' }, at ? fmtRel(at) : note || '')));
    return h('ul', { class: 'timeline' },
      step('created', m.created_at),
      step('scheduled', m.dispatch_at),
      step('started', m.started_at, m.state === 'scheduled' ? 'not yet' : ''),
      step('settled', m.settled_at, m.state === 'dispatching' ? 'in progress' : ''),
      h('li', {}, h('span', { class: 'dot' }), h('span', { class: 'what' }, 'expires'), h('span', {}, fmtTime(m.expires_at))));
  }

  // histogram draws the server's skew buckets as an SVG bar chart.
  function histogram(buckets) {
    const total = buckets.reduce((n, b) => n + b.devices, 0);
    if (!total) return h('p', { class: 'muted' }, 'No accepted deliveries yet.');
    const W = 640, H = 200, left = 40, bottom = 24, top = 8;
    const max = Math.max(...buckets.map((b) => b.devices));
    const bw = (W - left) / buckets.length;
    const y = (n) => top + (H - top - bottom) * (1 - n / max);
    const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'skew histogram' });
    chart.append(svg('text', { x: left - 6, y: top + 8, 'text-anchor': 'end' }, fmtNum(max)));
    chart.append(svg('text', { x: left - 6, y: H - bottom, 'text-anchor': 'end' }, '0'));
    buckets.forEach((b, i) => {
      const bar = svg('rect', { x: left + i * bw + 1, y: y(b.devices), width: Math.max(bw - 2, 1), height: H - bottom - y(b.devices) });
      bar.append(svg('title', {}, `${fmtMs(b.from_ms)} – ${fmtMs(b.to_ms)}: ${fmtNum(b.devices)} devices`));
      chart.append(bar);
    });
    const label = (x, ms, anchor) => chart.append(svg('text', { x, y: H - 6, 'text-anchor': anchor }, fmtMs(ms)));
    label(left, buckets[0].from_ms, 'start');
    label(left + (W - left) / 2, buckets[Math.floor(buckets.length / 2)].from_ms, 'middle');
    label(W, buckets[buckets.length - 1].to_ms, 'end');
    return chart;
  }

  function messagePage(id) {
    // failures pages through the failed deliveries; cursors as in messagesPage.
    const failures = { cursor: '', before: [], next: '' };
    replace('view',
      h('div', { class: 'toolbar' },
        h('h1', { class: 'grow' }, 'Message ', h('span', { class: 'mono' }, id), ' ', h('span', { id: 'message-state' })),
        h('span', { id: 'cancel-box' })),
      h('div', { class: 'panel', id: 'message-content' }),
      h('div', { class: 'row' },
        h('div', { class: 'panel' }, h('h2', {}, 'Timeline'), h('div', { id: 'timeline' })),
        h('div', { class: 'panel', style: 'flex:2' }, h('h2', {}, 'Deliveries'),
          h('div', { class: 'counters', id: 'counters' }), h('div', { style: 'margin-top:12px', id: 'progress' }),
          h('h3', {}, "Withheld for their users' sake"),
          h('div', { class: 'counters', id: 'withheld-counters' }),
          h('p', { class: 'muted', id: 'message-meta' }))),
      // A local-time message goes out in waves, one per zone's instant;
      // the panel shows for such a message only.
      h('div', { class: 'panel', id: 'waves-panel', hidden: true }, h('h2', {}, 'Waves (local time)'),
        h('table', { id: 'waves' }, h('thead', {}, h('tr', {},
          h('th', {}, 'Due at'), h('th', {}, 'Expires at'),
          ['Devices', 'Accepted', 'Failed', 'Expired', 'Cancelled', 'Pending'].map((c) => h('th', { class: 'num' }, c)),
          h('th', {}, 'Progress'))), h('tbody', { id: 'waves-body' }))),
      h('div', { class: 'row' },
        h('div', { class: 'panel histogram', style: 'flex:2' }, h('h2', {}, 'Skew (provider acceptance − due time)'),
          h('div', { id: 'histogram' }), h('div', { class: 'quantiles', id: 'quantiles' })),
        h('div', { class: 'panel' }, h('h2', {}, 'Failures by reason'), h('div', { id: 'reasons' }))),
      h('div', { class: 'panel', id: 'receipts-panel' }, h('h2', {}, 'What the devices saw (receipts)'),
        h('div', { class: 'counters', id: 'receipt-counters' }), h('div', { style: 'margin-top:12px', id: 'skews' })),
      h('div', { class: 'panel' }, h('h2', {}, 'Failed deliveries'),
        h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'User'), h('th', {}, 'Device'), h('th', {}, 'Channel'), h('th', {}, 'Reason'), h('th', {}, 'Attempted at'))),
          h('tbody', { id: 'failures-body' })),
        h('div', { class: 'toolbar', style: 'margin-top:12px' }, h('span', { class: 'grow' }),
          h('button', { class: 'secondary', id: 'failures-prev', disabled: true, onclick: () => { failures.cursor = failures.before.pop() || ''; loadFailures(); } }, '‹ Previous'),
          h('button', { class: 'secondary', id: 'failures-next', disabled: true, onclick: () => { failures.before.push(failures.cursor); failures.cursor = failures.next; loadFailures(); } }, 'Next ›'))));

    const loadFailures = async () => {
      const q = new URLSearchParams({ status: 'failed', limit: '20' });
      if (failures.cursor) q.set('cursor', failures.cursor);
      const page = await api('GET', `/messages/${id}/deliveries?${q}`);
      failures.next = page.next_cursor || '';
      document.getElementById('failures-next').disabled = !failures.next;
      document.getElementById('failures-prev').disabled = !failures.cursor;
      replace('failures-body', page.items.length ? page.items.map((d) => h('tr', {},
        h('td', {}, d.user_id), h('td', { class: 'mono' }, d.device_id), h('td', {}, d.channel),
        h('td', {}, d.reason || '—'), h('td', {}, fmtTime(d.attempted_at)))) : h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No failed deliveries.')));
    };

    const cancelBox = (m) => {
      if (m.state !== 'scheduled') return [];
      // Two steps, so that a stray click cancels nothing.
      const confirm = h('button', { class: 'danger', id: 'cancel-confirm', hidden: true, onclick: async () => {
        try {
          await api('DELETE', `/messages/${id}`);
          flash('Message cancelled.', true);
        } catch (e) {
          flash(`Not cancelled: ${e.message}`);
        }
        load();
      } }, 'Yes, cancel it');
      return [h('button', { class: 'secondary', id: 'cancel', onclick: (e) => { e.target.hidden = true; confirm.hidden = false; } }, 'Cancel message…'), ' ', confirm];
    };

    let shownState = '';
    const load = async () => {
      const [m, breakdown] = await Promise.all([api('GET', `/messages/${id}`), api('GET', `/messages/${id}/breakdown`)]);
      replace('message-state', badge(m.state));
      replace('message-content', content(m.payload));
      if (m.state !== shownState) replace('cancel-box', cancelBox(m));
      shownState = m.state;
      replace('timeline', timeline(m));
      replace('counters', counters(m.deliveries));
      replace('progress', progress(m.deliveries));
      replace('withheld-counters', withheldCounters(m.deliveries));
      replace('message-meta', `${m.priority} · `,
        h('span', { id: 'message-category', title: "what its recipients' preferences make of it" }, `category ${m.category}, quiet hours: ${m.quiet_hours}`),
        ` · ${fmtNum(m.recipient_count)} recipients · ${fmtNum(m.chunk_count)} chunks`,
        m.schedule_id ? [' · schedule ', h('a', { href: `#/messages?schedule_id=${m.schedule_id}` }, m.schedule_id)] : []);
      const waves = m.waves || [];
      document.getElementById('waves-panel').hidden = waves.length === 0;
      replace('waves-body', waves.map((w) => h('tr', { 'data-wave': w.dispatch_at },
        h('td', { title: w.dispatch_at }, fmtTime(w.dispatch_at), h('div', { class: 'muted' }, fmtRel(w.dispatch_at))),
        h('td', { title: w.expires_at }, fmtTime(w.expires_at)),
        ['devices', 'accepted', 'failed', 'expired', 'cancelled', 'pending'].map((k) => h('td', { class: `num ${k}` }, fmtNum(w[k]))),
        h('td', {}, progress({ ...w, total: w.devices })))));
      replace('histogram', histogram(breakdown.skew_histogram));
      const sk = m.skew_ms;
      replace('quantiles', ['p50', 'p95', 'p99', 'max'].map((k) => h('div', { id: `skew-${k}` }, `${k} `, h('b', {}, fmtMs(sk ? sk[k] : null)))));
      replace('receipt-counters', receiptCounters(m.receipts));
      replace('skews', skewTable(m.skew_ms, m.receipts.skew_ms));
      replace('reasons', breakdown.failures_by_reason.length ? h('table', {},
        h('thead', {}, h('tr', {}, h('th', {}, 'Status'), h('th', {}, 'Reason'), h('th', { class: 'num' }, 'Devices'))),
        h('tbody', {}, breakdown.failures_by_reason.map((r) => h('tr', {}, h('td', {}, r.status), h('td', {}, r.reason || '—'), h('td', { class: 'num' }, fmtNum(r.devices))))))
        : h('p', { class: 'muted' }, 'None.'));
      await loadFailures();
      // Poll while something can still change.
      return m.state === 'scheduled' || m.state === 'dispatching';
    };
    poll(1500, load);
  }

  // ---- Schedules.

  function schedulesPage() {
    replace('view', h('h1', {}, 'Schedules'), h('div', { class: 'panel' },
      h('table', { id: 'schedules' }, h('thead', {}, h('tr', {},
        h('th', {}, 'Schedule'), h('th', {}, 'Cron'), h('th', {}, 'Zone'), h('th', {}, 'Audience'), h('th', {}, 'Priority'),
        h('th', {}, 'Next runs'), h('th', {}, 'State'), h('th', {}))), h('tbody', { id: 'schedules-body' }))));
    const load = async () => {
      const page = await api('GET', '/schedules?limit=100');
      replace('schedules-body', page.items.length ? page.items.map((s) => {
        const aud = s.audience.type === 'segment' ? `segment ${s.audience.id}` : `${s.audience.ids.length} user(s)`;
        return h('tr', { 'data-schedule-id': s.schedule_id },
          h('td', {}, h('a', { class: 'mono', href: `#/messages?schedule_id=${s.schedule_id}`, title: 'its messages' }, s.schedule_id)),
          h('td', { class: 'mono' }, s.cron), h('td', {}, s.timezone), h('td', {}, aud), h('td', {}, s.priority),
          h('td', {}, s.paused ? h('span', { class: 'muted' }, 'paused') : (s.next_runs || []).slice(0, 3).map((r) => {
            // A run already made into a message links to it.
            const made = (s.pending_runs || []).find((p) => p.run_at === r);
            return h('div', { class: made ? 'pending-run' : null }, fmtTime(r), ' ', h('span', { class: 'muted' }, fmtRel(r)),
              made ? [' ', h('a', { class: 'mono', href: `#/messages/${made.message_id}` }, made.message_id)] : null);
          })),
          h('td', {}, badge(s.paused ? 'paused' : 'active')),
          h('td', {}, h('button', { class: 'secondary', onclick: async () => {
            try {
              await api('PATCH', `/schedules/${s.schedule_id}`, { paused: !s.paused });
              flash(`Schedule ${s.schedule_id} ${s.paused ? 'resumed' : 'paused'}.`, true);
            } catch (e) {
              flash(e.message);
            }
            load();
          } }, s.paused ? 'Resume' : 'Pause')));
      }) : h('tr', {}, h('td', { colspan: 8, class: 'muted' }, 'No schedules.')));
    };
    poll(5000, load);
  }

  // ---- Providers.

  function providersPage() {
    replace('view', h('h1', {}, 'Providers'), h('div', { class: 'panel' },
      h('table', { id: 'providers' }, h('thead', {}, h('tr', {},
        h('th', {}, 'Channel'), h('th', {}, 'Configured'), h('th', {}, 'Circuit'), h('th', { class: 'num' }, 'Workers'),
        h('th', { class: 'num' }, 'Sends'), h('th', { class: 'num' }, 'Failures'), h('th', { class: 'num' }, 'Error rate'),
        h('th', { class: 'num' }, 'Recent'), h('th', {}, 'Last error'))), h('tbody', { id: 'providers-body' })),
      h('p', { class: 'muted' }, 'Sends and failures count since each worker started; "recent" is the error rate between the last two refreshes (every 2 s).')));
    // previous holds the last sample per channel, for the recent error rate.
    const previous = {};
    const rate = (f, s) => (s > 0 ? `${((100 * f) / s).toFixed(1)} %` : '—');
    poll(2000, async () => {
      const all = await api('GET', '/providers');
      replace('providers-body', Object.keys(all).sort().map((ch) => {
        const p = all[ch];
        const prev = previous[ch];
        previous[ch] = p;
        const recent = prev ? rate(p.failures - prev.failures, p.sends - prev.sends) : '—';
        return h('tr', { 'data-channel': ch },
          h('td', {}, ch), h('td', {}, p.configured ? 'yes' : 'no'), h('td', {}, badge(p.state)),
          h('td', { class: 'num' }, p.workers), h('td', { class: 'num' }, fmtNum(p.sends)), h('td', { class: 'num' }, fmtNum(p.failures)),
          h('td', { class: 'num' }, rate(p.failures, p.sends)), h('td', { class: 'num' }, recent),
          h('td', {}, p.last_error ? [p.last_error, h('div', { class: 'muted' }, fmtTime(p.last_error_at))] : '—'));
      }));
    });
  }

  // ---- Apps: each app's channels, where their credentials come from, and
  // how the workers find them (a provider refusing an app's credentials
  // shows here, naming the app).

  function appsPage() {
    replace('view', h('h1', {}, 'Apps'), h('div', { class: 'panel' },
      h('table', { id: 'apps' }, h('thead', {}, h('tr', {},
        h('th', {}, 'App'), h('th', {}, 'Channel'), h('th', {}, 'Credential'), h('th', {}, 'Circuit'),
        h('th', { class: 'num' }, 'Workers'), h('th', { class: 'num' }, 'Sends'), h('th', { class: 'num' }, 'Refused'),
        h('th', {}, 'Last refusal or error'))), h('tbody', { id: 'apps-body' })),
      h('p', { class: 'muted' }, 'Credentials are managed with POST /v1/apps/{app}/credentials or herald apps; their private parts are never shown. "Refused" counts the pushes a provider refused for the app\'s credentials.')));
    poll(2000, async () => {
      const all = await api('GET', '/apps');
      const rows = [];
      for (const a of all.items) {
        for (const c of a.channels) {
          const hl = a.health[c.channel] || {};
          const active = c.credentials.find((x) => x.state === 'active');
          const source = a.disabled ? 'app disabled' : active ? `stored v${active.version}` : c.source;
          const last = hl.last_refused || hl.last_error;
          const lastAt = hl.last_refused ? hl.last_refused_at : hl.last_error_at;
          rows.push(h('tr', { 'data-app': a.name, 'data-channel': c.channel, class: hl.refused > 0 ? 'refused' : '' },
            h('td', {}, a.name), h('td', {}, c.channel), h('td', {}, source), h('td', {}, badge(hl.state || 'closed')),
            h('td', { class: 'num' }, hl.workers || 0), h('td', { class: 'num' }, fmtNum(hl.sends || 0)),
            h('td', { class: 'num' }, fmtNum(hl.refused || 0)),
            h('td', {}, last ? [last, h('div', { class: 'muted' }, fmtTime(lastAt))] : '—')));
        }
      }
      replace('apps-body', rows);
    });
  }

  // ---- Send a test message.

  function sendPage() {
    // One key per form shown: a double submit schedules one message.
    const key = randomKey();
    const form = h('form', { class: 'stack panel', id: 'send-form', onsubmit: async (e) => {
      e.preventDefault();
      const f = new FormData(form);
      const id = f.get('audience_id').trim();
      const body = {
        priority: f.get('priority'),
        audience: f.get('audience_type') === 'segment' ? { type: 'segment', id } : { type: 'users', ids: [id] },
        payload: { title: f.get('title'), body: f.get('body') },
      };
      if (f.get('dispatch_at')) body.dispatch_at = new Date(f.get('dispatch_at')).toISOString();
      try {
        const m = await api('POST', '/messages', body, { 'Idempotency-Key': key });
        flash(`Scheduled ${m.message_id} for ${fmtNum(m.device_count)} devices.`, true);
        location.hash = `#/messages/${m.message_id}`;
      } catch (err) {
        flash(err.message);
      }
    } },
    h('div', { class: 'inline' },
      h('label', {}, 'Audience', h('select', { name: 'audience_type', id: 'audience-type' }, h('option', { value: 'users' }, 'user'), h('option', { value: 'segment' }, 'segment'))),
      h('label', { style: 'flex:1' }, 'Id', h('input', { name: 'audience_id', id: 'audience-id', required: true, placeholder: 'u_1 or seg_x' }))),
    h('label', {}, 'Title', h('input', { name: 'title', id: 'title', value: 'Test from the Herald dashboard' })),
    h('label', {}, 'Body', h('textarea', { name: 'body', id: 'body', rows: 3 })),
    h('div', { class: 'inline' },
      h('label', {}, 'Priority', h('select', { name: 'priority', id: 'priority' }, h('option', { value: 'bulk' }, 'bulk'), h('option', { value: 'urgent' }, 'urgent'))),
      h('label', { style: 'flex:1' }, 'Dispatch at (empty: now)', h('input', { type: 'datetime-local', step: 1, name: 'dispatch_at', id: 'dispatch-at' }))),
    h('div', {}, h('button', { type: 'submit', id: 'send-submit' }, 'Schedule')));
    replace('view', h('h1', {}, 'Send a test message'), form);
  }

  // ---- Routing.

  function route() {
    ui.generation++;
    flash('');
    const [path, query] = (location.hash.replace(/^#/, '') || '/messages').split('?');
    const params = new URLSearchParams(query || '');
    const parts = path.split('/').filter(Boolean);
    for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === parts[0]);
    if (parts[0] === 'messages' && parts[1]) return messagePage(decodeURIComponent(parts[1]));
    if (parts[0] === 'schedules') return schedulesPage();
    if (parts[0] === 'providers') return providersPage();
    if (parts[0] === 'apps') return appsPage();
    if (parts[0] === 'send') return sendPage();
    return messagesPage(params);
  }

  async function start() {
    try {
      const s = await api('GET', '/session');
      ui.csrf = s.csrf_token;
      document.getElementById('riverui-link').hidden = !s.river_ui;
    } catch (e) {
      flash(e.message);
      return;
    }
    document.getElementById('logout').addEventListener('click', async () => {
      await fetch('/logout', { method: 'POST', credentials: 'same-origin', headers: { 'X-CSRF-Token': ui.csrf } });
      location.href = '/login';
    });
    window.addEventListener('hashchange', route);
    route();
  }

  document.addEventListener('DOMContentLoaded', start);
})();
