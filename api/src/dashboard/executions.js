// attune dashboard: the executions list (status, action and time filters, pagination) and one
// execution's page: its details, parameters, result and output, its retry chain as a
// timeline, its live output while it runs, and the Retry and Cancel buttons, which call the API and show what it answers (shown
// only to a token whose role may use them: operator or admin).

import { STATUSES, between, circuitBadge, el, fill, formatSeconds, formatTime, isTerminal, render, select, statusBadge } from './dom.js';
import { LeftPage, api, errorBox, mayOperate, poll, whoami } from './api.js';
import { liveOutput } from './live.js';

const EXECUTION_POLL_MS = 2000;

const PAGE_SIZE = 25;

const WINDOWS = [['', 'any time'], ['900', 'last 15 minutes'], ['3600', 'last hour'], ['21600', 'last 6 hours'],
  ['86400', 'last 24 hours'], ['604800', 'last 7 days']];

export async function executionsPage() {
  const params = new URLSearchParams(location.search);
  const status = params.get('status') || '';
  const action = params.get('action_ref') || '';
  // only the windows offered; pages after the first keep the first page's bounds (`after`, and
  // `before` just past its newest row, by the server's clock), so rows arriving meanwhile do not
  // shift them
  const since = WINDOWS.some(([value]) => value && value === params.get('window')) ? params.get('window') : '';
  const pinned = (name) => (Number.isNaN(Date.parse(params.get(name) || '')) ? null : params.get(name));
  const before = pinned('before');
  const after = since ? (pinned('after') || new Date(Date.now() - 1000 * Number(since)).toISOString()) : null;
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
  const bulk = el('section', { id: 'bulk-panel' });
  render(el('div', { class: 'title' }, el('h1', {}, 'Executions')), form, bulk, results);

  const query = new URLSearchParams({ limit: String(PAGE_SIZE), offset: String(offset) });
  if (status) query.set('status', status);
  if (action) query.set('action_ref', action);
  if (before) query.set('created_before', before);
  if (after) query.set('created_after', after);
  // what the filters select, for a bulk action on it (by an operator, once a filter is set)
  const filter = {};
  if (status) filter.status = status;
  if (action) filter.action_ref = action;
  if (before) filter.created_before = before;
  if (after) filter.created_after = after;
  whoami().then((me) => {
    if (mayOperate(me.role) && Object.keys(filter).length > 0) fill(bulk, bulkForm(filter));
  }).catch(() => {});
  try {
    const [page, workers, actions] = await Promise.all([api('GET', `/api/v1/executions?${query}`),
      workerNames(), api('GET', '/api/v1/actions')]);
    document.getElementById('actions').replaceChildren(
      ...actions.map((a) => el('option', { value: a.ref })));
    const newest = page.items.length ? new Date(Date.parse(page.items[0].created) + 1).toISOString() : null;
    fill(results, executionTable(page, workers), pager(page, params, { before: before || newest, after }));
  } catch (error) {
    if (error instanceof LeftPage) return;
    results.replaceChildren(errorBox(error));
  }
}

