// attune dashboard: the workers page. Every worker with its health class (colour and text),
// queue depth, failure rate, consecutive failures, heartbeat age and runtimes, and the counts by
// class with the quick reference's alerts; operators drain and undrain workers; polled every few
// seconds.

import { card, el, fill, formatClock, formatPercent, formatSeconds, formatTime, healthBadge, render } from './dom.js';
import { api, errorBox, mayOperate, poll, whoami } from './api.js';

const WORKERS_POLL_MS = 3000;

export function workersPage() {
  const updated = el('span', { class: 'muted', id: 'updated' });
  const summary = el('section', { id: 'worker-summary' });
  const table = el('section', { id: 'worker-table' });
  const paused = el('section', { id: 'pauses' });
  const pausing = el('section', { id: 'pause-form' });
  const limited = el('section', { id: 'concurrency' });
  const limiting = el('section', { id: 'concurrency-form' });
  render(el('div', { class: 'title' }, el('h1', {}, 'Workers'), updated), summary, table, paused, pausing, limited,
    limiting);
  let operate = false;
  whoami().then((me) => {
    operate = mayOperate(me.role);
    if (operate) {
      fill(pausing, pauseForm());
      fill(limiting, concurrencyForm());
    }
  }).catch(() => {});
  poll(WORKERS_POLL_MS, async () => {
    const [workers, stats, pauses, actions] = await Promise.all([api('GET', '/api/v1/workers'),
      api('GET', '/api/v1/stats/workers'), api('GET', '/api/v1/pauses'), api('GET', '/api/v1/actions')]);
    fill(summary, workerSummary(stats));
    fill(table, workerTable(workers, operate));
    fill(paused, pauseTable(pauses, operate));
    fill(limited, concurrencyTable(actions, operate));
    updated.textContent = `updated ${formatClock(new Date())} · refreshes every ${WORKERS_POLL_MS / 1000} s`;
  });
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

// Drain (it finishes what it runs and holds, and is dispatched nothing new) or undrain a worker.
function drainButton(worker) {
  const drained = worker.drained_at !== null && worker.drained_at !== undefined;
  const button = el('button', { type: 'button', class: 'secondary',
    [drained ? 'data-undrain' : 'data-drain']: worker.name }, drained ? 'Undrain' : 'Drain');
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      const w = await api(drained ? 'DELETE' : 'PUT', `/api/v1/workers/${encodeURIComponent(worker.name)}/drain`);
      button.closest('tr').querySelector('[data-field=status]').textContent = workerStatus(w);
      button.replaceWith(drainButton(w));
    } catch (error) {
      button.replaceWith(errorBox(error));
    }
  });
  return button;
}

function workerStatus(worker) {
  return worker.drained_at ? `${worker.status} (drained since ${formatTime(worker.drained_at)})` : worker.status;
}

function workerTable(workers, operate) {
  if (workers.length === 0) return el('p', { class: 'empty' }, 'No worker has registered yet.');
  const rows = workers.map((worker) => {
    const health = (worker.capabilities && worker.capabilities.health) || {};
    const total = health.total_executions || 0;
    const failed = health.failed_executions || 0;
    const failureRate = total > 0 ? `${((100 * failed) / total).toFixed(1)} % (${failed}/${total})` : `— (0 runs)`;
    return el('tr', { 'data-worker': worker.name },
      el('td', { class: 'name' }, worker.name, el('span', { class: 'muted' }, ` #${worker.id}`)),
      el('td', { 'data-field': 'status' }, workerStatus(worker)),
      el('td', {}, healthBadge(worker.health)),
      el('td', { class: 'num', 'data-field': 'queue_depth' }, String(worker.queue_depth)),
      el('td', { class: 'num', 'data-field': 'failure_rate' }, failureRate),
      el('td', { class: 'num', 'data-field': 'consecutive_failures' }, String(health.consecutive_failures ?? 0)),
      el('td', { class: 'num', 'data-field': 'heartbeat_age' }, formatSeconds(worker.heartbeat_age_secs)),
      el('td', { 'data-field': 'runtimes' }, (worker.runtimes || []).join(', ')),
      el('td', {}, operate && worker.status === 'active' ? drainButton(worker) : null));
  });
  return el('table', { class: 'grid' },
    el('thead', {}, el('tr', {}, ['worker', 'status', 'health', 'queue depth', 'failure rate',
      'consecutive failures', 'heartbeat age', 'runtimes', ''].map((h) => el('th', {}, h)))),
    el('tbody', {}, rows));
}

