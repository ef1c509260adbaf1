// attune dashboard: DOM building that only ever inserts text (text nodes, attributes, never
// HTML), the formatting of times, durations and percentages, and the status and health badges.

const TERMINAL = ['completed', 'failed', 'timeout', 'canceled', 'abandoned'];

export const STATUSES = ['requested', 'scheduling', 'scheduled', 'running', 'delayed', 'completed', 'failed',
  'timeout', 'canceled', 'abandoned'];

const SVG_NS = 'http://www.w3.org/2000/svg';

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
  return node;
}

function setAttributes(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'onclick' || key === 'onsubmit' || key === 'onchange') {
      node.addEventListener(key.slice(2), value);
    } else {
      node.setAttribute(key, value === true ? '' : String(value));
    }
  }
  return node;
}

export function el(tag, attrs, ...children) {
  return append(setAttributes(document.createElement(tag), attrs), children);
}

export function svg(tag, attrs, ...children) {
  return append(setAttributes(document.createElementNS(SVG_NS, tag), attrs), children);
}

/** Replaces the children of `node` (arrays are flattened; strings become text). */
export function fill(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

export function main() {
  return document.getElementById('main');
}

export function render(...children) {
  main().replaceChildren(...children.flat().filter((c) => c));
}

function pad(n) {
  return String(n).padStart(2, '0');
}

export function formatTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
}

export function formatClock(date) {
  return `${pad(date.getUTCHours())}:${pad(date.getUTCMinutes())}:${pad(date.getUTCSeconds())}`;
}

export function formatSeconds(seconds) {
  if (seconds === null || seconds === undefined) return '—';
  if (seconds < 10) return `${seconds.toFixed(2)} s`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${pad(Math.floor(seconds % 60))}s`;
  return `${Math.floor(seconds / 3600)}h ${pad(Math.floor((seconds % 3600) / 60))}m`;
}

export function formatPercent(value) {
  return value === null || value === undefined ? '—' : `${Number(value).toFixed(1)} %`;
}

export function between(from, to) {
  return from && to ? (new Date(to) - new Date(from)) / 1000 : null;
}

function badge(kind, text) {
  return el('span', { class: `badge ${kind}-${text}`, 'data-badge': text }, text);
}

export function statusBadge(status) {
  return badge('status', status);
}

export function healthBadge(health) {
  return el('span', { class: `badge health-${health}`, 'data-health': health },
    el('span', { class: 'dot', 'aria-hidden': 'true' }), health);
}

// an action's circuit breaker: closed, open (until when) or half-open
export function circuitBadge(circuit) {
  const state = circuit ? circuit.state : 'closed';
  const text = state === 'open' ? `circuit open until ${formatTime(circuit.open_until)}`
    : state === 'half_open' ? 'circuit half-open (one trial)' : 'circuit closed';
  return el('span', { class: `badge circuit-${state}`, 'data-circuit': state }, text);
}

export function isTerminal(status) {
  return TERMINAL.includes(status);
}

export function card(label, value, attrs, note) {
  return el('div', Object.assign({ class: 'card' }, attrs || {}),
    el('div', { class: 'card-value' }, value), el('div', { class: 'card-label' }, label),
    note ? el('div', { class: 'card-note' }, note) : null);
}

export function select(name, options, selected) {
  return el('select', { name, id: `filter-${name}` },
    options.map(([value, label]) => el('option', { value, selected: value === selected }, label)));
}
