// attune dashboard: the events page. The rules (a pack's or an operator's), which operators
// enable, disable or delete; and the recent events, newest first, each with what every rule made
// of it: the execution, or the reason it made none. Operators replay an event. Polled every few
// seconds.

import { el, fill, formatClock, formatTime, render } from './dom.js';
import { api, errorBox, mayOperate, poll, whoami } from './api.js';

const EVENTS_POLL_MS = 3000;
const EVENTS_SHOWN = 50;

export function eventsPage() {
  const updated = el('span', { class: 'muted', id: 'updated' });
  const rules = el('section', { id: 'rule-table' });
  const trigger = el('input', { id: 'event-trigger', placeholder: 'trigger: webhook.alerts', size: 28 });
  const events = el('section', { id: 'event-table' });
  render(el('div', { class: 'title' }, el('h1', {}, 'Events'), updated),
    el('h2', {}, 'Rules'), rules,
    el('h2', {}, 'Recent events'), el('div', { class: 'filters' }, trigger), events);
  let operate = false;
  whoami().then((me) => { operate = mayOperate(me.role); }).catch(() => {});
  poll(EVENTS_POLL_MS, async () => {
    const query = new URLSearchParams({ limit: String(EVENTS_SHOWN) });
    if (trigger.value.trim() !== '') query.set('trigger', trigger.value.trim());
    const [ruleList, eventList] = await Promise.all([
      api('GET', '/api/v1/rules'), api('GET', `/api/v1/events?${query}`),
    ]);
    fill(rules, ruleTable(ruleList, operate));
    fill(events, eventTable(eventList, operate));
    updated.textContent = `updated ${formatClock(new Date())} · refreshes every ${EVENTS_POLL_MS / 1000} s`;
  });
}

function act(label, method, path, body, attrs) {
  const button = el('button', { type: 'button', class: 'secondary', ...attrs }, label);
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      await api(method, path, body);
    } catch (error) {
      button.replaceWith(errorBox(error));
    }
  });
  return button;
}

function ruleTable(rules, operate) {
  if (rules.length === 0) return el('p', { class: 'muted', id: 'no-rules' }, 'No rule.');
  const rows = rules.map((r) => {
    const path = `/api/v1/rules/${encodeURIComponent(r.ref)}`;
    const actions = operate ? [
      r.enabled ? act('Disable', 'PUT', `${path}/enabled`, { enabled: false }, { 'data-disable-rule': r.ref })
        : act('Enable', 'PUT', `${path}/enabled`, { enabled: true }, { 'data-enable-rule': r.ref }),
      r.made_by === null ? null : act('Delete', 'DELETE', path, undefined, { 'data-delete-rule': r.ref }),
    ] : null;
    const d = r.definition || {};
    const holds = [d.cooldown ? `cooldown ${d.cooldown.key} ${d.cooldown.for}` : null,
      d.rate ? `at most ${d.rate.most} per ${d.rate.per}` : null].filter((x) => x !== null).join(' · ');
    return el('tr', { 'data-rule': r.ref },
      el('td', { class: 'name' }, r.ref), el('td', {}, r.trigger), el('td', {}, r.action_ref),
      el('td', { 'data-field': 'criteria' }, (d.criteria || []).join(' and ') || 'every event'),
      el('td', {}, holds),
      el('td', { 'data-field': 'enabled' }, r.enabled ? 'enabled' : 'disabled'),
      el('td', {}, r.made_by === null ? `pack ${r.pack}` : 'made through the API'),
      el('td', {}, actions));
  });
  return el('table', { class: 'grid' },
    el('thead', {}, el('tr', {}, ['rule', 'trigger', 'action', 'criteria', 'holds', 'state', 'from', '']
      .map((h) => el('th', {}, h)))),
    el('tbody', {}, rows));
}

function answer(m) {
  if (m.execution !== null) {
    return el('a', { href: `/ui/executions/${m.execution}` }, `execution #${m.execution}`);
  }
  return el('span', { class: m.matched ? 'held' : 'muted' }, m.reason || (m.matched ? 'matched' : 'not matched'));
}

function eventTable(events, operate) {
  if (events.length === 0) return el('p', { class: 'muted', id: 'no-events' }, 'No event.');
  const rows = events.flatMap((e) => {
    const matches = e.matches.length === 0 ? [null] : e.matches;
    return matches.map((m, i) => el('tr', { 'data-event': String(e.id), 'data-rule': m === null ? '' : m.rule },
      el('td', {}, i === 0 ? `#${e.id}` : ''),
      el('td', {}, i === 0 ? formatTime(e.received) : ''),
      el('td', {}, i === 0 ? e.trigger : ''),
      el('td', {}, i === 0 ? (e.delivery || (e.replay_of === null ? '' : `replay of #${e.replay_of}`)) : ''),
      el('td', {}, m === null ? 'no rule' : m.rule),
      el('td', { 'data-field': 'answer' }, m === null ? '' : answer(m)),
      el('td', {}, i === 0 && operate
        ? act('Replay', 'POST', `/api/v1/events/${e.id}/replay`, undefined, { 'data-replay': String(e.id) }) : null)));
  });
  return el('table', { class: 'grid' },
    el('thead', {}, el('tr', {}, ['event', 'received', 'trigger', 'delivery', 'rule', 'what it made', '']
      .map((h) => el('th', {}, h)))),
    el('tbody', {}, rows));
}