// What is paused (its requests wait until it is resumed), with Resume for operators.
function pauseTable(pauses, operate) {
  if (pauses.length === 0) return el('p', { class: 'muted', id: 'no-pauses' }, 'Nothing is paused.');
  const rows = pauses.map((p) => {
    const resume = el('button', { type: 'button', class: 'secondary', 'data-resume': `${p.kind}/${p.name}` }, 'Resume');
    resume.addEventListener('click', async () => {
      resume.disabled = true;
      try {
        await api('DELETE', `/api/v1/pauses/${p.kind}/${encodeURIComponent(p.name)}`);
        resume.closest('tr').remove();
      } catch (error) {
        resume.replaceWith(errorBox(error));
      }
    });
    return el('tr', { 'data-pause': `${p.kind}/${p.name}` },
      el('td', {}, p.kind), el('td', { class: 'name' }, p.name), el('td', {}, p.reason),
      el('td', {}, p.paused_by_name || (p.paused_by === null ? '—' : `#${p.paused_by}`)), el('td', {}, formatTime(p.paused_at)),
      el('td', {}, operate ? resume : null));
  });
  return [el('h2', {}, 'Paused'), el('table', { class: 'grid' },
    el('thead', {}, el('tr', {}, ['kind', 'name', 'reason', 'by', 'since', ''].map((h) => el('th', {}, h)))),
    el('tbody', {}, rows))];
}

// Pause an action or a runtime (operators): its requests wait until it is resumed.
function pauseForm() {
  const kind = el('select', { id: 'pause-kind' }, el('option', { value: 'action' }, 'action'),
    el('option', { value: 'runtime' }, 'runtime'));
  const name = el('input', { id: 'pause-name', placeholder: 'pack.action or runtime' });
  const reason = el('input', { id: 'pause-reason', placeholder: 'why (required)', size: 30 });
  const outcome = el('span', { id: 'pause-outcome' });
  const button = el('button', { type: 'button', id: 'pause-apply' }, 'Pause');
  button.addEventListener('click', async () => {
    try {
      const p = await api('PUT', `/api/v1/pauses/${kind.value}/${encodeURIComponent(name.value)}`, { reason: reason.value });
      fill(outcome, el('span', { class: 'ok', 'data-paused': `${p.kind}/${p.name}` }, `paused ${p.kind} ${p.name}`));
    } catch (error) {
      fill(outcome, errorBox(error));
    }
  });
  return el('div', { class: 'filters' }, el('strong', {}, 'Pause: '), kind, name, reason, button, outcome);
}

// Actions with a concurrency policy in force (at most `limit` scheduled or running at once, per
// value of `key`), and whose it is; operators clear an operator's policy.
function concurrencyTable(actions, operate) {
  const held = actions.filter((a) => a.concurrency !== null || a.concurrency_set !== null);
  if (held.length === 0) return el('p', { class: 'muted', id: 'no-concurrency' }, 'No action has a concurrency limit.');
  const rows = held.map((a) => {
    const set = a.concurrency_set;
    const clear = el('button', { type: 'button', class: 'secondary', 'data-clear-concurrency': a.ref }, 'Clear');
    clear.addEventListener('click', async () => {
      clear.disabled = true;
      try {
        await api('DELETE', `/api/v1/actions/${encodeURIComponent(a.ref)}/concurrency`);
      } catch (error) {
        clear.replaceWith(errorBox(error));
      }
    });
    const limit = a.concurrency === null ? 'no limit' : String(a.concurrency.limit);
    return el('tr', { 'data-concurrency': a.ref },
      el('td', { class: 'name' }, a.ref), el('td', { class: 'num', 'data-field': 'limit' }, limit),
      el('td', {}, (a.concurrency && a.concurrency.key) || '—'),
      el('td', { 'data-field': 'source' }, set === null ? 'pack' : `operator #${set.set_by}, ${formatTime(set.set_at)}: ${set.reason}`),
      el('td', {}, operate && set !== null ? clear : null));
  });
  return [el('h2', {}, 'Concurrency limits'), el('table', { class: 'grid' },
    el('thead', {}, el('tr', {}, ['action', 'at most at once', 'per value of', 'set by', ''].map((h) => el('th', {}, h)))),
    el('tbody', {}, rows))];
}

// Set an action's concurrency policy (operators), in place of its pack's.
function concurrencyForm() {
  const action = el('input', { id: 'concurrency-action', placeholder: 'pack.action' });
  const limit = el('input', { id: 'concurrency-limit', placeholder: 'limit (empty: none)', size: 10 });
  const key = el('input', { id: 'concurrency-key', placeholder: 'per parameter (optional)', size: 16 });
  const reason = el('input', { id: 'concurrency-reason', placeholder: 'why (required)', size: 30 });
  const outcome = el('span', { id: 'concurrency-outcome' });
  const button = el('button', { type: 'button', id: 'concurrency-apply' }, 'Set limit');
  button.addEventListener('click', async () => {
    try {
      const body = { limit: limit.value.trim() === '' ? null : Number(limit.value), reason: reason.value };
      if (key.value.trim() !== '') body.key = key.value;
      const a = await api('PUT', `/api/v1/actions/${encodeURIComponent(action.value)}/concurrency`, body);
      const shown = a.concurrency === null ? 'no limit' : `at most ${a.concurrency.limit}`;
      fill(outcome, el('span', { class: 'ok', 'data-limited': a.ref }, `${a.ref}: ${shown}`));
    } catch (error) {
      fill(outcome, errorBox(error));
    }
  });
  return el('div', { class: 'filters' }, el('strong', {}, 'Concurrency: '), action, limit, key, reason, button, outcome);
}
