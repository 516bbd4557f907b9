"""The page's CSS and the one small script (token details on hover, pane scroll sync, scrolling
the first divergence into view, the byte view, bringing a finished run's verdict into view, sorting
a workload's prompt table and opening a prompt from it). Passed to launch(css=..., head=...) and
inlined into the static report."""

from .tokens import BLOCK

CSS = """
/* Issue 46 item 15. Gradio's bundled "Source Sans Pro" has, at weight 600, a few glyphs only (capital
   A among them): bold text mixed two fonts, capitals small ("CAncelled"). The system's sans-serif has
   every weight of every glyph. */
:root, .gradio-container { --font: ui-sans-serif, system-ui, "DejaVu Sans", sans-serif; }
/* A dropdown's text stops before its arrow (the kind of a side ran into it). */
.gradio-container .secondary-wrap > input { padding-right: 28px; text-overflow: ellipsis; }
.pc-offscreen { position:absolute !important; left:-10000px; top:0; width:120px; height:60px; overflow:hidden; }
.pt-root { --m:#e8f0ea; --m-b:#cfe0d4; --d:#dc2626; --a:#fdecec; --a-b:#f5c2c2; font-size: 13px; }
.pt-legend { display:flex; gap:8px; align-items:center; margin:2px 0 6px; color:#555; }
.pt-key { border-radius:3px; padding:0 4px; border:1px solid transparent; }
.pt-ws { color:#888; margin-left:8px; }
.pt-note { color:#555; margin-bottom:4px; }
.pt-panes { display:grid; grid-template-columns: repeat(var(--n, 2), minmax(0, 1fr)); gap:10px; }
.pt-pane { border:1px solid #d4d4d8; border-radius:8px; min-width:0; background:#fff; }
.pt-head { font-weight:600; padding:6px 10px; border-bottom:1px solid #e4e4e7; background:#fafafa;
  border-radius:8px 8px 0 0; display:flex; justify-content:space-between; color:#18181b; }
.pt-count { font-weight:400; color:#71717a; }
.pt-body { max-height:360px; overflow-y:auto; padding:8px 10px; line-height:1.9;
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; color:#18181b; }
.pt-body .b { content-visibility:auto; contain-intrinsic-size:auto 120px; }
.pt-body .b + .b { border-top:1px dashed #eee; }
.t { display:inline-block; white-space:pre; border-radius:3px; padding:0 1px; margin:1px 1px 1px 0;
  cursor:pointer; border:1px solid transparent; line-height:1.45; }
.t i { color:#a1a1aa; font-style:normal; }
.t.m, .pt-key.m { background:var(--m); border-color:var(--m-b); }
.t.n { background:#f4f4f5; border-color:#e4e4e7; }
.t.d, .pt-key.d { background:var(--d); color:#fff; border-color:#991b1b; font-weight:700; }
.t.d i { color:#fecaca; }
.t.a, .pt-key.a { background:var(--a); border-color:var(--a-b); color:#7f1d1d; }
.t.hl { outline:2px solid #2563eb; outline-offset:1px; }
.t.f, .pt-key.f { box-shadow:0 0 0 2px #d97706; }
.pt-end { color:#991b1b; font-style:italic; margin-top:4px; }
.pt-ref { font-weight:400; font-size:11px; color:#1d4ed8; background:#dbeafe; border-radius:3px; padding:0 4px; margin-left:4px; }
.t .x { display:none; font-weight:400; font-family: ui-monospace, monospace; font-size:11px; }
.pt-bytes .t.r .x { display:inline; } .pt-bytes .t.r .tx { display:none; }
.t.r { text-decoration: underline dotted #a1a1aa; }
.pt-bytes-toggle { margin-left:auto; color:#3f3f46; } .pt-hex { color:#71717a; font-family: ui-monospace, monospace; font-size:12px; }
.pt-refnote { color:#71717a; font-weight:400; }
.pt-info { margin-top:8px; padding:8px 10px; border:1px solid #e4e4e7; border-radius:8px; background:#fafafa;
  color:#3f3f46; min-height:2.5em; }
.pt-info table { border-collapse:collapse; width:100%; font-size:12.5px; }
.pt-info th, .pt-info td { padding:2px 8px; text-align:left; border-bottom:1px solid #eee; }
.pt-info td.lp { font-family: ui-monospace, monospace; color:#52525b; }
.pt-info code { background:#fff; border:1px solid #e4e4e7; border-radius:3px; padding:0 3px; }
.pt-info .chosen { background:#dbeafe; }
.pt-info .pos { font-weight:600; }
.pc-card { border:1px solid #e4e4e7; border-radius:10px; padding:10px 14px; background:#fff; color:#18181b; }
.pc-card + .pc-card { margin-top:8px; }
.pc-title { font-weight:600; margin-bottom:4px; }
.pc-error { border-color:#fca5a5; background:#fef2f2; color:#7f1d1d; }
.pc-fix { margin-top:4px; color:#14532d; }
.pc-notice { background:#f8fafc; color:#334155; }
.pc-warn { margin-top:6px; color:#9a3412; font-weight:600; }
.pc-kv { border-collapse:collapse; font-size:13px; border:none !important; }
.pc-kv th, .pc-kv td { border:none !important; background:none !important; }
.pc-card b { font-size:inherit; }
.pc-kv th { text-align:left; font-weight:500; color:#71717a; padding:1px 12px 1px 0; vertical-align:top; }
.pc-kv td { padding:1px 0; word-break:break-all; }
.pc-head { display:flex; gap:12px; align-items:center; flex-wrap:wrap; margin-bottom:6px; }
.pc-badge { font-weight:700; padding:3px 10px; border-radius:999px; font-size:13px; letter-spacing:.02em; }
.pc-badge.ok { background:#dcfce7; color:#166534; }
.pc-badge.div { background:#fee2e2; color:#991b1b; }
.pc-badge.err { background:#7f1d1d; color:#fff; }
.pc-badge.cancel { background:#e4e4e7; color:#3f3f46; }
.pc-meta { color:#52525b; }
.pc-tok { background:#f4f4f5; border-radius:3px; padding:0 4px; }
.pc-verdict { margin:4px 0; padding:4px 8px; background:#fffbeb; border-left:3px solid #f59e0b; }
.pc-findings { margin:6px 0 0 18px; padding:0; }
.pc-findings .sev-warning { color:#9a3412; } .pc-findings .sev-error { color:#991b1b; }
.pc-fixinline { color:#14532d; }
.pc-foot { margin-top:6px; color:#71717a; font-size:12px; }
.pp-row { display:flex; align-items:center; gap:8px; margin:3px 0; }
.pp-name { width:40px; font-weight:600; }
.pp-bar { flex:1; height:8px; background:#f4f4f5; border-radius:4px; overflow:hidden; max-width:420px; }
.pp-bar span { display:block; height:100%; background:#2563eb; transition: width .2s; }
.pp-n { color:#52525b; min-width:120px; }
.pp-time { color:#71717a; font-weight:400; margin-left:8px; }
.pp-log { margin:4px 0 0 18px; padding:0; color:#71717a; font-size:12px; }
.field-error input, .field-error textarea, .field-error select { border-color:#dc2626 !important; }
.field-error .info, .field-error [data-testid="block-info"] + div { color:#b91c1c !important; }
#cfg-error, #prompt-count { min-height: 1em; }
.pc-cfgline { color:#3f3f46; padding:4px 2px; }
.pc-cfgline.pc-bad { color:#991b1b; font-weight:600; }
.pc-sides, .pc-setting-table, .pc-phases { border-collapse:collapse; font-size:12.5px; margin:6px 0; }
.pc-sides th, .pc-sides td, .pc-setting-table th, .pc-setting-table td, .pc-phases td {
  border-bottom:1px solid #eee; padding:2px 8px; text-align:left; vertical-align:top; }
.pc-setting-table tr.diff th, .pc-setting-table tr.diff td { background:#fff7ed; font-weight:600; }
.pc-layers .pc-layers-verdict { font-size:15px; margin:6px 0; }
.pc-layers tr.pc-over td { background:#fef2f2; font-weight:600; }
.pc-layers-error { border-color:#fca5a5; }
.pc-phases td { text-align:center; border:1px solid #eee; }
.pc-muted { color:#71717a; }
.pc-settings summary, .pc-timings summary, .pc-cross summary { cursor:pointer; color:#3f3f46; }
/* MoE routes: the layer x token grid (parity_ui.render.sections.routing) */
.rt-grid { border-collapse:collapse; font:11px ui-monospace,monospace; margin:4px 0; }
.rt-grid td, .rt-grid th { min-width:14px; height:14px; padding:0; text-align:center; border:1px solid #fff; }
.rt-grid th { color:#71717a; font-weight:400; padding:0 4px; white-space:nowrap; }
.rt-same { background:#dcfce7; } .rt-order { background:#fef9c3; } .rt-diff { background:#fecaca; }
.rt-na { background:#f4f4f5; color:#a1a1aa; } .rt-fork { outline:2px solid #2563eb; }
.rt-flip { outline:2px solid #dc2626; font-weight:700; }
.pc-routes summary { cursor:pointer; color:#3f3f46; }
/* The op map (parity_ui.ui.op_map_view, render.op_map) */
.om-cell div { font-family: ui-monospace, monospace; font-size:12px; white-space:pre-wrap; }
.om-svg { display:block; margin:4px 0; background:#fff; }
.om-swap { margin-top:6px; }
/* A card under the upload button (a workload described, a file refused) takes the row's whole width. */
div:has(> #prompt-count .pc-card) { flex-wrap:wrap; }
#prompt-count:has(.pc-card) { flex:1 1 100% !important; min-width:100% !important; }
.wl-pick ul { margin:4px 0 0 18px; }
.wl-headline { font-size:15px; font-weight:600; margin:6px 0 2px; }
.wl-verdict { margin:6px 0; padding:4px 8px; border-left:3px solid #a1a1aa; }
.wl-verdict.ok { border-color:#16a34a; background:#f0fdf4; }
.wl-verdict.div { border-color:#dc2626; background:#fef2f2; }
.wl-checks { margin:4px 0 0; }
.wl-resume { margin-top:6px; color:#1e3a8a; }
.wl-figures td.pc-over { background:#fef2f2; color:#991b1b; font-weight:600; }
.wl-figures td.pc-unsure { background:#fffbeb; color:#92400e; }
.wl-legend { margin:4px 0 0 0; padding-left:18px; font-size:12px; }
.wl-figures td { text-align:right; font-variant-numeric:tabular-nums; }
.wl-scroll { max-height:420px; overflow:auto; border:1px solid #e4e4e7; border-radius:8px; margin-top:4px; }
.wl-table { border-collapse:collapse; font-size:12.5px; width:100%; }
.wl-table[data-pick] { table-layout:fixed; }  /* rows added later cost only themselves */
.wl-table[data-pick] th:first-child { width:48px; } .wl-table[data-pick] th:nth-child(2) { width:26%; }
.wl-table[data-pick] td { overflow:hidden; text-overflow:ellipsis; }
.wl-table th { position:sticky; top:0; background:#fafafa; cursor:pointer; text-align:left; padding:3px 8px;
  border-bottom:1px solid #e4e4e7; white-space:nowrap; user-select:none; }
/* The sort direction as a CSS triangle: no glyph a page's fonts might lack. */
.wl-table th[aria-sort]::after { content:""; display:inline-block; margin-left:5px; vertical-align:middle;
  border-left:4px solid transparent; border-right:4px solid transparent; }
.wl-table th[aria-sort=ascending]::after { border-bottom:6px solid currentColor; }
.wl-table th[aria-sort=descending]::after { border-top:6px solid currentColor; }
.wl-table td { padding:2px 8px; border-bottom:1px solid #f4f4f5; white-space:nowrap; font-variant-numeric:tabular-nums; }
.wl-table td.div { color:#991b1b; font-weight:600; }
.wl-table[data-pick] tbody tr { cursor:pointer; }
.wl-table tbody tr:hover { background:#eff6ff; } .wl-table tbody tr.sel { background:#dbeafe; }
.wl-charts { display:flex; gap:16px; flex-wrap:wrap; margin:8px 0; }
.wl-svg { background:#fff; border:1px solid #e4e4e7; border-radius:8px; }
.rp-cols { display:flex; gap:16px; align-items:flex-start; }
.rp-col { flex:1 1 0; min-width:0; border:1px solid #e4e4e7; border-radius:8px; padding:8px; }
.rp-label { font-weight:600; margin-bottom:4px; }
.rp-result { margin:4px 0; }
.rp-diff tr.diff td { background:#fffbeb; }
.rp-panes { margin-top:10px; }
/* an invariance audit (render.audit): its verdict card and its axes x prompts grid */
.au-card { border:1px solid #d4d4d8; border-radius:8px; padding:10px 14px; margin:6px 0 10px; background:#fff; color:#18181b; }
.au-card.ok { border-left:6px solid #16a34a; } .au-card.bad { border-left:6px solid #dc2626; }
.au-card.void { border-left:6px solid #7c3aed; } .au-card.other { border-left:6px solid #d97706; }
.au-verdict { font-size:18px; font-weight:700; margin-bottom:4px; }
.au-muted { color:#71717a; }
.au-scroll { overflow-x:auto; max-width:100%; }
.au-grid { border-collapse:collapse; font-size:12px; color:#18181b; }
.au-grid th, .au-grid td { border:1px solid #e4e4e7; padding:2px 6px; text-align:left; white-space:nowrap; }
.au-grid th { background:#fafafa; position:sticky; top:0; }
.au-grid td.c { text-align:center; min-width:18px; padding:2px 3px; font-family:ui-monospace,monospace; }
.au-grid .identical { background:#e8f5ec; color:#166534; }
.au-grid .broken { background:#fde2e2; color:#991b1b; font-weight:700; }
.au-grid .vacuous { background:#fef3c7; color:#92400e; }
.au-grid .skipped, .au-grid .na { color:#a1a1aa; }
.au-grid .err { background:#fde2e2; color:#7f1d1d; }
.au-grid[data-pick] td[data-k] { cursor:pointer; }
.au-grid[data-pick] td[data-k]:hover { outline:2px solid #2563eb; outline-offset:-2px; }
.au-grid td.why { white-space:normal; max-width:420px; color:#52525b; }
.au-axis { margin:6px 0; } .au-axis code { font-size:12px; }
.au-ev { font-size:12px; } .au-ev td { vertical-align:top; padding:1px 8px 1px 0; }

/* A run's trend over its steps (render.trend): small charts side by side, the jumping step's row marked. */
.tr-charts { display:flex; gap:10px; flex-wrap:wrap; margin:8px 0; }
.tr-steps tr.div td { background:#fef2f2; }
.tr-jumps li { margin:2px 0; } .tr-chart a { cursor:pointer; }
"""

