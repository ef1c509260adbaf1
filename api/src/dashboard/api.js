// attune dashboard: the JSON API client. Every call carries `Authorization: Bearer <token>` from
// sessionStorage; a 401 clears the token and returns to the login form with the API's message.
// Also who the token is (`whoami`: its name and role, so pages hide what the role may not do),
// the error box and the poller the live pages refresh with.

import { el, main } from './dom.js';

export const TOKEN_KEY = 'attune.token';

export const REFUSAL_KEY = 'attune.refusal';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Thrown after a 401 has sent the browser to the login form: nothing more is rendered. */
export class LeftPage extends Error {}

export async function request(method, path, token, body, reason) {
  const headers = { Authorization: `Bearer ${token}` };
  // why, for the audit trail (and a cancel's record)
  if (reason) headers['X-Attune-Reason'] = reason;
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

export async function api(method, path, body, reason) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) {
    toLogin(null);
    throw new LeftPage();
  }
  try {
    return await request(method, path, token, body, reason);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      toLogin(`The API refused the token: ${error.message}`);
      throw new LeftPage();
    }
    throw error;
  }
}

let me = null;

/** The caller's token as `GET /api/v1/whoami` tells it (`{token_id, name, role}`), read once a page. */
export function whoami() {
  if (!me) {
    me = api('GET', '/api/v1/whoami').catch((error) => {
      me = null; // asked again next time
      throw error;
    });
  }
  return me;
}

/** Whether `role` may submit, retry, cancel and fail executions (the API's roles table decides). */
export function mayOperate(role) {
  return role === 'operator' || role === 'admin';
}

export function toLogin(message) {
  if (message) sessionStorage.setItem(REFUSAL_KEY, message);
  const next = location.pathname + location.search;
  location.replace(`/ui/login?next=${encodeURIComponent(next)}`);
}

export function errorBox(error) {
  const text = error instanceof ApiError
    ? `${error.message} (${error.status ? `HTTP ${error.status}, ` : ''}${error.code})`
    : String(error.message || error);
  return el('div', { class: 'error', role: 'alert', 'data-error': error.code || 'error' }, text);
}

/** Runs `load` now and every `ms` after the previous run ends; errors show above the page. */
export function poll(ms, load) {
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
