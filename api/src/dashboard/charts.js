// attune dashboard: bar charts over time buckets as inline SVG, with dashed threshold lines.

import { el, formatClock, svg } from './dom.js';

export function chartBox(title, subtitle, chart, legend) {
  return el('figure', { class: 'chart' }, el('figcaption', {}, el('strong', {}, title), ' ',
    el('span', { class: 'muted' }, subtitle)), chart, legend || null);
}

/**
 * A bar chart over the series' buckets: `stack(bucket)` gives the bar's segments bottom-up,
 * `options.value` draws a dashed threshold line, `tooltip(bucket)` titles each bucket.
 */
export function barChart(name, series, stack, options, tooltip) {
  const width = 1200;
  const height = 200;
  const left = 44;
  const right = 12;
  const top = 14;
  const bottom = 28;
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const totals = series.buckets.map((b) => stack(b).reduce((sum, s) => sum + s.value, 0));
  let max = Math.max(options.floor || 1, options.value || 0, ...totals);
  if (options.max) max = Math.min(max, options.max);
  max = options.integer ? Math.ceil(max) : niceCeiling(max);
  const y = (v) => top + plotHeight - (Math.min(v, max) / max) * plotHeight;
  const slot = plotWidth / series.buckets.length;
  const chart = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart-svg', 'data-chart': name,
    role: 'img', 'aria-label': name });
  for (let i = 0; i <= 4; i += 1) {
    const v = (max * i) / 4;
    const label = options.integer ? String(Math.round(v)) : `${Math.round(v)}${options.unit || ''}`;
    chart.appendChild(svg('line', { x1: left, x2: width - right, y1: y(v), y2: y(v), class: 'gridline' }));
    chart.appendChild(svg('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, label));
  }
  series.buckets.forEach((b, i) => {
    const x = left + i * slot + slot * 0.15;
    const group = svg('g', { 'data-bucket': i }, svg('title', {}, tooltip(b)));
    // an invisible full-height target so every bucket has its tooltip
    group.appendChild(svg('rect', { x: left + i * slot, y: top, width: slot, height: plotHeight, class: 'hover' }));
    let base = 0;
    for (const segment of stack(b)) {
      const rect = svg('rect', { x, width: slot * 0.7, y: y(base + segment.value),
        height: Math.max(1, y(base) - y(base + segment.value)), fill: segment.colour, class: 'bar' });
      if (segment.reason) rect.setAttribute('data-reason', segment.reason);
      group.appendChild(rect);
      base += segment.value;
    }
    chart.appendChild(group);
  });
  const ticks = [0, Math.floor(series.buckets.length / 2), series.buckets.length - 1];
  for (const i of [...new Set(ticks)]) {
    const b = series.buckets[i];
    if (!b) continue;
    chart.appendChild(svg('text', { x: left + i * slot + slot / 2, y: height - 8, 'text-anchor': 'middle', class: 'axis' },
      formatClock(new Date(b.start)).slice(0, 5)));
  }
  if (options.value !== undefined) {
    const ty = y(options.value);
    chart.appendChild(svg('line', { x1: left, x2: width - right, y1: ty, y2: ty, class: 'threshold',
      'data-threshold': String(options.value) }));
    chart.appendChild(svg('text', { x: left + 6, y: ty - 5, class: 'threshold-label' }, options.label));
  }
  chart.appendChild(svg('line', { x1: left, x2: width - right, y1: top + plotHeight, y2: top + plotHeight, class: 'baseline' }));
  return chart;
}

function niceCeiling(v) {
  const step = v <= 100 ? 25 : v <= 400 ? 100 : 10 ** Math.floor(Math.log10(v));
  return Math.ceil(v / step) * step;
}
