// attune dashboard: the schedules page. Every schedule with its action, timing, catch-up policy,
// next and last run; operators pause, resume, run, edit and delete them, and make new ones. Polled
// every few seconds. Each run is an execution like any other (its page names the schedule).

import { el, fill, formatClock, formatTime, render } from './dom.js';
import { api, errorBox, mayOperate, poll, whoami } from './api.js';

const SCHEDULES_POLL_MS = 3000;

export function schedulesPage() {
  const updated = el('span', { class: 'muted', id: 'updated' });
  const table = el('section', { id: 'schedule-table' });
  const making = el('section', { id: 'schedule-form' });
  render(el('div', { class: 'title' }, el('h1', {}, 'Schedules'), updated), table, making);
  let operate = false;
  const form = scheduleForm();
  whoami().then((me) => {
    operate = mayOperate(me.role);
    if (operate) fill(making, form.node);
  }).catch(() => {});
  poll(SCHEDULES_POLL_MS, async () => {
    fill(table, scheduleTable(await api('GET', '/api/v1/schedules?limit=1000'), operate, form.edit));
    updated.textContent = `updated ${formatClock(new Date())} · refreshes every ${SCHEDULES_POLL_MS / 1000} s`;
  });
}

function timing(s) {
  return s.cron === null ? `at ${formatTime(s.at)}` : `${s.cron} (${s.timezone})`;
}

function act(label, method, path, attrs) {
  const button = el('button', { type: 'button', class: 'secondary', ...attrs }, label);
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      await api(method, path);
    } catch (error) {
      button.replaceWith(errorBox(error));
    }
  });
  return button;
}

function scheduleTable(schedules, operate, edit) {
  if (schedules.length === 0) return el('p', { class: 'muted', id: 'no-schedules' }, 'No schedule.');
  const rows = schedules.map((s) => {
    const path = `/api/v1/schedules/${encodeURIComponent(s.name)}`;
    const last = s.last_execution === null ? '—'
      : el('a', { href: `/ui/executions/${s.last_execution}` }, `#${s.last_execution} (${formatTime(s.last_run)})`);
    const actions = operate ? [
      s.paused ? act('Resume', 'POST', `${path}/resume`, { 'data-resume-schedule': s.name })
        : act('Pause', 'POST', `${path}/pause`, { 'data-pause-schedule': s.name }),
      act('Run now', 'POST', `${path}/run`, { 'data-run-schedule': s.name }),
      el('button', { type: 'button', class: 'secondary', 'data-edit-schedule': s.name, onclick: () => edit(s) }, 'Edit'),
      act('Delete', 'DELETE', path, { 'data-delete-schedule': s.name }),
    ] : null;
    return el('tr', { 'data-schedule': s.name },
      el('td', { class: 'name' }, s.name), el('td', {}, s.action_ref), el('td', { 'data-field': 'timing' }, timing(s)),
      el('td', {}, s.catch_up),
      el('td', { 'data-field': 'next' }, s.paused ? 'paused' : (s.next_run === null ? 'done' : formatTime(s.next_run))),
      el('td', { 'data-field': 'last' }, last), el('td', {}, s.reason || ''), el('td', {}, actions));
  });
  return el('table', { class: 'grid' },
    el('thead', {}, el('tr', {}, ['name', 'action', 'when', 'catch-up', 'next run', 'last run', 'reason', '']
      .map((h) => el('th', {}, h)))),
    el('tbody', {}, rows));
}

// Make a schedule, or change one (operators): parameters as a JSON object, a cron expression in a
// time zone or one instant. Edit on a row loads that schedule into the form; Save replaces its
// definition (PUT: what it ran stays its own), Cancel goes back to making a new one.
function scheduleForm() {
  const field = (id, placeholder, size) => el('input', { id, placeholder, size: size || 16 });
  const name = field('schedule-name', 'name');
  const action = field('schedule-action', 'pack.action');
  const parameters = field('schedule-parameters', '{"message": "hi"}', 24);
  const cron = field('schedule-cron', 'cron: 0 3 * * *');
  const timezone = field('schedule-timezone', 'UTC');
  const at = field('schedule-at', 'or at: 2026-12-01T03:00:00Z', 24);
  const catchUp = el('select', { id: 'schedule-catch-up' }, el('option', { value: 'skip' }, 'skip missed'),
    el('option', { value: 'once' }, 'run missed once'));
  const reason = field('schedule-reason', 'why', 20);
  const outcome = el('span', { id: 'schedule-outcome' });
  const heading = el('strong', {}, 'New schedule: ');
  const button = el('button', { type: 'button', id: 'schedule-apply' }, 'Make');
  const cancel = el('button', { type: 'button', class: 'secondary', id: 'schedule-cancel-edit', hidden: true },
    'Cancel');
  let editing = null; // the name of the schedule being changed, or null when making one
  let paused = false; // a schedule changed stays paused or running as it was
  const setMode = (schedule) => {
    editing = schedule ? schedule.name : null;
    paused = schedule ? schedule.paused : false;
    heading.textContent = editing ? `Edit ${editing}: ` : 'New schedule: ';
    button.textContent = editing ? 'Save' : 'Make';
    name.readOnly = editing !== null;
    cancel.hidden = editing === null;
  };
  const edit = (s) => {
    setMode(s);
    name.value = s.name;
    action.value = s.action_ref;
    parameters.value = JSON.stringify(s.parameters || {});
    cron.value = s.cron || '';
    timezone.value = s.cron === null ? '' : s.timezone;
    at.value = s.at || '';
    catchUp.value = s.catch_up;
    reason.value = s.reason || '';
    fill(outcome);
    name.scrollIntoView({ block: 'center' });
  };
  cancel.addEventListener('click', () => {
    setMode(null);
    for (const input of [name, action, parameters, cron, timezone, at, reason]) input.value = '';
    fill(outcome);
  });
  button.addEventListener('click', async () => {
    try {
      const body = { name: name.value, action_ref: action.value, catch_up: catchUp.value, paused };
      if (parameters.value.trim() !== '') {
        try {
          body.parameters = JSON.parse(parameters.value);
        } catch (error) {
          throw new Error(`parameters: not a JSON object (${error.message})`);
        }
      }
      if (cron.value.trim() !== '') {
        body.cron = cron.value;
        if (timezone.value.trim() !== '') body.timezone = timezone.value;
      } else {
        body.at = at.value;
      }
      if (reason.value.trim() !== '') body.reason = reason.value;
      const s = editing
        ? await api('PUT', `/api/v1/schedules/${encodeURIComponent(editing)}`, body)
        : await api('POST', '/api/v1/schedules', body);
      const said = editing ? 'changed' : 'made';
      fill(outcome, el('span', { class: 'ok', [`data-${said}`]: s.name }, `${said} ${s.name}: next ${formatTime(s.next_run)}`));
    } catch (error) {
      fill(outcome, errorBox(error));
    }
  });
  const node = el('div', { class: 'filters' }, heading, name, action, parameters, cron, timezone, at, catchUp, reason,
    button, cancel, outcome);
  return { node, edit };
}
