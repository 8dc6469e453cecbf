// framespool dashboard: plain JS, no build step.
//
// The API key is asked for once and kept in this tab's sessionStorage; every
// request sends it as an Authorization header, never in a URL. Live job
// updates come from GET /v1/jobs/{id}/events read with fetch() and a
// ReadableStream (EventSource cannot send headers), resuming with
// Last-Event-ID after a dropped connection. The cluster and the job list are
// polled. Everything the API returns is inserted as text, never as HTML.
'use strict';

(() => {
  const KEY_STORAGE = 'framespool.apiKey';
  const POLL_MS = 2000;
  const HISTORY = 150;               // samples kept for the charts (5 minutes at 2 s)
  const TERMINAL = new Set(['COMPLETED', 'FAILED', 'CANCELLED', 'REJECTED']);
  const COALESCED = new Set(['RunProgress', 'JobWaitEstimated']);
  const SVG_NS = 'http://www.w3.org/2000/svg';

  // ---------------------------------------------------------------- helpers
  const $ = (selector) => document.querySelector(selector);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === 'class') node.className = value;
      else if (name === 'text') node.textContent = value;
      else node.setAttribute(name, value === true ? '' : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function svgEl(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    return node;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function colorFor(name) {
    let h = 0;
    for (const ch of String(name)) h = (h * 31 + ch.codePointAt(0)) >>> 0;
    return `hsl(${h % 360}, 55%, 52%)`;
  }

  function shortId(jobId) {
    const id = String(jobId || '');
    return id.startsWith('job_') ? id.slice(4, 10) : id.slice(0, 6);
  }

  function timeText(ms) {
    if (!ms) return '';
    return new Date(ms).toLocaleTimeString(undefined, { hour12: false });
  }

  function percent(x) {
    return `${Math.round(Math.max(0, Math.min(1, Number(x) || 0)) * 100)}%`;
  }

  function setStatus(text, isError) {
    const status = $('#status');
    status.textContent = text;
    status.classList.toggle('error', Boolean(isError));
  }

  // ---------------------------------------------------------------- API
  class ApiError extends Error {
    constructor(status, code, message, field) {
      super(message);
      this.status = status;
      this.code = code;
      this.field = field;
    }
  }

  const auth = {
    get key() { return sessionStorage.getItem(KEY_STORAGE); },
    set(key) { sessionStorage.setItem(KEY_STORAGE, key); },
    clear() { sessionStorage.removeItem(KEY_STORAGE); },
  };

  function authHeaders(extra) {
    return { Authorization: `Bearer ${auth.key}`, ...(extra || {}) };
  }

  async function api(path, options) {
    const opts = options || {};
    if (!auth.key) throw new ApiError(401, 'unauthenticated', 'sign in first');
    const headers = authHeaders({ Accept: 'application/json', ...(opts.headers || {}) });
    let body;
    if (opts.body !== undefined) {
      headers['Content-Type'] = 'application/json';
      body = JSON.stringify(opts.body);
    }
    const response = await fetch(path, {
      method: opts.method || 'GET', headers, body, signal: opts.signal,
      cache: 'no-store', credentials: 'omit', redirect: 'error',
    });
    let doc = null;
    try { doc = await response.json(); } catch (_) { doc = null; }
    if (!response.ok) {
      const err = (doc && doc.error) || {};
      const error = new ApiError(response.status, err.code || 'http_error',
        err.message || response.statusText, err.field);
      if (response.status === 401) signOut(error.message);
      throw error;
    }
    return doc;
  }

  // ---------------------------------------------------------------- sign-in
  function signOut(message) {
    auth.clear();
    stopPolling();
    stopJobStream();
    $('#login-error').textContent = message || '';
    route();
  }

  async function signIn(event) {
    event.preventDefault();
    const input = $('#api-key');
    const key = input.value.trim();
    if (!key) return;
    auth.set(key);
    input.value = '';
    $('#login-error').textContent = '';
    try {
      await api('/v1/jobs?limit=1');
    } catch (error) {
      if (error.status !== 401) $('#login-error').textContent = error.message;
      return;
    }
    route();
  }

  // ---------------------------------------------------------------- polling
  let pollTimer = null;
  let polling = false;
  const history = [];   // {t, running: {tenant: gpus}, queued: {tier: jobs}, total}

  function startPolling() {
    if (pollTimer !== null) return;
    loadModels();
    refresh();
    pollTimer = setInterval(refresh, POLL_MS);
  }

  function stopPolling() {
    if (pollTimer !== null) clearInterval(pollTimer);
    pollTimer = null;
  }

  async function refresh() {
    if (polling || !auth.key) return;
    polling = true;
    try {
      const [cluster, jobs] = await Promise.all([api('/v1/cluster'), api('/v1/jobs?limit=50')]);
      renderCluster(cluster);
      record(cluster);
      renderShare(cluster);
      renderJobs(jobs.jobs);
      setStatus(`updated ${timeText(Date.now())}`, false);
    } catch (error) {
      if (error.status !== 401) setStatus(`refresh failed: ${error.message}`, true);
    } finally {
      polling = false;
    }
  }

  // ---------------------------------------------------------------- cluster
  function renderCluster(cluster) {
    const totals = cluster.totals || {};
    const legend = $('#gpu-legend');
    legend.replaceChildren(
      ...['busy', 'free', 'degraded', 'down'].map((bucket) =>
        el('li', { class: bucket, 'data-bucket': bucket, text: `${bucket} ${totals[bucket] || 0}` })),
      el('li', { class: 'plain', text: `${totals.nodes || 0} nodes` }));
    const map = $('#gpu-map');
    const cells = (cluster.cells || []).filter((cell) => (cell.nodes || []).length > 0);
    if (!cells.length) {
      map.replaceChildren(el('p', { class: 'hint', text: 'No node has registered yet.' }));
      return;
    }
    map.replaceChildren(...cells.map((cell) => el('div', { class: 'cell' },
      el('p', { class: 'cell-name', text: `${cell.cell} · ${cell.totals.busy}/${cell.totals.total} busy` }),
      el('div', { class: 'nodes' }, ...(cell.nodes || []).map(renderNode)))));
  }

  function renderNode(node) {
    const state = String(node.state || '').toLowerCase();
    return el('div', { class: `node state-${state}`, 'data-node': node.node_id },
      el('div', { class: 'node-head' },
        el('span', { class: 'node-id', text: node.node_id }),
        el('span', { class: 'node-meta', text: [node.state, node.gpu_type, node.rail].filter(Boolean).join(' · ') })),
      el('div', { class: 'gpus' }, ...(node.gpus || []).map((gpu) => renderGpu(node, gpu))));
  }

  function renderGpu(node, gpu) {
    const title = `${node.node_id} GPU ${gpu.index}: ${gpu.bucket}` +
      (gpu.job_id ? ` — ${gpu.job_id} run ${gpu.run}` : '');
    const attrs = { class: `gpu ${gpu.bucket}`, title, 'data-gpu': `${node.node_id}/${gpu.index}`,
      'data-bucket': gpu.bucket, 'data-job-id': gpu.job_id || null };
    const children = [el('span', { text: String(gpu.index) })];
    if (gpu.job_id) {
      children.push(el('span', { class: 'job', text: shortId(gpu.job_id) }));
      return el('a', { ...attrs, href: `#/jobs/${encodeURIComponent(gpu.job_id)}` }, ...children);
    }
    return el('div', attrs, ...children);
  }

  // ---------------------------------------------------------------- queues and share
  function record(cluster) {
    const queues = cluster.queues || {};
    const running = {};
    for (const [tenant, row] of Object.entries(queues.by_tenant || {})) running[tenant] = row.running_gpus;
    const queued = {};
    for (const [tier, row] of Object.entries(queues.by_tier || {})) queued[tier] = row.queued;
    history.push({ t: Date.now(), running, queued, total: (cluster.totals || {}).total || 0 });
    if (history.length > HISTORY) history.shift();
  }

  function keysOf(field) {
    const names = new Set();
    for (const sample of history) for (const name of Object.keys(sample[field])) names.add(name);
    return [...names].sort();
  }

  function legendItems(names, container) {
    container.replaceChildren(...names.map((name) => {
      const item = el('li', { text: name });
      item.style.setProperty('--swatch', colorFor(name));
      return item;
    }));
  }

  function chartFrame(chart, maxValue) {
    chart.replaceChildren(
      svgEl('line', { class: 'axis', x1: 0, y1: 159, x2: 600, y2: 159 }),
      svgEl('line', { class: 'axis', x1: 0, y1: 10, x2: 600, y2: 10 }));
    const label = svgEl('text', { class: 'label', x: 4, y: 22 });
    label.textContent = String(maxValue);
    chart.append(label);
  }

  // the samples kept span the chart's width (a sliding window once HISTORY are kept)
  const xOf = (i) => (history.length < 2 ? 600 : (i / (history.length - 1)) * 600);
  const yOf = (value, max) => 159 - (max > 0 ? (value / max) * 149 : 0);

  function renderShare(cluster) {
    // stacked areas: GPUs in use per tenant
    const tenants = keysOf('running');
    const shareChart = $('#share-chart');
    const maxGpus = Math.max(1, ...history.map((s) => Math.max(s.total,
      Object.values(s.running).reduce((a, b) => a + b, 0))));
    chartFrame(shareChart, maxGpus);
    const base = history.map(() => 0);
    for (const tenant of tenants) {
      const top = history.map((s, i) => base[i] + (s.running[tenant] || 0));
      const upper = top.map((v, i) => `${xOf(i).toFixed(1)},${yOf(v, maxGpus).toFixed(1)}`);
      const lower = base.map((v, i) => `${xOf(i).toFixed(1)},${yOf(v, maxGpus).toFixed(1)}`).reverse();
      shareChart.append(svgEl('polygon', { points: [...upper, ...lower].join(' '),
        fill: colorFor(tenant), 'fill-opacity': 0.75, 'data-tenant': tenant }));
      top.forEach((v, i) => { base[i] = v; });
    }
    legendItems(tenants, $('#share-legend'));

    // lines: queued jobs per tier
    const tiers = keysOf('queued');
    const queueChart = $('#queue-chart');
    const maxQueued = Math.max(1, ...history.flatMap((s) => Object.values(s.queued)));
    chartFrame(queueChart, maxQueued);
    for (const tier of tiers) {
      const points = history.map((s, i) => `${xOf(i).toFixed(1)},${yOf(s.queued[tier] || 0, maxQueued).toFixed(1)}`);
      queueChart.append(svgEl('polyline', { points: points.join(' '), fill: 'none',
        stroke: colorFor(tier), 'stroke-width': 2, 'data-tier': tier }));
    }
    legendItems(tiers, $('#queue-legend'));

    // the current figures
    const byTenant = (cluster.queues || {}).by_tenant || {};
    const totalRunning = Object.values(byTenant).reduce((a, row) => a + row.running_gpus, 0);
    $('#share-table tbody').replaceChildren(...Object.entries(byTenant).map(([tenant, row]) =>
      el('tr', { 'data-tenant': tenant },
        el('td', { text: tenant }),
        el('td', { text: String(row.running_gpus) }),
        el('td', { text: totalRunning ? percent(row.running_gpus / totalRunning) : '–' }),
        el('td', { text: String(row.queued) }),
        el('td', { text: String(row.queued_gpus) }))));
  }

  // ---------------------------------------------------------------- jobs
  function progressCell(job) {
    const bar = el('span');
    bar.style.setProperty('width', percent(job.progress));
    return el('td', {}, el('span', { class: 'mini-progress' }, bar),
      el('span', { class: 'pct', text: percent(job.progress) }));
  }

  function renderJobs(jobs) {
    $('#jobs-empty').hidden = jobs.length > 0;
    $('#jobs-table tbody').replaceChildren(...jobs.map((job) =>
      el('tr', { 'data-job-id': job.job_id },
        el('td', { class: 'mono' }, el('a', { href: `#/jobs/${encodeURIComponent(job.job_id)}`, text: job.job_id })),
        el('td', {}, el('span', { class: `badge state ${job.state}`, text: job.state })),
        progressCell(job),
        el('td', { text: job.tier }),
        el('td', { text: String(job.gpus) }),
        el('td', { class: 'prompt', title: job.prompt, text: job.prompt }),
        el('td', { text: timeText(job.created_ms) }))));
  }

  // The models and tiers this tenant may submit (GET /v1/models), with their defaults.
  async function loadModels() {
    let doc;
    try { doc = await api('/v1/models'); } catch (_) { return; }
    const models = $('#submit-model');
    models.replaceChildren(...doc.models.map((m) => el('option', {
      value: m.name, text: m.description ? `${m.name}: ${m.description}` : m.name,
    })));
    if (doc.default_model) models.value = doc.default_model;
    const tiers = $('#submit-tier');
    tiers.replaceChildren(...doc.tiers.map((t) => el('option', { value: t, text: t })));
    tiers.value = doc.default_tier;
  }

  async function submitJob(event) {
    event.preventDefault();
    const prompt = $('#submit-prompt').value.trim();
    const gpus = Number($('#submit-gpus').value);
    const duration = Number($('#submit-duration').value) || 2;
    const out = $('#submit-result');
    if (!prompt) return;
    const body = { prompt, gpus, gpus_per_node: Math.min(gpus, 8),
      params: { duration_s: duration, fps: 8, resolution: '128x72' } };
    if ($('#submit-model').value) body.model = $('#submit-model').value;
    if ($('#submit-tier').value) body.tier = $('#submit-tier').value;
    try {
      const job = await api('/v1/jobs', {
        method: 'POST', headers: { 'Idempotency-Key': crypto.randomUUID() }, body,
      });
      $('#submit-prompt').value = '';
      out.replaceChildren('submitted ', el('a', { href: `#/jobs/${encodeURIComponent(job.job_id)}`, text: job.job_id }));
      refresh();
    } catch (error) {
      out.textContent = error.field ? `${error.field}: ${error.message}` : error.message;
    }
  }

  // ---------------------------------------------------------------- one job
  const page = { jobId: null, abort: null, entries: [], lastSeq: 0, refreshTimer: null, job: null };

  function stopJobStream() {
    if (page.abort) page.abort.abort();
    page.abort = null;
    if (page.refreshTimer) clearTimeout(page.refreshTimer);
    page.refreshTimer = null;
    page.jobId = null;
  }

  async function showJob(jobId) {
    page.jobId = jobId;
    page.entries = [];
    page.lastSeq = 0;
    page.job = null;
    $('#job-title').textContent = jobId;
    $('#job-state').textContent = '';
    $('#job-state').className = 'badge';
    $('#job-error').textContent = '';
    $('#job-details').replaceChildren();
    $('#job-progress-text').textContent = '';
    $('#job-progress-bar').style.setProperty('width', '0%');
    $('#timeline tbody').replaceChildren();
    delete $('#job-result').dataset.jobId;
    $('#job-result').replaceChildren(el('h3', { text: 'Result' }),
      el('p', { id: 'job-result-hint', class: 'hint', text: 'Available once the job is COMPLETED.' }));
    $('#job-cancel').hidden = true;
    let job;
    try {
      job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`);
    } catch (error) {
      if (page.jobId === jobId) $('#job-error').textContent = error.message;
      return;
    }
    if (page.jobId !== jobId) return;
    for (const entry of job.timeline || []) addEntry(entry);
    renderJob(job);
    streamJob(jobId);
  }

  function renderJob(job) {
    page.job = job;
    const state = $('#job-state');
    state.textContent = job.state;
    state.className = `badge ${job.state}`;
    $('#job-progress-bar').style.setProperty('width', percent(job.progress));
    const steps = job.total_steps ? ` · step ${job.step}/${job.total_steps}` : '';
    const waiting = job.state === 'QUEUED' || job.state === 'SUBMITTED';
    const band = job.wait_p50_s !== null && job.wait_p90_s !== null
      ? `, P50 ~${Math.round(job.wait_p50_s)} s, P90 ~${Math.round(job.wait_p90_s)} s`
      : job.wait_estimate_s !== null ? `, ~${Math.round(job.wait_estimate_s)} s wait` : '';
    const wait = waiting && (job.position || band)
      ? ` · ${job.position ? `position ${job.position}` : 'waiting'}${band}` : '';
    $('#job-progress-text').textContent = `${percent(job.progress)}${steps}${wait}` +
      (job.progress_message ? ` · ${job.progress_message}` : '');
    const rows = [
      ['prompt', job.prompt], ['model', [job.model, job.model_version].filter(Boolean).join(' ')],
      ['tier', job.tier], ['GPUs', `${job.gpus} (${job.gpus_per_node} per node)`],
      ['run', job.run ? String(job.run) : '–'], ['nodes', (job.nodes || []).join(', ') || '–'],
      ['cell', job.cell || '–'],
      ['reason', job.reason ? (job.reason_code ? `[${job.reason_code}] ${job.reason}` : job.reason) : '–'],
      ['params', Object.entries(job.params || {}).map(([k, v]) => `${k}=${v}`).join(' ') || '–'],
      ['submitted', timeText(job.created_ms)], ['started', timeText(job.started_ms) || '–'],
      ['finished', timeText(job.finished_ms) || '–'],
    ];
    $('#job-details').replaceChildren(...rows.flatMap(([name, value]) =>
      [el('dt', { text: name }), el('dd', { 'data-field': name, text: value })]));
    $('#job-cancel').hidden = TERMINAL.has(job.state);
  }

  function addEntry(entry) {
    if (entry.seq <= page.lastSeq) return;
    const last = page.entries[page.entries.length - 1];
    if (last && COALESCED.has(entry.type) && last.type === entry.type && last.state === entry.state) {
      page.entries.pop();
    }
    page.entries.push(entry);
    page.lastSeq = entry.seq;
  }

  function renderTimeline() {
    $('#timeline tbody').replaceChildren(...page.entries.map((e) =>
      el('tr', { 'data-seq': e.seq, 'data-type': e.type },
        el('td', { text: String(e.seq) }),
        el('td', { class: 'nowrap', text: timeText(e.ts_ms) }),
        el('td', { class: 'mono', text: e.type }),
        el('td', {}, el('span', { class: `badge ${e.state}`, text: e.state })),
        el('td', { class: 'summary', text: e.summary }))));
  }

  function scheduleJobRefresh(jobId, delayMs) {
    if (page.refreshTimer) return;
    page.refreshTimer = setTimeout(async () => {
      page.refreshTimer = null;
      if (page.jobId !== jobId) return;
      try {
        const job = await api(`/v1/jobs/${encodeURIComponent(jobId)}?timeline=0`);
        if (page.jobId !== jobId) return;
        renderJob(job);
        if (job.state === 'COMPLETED') showResult(job);
      } catch (error) {
        if (page.jobId === jobId) $('#job-error').textContent = error.message;
      }
    }, delayMs);
  }

  async function showResult(job) {
    const box = $('#job-result');
    if (box.dataset.jobId === job.job_id) return;
    box.dataset.jobId = job.job_id;
    try {
      const result = await api(`/v1/jobs/${encodeURIComponent(job.job_id)}/result`);
      if (page.jobId !== job.job_id) return;
      const isVideo = /\.(mp4|webm|mov)$/i.test(result.artifact_uri || '');
      const media = isVideo
        ? el('video', { src: result.url, controls: true, loop: true, muted: true, autoplay: true })
        : el('img', { src: result.url, alt: `result of ${job.job_id}`, referrerpolicy: 'no-referrer' });
      box.replaceChildren(el('h3', { text: 'Result' }), media,
        el('p', { class: 'hint' },
          el('a', { href: result.url, target: '_blank', rel: 'noopener noreferrer', text: 'open' }),
          ` · link expires ${timeText(result.expires_at_ms)}`));
    } catch (error) {
      delete box.dataset.jobId;
      box.replaceChildren(el('h3', { text: 'Result' }), el('p', { class: 'error', text: error.message }));
    }
  }

  function setLive(on) {
    $('#job-live').hidden = !on;
  }

  // Reads one SSE response; calls onEvent({id, event, data}); true once the stream said "end".
  async function readEvents(body, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    let event = { data: [] };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, newline).replace(/\r$/, '');
        buffer = buffer.slice(newline + 1);
        if (line === '') {
          if (event.data.length) {
            const ended = onEvent({ id: event.id, event: event.event || 'message', data: event.data.join('\n') });
            if (ended) {
              reader.cancel().catch(() => {});
              return true;
            }
          }
          event = { data: [] };
        } else if (!line.startsWith(':')) {
          const colon = line.indexOf(':');
          const name = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? '' : line.slice(colon + 1);
          if (value.startsWith(' ')) value = value.slice(1);
          if (name === 'data') event.data.push(value);
          else if (name === 'id') event.id = value;
          else if (name === 'event') event.event = value;
        }
      }
    }
  }

  function onJobEvent(jobId, message) {
    if (page.jobId !== jobId) return true;
    if (message.event === 'end') {
      scheduleJobRefresh(jobId, 0);
      return true;
    }
    let entry;
    try { entry = JSON.parse(message.data); } catch (_) { return false; }
    addEntry(entry);
    renderTimeline();
    const now = entry.status || entry;  // the job as the event was sent
    const state = $('#job-state');
    state.textContent = now.state;
    state.className = `badge ${now.state}`;
    if (entry.status && page.job) renderJob({ ...page.job, ...entry.status });
    scheduleJobRefresh(jobId, 300);
    return false;
  }

  async function streamJob(jobId) {
    const controller = new AbortController();
    page.abort = controller;
    renderTimeline();
    let delay = 1000;
    while (!controller.signal.aborted && page.jobId === jobId) {
      let ended = false;
      try {
        const response = await fetch(`/v1/jobs/${encodeURIComponent(jobId)}/events`, {
          headers: authHeaders({ Accept: 'text/event-stream', 'Last-Event-ID': String(page.lastSeq) }),
          signal: controller.signal, cache: 'no-store', credentials: 'omit',
        });
        if (response.status === 401) { signOut('your API key was refused'); return; }
        if (!response.ok) throw new Error(`event stream answered HTTP ${response.status}`);
        setLive(true);
        ended = await readEvents(response.body, (message) => onJobEvent(jobId, message));
        delay = 1000;
      } catch (error) {
        if (controller.signal.aborted) return;
        setStatus(`live updates interrupted: ${error.message}; reconnecting`, true);
      } finally {
        setLive(false);
      }
      if (ended || controller.signal.aborted) return;
      await sleep(delay);
      delay = Math.min(delay * 2, 15000);
    }
  }

  async function cancelJob() {
    const jobId = page.jobId;
    if (!jobId) return;
    try {
      await api(`/v1/jobs/${encodeURIComponent(jobId)}`, { method: 'DELETE' });
      $('#job-cancel').hidden = true;
    } catch (error) {
      $('#job-error').textContent = error.message;
    }
  }

  // ---------------------------------------------------------------- routing
  function route() {
    stopJobStream();
    const signedIn = Boolean(auth.key);
    $('#login').hidden = signedIn;
    $('#app').hidden = !signedIn;
    $('#nav').hidden = !signedIn;
    $('#sign-out').hidden = !signedIn;
    if (!signedIn) {
      setStatus('', false);
      $('#api-key').focus();
      return;
    }
    startPolling();
    const match = location.hash.match(/^#\/jobs\/([^/]+)$/);
    $('#view-overview').hidden = Boolean(match);
    $('#view-job').hidden = !match;
    if (match) showJob(decodeURIComponent(match[1]));
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('#login-form').addEventListener('submit', signIn);
    $('#submit-form').addEventListener('submit', submitJob);
    $('#sign-out').addEventListener('click', () => signOut(''));
    $('#job-cancel').addEventListener('click', cancelJob);
    window.addEventListener('hashchange', route);
    route();
  });
})();