JS_TEMPLATE = r"""
<script>
(() => {
  const BLOCK = __BLOCK__;
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
  const show = (s) => { if (s === '') return '∅'; return s.replace(/ /g,'·').replace(/\n/g,'⏎').replace(/\t/g,'→'); };
  const fmt = (x) => (x === null || x === undefined) ? '–' : Number(x).toFixed(4);
  const utf8 = new TextEncoder();
  // A token's bytes: the stored hex where its text cannot show them, else the text's UTF-8.
  const bytesOf = (d, id) => {
    const raw = d.raw[id];
    if (raw) return raw.match(/../g).join(' ');
    return Array.from(utf8.encode(d.vocab[id] ?? '')).map((b) => b.toString(16).padStart(2, '0')).join(' ');
  };

  function data(root) {
    if (!root._pt) { root._pt = JSON.parse(root.querySelector('.pt-json').textContent); }
    return root._pt;
  }
  // A long stored view carries the details of the positions it built (from `off`); the rest
  // come from the app's pane_details endpoint once it shows (data-src), then its lazy blocks build.
  const row = (d, name, i) => (i < (d.off || 0)) ? undefined : d.steps[name][i - (d.off || 0)];
  const count = (d, name) => d.len ? d.len[name] : d.steps[name].length;
  const ready = (root) => !root.dataset.src || root.dataset.full === '1';
  async function fetchDetails(root) {
    const base = ((window.gradio_config && window.gradio_config.root) || '').replace(/\/$/, '');
    const url = `${base}/gradio_api/call/pane_details`;
    const r = await fetch(url, {method: 'POST', headers: {'Content-Type': 'application/json'},
                                body: JSON.stringify({data: [root.dataset.src]})});
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const {event_id} = await r.json();
    const text = await (await fetch(`${url}/${event_id}`)).text();
    const lines = text.split('\n');
    const at = lines.findIndex((l) => l === 'event: complete' || l === 'event: error');  // skips heartbeats
    const kind = at >= 0 ? lines[at].slice(7).trim() : '';
    const payload = lines.slice(at + 1).find((l) => l.startsWith('data: '));
    if (kind !== 'complete' || !payload) throw new Error(payload ? payload.slice(6) : 'no answer');
    root._pt = JSON.parse(JSON.parse(payload.slice(6))[0]);
    root.dataset.full = '1';
  }
  // Long panes arrive with only the blocks near the divergence built; the rest are built here from
  // the details JSON when they scroll near (or when a position in them is shown).
  const MARK = {' ': '·', '\n': '⏎', '\t': '→', '\r': '␍'};
  function vis(text) {
    if (text === '') return '<i>∅</i>';
    let out = '';
    for (const ch of text) {
      const c = ch.codePointAt(0);
      if (MARK[ch]) out += `<i>${MARK[ch]}</i>`;
      else if (c < 32 || (c >= 0x7f && c < 0xa0)) out += `<i>\\x${c.toString(16).padStart(2, '0')}</i>`;
      else out += esc(ch);
    }
    return out;
  }
  function fill(root, blk) {
    if (!blk.dataset.lazy || !ready(root)) return;
    const d = data(root);
    const name = blk.closest('.pt-pane').dataset.side;
    const ref = d.sides[0];
    const isRef = name === ref;
    const other = isRef ? (root.dataset.sel || ref) : ref;
    const divRaw = isRef ? root.dataset.div : d.divs[name];
    const div = (divRaw === undefined || divRaw === null) ? null : Number(divRaw);
    const o = Number(blk.dataset.o), n = Number(blk.dataset.n);
    let html = '';
    for (let i = o; i < o + n; i++) {
      const id = row(d, name, i)[0];
      const cls = div !== null && i === div ? 'd' : (div !== null && i > div ? 'a'
        : (i < count(d, other) && row(d, other, i)[0] === id ? 'm' : 'n'));
      const text = d.vocab[id] ?? '';
      const raw = d.raw[id];
      html += raw ? `<span class="t ${cls} r"><span class="tx">${vis(text)}</span><b class="x">${raw.match(/../g).join(' ')}</b></span>`
                  : `<span class="t ${cls}">${vis(text)}</span>`;
      if (text.endsWith('\n')) html += '<br>';
    }
    blk.innerHTML = html;
    blk.removeAttribute('data-lazy');
    blk.style.minHeight = '';
  }
  // Chips are the .t children of their block (a <br> follows a newline token).
  function indexOf(chip) {
    const blk = chip.parentElement;
    return Number(blk.dataset.o) + Array.prototype.indexOf.call(blk.querySelectorAll(':scope > .t'), chip);
  }
  function chipAt(pane, i) {
    const blk = pane.querySelectorAll('.b')[Math.floor(i / BLOCK)];
    if (blk) fill(pane.closest('.pt-root'), blk);
    return blk ? blk.querySelectorAll(':scope > .t')[i % BLOCK] : null;
  }
  function side(d, name, i) {
    const s = row(d, name, i);
    if (!s) return null;
    const top = [];
    for (let k = 0; k < s[3].length; k += 2) top.push([s[3][k], s[3][k + 1]]);
    return {id: s[0], text: d.vocab[s[0]], lp: s[1], rank: s[2], top, ties: s[4] || [], draw: (s[5] && s[5].length) ? s[5] : null, dist: s[6] || null};
  }
  function render(root, i) {
    const d = data(root);
    const ref = d.sides[0];
    const div = root.dataset.div === undefined ? null : Number(root.dataset.div);
    const sel = root.dataset.sel;
    const tag = div === null ? '' : (i === div ? ` — <b style="color:#dc2626">first divergence of ${esc(sel)}</b>` : (i > div ? ' — after the divergence (contexts differ)' : ' — same token on the compared sides'));
    const xs = d.sides.map((n) => side(d, n, i));
    // Logprobs that differ in their bits but read alike at 4 decimals (an audit's break is often a few
    // ulp): shown to 9 significant digits, enough to tell any two float32 values apart.
    const lps = xs.filter((x) => x && x.lp !== null && x.lp !== undefined).map((x) => x.lp);
    const fine = lps.some((a) => lps.some((b) => a !== b && fmt(a) === fmt(b)));
    const lpText = (v) => (fine && v !== null && v !== undefined) ? Number(v).toPrecision(9) : fmt(v);
    const head = (x, n) => x ? `<b>${esc(n)}</b> chose <code>${esc(show(x.text))}</code> id ${x.id} <span class="pt-hex">bytes ${bytesOf(d, x.id)}</span>, logprob ${lpText(x.lp)}, rank ${x.rank ?? '–'}${x.ties.length ? ` <b class="pt-tie">= exact tie with rank ${x.ties.join(', ')} (same logprob)</b>` : ''}${x.draw ? `; drawn from ${x.draw[1]} kept tokens (kept mass S ${fmt(x.draw[2])}), sampling margin ${x.draw[0] >= 1e29 ? 'none (one token kept)' : fmt(x.draw[0])}` : ''}${x.dist ? `; whole distribution against the reference: KL(ref‖side) ${fmt(x.dist[0])}, KL(side‖ref) ${fmt(x.dist[1])}, total variation ${fmt(x.dist[2])}` : ''}` : `<b>${esc(n)}</b>: no token here`;
    const k = Math.max(0, ...xs.map((x) => x ? x.top.length : 0));
    let rows = '';
    for (let r = 0; r < k; r++) {
      const cell = (x) => {
        if (!x || !x.top[r]) return '<td></td><td></td>';
        const [id, lp] = x.top[r];
        const cls = id === x.id ? ' class="chosen"' : '';
        return `<td${cls} title="bytes ${bytesOf(d, id)}"><code>${esc(show(d.vocab[id] ?? ''))}</code> <span style="color:#a1a1aa">${id}</span></td><td class="lp">${fmt(lp)}</td>`;
      };
      const tied = xs.some((x) => x && x.ties.length && (x.ties.includes(r + 1) || x.rank === r + 1));
      rows += `<tr><td>${r + 1}${tied ? '=' : ''}</td>${xs.map(cell).join('')}</tr>`;
    }
    const th = d.sides.map((n) => `<th>${esc(n)} top-k</th><th>logprob</th>`).join('');
    const table = k ? `<table><tr><th>rank</th>${th}</tr>${rows}</table>` : '';
    const fineNote = fine ? ' <span class="pt-refnote">(logprobs equal to 4 decimals but not in their bits: 9 digits shown)</span>' : '';
    root.querySelector('.pt-info').innerHTML = `<div class="pos">Position ${i}${tag} <span class="pt-refnote">(reference: ${esc(ref)})</span>${fineNote}</div>` + xs.map((x, j) => `<div>${head(x, d.sides[j])}</div>`).join('') + table;
    root.querySelectorAll('.t.hl').forEach((c) => c.classList.remove('hl'));
    root.querySelectorAll('.pt-pane').forEach((p) => { const c = chipAt(p, i); if (c) c.classList.add('hl'); });
  }
  function init(root) {
    root.dataset.init = '1';
    const bodies = root.querySelectorAll('.pt-body');
    let syncing = false;
    bodies.forEach((b) => b.addEventListener('scroll', () => {
      if (syncing) return; syncing = true;
      bodies.forEach((o) => { if (o !== b) o.scrollTop = b.scrollTop; });
      requestAnimationFrame(() => { syncing = false; });
    }, {passive: true}));
    // Hover follows the pointer's own moves, never content moving under a resting pointer: a scroll
    // (the view revealed at a run's end, the panes opened at the fork) fires mouseover there but no
    // mousemove, and the details showed another position than the fork (issue 46 item 11).
    root.addEventListener('mousemove', (e) => {
      const c = e.target.closest('.pt-body .t');
      if (!c || root._pin !== undefined) return;
      const i = indexOf(c);
      if (i !== root._hover) { root._hover = i; render(root, i); }
    }, {passive: true});
    root.addEventListener('click', (e) => {
      const c = e.target.closest('.pt-body .t');
      if (!c) return;
      const i = indexOf(c);
      root._pin = root._pin === i ? undefined : i;
      render(root, i);
    });
    const observe = () => {
      const lazy = root.querySelectorAll('.b[data-lazy]');
      if (!lazy.length) return;
      const io = new IntersectionObserver((entries) => entries.forEach((en) => {
        if (en.isIntersecting) { fill(root, en.target); io.unobserve(en.target); }
      }), {rootMargin: '800px 0px'});
      lazy.forEach((b) => io.observe(b));
    };
    if (ready(root)) observe();
    else fetchDetails(root).then(observe).catch((err) => {
      root.dataset.full = 'failed';
      root.querySelector('.pt-info').insertAdjacentHTML('afterbegin',
        `<div class="pt-note">Only the positions around the divergence have details: loading the rest failed (${esc(err.message)}). Reopen the run to retry.</div>`);
    });
    const cb = root.querySelector('.pt-bytes-cb');
    if (cb) cb.addEventListener('change', () => root.classList.toggle('pt-bytes', cb.checked));
    if (root.dataset.live) {
      bodies.forEach((b) => { b.scrollTop = b.scrollHeight; });
    } else if (root.dataset.focus !== undefined || root.dataset.div !== undefined) {
      // Opened at a token (a replay's worst one), else at the first divergence.
      const i = Number(root.dataset.focus !== undefined ? root.dataset.focus : root.dataset.div);
      // Twice: off-screen blocks are laid out (content-visibility) only once scrolled near.
      const reveal = () => bodies.forEach((b) => {
        const c = chipAt(b, i) || b.querySelector('.pt-end');
        if (c) b.scrollTop += c.getBoundingClientRect().top - b.getBoundingClientRect().top - b.clientHeight / 3;
      });
      reveal(); requestAnimationFrame(reveal);
      render(root, i);
    }
  }
  // A run that just finished in this page brings its verdict into view (once per run).
  function reveal(card) {
    card.dataset.revealed = '1';
    card.scrollIntoView({behavior: 'smooth', block: 'start'});
  }
  // A workload's prompt table: sorted here by any column (each cell's value in data-v, else its
  // text; ties in prompt order), so a click on a header costs no server call, also for 1,000s of
  // rows. In the app (data-pick) a click on a row writes its prompt into the view's off-screen box
  // and presses its button: the server opens that prompt's token view.
  // The rows an app's table keeps in its <template> (render.workload EAGER_TABLE_ROWS): moved into the
  // body `n` at a time, in the table's order (all when n is 0). Returns whether any are left.
  function moreRows(table, n) {
    const rest = table.parentElement.querySelector('template.wl-rest');
    if (!rest) return false;
    const rows = rest.content.children;
    const frag = document.createDocumentFragment();
    for (let k = n || rows.length; k > 0 && rows.length; k--) frag.appendChild(rows[0]);
    table.tBodies[0].appendChild(frag);
    if (rows.length) return true;
    rest.remove();
    return false;
  }
  // More rows as the table is scrolled near its end (never in the background: a chunk laid out while
  // the user clicks a row would delay that click).
  function moreOnScroll(table) {
    const box = table.closest('.wl-scroll');
    if (!box || !box.querySelector('template.wl-rest')) return;
    const onScroll = () => {
      if (box.scrollTop + box.clientHeight < box.scrollHeight - 300) return;
      if (!moreRows(table, 200)) box.removeEventListener('scroll', onScroll);
    };
    box.addEventListener('scroll', onScroll, {passive: true});
  }
  // Sorted over every row, those laid out and those still in the <template>; the body keeps as many
  // rows as it had (the first of the new order) and the rest go back to the template, moved in as the
  // table is scrolled: laying out all 1,000 rows of a workload after a sort froze the page for ~0.6 s
  // on 2 cores (style and layout of every cell), and every later redraw of the page paid for them too.
  function sortTable(table, th) {
    const col = th.cellIndex;
    const asc = th.getAttribute('aria-sort') !== 'ascending';
    table.querySelectorAll('thead th[aria-sort]').forEach((h) => h.removeAttribute('aria-sort'));
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    const num = th.dataset.sort === 'num';
    const body = table.tBodies[0];
    const rest = table.parentElement.querySelector('template.wl-rest');
    const shown = body.rows.length;
    const all = Array.from(body.rows).concat(rest ? Array.from(rest.content.children) : []);
    const keyed = all.map((r) => {
      const td = r.cells[col];
      const v = td.dataset.v !== undefined ? td.dataset.v : td.textContent;
      return [num ? Number(v) : v.toLowerCase(), Number(r.dataset.i), r];
    });
    const dir = asc ? 1 : -1;
    keyed.sort((a, b) => (a[0] < b[0] ? -dir : a[0] > b[0] ? dir : 0) || a[1] - b[1]);
    const now = document.createDocumentFragment();
    keyed.slice(0, shown).forEach((k) => now.appendChild(k[2]));
    if (rest) {
      const later = document.createDocumentFragment();
      keyed.slice(shown).forEach((k) => later.appendChild(k[2]));
      rest.content.appendChild(later);
    }
    body.appendChild(now);
    table.dataset.sorted = `${col}:${asc ? 'asc' : 'desc'}`;
  }
  function pickRow(table, tr) {
    const pick = table.dataset.pick;
    if (!pick) return;
    table.querySelectorAll('tbody tr.sel').forEach((r) => r.classList.remove('sel'));
    tr.classList.add('sel');
    const box = document.querySelector(`#${pick}-wl-pick textarea, #${pick}-wl-pick input`);
    const btn = document.querySelector(`#${pick}-wl-open`);
    if (!box || !btn) return;
    box.value = tr.dataset.at !== undefined ? `${tr.dataset.i}@${tr.dataset.at}` : tr.dataset.i;  // a replay's token
    box.dispatchEvent(new Event('input', {bubbles: true}));
    btn.click();
  }
  // An audit's grid (render.audit): a broken cell, or an axis's first break, writes `side|axis|prompt`
  // into the view's off-screen box and presses its button: the server opens that pair at its break.
  function pickCell(grid, td) {
    const pick = grid.dataset.pick;
    const box = document.querySelector(`#${pick}-au-pick textarea, #${pick}-au-pick input`);
    const btn = document.querySelector(`#${pick}-au-open`);
    if (!box || !btn) return;
    grid.querySelectorAll('td.sel').forEach((c) => c.classList.remove('sel'));
    td.classList.add('sel');
    box.value = td.dataset.k;
    box.dispatchEvent(new Event('input', {bubbles: true}));
    btn.click();
  }
  function initGrid(grid) {
    grid.dataset.init = '1';
    grid.addEventListener('click', (e) => {
      const td = e.target.closest('td[data-k]');
      if (td) pickCell(grid, td);
    });
  }
  function initTable(table) {
    table.dataset.init = '1';
    moreOnScroll(table);
    table.tHead.addEventListener('click', (e) => {
      const th = e.target.closest('th[data-sort]');
      if (th) sortTable(table, th);
    });
    table.tBodies[0].addEventListener('click', (e) => {
      const tr = e.target.closest('tr[data-i]');
      if (tr) pickRow(table, tr);
    });
  }
  // The op map (ui.op_map_view): a click on a cell writes "LOC|row|col" into the view's hidden box and
  // presses its button; the server answers with the cell's figures and the panes at that token. Plotly
  // re-creates its event emitter (gd._ev) when a figure is drawn anew: bind once per emitter.
  function initOpMap(el) {
    if (!el.on || (el._ev && el._omBound === el._ev)) return;
    el._omBound = el._ev;
    el.on('plotly_click', (ev) => {
      const pt = ev && ev.points && ev.points[0];
      const meta = el.layout && el.layout.meta;
      if (!pt || !meta || !meta.loc || pt.data.name === 'router margin') return;
      const at = Array.isArray(pt.pointNumber) ? pt.pointNumber : pt.pointIndex;
      if (!Array.isArray(at)) return;
      const wrap = el.closest('[id$="-opmap"]');
      const pick = wrap ? wrap.id.replace(/-opmap$/, '') : '';
      const box = document.querySelector(`#${pick}-om-pick textarea, #${pick}-om-pick input`);
      const btn = document.querySelector(`#${pick}-om-open`);
      if (!box || !btn) return;
      box.value = `${meta.loc}|${at[0]}|${at[1]}`;
      box.dispatchEvent(new Event('input', {bubbles: true}));
      btn.click();
    });
  }
  const scan = () => {
    document.querySelectorAll('[id$="-opmap"] .js-plotly-plot').forEach(initOpMap);
    document.querySelectorAll('.pt-root:not([data-init])').forEach(init);
    document.querySelectorAll('.pc-summary[data-reveal]:not([data-revealed]), .pc-workload[data-reveal]:not([data-revealed])').forEach(reveal);
    document.querySelectorAll('table.wl-table:not([data-init])').forEach(initTable);
    document.querySelectorAll('table.au-grid[data-pick]:not([data-init])').forEach(initGrid);
  };
  let queued = false;
  new MutationObserver(() => {
    if (queued) return; queued = true;
    requestAnimationFrame(() => { queued = false; scan(); });
  }).observe(document.documentElement, {childList: true, subtree: true});
})();
</script>
"""

JS = JS_TEMPLATE.replace("__BLOCK__", str(BLOCK))
