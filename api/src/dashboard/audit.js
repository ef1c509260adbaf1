// attune dashboard: the audit trail (admin). Every request that could change state, newest first,
// with who asked, the answer it got, what it made and the reason given; filtered by who, route
// or target, a page of 100 at a time.

import { el, fill, formatTime, render } from './dom.js';
import { api, poll } from './api.js';

const AUDIT_POLL_MS = 5000;
const FILTERS = ['actor', 'route', 'target'];

export function auditPage() {
  const params = new URLSearchParams(location.search);
  const form = el('form', { id: 'audit-filter', class: 'filters', method: 'get', action: '/ui/audit' },
    FILTERS.map((name) => el('label', {}, name, ' ',
      el('input', { name, value: params.get(name) || '', placeholder: name === 'target' ? 'execution:42' : '' }))),
    el('button', { type: 'submit' }, 'Filter'));
  const table = el('section', { id: 'audit-table' }, el('p', { class: 'muted' }, 'loading…'));
  render(el('div', { class: 'title' }, el('h1', {}, 'Audit trail')), form, table);
  const query = new URLSearchParams({ limit: '100' });
  for (const name of [...FILTERS, 'before']) {
    if (params.get(name)) query.set(name, params.get(name));
  }
  poll(AUDIT_POLL_MS, async () => {
    fill(table, auditTable(await api('GET', `/api/v1/audit?${query}`), params));
  });
}

function auditTable(page, params) {
  if (page.events.length === 0) return el('p', { class: 'empty' }, 'No audit event matches.');
  const rows = page.events.map((e) => el('tr', { 'data-event': e.id },
    el('td', { class: 'num' }, String(e.id)),
    el('td', {}, formatTime(e.at)),
    el('td', { 'data-field': 'who' }, e.token_name ? `${e.token_name} (${e.role})` : (e.actor || '—')),
    el('td', { 'data-field': 'request' }, `${e.method} ${e.path}`),
    el('td', { class: 'num', 'data-field': 'status' }, String(e.status)),
    el('td', { 'data-field': 'target' }, e.target || '—'),
    el('td', { 'data-field': 'reason' }, e.reason || '—')));
  const older = new URLSearchParams(params);
  if (page.next_before !== null) older.set('before', String(page.next_before));
  return [
    el('table', {},
      el('thead', {}, el('tr', {}, ['id', 'at', 'who', 'request', 'status', 'target', 'reason'].map((h) => el('th', {}, h)))),
      el('tbody', {}, rows)),
    page.next_before !== null ? el('a', { href: `/ui/audit?${older}`, class: 'button secondary', id: 'page-next' }, 'older →') : null,
  ];
}
