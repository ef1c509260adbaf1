// attune dashboard: the entry point. Picks the page for the current /ui path; every page other
// than the login form needs a token in the browser session.

import { LeftPage, TOKEN_KEY, toLogin, whoami } from './api.js';
import { loginPage } from './login.js';
import { workersPage } from './workers.js';
import { executionPage, executionsPage } from './executions.js';
import { retriesPage } from './retries.js';
import { auditPage } from './audit.js';
import { schedulesPage } from './schedules.js';
import { eventsPage } from './events.js';
import { actionPage, actionsPage } from './actions.js';

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
  whoami().then((me) => {
    document.getElementById('whoami').textContent = `${me.name} (${me.role})`;
    // the audit trail is for admins alone
    document.querySelector('[data-nav="audit"]').hidden = me.role !== 'admin';
  }).catch((error) => {
    if (!(error instanceof LeftPage)) console.warn('whoami', error);
  });
  const section = path.split('/')[2] || 'workers';
  document.querySelector(`[data-nav="${section}"]`)?.classList.add('active');
  const execution = path.match(/^\/ui\/executions\/(\d+)$/);
  const action = path.match(/^\/ui\/actions\/([^/]+)$/);
  if (action) {
    const ref = decodeURIComponent(action[1]);
    document.title = `attune · ${ref}`;
    actionPage(ref);
  } else if (section === 'actions') {
    document.title = 'attune · actions';
    actionsPage();
  } else if (execution) {
    document.title = `attune · execution #${execution[1]}`;
    executionPage(execution[1]);
  } else if (section === 'executions') {
    document.title = 'attune · executions';
    executionsPage();
  } else if (section === 'schedules') {
    document.title = 'attune · schedules';
    schedulesPage();
  } else if (section === 'events') {
    document.title = 'attune · events';
    eventsPage();
  } else if (section === 'audit') {
    document.title = 'attune · audit trail';
    auditPage();
  } else if (section === 'retries') {
    document.title = 'attune · retries';
    retriesPage();
  } else {
    document.title = 'attune · workers';
    workersPage();
  }
}

route();
