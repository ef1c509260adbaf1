// attune dashboard: the login form. It checks the token against the API before keeping it in
// sessionStorage, and shows the API's refusal when there is one.

import { el, render } from './dom.js';
import { ApiError, REFUSAL_KEY, TOKEN_KEY, errorBox, request } from './api.js';

function safeNext() {
  const next = new URLSearchParams(location.search).get('next') || '';
  return /^\/ui\/[A-Za-z0-9/_?=&%.:+-]*$/.test(next) && !next.startsWith('/ui/login') ? next : '/ui/workers';
}

export function loginPage() {
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