// A bulk action on what the filters select: a preview (a dry run) first, which says how many and
// arms the button that acts on them; a reason is required.
function bulkForm(filter) {
  const outcome = el('div', { id: 'bulk-outcome' });
  const action = select('bulk-action', [['retry', 'retry'], ['cancel', 'cancel'], ['fail', 'fail']], 'retry');
  action.id = 'bulk-action';
  const reason = el('input', { id: 'bulk-reason', placeholder: 'why (required)', size: 30 });
  const apply = el('button', { type: 'button', id: 'bulk-apply', class: 'danger', disabled: true }, 'Apply');
  // Apply acts on no more than the preview showed, and on nothing created since
  let bound = null;
  const call = (dryRun) => api('POST', '/api/v1/executions/bulk', dryRun
    ? { action: action.value, filter, reason: reason.value, dry_run: true, limit: 1000 }
    : { action: action.value, filter: bound.filter, reason: reason.value, dry_run: false, limit: bound.limit });
  const disarm = () => { apply.disabled = true; apply.textContent = 'Apply'; };
  action.addEventListener('change', disarm);
  reason.addEventListener('input', disarm);
  const preview = el('button', { type: 'button', id: 'bulk-preview', class: 'secondary' }, 'Preview');
  preview.addEventListener('click', async () => {
    try {
      const pinned = { ...filter };
      if (!pinned.created_before) pinned.created_before = new Date(Date.now() + 1000).toISOString();
      const dry = await call(true);
      bound = { filter: pinned, limit: Math.max(1, dry.selected.length) };
      fill(outcome, el('p', { 'data-bulk': 'preview' }, `${action.value}: ${dry.selected.length} selected`
        + (dry.more ? ' (more match: apply, then preview again)' : '')));
      apply.disabled = dry.selected.length === 0;
      apply.textContent = `Apply to ${dry.selected.length}`;
    } catch (error) {
      fill(outcome, errorBox(error));
    }
  });
  apply.addEventListener('click', async () => {
    disarm();
    try {
      const done = await call(false);
      fill(outcome, el('div', { class: 'ok', 'data-bulk': 'done' },
        `${action.value}: ${done.done.length} done, ${done.skipped.length} skipped`));
    } catch (error) {
      fill(outcome, errorBox(error));
    }
  });
  return el('div', { class: 'filters' }, el('strong', {}, 'Bulk action on what these filters select: '),
    action, reason, preview, apply, outcome);
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
    // a failure retried already is handled: its retry says where the chain went on
    el('td', { 'data-field': 'status' }, statusBadge(e.status),
      e.retried_by === null || e.retried_by === undefined ? ''
        : el('span', { class: 'muted', 'data-retried-by': e.retried_by }, ' → ', executionLink(e.retried_by))),
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

function pager(page, params, bounds) {
  const link = (offset, text, id) => {
    const next = new URLSearchParams(params);
    next.set('offset', String(offset));
    if (bounds.before) next.set('before', bounds.before);
    if (bounds.after) next.set('after', bounds.after);
    return el('a', { href: `/ui/executions?${next}`, class: 'button secondary', id }, text);
  };
  const first = page.total === 0 ? 0 : page.offset + 1;
  const last = page.offset + page.items.length;
  return el('div', { class: 'pager' },
    page.offset > 0 ? link(Math.max(0, page.offset - page.limit), '← newer', 'page-prev') : null,
    el('span', { id: 'page-range' }, `${first}–${last} of ${page.total}${page.total_exact === false ? '+' : ''}`),
    // a page the byte budget cut short says where the next starts
    // (past the deepest offset the API takes, 10000, only a cursor pages on: narrow the filter)
    page.next_offset !== null && page.next_offset !== undefined && page.next_offset <= 10000
      ? link(page.next_offset, 'older →', 'page-next') : null);
}

export function executionPage(id) {
  const notice = el('div', { id: 'notice' });
  const body = el('div', { id: 'execution' }, el('p', { class: 'muted' }, 'loading…'));
  // while it runs, its output as it comes (`live.js`), outside what each refresh re-renders
  const live = el('div', { id: 'live-holder' });
  render(notice, body, live);
  // one refresh loop at a time: an action starts a new one, and a load of an older loop (whose
  // answers may be older than the action) stops its loop without rendering
  let generation = 0;
  let shown = null;
  // survives re-rendering: a cancel armed by a first click is confirmed by the second
  const ui = { cancelArmed: false, cancelTimer: null, reason: '' };
  const load = async (gen) => {
    const [execution, chain, names, me] = await Promise.all([api('GET', `/api/v1/executions/${id}`),
      api('GET', `/api/v1/executions/${id}/chain?fields=summary`), workerNames(), whoami()]);
    // the action's circuit breaker (gone with a removed action: no badge then)
    const action = await api('GET', `/api/v1/actions/${encodeURIComponent(execution.action_ref)}`).catch(() => null);
    // a workflow run: its steps as a graph
    const graph = execution.runtime === 'workflow'
      ? await api('GET', `/api/v1/workflows/${id}?limit=20`).catch(() => null) : null;
    if (gen !== generation) throw new LeftPage();
    if (!isTerminal(execution.status) && !live.firstChild) live.append(liveOutput(id));
    // re-render only what changed, so a button is not replaced under the user's pointer
    const key = JSON.stringify([execution, chain, [...names], action && action.circuit, me.role, graph]);
    if (key !== shown) {
      shown = key;
      const operate = mayOperate(me.role);
      fill(body, executionView(execution, chain, names, { retry, cancel, ui, operate }, action),
        graph ? workflowView(graph) : null);
    }
    // (a step shows a page of its executions: the rest are in its counts)
  const stepsDone = !graph || graph.steps.every((s) => s.state !== 'running'
    && (!s.items || s.items.in_flight === 0) && s.executions.every((x) => isTerminal(x.status)));
    return chain.attempts.every((a) => isTerminal(a.status)) && isTerminal(execution.status) && stepsDone;
  };
  // refreshes while anything in the chain is still moving, and stops once all of it is finished
  const follow = () => {
    const gen = ++generation;
    poll(EXECUTION_POLL_MS, async () => {
      if (await load(gen)) throw new LeftPage();
    });
  };
  const act = async (what, path) => {
    notice.replaceChildren(el('p', { class: 'muted' }, `${what}…`));
    try {
      const result = await api('POST', path, {}, ui.reason.trim());
      notice.replaceChildren(el('div', { class: 'ok', 'data-notice': what },
        what === 'retry' ? ['Retry requested as ', executionLink(result.id, `execution #${result.id}`),
          ` (${result.retry_reason}).`] : `Execution #${result.id} is ${result.status}.`));
    } catch (error) {
      if (error instanceof LeftPage) return;
      notice.replaceChildren(errorBox(error));
    }
    shown = null; // render afresh, also to re-enable a button whose action the API refused
    follow();
  };
  const retry = () => act('retry', `/api/v1/executions/${id}/retry`);
  const cancel = () => act('cancel', `/api/v1/executions/${id}/cancel`);
  follow();
}

// A workflow run's steps, in the order written: each with its state, what it needs, its items
// and the first of the executions it made (each a link), so the run reads as its graph.
function workflowView(graph) {
  const rows = graph.steps.map((step) => el('tr', { 'data-step': step.name, 'data-state': step.state },
    el('td', {}, step.name, step.phase === 'on-failure' ? el('span', { class: 'muted' }, ' (on-failure)') : null),
    el('td', {}, step.action),
    el('td', {}, el('span', { class: `badge step-${step.state}`, 'data-badge': step.state }, step.state)),
    el('td', {}, step.needs.length ? step.needs.join(', ') : '—'),
    el('td', {}, step.items ? `${step.items.succeeded}/${step.items.total} (${step.items.in_flight} running, ${step.items.failed} failed)` : '—'),
    el('td', {}, formatSeconds(between(step.started, step.finished))),
    el('td', {}, step.executions.map((x) => [executionLink(x.id), ' ', statusBadge(x.status), ' ']),
      step.attempts > step.executions.length
        ? el('span', { class: 'muted' }, `and ${step.attempts - step.executions.length} more`) : null),
    el('td', {}, step.reason || '')));
  return el('section', { id: 'workflow' },
    el('h2', {}, 'Workflow steps'),
    graph.resumes ? el('p', { class: 'muted' }, 'resumes ', executionLink(graph.resumes), ': what it completed is not run again') : null,
    el('table', {}, el('thead', {}, el('tr', {}, ...['step', 'action', 'state', 'needs', 'items', 'took', 'executions', 'reason']
      .map((h) => el('th', {}, h)))), el('tbody', {}, rows)));
}

function fact(label, ...value) {
  return [el('dt', {}, label), el('dd', { 'data-fact': label }, ...value)];
}

function executionView(e, chain, names, actions, action) {
  const retryButton = el('button', { type: 'button', id: 'retry', disabled: !isTerminal(e.status) || e.retried_by !== null,
    title: e.retried_by !== null ? `already retried by #${e.retried_by}` : 'run it again as a manual retry' }, 'Retry');
  retryButton.addEventListener('click', () => {
    retryButton.disabled = true;
    actions.retry();
  });
  const ui = actions.ui;
  // why: sent with a retry or a cancel (the audit trail keeps it; a cancel's record too)
  const reason = el('input', { id: 'action-reason', placeholder: 'why (kept in the audit trail)', size: 28 });
  reason.value = ui.reason;
  reason.addEventListener('input', () => { ui.reason = reason.value; });
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
    // what holds it, while it waits
    e.waiting ? fact('waiting', el('span', { id: 'waiting', 'data-reason': e.waiting.reason },
      e.waiting.message + (e.waiting.paused_by_name ? ` (paused by ${e.waiting.paused_by_name})` : ''))) : null,
    fact('failure kind', e.failure_kind || '—'),
    fact('error', e.error || '—'),
    fact('exit code', e.exit_code === null ? '—' : String(e.exit_code)),
    e.http_status !== null && e.http_status !== undefined ? fact('HTTP status', String(e.http_status)) : null,
    action && (action.circuit || (action.retry_policy && action.retry_policy.circuit))
      ? fact('circuit', circuitBadge(action.circuit)) : null,
    fact('worker', workerLabel(names, e.worker)),
    fact('submitted by', tokenLabel(e.submitted_by_name, e.submitted_by)),
    e.ended_by !== null && e.ended_by !== undefined ? fact('ended by', tokenLabel(e.ended_by_name, e.ended_by)) : null,
    fact('attempt', `${e.retry_count} (max retries ${e.max_retries < 0 ? 'unlimited' : e.max_retries ?? 0})`),
    e.retry_decision ? fact('retry decision', decisionText(e.retry_decision)) : null,
    fact('retry reason', e.retry_reason || '—'),
    fact('retry of', e.original_execution !== null ? ['#', executionLink(e.original_execution, String(e.original_execution))] : '—'),
    fact('retried by', e.retried_by !== null ? ['#', executionLink(e.retried_by, String(e.retried_by))] : '—'),
    e.workflow_run !== null && e.workflow_run !== undefined
      ? fact('workflow', `step ${e.workflow_step}${e.workflow_item ? ` item ${e.workflow_item}` : ''} of run `, executionLink(e.workflow_run)) : null,
    fact('created', formatTime(e.created)),
    fact('started', formatTime(e.started)),
    fact('finished', formatTime(e.finished)),
    fact('duration', formatSeconds(between(e.started, e.finished))),
    e.next_attempt_at ? fact('next attempt at', formatTime(e.next_attempt_at)) : null);
  return [
    el('div', { class: 'title' },
      el('h1', {}, `Execution #${e.id}`, el('span', { class: 'muted' }, ` ${e.action_ref}`)),
      statusBadge(e.status), el('span', { class: 'spacer' }), actions.operate ? [reason, retryButton, cancelButton] : null),
    el('div', { class: 'columns' },
      el('section', {}, el('h2', {}, 'Details'), facts),
      el('section', {}, el('h2', {}, `Retry chain (${chain.total} attempt${chain.total === 1 ? '' : 's'})`),
        timeline(chain.attempts, e.id, names),
        // an answer holds what the API's byte budget allows: a longer chain shows its first attempts
        chain.truncated ? el('p', { class: 'muted', id: 'chain-truncated' },
          `the first ${chain.attempts.length} shown`) : null)),
    block('Parameters', 'parameters', JSON.stringify(e.parameters, null, 2)),
    block('Result', 'result', e.result === null ? null : JSON.stringify(e.result, null, 2)),
    block('stdout', 'stdout', e.stdout),
    block('stderr', 'stderr', e.stderr),
  ];
}

// an API token as the execution names it: its name and id ("—" when no token asked)
function tokenLabel(name, id) {
  if (id === null || id === undefined) return '—';
  return name ? `${name} (token #${id})` : `token #${id}`;
}

// what the RetryManager decided for a failed attempt (its reason names the rule that matched)
function decisionText(d) {
  return d.reason;
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
      `failed: ${a.failure_kind}${a.exit_code !== null ? ` (exit ${a.exit_code})` : ''}`
      + `${a.http_status !== null && a.http_status !== undefined ? ` (HTTP ${a.http_status})` : ''}`) : null,
    a.retry_decision ? el('div', { 'data-field': 'decision' }, `decision: ${decisionText(a.retry_decision)}`) : null,
    when);
  }));
}
