// attune dashboard: the retries page. Retry rate, retry success rate and retries by reason over
// time as charts with the quick reference's alert thresholds marked, and the reasons table.

import { card, circuitBadge, el, fill, formatClock, formatPercent, formatSeconds, render, select, svg } from './dom.js';
import { api, poll } from './api.js';
import { barChart, chartBox } from './charts.js';

const RETRIES_POLL_MS = 15000;

const RETRY_WINDOWS = [['300', 'last 5 minutes'], ['900', 'last 15 minutes'], ['3600', 'last hour'], ['21600', 'last 6 hours'], ['86400', 'last 24 hours'],
  ['604800', 'last 7 days']];

const REASON_COLOURS = ['#0969da', '#bf8700', '#8250df', '#1a7f37', '#cf222e', '#57606a', '#e16f24', '#1b7c83'];

export function retriesPage() {
  const params = new URLSearchParams(location.search);
  const since = RETRY_WINDOWS.some(([v]) => v === params.get('window')) ? params.get('window') : '3600';
  const form = el('form', { class: 'filters', method: 'get', action: '/ui/retries' },
    el('label', {}, 'window ', select('window', RETRY_WINDOWS, since)),
    el('button', { type: 'submit' }, 'Apply'));
  const updated = el('span', { class: 'muted', id: 'updated' });
  const summary = el('section', { id: 'retry-summary' });
  const charts = el('section', { id: 'retry-charts' });
  const reasons = el('section', { id: 'retry-reasons' });
  const circuits = el('section', { id: 'circuits' });
  render(el('div', { class: 'title' }, el('h1', {}, 'Retries'), updated), form, summary, circuits, charts, reasons);
  poll(RETRIES_POLL_MS, async () => {
    const [stats, series, actions] = await Promise.all([api('GET', `/api/v1/stats/retries?window_secs=${since}`),
      api('GET', `/api/v1/stats/retries/series?window_secs=${since}&buckets=30`), api('GET', '/api/v1/actions')]);
    fill(summary, retrySummary(stats, series.thresholds));
    fill(circuits, circuitTable(actions));
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

// the actions with a circuit breaker, open ones first: an open circuit holds the action's retries
// and waiting executions back
function circuitTable(actions) {
  const order = { open: 0, half_open: 1, closed: 2 };
  const guarded = actions.filter((a) => a.circuit || (a.retry_policy && a.retry_policy.circuit))
    .sort((a, b) => order[a.circuit ? a.circuit.state : 'closed'] - order[b.circuit ? b.circuit.state : 'closed']);
  if (guarded.length === 0) return [];
  return [el('h2', {}, 'Circuit breakers'), el('table', { class: 'grid', id: 'circuit-table' },
    el('thead', {}, el('tr', {}, ['action', 'circuit', 'failed / finished in window', 'opened'].map((h) => el('th', {}, h)))),
    el('tbody', {}, guarded.map((a) => el('tr', { 'data-action': a.ref },
      el('td', { class: 'name' }, a.ref), el('td', {}, circuitBadge(a.circuit)),
      el('td', { class: 'num' }, a.circuit ? `${a.circuit.window_failed} / ${a.circuit.window_finished}` : '—'),
      el('td', { class: 'num' }, a.circuit ? String(a.circuit.opened_count) : '0')))))];
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
