// The webhook portal (docs/api.md, "The portal"). Every call goes to the service's public
// API with the session token as "Authorization: Bearer"; the page has no route of its own.
// Everything that comes from the API is shown through textContent: never innerHTML.
'use strict';

(function () {
  const PAGE_SIZE = 20;
  const RETRIES_ON_429 = 4;
  const MAX_RETRY_WAIT_S = 5;
  const state = {
    token: null,
    features: {},
    endpoints: [],
    failures: {},
    selected: null,
    deliveries: [],
    nextCursor: null,
    page: 0,
  };

  // -- the token: from the fragment into memory, and the fragment cleared -----------------
  function takeToken() {
    const match = /(?:^#|&)token=([^&]+)/.exec(window.location.hash || '');
    if (match) {
      try { state.token = decodeURIComponent(match[1]); } catch (_) { state.token = null; }
    }
    window.history.replaceState(null, '', window.location.pathname + window.location.search);
  }

  // -- DOM helpers ---------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === 'text') node.textContent = value == null ? '' : String(value);
      else if (name === 'onclick') node.addEventListener('click', value);
      else node.setAttribute(name, String(value));
    }
    for (const child of children) if (child != null) node.append(child);
    return node;
  }
  function $(id) { return document.getElementById(id); }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function notice(text, isError) {
    const box = $('notice');
    box.textContent = text;
    box.className = isError ? 'error' : '';
    box.hidden = !text;
  }
  const enc = encodeURIComponent;

  // -- the API -------------------------------------------------------------------------------
  class SessionEnded extends Error {}

  async function api(method, path, body) {
    const init = {
      method,
      headers: { Authorization: 'Bearer ' + state.token, Accept: 'application/json' },
      credentials: 'omit',
      cache: 'no-store',
      redirect: 'error',
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    // A 429 was refused before anything was done (the workspace's one deliveries scan is
    // busy, or its request rate spent): wait its Retry-After and try again, a few times.
    let response = await fetch(path, init);
    for (let tries = 1; response.status === 429 && tries < RETRIES_ON_429; tries += 1) {
      const wait = Math.min(Number(response.headers.get('Retry-After')) || 1, MAX_RETRY_WAIT_S);
      await new Promise((resolve) => setTimeout(resolve, wait * 1000));
      response = await fetch(path, init);
    }
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (response.status === 401) {
      throw new SessionEnded((data && data.error && data.error.message) || 'Session refused.');
    }
    if (!response.ok) {
      const message = (data && data.error && data.error.message) || ('HTTP ' + response.status);
      throw new Error(message);
    }
    return data;
  }

  // A route is there when the service answers its OPTIONS with an Allow naming the method;
  // a route not served (404) or not taking the method (405) hides its control.
  async function hasRoute(method, path) {
    try {
      const response = await fetch(path, { method: 'OPTIONS', credentials: 'omit', cache: 'no-store' });
      if (response.status !== 204) return false;
      const allow = (response.headers.get('Allow') || '').split(',').map((m) => m.trim());
      return allow.includes(method);
    } catch (_) {
      return false;
    }
  }

  async function detectFeatures() {
    const probe = '/v1/webhook-endpoints/probe';
    const [catalogue, detail, resend, test] = await Promise.all([
      hasRoute('GET', '/v1/event-types'),
      hasRoute('GET', probe + '/deliveries/probe'),
      hasRoute('POST', probe + '/deliveries/probe/resend'),
      hasRoute('POST', probe + '/test'),
    ]);
    state.features = { catalogue, detail, resend, test };
  }

  // -- deliveries: one shape over the route's versions ---------------------------------------
  function outcome(d) {
    const s = d.status || d.state || '';
    if (s === 'delivered' || s === 'succeeded') return 'succeeded';
    if (s === 'failed') return 'failed';
    if (s === 'failing') return 'failing';
    return (d.attempts_count || (typeof d.attempts === 'number' ? d.attempts : 0)) > 0 &&
      (d.last_error || (d.last_status && d.last_status >= 300)) ? 'failing' : 'pending';
  }
  function deliveryId(d) { return d.delivery_id || d.webhook_id || d.id || ''; }
  function when(d) { return d.updated_at || d.created_at || ''; }
  function attemptCount(d) {
    if (typeof d.attempts === 'number') return d.attempts;
    if (Array.isArray(d.attempts)) return d.attempts.length;
    return d.attempts_count == null ? '' : d.attempts_count;
  }

  async function loadDeliveries(endpointId, cursor) {
    const query = new URLSearchParams();
    const status = $('filter-status').value;
    const type = $('filter-type').value;
    if (status) query.set('status', status);
    if (type) query.set('event_type', type);
    if (cursor) query.set('cursor', cursor);
    const q = query.toString();
    const body = await api('GET', '/v1/webhook-endpoints/' + enc(endpointId) + '/deliveries' + (q ? '?' + q : ''));
    const rows = (body && Array.isArray(body.data)) ? body.data : [];
    const next = body && (body.next_cursor || (body.page && body.page.next_cursor)) || null;
    // A service without the filters answers every delivery: filtered here as well.
    return {
      rows: rows.filter((d) => (!status || outcome(d) === status) && (!type || d.event_type === type)),
      next: typeof next === 'string' ? next : null,
    };
  }

  // -- endpoints -----------------------------------------------------------------------------
  async function loadEndpoints() {
    const body = await api('GET', '/v1/webhook-endpoints');
    state.endpoints = (body && Array.isArray(body.data)) ? body.data : [];
    if (state.endpoints.length) $('workspace').textContent = 'Workspace ' + state.endpoints[0].workspace_id;
    // One after another: the service runs one deliveries scan per workspace at a time.
    for (const e of state.endpoints) {
      try {
        const body2 = await api('GET', '/v1/webhook-endpoints/' + enc(e.id) + '/deliveries');
        const rows = (body2 && Array.isArray(body2.data)) ? body2.data : [];
        state.failures[e.id] = rows.filter((d) => ['failed', 'failing'].includes(outcome(d))).length;
      } catch (err) {
        if (err instanceof SessionEnded) throw err;
        state.failures[e.id] = null;
      }
    }
    renderEndpoints();
  }

  // A disabled endpoint's recovery (docs/api.md, the endpoint object): its next probe and
  // what the last one came to.
  function probing(e) {
    const r = e.recovery;
    if (e.status !== 'disabled' || !r) return null;
    const next = !e.auto_recover ? 'auto-recovery off'
      : r.next_probe_at == null ? 'no more probes'
        : 'next probe ' + new Date(r.next_probe_at * 1000).toISOString().slice(0, 19) + 'Z';
    const p = r.last_probe;
    const last = p ? 'last probe ' + p.at + ': ' + (p.status ?? p.error ?? 'no answer') : 'not probed yet';
    return el('div', { class: 'muted endpoint-probe', text: next + '; ' + last });
  }

  function renderEndpoints() {
    const tbody = $('endpoints').tBodies[0];
    clear(tbody);
    for (const e of state.endpoints) {
      const actions = el('td', {},
        el('button', { type: 'button', 'data-action': 'deliveries', text: 'Deliveries', onclick: () => selectEndpoint(e.id) }),
        el('button', { type: 'button', 'data-action': 'rotate', text: 'Rotate secret', onclick: () => rotate(e.id) }),
        e.status === 'active'
          ? el('button', { type: 'button', 'data-action': 'deactivate', text: 'Deactivate', onclick: () => setStatus(e.id, 'deactivate') })
          : el('button', { type: 'button', 'data-action': 'activate', text: 'Activate', onclick: () => setStatus(e.id, 'activate') }),
      );
      const failures = state.failures[e.id];
      tbody.append(el('tr', { 'data-endpoint': e.id, class: e.id === state.selected ? 'selected' : '' },
        el('td', { class: 'url' },
          el('div', { class: 'endpoint-url', text: e.url }),
          el('div', { class: 'muted endpoint-description', text: e.description || '' }),
          el('div', { class: 'muted', text: e.id })),
        el('td', { class: 'endpoint-state state-' + e.status },
          e.status, e.disabled_reason ? el('div', { class: 'muted', text: e.disabled_reason }) : null,
          probing(e)),
        el('td', { class: 'endpoint-failures', text: failures == null ? '–' : failures }),
        actions));
    }
    $('endpoints-section').hidden = false;
  }

  async function act(what, run) {
    try {
      await run();
    } catch (err) {
      if (err instanceof SessionEnded) return ended(err);
      notice(what + ' failed: ' + err.message, true);
    }
  }

  function setStatus(endpointId, action) {
    return act(action, async () => {
      await api('POST', '/v1/webhook-endpoints/' + enc(endpointId) + '/' + action);
      notice('Endpoint ' + endpointId + (action === 'activate' ? ' activated.' : ' deactivated.'));
      await loadEndpoints();
    });
  }

  function rotate(endpointId) {
    return act('Rotate', async () => {
      const body = await api('POST', '/v1/webhook-endpoints/' + enc(endpointId) + '/rotate-secret');
      const box = $('secret');
      clear(box);
      box.append('New signing secret of ' + endpointId + ' (shown once; the previous one keeps signing for the overlap): ',
        el('code', { id: 'new-secret', text: body.data.secret }));
      box.hidden = false;
      notice('Secret rotated.');
    });
  }

  // -- one endpoint's deliveries -------------------------------------------------------------
  function selectEndpoint(endpointId) {
    state.selected = endpointId;
    state.page = 0;
    renderEndpoints();
    const endpoint = state.endpoints.find((e) => e.id === endpointId);
    $('endpoint-name').textContent = endpoint ? endpoint.url : endpointId;
    $('endpoint-section').hidden = false;
    $('detail').hidden = true;
    // The previous endpoint's rows go at once: an Attempts or Resend click on one of them
    // would ask this endpoint for a delivery it never had.
    state.deliveries = [];
    state.nextCursor = null;
    renderDeliveries();
    return refreshDeliveries();
  }

  function refreshDeliveries() {
    const endpointId = state.selected;
    return act('Loading the deliveries', async () => {
      const { rows, next } = await loadDeliveries(endpointId, null);
      // Another endpoint was chosen while this one loaded: its answer is not what is shown.
      if (state.selected !== endpointId) return;
      state.deliveries = rows;
      state.nextCursor = next;
      renderDeliveries();
      renderChart(rows);
    });
  }

  async function older() {
    const shown = (state.page + 1) * PAGE_SIZE;
    if (shown >= state.deliveries.length && state.nextCursor) {
      const endpointId = state.selected;
      await act('Loading older deliveries', async () => {
        const { rows, next } = await loadDeliveries(endpointId, state.nextCursor);
        if (state.selected !== endpointId) return;
        state.deliveries = state.deliveries.concat(rows);
        state.nextCursor = next;
      });
    }
    if (shown < state.deliveries.length) state.page += 1;
    renderDeliveries();
  }

  function renderDeliveries() {
    const tbody = $('deliveries').tBodies[0];
    clear(tbody);
    const start = state.page * PAGE_SIZE;
    const endpointId = state.selected;  // each row's buttons ask the endpoint it was read for
    for (const d of state.deliveries.slice(start, start + PAGE_SIZE)) {
      const id = deliveryId(d);
      const last = [d.last_status, d.last_error].filter((v) => v != null && v !== '').join(' ');
      const buttons = el('td', {});
      if (state.features.detail) {
        buttons.append(el('button', { type: 'button', class: 'link', 'data-action': 'attempts', text: 'Attempts', onclick: () => showDetail(endpointId, id) }));
      }
      if (state.features.resend) {
        buttons.append(el('button', { type: 'button', 'data-action': 'resend', text: 'Resend', onclick: () => resend(endpointId, id) }));
      }
      tbody.append(el('tr', { 'data-delivery': id },
        el('td', { text: when(d) }),
        el('td', { text: d.event_type || '' }),
        el('td', { text: d.account_id || '' }),
        el('td', { class: 'delivery-state state-' + outcome(d), text: outcome(d) }),
        el('td', { text: attemptCount(d) }),
        el('td', { class: 'excerpt', text: last }),
        buttons));
    }
    const pages = Math.max(1, Math.ceil(state.deliveries.length / PAGE_SIZE));
    $('page').textContent = 'page ' + (state.page + 1) + ' of ' + pages + (state.nextCursor ? '+' : '');
    $('newer').disabled = state.page === 0;
    $('older').disabled = start + PAGE_SIZE >= state.deliveries.length && !state.nextCursor;
  }

  function showDetail(endpointId, id) {
    return act('Loading the delivery', async () => {
      const body = await api('GET', '/v1/webhook-endpoints/' + enc(endpointId) + '/deliveries/' + enc(id));
      const data = (body && body.data) || {};
      const attempts = Array.isArray(data.attempts_detail) ? data.attempts_detail
        : Array.isArray(data.attempts) ? data.attempts : [];
      $('detail-id').textContent = id;
      const columns = [];
      for (const a of attempts) for (const k of Object.keys(a || {})) if (!columns.includes(k)) columns.push(k);
      const head = $('attempts').tHead.rows[0];
      clear(head);
      for (const c of columns) head.append(el('th', { text: c }));
      const tbody = $('attempts').tBodies[0];
      clear(tbody);
      for (const a of attempts) {
        tbody.append(el('tr', {}, ...columns.map((c) => {
          const v = a[c];
          const text = v == null ? '' : (typeof v === 'object' ? JSON.stringify(v) : String(v));
          return el('td', { class: 'excerpt' }, /body|excerpt/.test(c) ? el('pre', { text }) : text);
        })));
      }
      $('detail').hidden = false;
    });
  }

  function resend(endpointId, id) {
    return act('Resend', async () => {
      await api('POST', '/v1/webhook-endpoints/' + enc(endpointId) + '/deliveries/' + enc(id) + '/resend');
      notice('Delivery ' + id + ' queued again.');
      await refreshDeliveries();
    });
  }

  function sendTest() {
    return act('Test send', async () => {
      const type = $('test-type').value;
      const body = await api('POST', '/v1/webhook-endpoints/' + enc(state.selected) + '/test', { event_type: type });
      const id = body && body.data ? deliveryId(body.data) : '';
      notice('Test ' + type + ' sent' + (id ? ' as ' + id : '') + '.');
      await refreshDeliveries();
    });
  }

  // -- the chart: deliveries per minute by outcome, last hour (SVG, no library) ---------------
  const SVG = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text != null) node.textContent = text;
    return node;
  }

  function renderChart(rows) {
    const chart = $('chart');
    clear(chart);
    const outcomes = ['succeeded', 'failing', 'pending', 'failed'];
    const now = Date.now();
    const minutes = Array.from({ length: 60 }, () => ({ succeeded: 0, failing: 0, pending: 0, failed: 0 }));
    for (const d of rows) {
      const t = Date.parse(when(d));
      if (Number.isNaN(t)) continue;
      const ago = Math.floor((now - t) / 60000);
      if (ago >= 0 && ago < 60) minutes[59 - ago][outcome(d)] += 1;
    }
    const top = Math.max(1, ...minutes.map((m) => outcomes.reduce((s, o) => s + m[o], 0)));
    const left = 28, bottom = 120, height = 105, width = 9;
    chart.append(svg('line', { class: 'axis', x1: left, y1: bottom, x2: left + 60 * 10, y2: bottom }));
    chart.append(svg('text', { x: 2, y: bottom - height + 8 }, String(top)));
    chart.append(svg('text', { x: 2, y: bottom }, '0'));
    chart.append(svg('text', { x: left, y: bottom + 14 }, '-60 min'));
    chart.append(svg('text', { x: left + 60 * 10 - 24, y: bottom + 14 }, 'now'));
    minutes.forEach((m, i) => {
      let y = bottom;
      for (const o of outcomes) {
        if (!m[o]) continue;
        const h = (m[o] / top) * height;
        y -= h;
        const rect = svg('rect', { class: o, x: left + i * 10, y, width, height: h });
        rect.append(svg('title', {}, m[o] + ' ' + o + ', ' + (59 - i) + ' min ago'));
        chart.append(rect);
      }
    });
  }

  // -- the event catalogue -------------------------------------------------------------------
  async function loadCatalogue() {
    const body = await api('GET', '/v1/event-types');
    const data = body ? body.data : null;
    const types = (data && Array.isArray(data.event_types)) ? data.event_types : [];
    const box = $('catalogue');
    clear(box);
    for (const t of types) {
      const name = t.event_type || t.type || t.name || '';
      box.append(el('div', { class: 'event-type', 'data-event-type': name },
        el('h3', { text: name }),
        el('p', { text: t.description || '' }),
        el('details', {}, el('summary', { text: 'Schema' }), el('pre', { text: JSON.stringify(t.schema || t.json_schema || {}, null, 2) })),
        el('details', {}, el('summary', { text: 'Example' }), el('pre', { text: JSON.stringify(t.example || t.example_payload || {}, null, 2) }))));
    }
    $('catalogue-section').hidden = false;
    return types.map((t) => t.event_type || t.type || t.name).filter(Boolean);
  }

  function fillTypes(types) {
    for (const id of ['filter-type', 'test-type']) {
      const select = $(id);
      for (const t of types) select.append(el('option', { value: t, text: t }));
    }
  }

  function ended(err) {
    state.token = null;
    $('endpoints-section').hidden = true;
    $('endpoint-section').hidden = true;
    $('catalogue-section').hidden = true;
    notice('This portal session is not valid (' + err.message + ') Ask for a new portal link.', true);
  }

  async function start() {
    takeToken();
    if (!state.token) {
      notice('No portal session: open the link your service gave you (it ends in #token=...).', true);
      return;
    }
    $('newer').addEventListener('click', () => { state.page = Math.max(0, state.page - 1); renderDeliveries(); });
    $('older').addEventListener('click', older);
    $('filter-status').addEventListener('change', refreshDeliveries);
    $('filter-type').addEventListener('change', refreshDeliveries);
    $('test-button').addEventListener('click', sendTest);
    try {
      await detectFeatures();
      await loadEndpoints();
      let types = ['account.auth_status_changed', 'account.auth_error'];
      if (state.features.catalogue) {
        try { types = await loadCatalogue(); } catch (err) { if (err instanceof SessionEnded) throw err; }
      }
      fillTypes(types);
      $('test-send').hidden = !state.features.test;
      document.body.setAttribute('data-ready', 'true');
      if (state.endpoints.length) await selectEndpoint(state.endpoints[0].id);
      document.body.setAttribute('data-loaded', 'true');
    } catch (err) {
      if (err instanceof SessionEnded) ended(err);
      else notice('The portal could not load: ' + err.message, true);
      document.body.setAttribute('data-loaded', 'true');
    }
  }

  document.addEventListener('DOMContentLoaded', start);
}());
