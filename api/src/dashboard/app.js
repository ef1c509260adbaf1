// attune dashboard: renders the page for the current /ui path from the JSON API.
//
// It owns the login form (the token lives in sessionStorage only), the API calls (every one with
// `Authorization: Bearer <token>`; a 401 clears the token and returns to the login form with the
// API's message), and the pages: workers (polled every 3 s), executions (filters, pagination),
// one execution with its retry chain (Retry and Cancel call the API), and retry charts drawn as
// inline SVG. Data only ever reaches the DOM as text (textContent, text nodes, attributes), never
// as HTML.
'use strict';

(function () {
  const TOKEN_KEY = 'attune.token';
  const REFUSAL_KEY = 'attune.refusal';
  const WORKERS_POLL_MS = 3000;
  const EXECUTION_POLL_MS = 2000;
  const RETRIES_POLL_MS = 15000;
  const PAGE_SIZE = 25;
  const TERMINAL = ['completed', 'failed', 'timeout', 'canceled', 'abandoned'];
  const STATUSES = ['requested', 'scheduling', 'scheduled', 'running', 'delayed', 'completed', 'failed',
    'timeout', 'canceled', 'abandoned'];
  const SVG_NS = 'http://www.w3.org/2000/svg';

  // ---- DOM helpers: text only -------------------------------------------------------------

  function append(node, children) {
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      if (Array.isArray(child)) append(node, child);
      else if (child instanceof Node) node.appendChild(child);
      else node.appendChild(document.createTextNode(String(child)));
    }
    return node;
  }

  function setAttributes(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'onclick' || key === 'onsubmit' || key === 'onchange') {
        node.addEventListener(key.slice(2), value);
      } else {
        node.setAttribute(key, value === true ? '' : String(value));
      }
    }
    return node;
  }

  function el(tag, attrs, ...children) {
    return append(setAttributes(document.createElement(tag), attrs), children);
  }

  function svg(tag, attrs, ...children) {
    return append(setAttributes(document.createElementNS(SVG_NS, tag), attrs), children);
  }

  /** Replaces the children of `node` (arrays are flattened; strings become text). */
  function fill(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }

  function main() {
    return document.getElementById('main');
  }

  function render(...children) {
    main().replaceChildren(...children.flat().filter((c) => c));
  }

  // ---- formatting -------------------------------------------------------------------------

  function pad(n) {
    return String(n).padStart(2, '0');
  }

  function formatTime(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
      `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
  }

  function formatClock(date) {
    return `${pad(date.getUTCHours())}:${pad(date.getUTCMinutes())}:${pad(date.getUTCSeconds())}`;
  }

  function formatSeconds(seconds) {
    if (seconds === null || seconds === undefined) return '—';
    if (seconds < 10) return `${seconds.toFixed(2)} s`;
    if (seconds < 60) return `${seconds.toFixed(1)} s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${pad(Math.floor(seconds % 60))}s`;
    return `${Math.floor(seconds / 3600)}h ${pad(Math.floor((seconds % 3600) / 60))}m`;
  }

  function formatPercent(value) {
    return value === null || value === undefined ? '—' : `${Number(value).toFixed(1)} %`;
  }

  function between(from, to) {
    return from && to ? (new Date(to) - new Date(from)) / 1000 : null;
  }

  function badge(kind, text) {
    return el('span', { class: `badge ${kind}-${text}`, 'data-badge': text }, text);
  }

  function statusBadge(status) {
    return badge('status', status);
  }

  function healthBadge(health) {
    return el('span', { class: `badge health-${health}`, 'data-health': health },
      el('span', { class: 'dot', 'aria-hidden': 'true' }), health);
  }

  function isTerminal(status) {
    return TERMINAL.includes(status);
  }

  // ---- the API ----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /** Thrown after a 401 has sent the browser to the login form: nothing more is rendered. */
  class LeftPage extends Error {}

  async function request(method, path, token, body) {
    const headers = { Authorization: `Bearer ${token}` };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new ApiError(0, 'unreachable', `the API is unreachable (${error.message})`);
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const detail = data && data.error ? data.error : {};
      throw new ApiError(response.status, detail.code || `http_${response.status}`,
        detail.message || text || response.statusText);
    }
    return data;
  }

  async function api(method, path, body) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) {
      toLogin(null);
      throw new LeftPage();
    }
    try {
      return await request(method, path, token, body);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        toLogin(`The API refused the token: ${error.message}`);
        throw new LeftPage();
      }
      throw error;
    }
  }

  function toLogin(message) {
    if (message) sessionStorage.setItem(REFUSAL_KEY, message);
    const next = location.pathname + location.search;
    location.replace(`/ui/login?next=${encodeURIComponent(next)}`);
  }

  function errorBox(error) {
    const text = error instanceof ApiError
      ? `${error.message} (${error.status ? `HTTP ${error.status}, ` : ''}${error.code})`
      : String(error.message || error);
    return el('div', { class: 'error', role: 'alert', 'data-error': error.code || 'error' }, text);
  }

  /** Runs `load` now and every `ms` after the previous run ends; errors show above the page. */
  function poll(ms, load) {
    let stopped = false;
    const run = async () => {
      try {
        await load();
        document.getElementById('poll-error')?.remove();
      } catch (error) {
        if (error instanceof LeftPage) {
          stopped = true;
          return;
        }
        const box = errorBox(error);
        box.id = 'poll-error';
        const existing = document.getElementById('poll-error');
        if (existing) existing.replaceWith(box);
        else main().prepend(box);
      }
      if (!stopped) setTimeout(run, ms);
    };
    run();
  }

  // ---- login ------------------------------------------------------------------------------

  function safeNext() {
    const next = new URLSearchParams(location.search).get('next') || '';
    return /^\/ui\/[A-Za-z0-9/_?=&%.:+-]*$/.test(next) && !next.startsWith('/ui/login') ? next : '/ui/workers';
  }

  function loginPage() {
    const refusal = sessionStorage.getItem(REFUSAL_KEY);
    sessionStorage.removeItem(REFUSAL_KEY);
    const message = el('div', { id: 'login-message', role: 'alert' });
    if (refusal) message.replaceChildren(el('div', { class: 'error', 'data-error': 'unauthorized' }, refusal));
    const input = el('input', {
      id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true,
      placeholder: 'the token from attune token create',
    });
    const form = el('form', { id: 'login', class: 'login' },
      el('h1', {}, 'attune'),
      el('p', { class: 'muted' }, 'Sign in with an API token (for a local system: the contents of .attune/token).'),
      el('label', { for: 'token' }, 'API token'), input,
      el('button', { type: 'submit', id: 'login-submit' }, 'Sign in'),
      message);
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const token = input.value.trim();
      message.replaceChildren(el('p', { class: 'muted' }, 'checking the token…'));
      try {
        await request('GET', '/api/v1/stats/workers', token);
      } catch (error) {
        const text = error instanceof ApiError && error.status === 401
          ? `The API refused the token: ${error.message}` : null;
        message.replaceChildren(text ? el('div', { class: 'error', 'data-error': 'unauthorized' }, text) : errorBox(error));
        return;
      }
      sessionStorage.setItem(TOKEN_KEY, token);
      location.assign(safeNext());
    });
    render(form);
    input.focus();
  }

  // ---- workers ----------------------------------------------------------------------------

  function workersPage() {
    const updated = el('span', { class: 'muted', id: 'updated' });
    const summary = el('section', { id: 'worker-summary' });
    const table = el('section', { id: 'worker-table' });
    render(el('div', { class: 'title' }, el('h1', {}, 'Workers'), updated), summary, table);
    poll(WORKERS_POLL_MS, async () => {
      const [workers, stats] = await Promise.all([api('GET', '/api/v1/workers'), api('GET', '/api/v1/stats/workers')]);
      fill(summary, workerSummary(stats));
      fill(table, workerTable(workers));
      updated.textContent = `updated ${formatClock(new Date())} · refreshes every ${WORKERS_POLL_MS / 1000} s`;
    });
  }

  function card(label, value, attrs, note) {
    return el('div', Object.assign({ class: 'card' }, attrs || {}),
      el('div', { class: 'card-value' }, value), el('div', { class: 'card-label' }, label),
      note ? el('div', { class: 'card-note' }, note) : null);
  }

  function workerSummary(stats) {
    const alerts = [];
    if (stats.alerts.unhealthy_over_half) {
      alerts.push(el('div', { class: 'alert', 'data-alert': 'unhealthy_over_half' },
        'Alert: more than half of the active workers are unhealthy (threshold 50 %)'));
    }
    if (stats.alerts.high_average_queue_depth) {
      alerts.push(el('div', { class: 'alert', 'data-alert': 'high_average_queue_depth' },
        'Alert: average queue depth is above 20'));
    }
    const rate = stats.average_failure_rate === null ? '—' : formatPercent(100 * stats.average_failure_rate);
    return [
      el('div', { class: 'cards' },
        card('healthy', String(stats.healthy), { class: 'card class-healthy', 'data-count': 'healthy' }),
        card('degraded', String(stats.degraded), { class: 'card class-degraded', 'data-count': 'degraded' }),
        card('unhealthy', String(stats.unhealthy), { class: 'card class-unhealthy', 'data-count': 'unhealthy' }),
        card('active workers', String(stats.active_workers), { 'data-count': 'active' }),
        card('average queue depth', stats.average_queue_depth === null ? '—' : stats.average_queue_depth.toFixed(1),
          { class: stats.alerts.high_average_queue_depth ? 'card alerting' : 'card' }, 'alert above 20'),
        card('average failure rate', rate, {}, 'active workers that ran anything')),
      alerts,
    ];
  }

  function workerTable(workers) {
    if (workers.length === 0) return el('p', { class: 'empty' }, 'No worker has registered yet.');
    const rows = workers.map((worker) => {
      const health = (worker.capabilities && worker.capabilities.health) || {};
      const total = health.total_executions || 0;
      const failed = health.failed_executions || 0;
      const failureRate = total > 0 ? `${((100 * failed) / total).toFixed(1)} % (${failed}/${total})` : `— (0 runs)`;
      return el('tr', { 'data-worker': worker.name },
        el('td', { class: 'name' }, worker.name, el('span', { class: 'muted' }, ` #${worker.id}`)),
        el('td', {}, worker.status),
        el('td', {}, healthBadge(worker.health)),
        el('td', { class: 'num', 'data-field': 'queue_depth' }, String(worker.queue_depth)),
        el('td', { class: 'num', 'data-field': 'failure_rate' }, failureRate),
        el('td', { class: 'num', 'data-field': 'consecutive_failures' }, String(health.consecutive_failures ?? 0)),
        el('td', { class: 'num', 'data-field': 'heartbeat_age' }, formatSeconds(worker.heartbeat_age_secs)),
        el('td', { 'data-field': 'runtimes' }, (worker.runtimes || []).join(', ')));
    });
    return el('table', { class: 'grid' },
      el('thead', {}, el('tr', {}, ['worker', 'status', 'health', 'queue depth', 'failure rate',
        'consecutive failures', 'heartbeat age', 'runtimes'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows));
  }

  // ---- executions -------------------------------------------------------------------------

  const WINDOWS = [['', 'any time'], ['900', 'last 15 minutes'], ['3600', 'last hour'], ['21600', 'last 6 hours'],
    ['86400', 'last 24 hours'], ['604800', 'last 7 days']];

  function select(name, options, selected) {
    return el('select', { name, id: `filter-${name}` },
      options.map(([value, label]) => el('option', { value, selected: value === selected }, label)));
  }

  async function executionsPage() {
    const params = new URLSearchParams(location.search);
    const status = params.get('status') || '';
    const action = params.get('action_ref') || '';
    const since = params.get('window') || '';
    const offset = Math.max(0, parseInt(params.get('offset') || '0', 10) || 0);
    const form = el('form', { class: 'filters', id: 'filters', method: 'get', action: '/ui/executions' },
      el('label', {}, 'status ', select('status', [['', 'any']].concat(STATUSES.map((s) => [s, s])), status)),
      el('label', {}, 'action ', el('input', { name: 'action_ref', id: 'filter-action_ref', value: action,
        placeholder: 'pack.action', list: 'actions' })),
      el('datalist', { id: 'actions' }),
      el('label', {}, 'created ', select('window', WINDOWS, since)),
      el('button', { type: 'submit', id: 'filter-apply' }, 'Apply'),
      el('a', { href: '/ui/executions', class: 'button secondary' }, 'Clear'));
    const results = el('section', { id: 'execution-results' }, el('p', { class: 'muted' }, 'loading…'));
    render(el('div', { class: 'title' }, el('h1', {}, 'Executions')), form, results);

    const query = new URLSearchParams({ limit: String(PAGE_SIZE), offset: String(offset) });
    if (status) query.set('status', status);
    if (action) query.set('action_ref', action);
    if (since) query.set('created_after', new Date(Date.now() - 1000 * Number(since)).toISOString());
    try {
      const [page, workers, actions] = await Promise.all([api('GET', `/api/v1/executions?${query}`),
        workerNames(), api('GET', '/api/v1/actions')]);
      document.getElementById('actions').replaceChildren(
        ...actions.map((a) => el('option', { value: a.ref })));
      fill(results, executionTable(page, workers), pager(page, params));
    } catch (error) {
      if (error instanceof LeftPage) return;
      results.replaceChildren(errorBox(error));
    }
  }

  async function workerNames() {
    const workers = await api('GET', '/api/v1/workers');
    return new Map(workers.map((w) => [w.id, w.name]));
  }

  function workerLabel(names, id) {
    if (id === null || id === undefined) return '—';
    return names.get(id) || `#${id}`;
  }

  function executionLink(id, text) {
    return el('a', { href: `/ui/executions/${encodeURIComponent(id)}` }, text || `#${id}`);
  }

  function executionTable(page, names) {
    if (page.items.length === 0) return el('p', { class: 'empty', id: 'no-executions' }, 'No execution matches these filters.');
    const rows = page.items.map((e) => el('tr', { 'data-execution': e.id, 'data-status': e.status },
      el('td', { class: 'num' }, executionLink(e.id)),
      el('td', {}, e.action_ref),
      el('td', {}, statusBadge(e.status)),
      el('td', {}, e.failure_kind || ''),
      el('td', { class: 'num' }, `${e.retry_count} / ${e.max_retries ?? 0}`),
      el('td', {}, e.retry_reason || ''),
      el('td', {}, workerLabel(names, e.worker)),
      el('td', {}, formatTime(e.created)),
      el('td', { class: 'num' }, formatSeconds(between(e.started, e.finished)))));
    return el('table', { class: 'grid', id: 'executions' },
      el('thead', {}, el('tr', {}, ['id', 'action', 'status', 'failure', 'attempt / max retries', 'retry reason',
        'worker', 'created', 'duration'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows));
  }

  function pager(page, params) {
    const link = (offset, text, id) => {
      const next = new URLSearchParams(params);
      next.set('offset', String(offset));
      return el('a', { href: `/ui/executions?${next}`, class: 'button secondary', id }, text);
    };
    const first = page.total === 0 ? 0 : page.offset + 1;
    const last = page.offset + page.items.length;
    return el('div', { class: 'pager' },
      page.offset > 0 ? link(Math.max(0, page.offset - page.limit), '← newer', 'page-prev') : null,
      el('span', { id: 'page-range' }, `${first}–${last} of ${page.total}`),
      last < page.total ? link(page.offset + page.limit, 'older →', 'page-next') : null);
  }

  // ---- one execution ----------------------------------------------------------------------

  function executionPage(id) {
    const notice = el('div', { id: 'notice' });
    const body = el('div', { id: 'execution' }, el('p', { class: 'muted' }, 'loading…'));
    render(notice, body);
    let polling = false;
    let shown = null;
    // survives re-rendering: a cancel armed by a first click is confirmed by the second
    const ui = { cancelArmed: false, cancelTimer: null };
    const load = async () => {
      const [execution, chain, names] = await Promise.all([api('GET', `/api/v1/executions/${id}`),
        api('GET', `/api/v1/executions/${id}/chain`), workerNames()]);
      // re-render only what changed, so a button is not replaced under the user's pointer
      const key = JSON.stringify([execution, chain, [...names]]);
      if (key !== shown) {
        shown = key;
        fill(body, executionView(execution, chain, names, { retry, cancel, ui }));
      }
      return chain.attempts.every((a) => isTerminal(a.status)) && isTerminal(execution.status);
    };
    // refreshes while anything in the chain is still moving, and stops once all of it is finished
    const follow = () => {
      if (polling) return;
      polling = true;
      poll(EXECUTION_POLL_MS, async () => {
        if (await load()) {
          polling = false;
          throw new LeftPage();
        }
      });
    };
    const act = async (what, path) => {
      notice.replaceChildren(el('p', { class: 'muted' }, `${what}…`));
      try {
        const result = await api('POST', path, {});
        notice.replaceChildren(el('div', { class: 'ok', 'data-notice': what },
          what === 'retry' ? ['Retry requested as ', executionLink(result.id, `execution #${result.id}`),
            ` (${result.retry_reason}).`] : `Execution #${result.id} is ${result.status}.`));
      } catch (error) {
        if (error instanceof LeftPage) return;
        notice.replaceChildren(errorBox(error));
      }
      shown = null; // render afresh, also to re-enable a button whose action the API refused
      follow();
      if (polling) await load().catch(() => {});
    };
    const retry = () => act('retry', `/api/v1/executions/${id}/retry`);
    const cancel = () => act('cancel', `/api/v1/executions/${id}/cancel`);
    follow();
  }

  function fact(label, ...value) {
    return [el('dt', {}, label), el('dd', { 'data-fact': label }, ...value)];
  }

  function executionView(e, chain, names, actions) {
    const retryButton = el('button', { type: 'button', id: 'retry', disabled: !isTerminal(e.status) || e.retried_by !== null,
      title: e.retried_by !== null ? `already retried by #${e.retried_by}` : 'run it again as a manual retry' }, 'Retry');
    retryButton.addEventListener('click', () => {
      retryButton.disabled = true;
      actions.retry();
    });
    const ui = actions.ui;
    const cancelButton = el('button', { type: 'button', id: 'cancel', class: 'danger', disabled: isTerminal(e.status) },
      ui.cancelArmed ? 'Confirm cancel' : 'Cancel');
    // a cancel kills a running process: it takes a second click (within 5 s) to confirm
    cancelButton.addEventListener('click', () => {
      if (!ui.cancelArmed) {
        ui.cancelArmed = true;
        cancelButton.textContent = 'Confirm cancel';
        ui.cancelTimer = setTimeout(() => {
          ui.cancelArmed = false;
          const current = document.getElementById('cancel');
          if (current) current.textContent = 'Cancel';
        }, 5000);
        return;
      }
      clearTimeout(ui.cancelTimer);
      ui.cancelArmed = false;
      cancelButton.disabled = true;
      actions.cancel();
    });
    const facts = el('dl', { class: 'facts' },
      fact('status', statusBadge(e.status)),
      fact('failure kind', e.failure_kind || '—'),
      fact('error', e.error || '—'),
      fact('exit code', e.exit_code === null ? '—' : String(e.exit_code)),
      fact('worker', workerLabel(names, e.worker)),
      fact('attempt', `${e.retry_count} (max retries ${e.max_retries ?? 0})`),
      fact('retry reason', e.retry_reason || '—'),
      fact('retry of', e.original_execution !== null ? ['#', executionLink(e.original_execution, String(e.original_execution))] : '—'),
      fact('retried by', e.retried_by !== null ? ['#', executionLink(e.retried_by, String(e.retried_by))] : '—'),
      fact('created', formatTime(e.created)),
      fact('started', formatTime(e.started)),
      fact('finished', formatTime(e.finished)),
      fact('duration', formatSeconds(between(e.started, e.finished))),
      e.next_attempt_at ? fact('next attempt at', formatTime(e.next_attempt_at)) : null);
    return [
      el('div', { class: 'title' },
        el('h1', {}, `Execution #${e.id}`, el('span', { class: 'muted' }, ` ${e.action_ref}`)),
        statusBadge(e.status), el('span', { class: 'spacer' }), retryButton, cancelButton),
      el('div', { class: 'columns' },
        el('section', {}, el('h2', {}, 'Details'), facts),
        el('section', {}, el('h2', {}, `Retry chain (${chain.attempts.length} attempt${chain.attempts.length === 1 ? '' : 's'})`),
          timeline(chain.attempts, e.id, names))),
      block('Parameters', 'parameters', JSON.stringify(e.parameters, null, 2)),
      block('Result', 'result', e.result === null ? null : JSON.stringify(e.result, null, 2)),
      block('stdout', 'stdout', e.stdout),
      block('stderr', 'stderr', e.stderr),
    ];
  }

  function block(title, id, text) {
    return el('section', {}, el('h2', {}, title),
      text ? el('pre', { id }, text) : el('p', { class: 'muted', id }, 'none'));
  }

  function timeline(attempts, current, names) {
    return el('ol', { class: 'timeline', id: 'chain' }, attempts.map((a) => {
      const gap = a.retry_count === 0 && a.original_execution === null
        ? el('div', { class: 'gap', 'data-field': 'gap' }, 'first attempt')
        : el('div', { class: 'gap', 'data-field': 'gap' },
          `backoff ${formatSeconds(a.backoff_secs)}`,
          a.gap_secs !== null ? ` · waited ${formatSeconds(a.gap_secs)} before starting` : '');
      const when = a.status === 'delayed'
        ? el('div', { class: 'next', 'data-field': 'next' }, `next attempt at ${formatTime(a.not_before)}`)
        : el('div', { class: 'muted' }, `${formatTime(a.started)} → ${formatTime(a.finished)}`);
      return el('li', { class: `attempt status-${a.status}${a.id === current ? ' current' : ''}`,
        'data-execution': a.id, 'data-attempt': a.retry_count },
      el('div', { class: 'attempt-head' },
        el('strong', {}, `attempt ${a.retry_count}`), ' ', executionLink(a.id), ' ', statusBadge(a.status),
        a.id === current ? el('span', { class: 'muted' }, ' (this page)') : null),
      el('div', { 'data-field': 'reason' }, a.retry_reason ? `reason: ${a.retry_reason}` : 'reason: —'),
      gap,
      el('div', { 'data-field': 'worker' }, `worker: ${workerLabel(names, a.worker)}`),
      a.failure_kind ? el('div', { 'data-field': 'failure' },
        `failed: ${a.failure_kind}${a.exit_code !== null ? ` (exit ${a.exit_code})` : ''}`) : null,
      when);
    }));
  }

  // ---- retries ----------------------------------------------------------------------------

  const RETRY_WINDOWS = [['300', 'last 5 minutes'], ['900', 'last 15 minutes'], ['3600', 'last hour'], ['21600', 'last 6 hours'], ['86400', 'last 24 hours'],
    ['604800', 'last 7 days']];
  const REASON_COLOURS = ['#0969da', '#bf8700', '#8250df', '#1a7f37', '#cf222e', '#57606a', '#e16f24', '#1b7c83'];

  function retriesPage() {
    const params = new URLSearchParams(location.search);
    const since = RETRY_WINDOWS.some(([v]) => v === params.get('window')) ? params.get('window') : '3600';
    const form = el('form', { class: 'filters', method: 'get', action: '/ui/retries' },
      el('label', {}, 'window ', select('window', RETRY_WINDOWS, since)),
      el('button', { type: 'submit' }, 'Apply'));
    const updated = el('span', { class: 'muted', id: 'updated' });
    const summary = el('section', { id: 'retry-summary' });
    const charts = el('section', { id: 'retry-charts' });
    const reasons = el('section', { id: 'retry-reasons' });
    render(el('div', { class: 'title' }, el('h1', {}, 'Retries'), updated), form, summary, charts, reasons);
    poll(RETRIES_POLL_MS, async () => {
      const [stats, series] = await Promise.all([api('GET', `/api/v1/stats/retries?window_secs=${since}`),
        api('GET', `/api/v1/stats/retries/series?window_secs=${since}&buckets=30`)]);
      fill(summary, retrySummary(stats, series.thresholds));
      fill(charts, retryCharts(series));
      fill(reasons, reasonTable(stats));
      updated.textContent = `updated ${formatClock(new Date())}`;
    });
  }

  function retrySummary(stats, thresholds) {
    const alerts = [];
    if (stats.alerts.high_retry_rate) {
      alerts.push(el('div', { class: 'alert', 'data-alert': 'high_retry_rate' },
        `Alert: retry rate is above ${thresholds.retry_rate_percent} %`));
    }
    if (stats.alerts.low_retry_success_rate) {
      alerts.push(el('div', { class: 'alert', 'data-alert': 'low_retry_success_rate' },
        `Alert: retry success rate is below ${thresholds.retry_success_percent} %`));
    }
    return [
      el('div', { class: 'cards' },
        card('retry rate', formatPercent(stats.retry_rate),
          { class: stats.alerts.high_retry_rate ? 'card alerting' : 'card', 'data-stat': 'retry_rate' },
          `alert above ${thresholds.retry_rate_percent} %`),
        card('retry success rate', formatPercent(stats.retry_success_rate),
          { class: stats.alerts.low_retry_success_rate ? 'card alerting' : 'card', 'data-stat': 'retry_success_rate' },
          `alert below ${thresholds.retry_success_percent} %`),
        card('original executions', String(stats.original_executions), { 'data-stat': 'original_executions' }),
        card('retries', String(stats.retry_executions), { 'data-stat': 'retry_executions' }),
        card('retries per execution', stats.average_retries_per_execution === null ? '—'
          : stats.average_retries_per_execution.toFixed(2), {})),
      alerts,
    ];
  }

  function reasonTable(stats) {
    if (stats.reasons.length === 0) return el('p', { class: 'empty' }, 'No retries in this window.');
    return [el('h2', {}, 'Reasons'), el('table', { class: 'grid', id: 'reasons' },
      el('thead', {}, el('tr', {}, ['reason', 'retries', 'succeeded', 'success rate'].map((h) => el('th', {}, h)))),
      el('tbody', {}, stats.reasons.map((r) => el('tr', { 'data-reason': r.reason },
        el('td', {}, r.reason), el('td', { class: 'num' }, String(r.total)),
        el('td', { class: 'num' }, String(r.succeeded)), el('td', { class: 'num' }, formatPercent(r.success_rate))))))];
  }

  function retryCharts(series) {
    const t = series.thresholds;
    const reasons = [...new Set(series.buckets.flatMap((b) => Object.keys(b.reasons)))].sort();
    const colours = new Map(reasons.map((r, i) => [r, REASON_COLOURS[i % REASON_COLOURS.length]]));
    const bucketLabel = (b) => `${formatClock(new Date(b.start))} + ${formatSeconds(series.bucket_secs)}`;
    return [
      chartBox('Retry rate over time', 'retries per 100 original executions created in each bucket',
        barChart('retry-rate', series, (b) => (b.retry_rate === null ? [] : [{ value: b.retry_rate, colour: '#0969da' }]),
          { value: t.retry_rate_percent, label: `alert above ${t.retry_rate_percent} %`, unit: '%', floor: 100 },
          (b) => `${bucketLabel(b)}: ${b.retry_executions} retries / ${b.original_executions} originals (${formatPercent(b.retry_rate)})`)),
      chartBox('Retry success rate over time', 'finished retries created in each bucket that completed',
        barChart('retry-success', series,
          (b) => (b.retry_success_rate === null ? [] : [{ value: b.retry_success_rate, colour: '#1a7f37' }]),
          { value: t.retry_success_percent, label: `alert below ${t.retry_success_percent} %`, unit: '%', floor: 100, max: 100 },
          (b) => `${bucketLabel(b)}: ${formatPercent(b.retry_success_rate)} succeeded`)),
      chartBox('Retries by reason over time', 'retries created in each bucket, by retry reason',
        barChart('retry-reasons', series,
          (b) => reasons.filter((r) => b.reasons[r]).map((r) => ({ value: b.reasons[r], colour: colours.get(r), reason: r })),
          { floor: 4, integer: true },
          (b) => `${bucketLabel(b)}: ${reasons.filter((r) => b.reasons[r]).map((r) => `${r} ${b.reasons[r]}`).join(', ') || 'none'}`),
        el('div', { class: 'legend' }, reasons.length === 0 ? el('span', { class: 'muted' }, 'no retries in this window')
          : reasons.map((r) => el('span', { class: 'legend-item', 'data-reason': r },
            svg('svg', { class: 'swatch', viewBox: '0 0 10 10', 'aria-hidden': 'true' },
              svg('rect', { width: 10, height: 10, rx: 2, fill: colours.get(r) })), r)))),
    ];
  }

  function chartBox(title, subtitle, chart, legend) {
    return el('figure', { class: 'chart' }, el('figcaption', {}, el('strong', {}, title), ' ',
      el('span', { class: 'muted' }, subtitle)), chart, legend || null);
  }

  /**
   * A bar chart over the series' buckets: `stack(bucket)` gives the bar's segments bottom-up,
   * `options.value` draws a dashed threshold line, `tooltip(bucket)` titles each bucket.
   */
  function barChart(name, series, stack, options, tooltip) {
    const width = 1200;
    const height = 200;
    const left = 44;
    const right = 12;
    const top = 14;
    const bottom = 28;
    const plotWidth = width - left - right;
    const plotHeight = height - top - bottom;
    const totals = series.buckets.map((b) => stack(b).reduce((sum, s) => sum + s.value, 0));
    let max = Math.max(options.floor || 1, options.value || 0, ...totals);
    if (options.max) max = Math.min(max, options.max);
    max = options.integer ? Math.ceil(max) : niceCeiling(max);
    const y = (v) => top + plotHeight - (Math.min(v, max) / max) * plotHeight;
    const slot = plotWidth / series.buckets.length;
    const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart-svg', 'data-chart': name,
      role: 'img', 'aria-label': name });
    for (let i = 0; i <= 4; i += 1) {
      const v = (max * i) / 4;
      const label = options.integer ? String(Math.round(v)) : `${Math.round(v)}${options.unit || ''}`;
      chart.appendChild(svg('line', { x1: left, x2: width - right, y1: y(v), y2: y(v), class: 'gridline' }));
      chart.appendChild(svg('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, label));
    }
    series.buckets.forEach((b, i) => {
      const x = left + i * slot + slot * 0.15;
      const group = svg('g', { 'data-bucket': i }, svg('title', {}, tooltip(b)));
      // an invisible full-height target so every bucket has its tooltip
      group.appendChild(svg('rect', { x: left + i * slot, y: top, width: slot, height: plotHeight, class: 'hover' }));
      let base = 0;
      for (const segment of stack(b)) {
        const rect = svg('rect', { x, width: slot * 0.7, y: y(base + segment.value),
          height: Math.max(1, y(base) - y(base + segment.value)), fill: segment.colour, class: 'bar' });
        if (segment.reason) rect.setAttribute('data-reason', segment.reason);
        group.appendChild(rect);
        base += segment.value;
      }
      chart.appendChild(group);
    });
    const ticks = [0, Math.floor(series.buckets.length / 2), series.buckets.length - 1];
    for (const i of [...new Set(ticks)]) {
      const b = series.buckets[i];
      if (!b) continue;
      chart.appendChild(svg('text', { x: left + i * slot + slot / 2, y: height - 8, 'text-anchor': 'middle', class: 'axis' },
        formatClock(new Date(b.start)).slice(0, 5)));
    }
    if (options.value !== undefined) {
      const ty = y(options.value);
      chart.appendChild(svg('line', { x1: left, x2: width - right, y1: ty, y2: ty, class: 'threshold',
        'data-threshold': String(options.value) }));
      chart.appendChild(svg('text', { x: left + 6, y: ty - 5, class: 'threshold-label' }, options.label));
    }
    chart.appendChild(svg('line', { x1: left, x2: width - right, y1: top + plotHeight, y2: top + plotHeight, class: 'baseline' }));
    return chart;
  }

  function niceCeiling(v) {
    const step = v <= 100 ? 25 : v <= 400 ? 100 : 10 ** Math.floor(Math.log10(v));
    return Math.ceil(v / step) * step;
  }

  // ---- routing ----------------------------------------------------------------------------

  function route() {
    const path = location.pathname.replace(/\/+$/, '');
    if (path === '/ui/login') {
      loginPage();
      return;
    }
    if (!sessionStorage.getItem(TOKEN_KEY)) {
      toLogin(null);
      return;
    }
    document.getElementById('top').hidden = false;
    document.getElementById('logout').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.assign('/ui/login');
    });
    const section = path.split('/')[2] || 'workers';
    document.querySelector(`[data-nav="${section}"]`)?.classList.add('active');
    const execution = path.match(/^\/ui\/executions\/(\d+)$/);
    if (execution) {
      document.title = `attune · execution #${execution[1]}`;
      executionPage(execution[1]);
    } else if (section === 'executions') {
      document.title = 'attune · executions';
      executionsPage();
    } else if (section === 'retries') {
      document.title = 'attune · retries';
      retriesPage();
    } else {
      document.title = 'attune · workers';
      workersPage();
    }
  }

  document.addEventListener('DOMContentLoaded', route);
}());
