// attune dashboard: an execution's live output, from `GET /api/v1/executions/{id}/output`
// (Server-Sent Events). EventSource cannot send the Authorization header, and the token must
// not go into a URL (URLs are logged): so fetch() with the header, read through the body's
// ReadableStream and split into events here. The section stops following once it has left the
// page (another page rendered) or the stream has ended.

import { el } from './dom.js';
import { TOKEN_KEY } from './api.js';

/** Parses SSE text as it comes: `push` returns the events (`{event, data}`) completed so far. */
export function sseParser() {
  let buffer = '';
  let event = null;
  let data = [];
  return {
    push(text) {
      buffer += text;
      const events = [];
      let newline;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        let line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length || event) events.push({ event: event || 'message', data: data.join('\n') });
          event = null;
          data = [];
        } else if (!line.startsWith(':')) {
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? '' : line.slice(colon + 1);
          if (value.startsWith(' ')) value = value.slice(1);
          if (field === 'event') event = value;
          if (field === 'data') data.push(value);
        }
      }
      return events;
    },
  };
}

/** A section that follows execution `id`'s output until it ends; `onEnd` is told its status. */
export function liveOutput(id, onEnd) {
  const output = el('pre', { id: 'live-output' });
  const state = el('p', { class: 'muted', id: 'live-state' }, 'following…');
  const section = el('section', { id: 'live' }, el('h2', {}, 'Live output'), output, state);
  const controller = new AbortController();
  const show = (text, stream) => {
    output.append(stream === 'stderr' ? el('span', { class: 'stderr' }, text) : document.createTextNode(text));
    output.scrollTop = output.scrollHeight;
  };
  const follow = async () => {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const response = await fetch(`/api/v1/executions/${id}/output`, {
      headers: { Authorization: `Bearer ${token}`, Accept: 'text/event-stream' },
      cache: 'no-store',
      signal: controller.signal,
    });
    if (!response.ok) {
      state.textContent = `live output unavailable (${response.status})`;
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = sseParser();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      if (!section.isConnected) {
        controller.abort();
        return;
      }
      for (const { event, data } of parser.push(value)) {
        const fields = JSON.parse(data || 'null') || {};
        if (event === 'stdout' || event === 'stderr') show(fields.text || '', event);
        if (event === 'skipped') show(`[${fields.bytes} bytes of ${fields.stream} not shown]\n`, 'stderr');
        if (event === 'capped') show(`[no more ${fields.stream} live past ${fields.limit_bytes} bytes]\n`, 'stderr');
        if (event === 'end') {
          state.textContent = `ended: ${fields.status}`;
          state.dataset.ended = fields.status;
          if (onEnd) onEnd(fields.status);
          return;
        }
        if (event === 'closed') {
          state.textContent = `stopped following: ${fields.reason}`;
          return;
        }
      }
    }
    state.textContent = 'the stream ended (reload the page to follow again)';
  };
  follow().catch((error) => {
    if (error.name !== 'AbortError') state.textContent = `live output unavailable (${error.message})`;
  });
  return section;
}
