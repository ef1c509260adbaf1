// attune dashboard: the actions pages. /ui/actions lists the packs and their actions; an action's
// page (/ui/actions/<ref>) shows how it runs (runtime, timeout, retries, concurrency, circuit)
// and its parameters, and lets an operator run it from a form built from those declarations: a
// secret parameter is typed masked (or named as a stored secret), an object or a list as JSON.

import { el, fill, render } from './dom.js';
import { api, errorBox, mayOperate, whoami } from './api.js';

export async function actionsPage() {
  const packs = el('section', { id: 'pack-table' });
  const actions = el('section', { id: 'action-table' });
  render(el('div', { class: 'title' }, el('h1', {}, 'Actions')), el('h2', {}, 'Packs'), packs,
    el('h2', {}, 'Actions'), actions);
  try {
    const [packList, actionList] = await Promise.all([api('GET', '/api/v1/packs'), api('GET', '/api/v1/actions')]);
    fill(packs, el('table', { class: 'grid' },
      el('thead', {}, el('tr', {}, ['pack', 'version', 'actions', 'description', 'registered from'].map((h) => el('th', {}, h)))),
      el('tbody', {}, packList.map((p) => el('tr', { 'data-pack': p.ref },
        el('td', { class: 'name' }, p.ref), el('td', {}, p.version), el('td', { class: 'num' }, String(p.action_count)),
        el('td', {}, p.description || ''), el('td', { class: 'muted' }, p.path || ''))))));
    fill(actions, el('table', { class: 'grid' },
      el('thead', {}, el('tr', {}, ['action', 'runtime', 'timeout', 'retries', 'description'].map((h) => el('th', {}, h)))),
      el('tbody', {}, actionList.map((a) => el('tr', { 'data-action': a.ref },
        el('td', { class: 'name' }, el('a', { href: `/ui/actions/${encodeURIComponent(a.ref)}` }, a.ref)),
        el('td', {}, a.runtime), el('td', { class: 'num' }, a.timeout_seconds === null ? '—' : `${a.timeout_seconds} s`),
        el('td', { class: 'num' }, a.max_retries === null ? '0' : (a.max_retries < 0 ? 'unlimited' : String(a.max_retries))),
        el('td', {}, a.description || ''))))));
  } catch (error) {
    fill(actions, errorBox(error));
  }
}

function fact(label, ...value) {
  return [el('dt', {}, label), el('dd', { 'data-fact': label }, ...value)];
}

const json = (value) => (value === null || value === undefined ? '—' : JSON.stringify(value));

export async function actionPage(ref) {
  let action;
  try {
    action = await api('GET', `/api/v1/actions/${encodeURIComponent(ref)}`);
  } catch (error) {
    render(el('h1', {}, ref), errorBox(error));
    return;
  }
  const specs = action.parameters || {};
  const rows = Object.entries(specs).map(([name, spec]) => el('tr', { 'data-parameter': name },
    el('td', { class: 'name' }, name), el('td', {}, spec.type || 'string'),
    el('td', {}, spec.required ? 'required' : ''), el('td', {}, spec.secret ? 'secret' : ''),
    el('td', {}, spec.default === undefined ? '' : json(spec.default)), el('td', {}, spec.description || '')));
  const form = el('section', { id: 'run-form' });
  render(el('div', { class: 'title' }, el('h1', {}, action.ref), el('span', { class: 'muted' }, ` ${action.description || ''}`)),
    el('div', { class: 'columns' },
      el('section', {}, el('h2', {}, 'How it runs'), el('dl', { class: 'facts' },
        fact('runtime', action.runtime), fact('entrypoint', action.entrypoint || '—'),
        fact('timeout', action.timeout_seconds === null ? 'the default' : `${action.timeout_seconds} s`),
        fact('max retries', action.max_retries === null ? '0' : String(action.max_retries)),
        fact('retry policy', json(action.retry_policy)), fact('concurrency', json(action.concurrency)),
        fact('circuit', json(action.circuit)))),
      el('section', {}, el('h2', {}, 'Parameters'), rows.length === 0 ? el('p', { class: 'muted' }, 'None.')
        : el('table', { class: 'grid', id: 'parameters' },
          el('thead', {}, el('tr', {}, ['name', 'type', '', '', 'default', 'description'].map((h) => el('th', {}, h)))),
          el('tbody', {}, rows)))),
    form);
  const me = await whoami().catch(() => null);
  if (me && mayOperate(me.role)) fill(form, runForm(action.ref, specs));
}

// One field per declared parameter; what is left empty takes the declared default.
function runForm(ref, specs) {
  const fields = Object.entries(specs).map(([name, spec]) => {
    const type = spec.type || 'string';
    const attrs = { id: `param-${name}`, 'data-param': name, 'data-type': type };
    let input;
    if (type === 'boolean') {
      input = el('select', attrs, el('option', { value: '' }, 'default'), el('option', { value: 'true' }, 'true'),
        el('option', { value: 'false' }, 'false'));
    } else if (type === 'object' || type === 'array') {
      input = el('textarea', { ...attrs, rows: 2, cols: 40, placeholder: type === 'object' ? '{"key": "value"}' : '["a", "b"]' });
    } else {
      input = el('input', { ...attrs, type: spec.secret ? 'password' : (type === 'string' ? 'text' : 'number'),
        step: type === 'number' ? 'any' : null, autocomplete: 'off',
        placeholder: spec.secret ? 'the value, or $secret:NAME for a stored one'
          : (spec.default === undefined ? (spec.required ? 'required' : '') : `default ${json(spec.default)}`) });
    }
    return el('label', { class: 'param' }, el('span', {}, name, spec.required ? ' *' : ''), input);
  });
  const outcome = el('div', { id: 'run-outcome' });
  const button = el('button', { type: 'button', id: 'run' }, 'Run');
  button.addEventListener('click', async () => {
    let parameters;
    try {
      parameters = collect(specs);
    } catch (error) {
      fill(outcome, el('div', { class: 'error' }, error.message));
      return;
    }
    button.disabled = true;
    try {
      const made = await api('POST', '/api/v1/executions', { action_ref: ref, parameters });
      fill(outcome, el('div', { class: 'ok', 'data-made': made.id }, 'Submitted as ',
        el('a', { href: `/ui/executions/${made.id}` }, `execution #${made.id}`), '.'));
    } catch (error) {
      fill(outcome, errorBox(error));
    } finally {
      button.disabled = false;
    }
  });
  return [el('h2', {}, 'Run it'), el('div', { class: 'run-fields' }, fields), button, outcome];
}

function collect(specs) {
  const parameters = {};
  for (const [name, spec] of Object.entries(specs)) {
    const raw = document.getElementById(`param-${name}`).value;
    if (raw.trim() === '') continue;
    const type = spec.type || 'string';
    if (spec.secret && raw.startsWith('$secret:')) {
      parameters[name] = { $secret: raw.slice('$secret:'.length) };
    } else if (type === 'integer' || type === 'number') {
      const value = Number(raw);
      if (!Number.isFinite(value) || (type === 'integer' && !Number.isInteger(value))) {
        throw new Error(`${name}: '${raw}' is not ${type === 'integer' ? 'an integer' : 'a number'}`);
      }
      parameters[name] = value;
    } else if (type === 'boolean') {
      parameters[name] = raw === 'true';
    } else if (type === 'object' || type === 'array') {
      try {
        parameters[name] = JSON.parse(raw);
      } catch (_) {
        throw new Error(`${name}: not JSON (${type === 'object' ? 'an object' : 'a list'})`);
      }
    } else {
      parameters[name] = raw;
    }
  }
  return parameters;
}
