// The bksim dashboard: polls /dashboard/api/state every POLL_MS and redraws. No dependencies.
// Every number the page shows also sits in a data-* attribute (tests read them from the DOM).
"use strict";
const POLL_MS = 1500;
const HISTORY = 60;          // samples kept per sparkline (90 s at POLL_MS)
const STRIPE_COLUMNS = 24;   // entries drawn per ledger striping grid
const history = {};          // key -> [numbers]
let polls = 0;

const $ = (id) => document.getElementById(id);
function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function fmt(n, digits = 0) {
  if (n === null || n === undefined) return "–";
  return Number(n).toLocaleString("en-US", {maximumFractionDigits: digits, minimumFractionDigits: digits});
}
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function push(key, value) {
  const h = history[key] || (history[key] = []);
  h.push(value);
  if (h.length > HISTORY) h.shift();
  return h;
}
function spark(values, color = "var(--accent)", w = 120, h = 24) {
  if (!values.length) return "";
  const max = Math.max(1, ...values);
  const step = w / Math.max(1, HISTORY - 1);
  const x0 = w - (values.length - 1) * step;
  const pts = values.map((v, i) => `${(x0 + i * step).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`);
  return `<svg width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" aria-hidden="true">` +
    `<polyline fill="none" stroke="${color}" stroke-width="1.5" points="${pts.join(" ")}"/></svg>`;
}
function more(n, what) { return n > 0 ? `<div class="more" data-more="${n}">+${n} more ${what}</div>` : ""; }
function stateClass(state) {
  return {"writable": "ok", "read-only": "warn", "unreachable": "bad", "OPEN": "info", "IN_RECOVERY": "warn",
          "CLOSED": "ok", "LedgerOpened": "ok", "Fenced": "bad", "Closed": "warn"}[state] || "info";
}

function drawBookies(b) {
  if (!b.items.length) { $("bookies").innerHTML = `<div class="empty">no bookie registered</div>`; return; }
  const rows = b.items.map((x) => {
    const used = x.used_ratio;
    const pct = used === null ? null : used * 100;
    const meter = pct === null ? "–" :
      `<div class="meter ${pct > 90 ? "bad" : pct > 75 ? "warn" : ""}"><span style="width:${pct.toFixed(1)}%"></span></div>`;
    const h = push("bookie:" + x.id, x.add_rate);
    return `<tr data-bookie="${esc(x.id)}" data-state="${esc(x.state)}" data-add-rate="${x.add_rate}">
      <td class="mono">${esc(x.id)}${x.error ? `<div class="err">${esc(x.error)}</div>` : ""}</td>
      <td><span class="badge ${stateClass(x.state)}">${esc(x.state)}</span></td>
      <td>${meter}</td><td class="num" style="white-space:nowrap">${pct === null ? "–" : pct.toFixed(1) + "%"} <span class="muted">· ${bytes(x.free_bytes)} free</span></td>
      <td class="num">${fmt(x.add_rate, 0)}</td><td>${spark(h, "var(--ok)")}</td>
      <td class="num" title="the bookie's gRPC API does not export it; see its /metrics">${x.journal_sync_p99_ms === null ? "–" : fmt(x.journal_sync_p99_ms, 2)}</td></tr>`;
  });
  $("bookies").innerHTML = `<table><thead><tr><th>Bookie</th><th>State</th><th>Disk</th><th class="num">Used</th>
    <th class="num">Adds/s*</th><th></th><th class="num">Sync p99</th></tr></thead>
    <tbody>${rows.join("")}</tbody></table>
    <div class="more">* entries/s this broker's open ledgers stripe onto the bookie</div>${more(b.more, "bookies")}`;
}

function drawBrokers(brokers) {
  if (!brokers.length) { $("brokers").innerHTML = `<div class="empty">no broker registered</div>`; return; }
  $("brokers").innerHTML = brokers.map((r) => `<div class="broker" data-broker="${esc(r.id)}" data-topic-count="${r.topic_count}">
      <span class="mono">${esc(r.id)}</span> ${r.self ? `<span class="badge info">this broker</span>` : ""}
      <span class="muted">${r.topic_count} topic${r.topic_count === 1 ? "" : "s"}</span>
      <div class="chips">${r.items.map((t) => `<span class="chip">${esc(t.replace("persistent://", ""))}</span>`).join("")}</div>
      ${more(r.more, "topics")}</div>`).join("");
}

function drawTopics(t) {
  if (!t.items.length) { $("topics").innerHTML = `<div class="empty">this broker serves no topic yet</div>`; return; }
  const rows = t.items.map((x) => {
    const hin = push("in:" + x.name, x.msg_rate_in), hb = push("backlog:" + x.name, x.backlog);
    return `<tr data-topic="${esc(x.name)}" data-msg-in="${x.msg_in_counter}" data-msg-out="${x.msg_out_counter}"
        data-backlog="${x.backlog}" data-storage="${x.storage_size}" data-last-confirmed="${esc(x.last_confirmed)}">
      <td class="mono">${esc(x.name)}</td><td><span class="badge ${stateClass(x.state)}">${esc(x.state)}</span></td>
      <td class="num">${fmt(x.msg_rate_in, 1)}</td><td>${spark(hin)}</td><td class="num">${fmt(x.msg_rate_out, 1)}</td>
      <td class="num">${fmt(x.msg_in_counter)}</td><td class="num">${fmt(x.msg_out_counter)}</td>
      <td class="num ${x.backlog ? "warn" : ""}">${fmt(x.backlog)}</td><td>${spark(hb, "var(--warn)")}</td>
      <td class="num">${bytes(x.storage_size)}</td><td class="mono">${esc(x.last_confirmed)}</td>
      <td class="mono">${x.ledgers.join(", ")}${x.ledgers_more ? ` +${x.ledgers_more}` : ""}</td></tr>`;
  });
  $("topics").innerHTML = `<table><thead><tr><th>Topic</th><th>State</th><th class="num">In/s</th><th></th>
    <th class="num">Out/s</th><th class="num">Msgs in</th><th class="num">Msgs out</th><th class="num">Backlog</th><th></th>
    <th class="num">Storage</th><th>Last confirmed</th><th>Ledgers</th></tr></thead><tbody>${rows.join("")}</tbody></table>
    ${more(t.more, "topics")}`;
}

function strip(c, w = 900, h = 22) {
  const span = Math.max(c.span, 1);
  const x = (off) => (off / span) * w;
  let svg = `<svg width="100%" height="${h + 14}" viewBox="0 0 ${w} ${h + 14}" preserveAspectRatio="none" role="img"
    aria-label="cursor strip"><rect x="0" y="0" width="${w}" height="${h}" rx="3" fill="var(--line)"/>`;
  if (c.read_offset) svg += `<rect class="holes" x="0" y="0" width="${x(c.read_offset).toFixed(2)}" height="${h}" fill="var(--bad)" opacity="0.85"/>`;
  for (const [a, b] of c.acked_ranges) {
    svg += `<rect class="acked" x="${x(a).toFixed(2)}" y="0" width="${Math.max(0.8, x(b) - x(a)).toFixed(2)}" height="${h}" fill="var(--ok)"/>`;
  }
  if (c.span) {
    const rx = Math.min(w - 1, x(c.read_offset));
    svg += `<rect x="${rx.toFixed(2)}" y="-2" width="2" height="${h + 4}" fill="var(--info)"/>`;
  }
  svg += `<text x="0" y="${h + 12}">${esc(c.mark_delete)}</text><text x="${w}" y="${h + 12}" text-anchor="end">+${fmt(c.span)} entries</text></svg>`;
  return svg;
}

function drawCursors(t) {
  const out = [];
  for (const x of t.items) {
    for (const c of x.subscriptions) {
      out.push(`<div class="cursor" data-cursor="${esc(x.name)}|${esc(c.name)}" data-mark-delete="${esc(c.mark_delete)}"
          data-read-position="${esc(c.read_position)}" data-backlog="${c.backlog}" data-holes="${c.holes}"
          data-acked="${c.acked_after_mark_delete}" data-ranges="${c.acked_ranges.length + c.acked_ranges_more}">
        <div class="head"><span class="mono">${esc(x.name.replace("persistent://", ""))}</span>
          <b>${esc(c.name)}</b><span class="badge info">${esc(c.type)}</span>
          <span>mark-delete <code>${esc(c.mark_delete)}</code></span><span>read <code>${esc(c.read_position)}</code></span>
          <span class="${c.backlog ? "warn" : "ok"}">backlog ${fmt(c.backlog)}</span>
          <span class="muted">${fmt(c.span - c.read_offset)} not yet delivered</span>
          <span class="${c.holes ? "bad" : "muted"}">holes ${fmt(c.holes)}</span>
          <span class="muted">${fmt(c.acked_ranges.length + c.acked_ranges_more)} acked ranges · ${c.consumers} consumer${c.consumers === 1 ? "" : "s"} · ${fmt(c.unacked)} unacked</span></div>
        ${strip(c)}${c.acked_ranges_more ? more(c.acked_ranges_more, "acked ranges not drawn") : ""}</div>`);
    }
    if (x.subscriptions_more) out.push(more(x.subscriptions_more, "subscriptions of " + x.name));
  }
  $("cursors").innerHTML = out.length ? out.join("") : `<div class="empty">no subscription</div>`;
}

function striping(l) {
  const seg = l.segments[l.segments.length - 1];
  const E = seg.ensemble.length, Qw = l.write_quorum;
  const last = Math.max(l.lac, seg.first_entry - 1);
  const first = Math.max(seg.first_entry, last - STRIPE_COLUMNS + 1);
  const cols = Math.max(0, last - first + 1);
  const cw = 22, rh = 16, lw = 150;
  const w = lw + Math.max(cols, 1) * cw, h = E * rh + 14;
  let svg = `<svg width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img" aria-label="striping">`;
  seg.ensemble.forEach((b, i) => {
    svg += `<text x="0" y="${i * rh + 12}" class="mono">${esc(b.length > 22 ? b.slice(0, 21) + "…" : b)}</text>`;
  });
  for (let c = 0; c < cols; c++) {
    const e = first + c;
    for (let k = 0; k < E; k++) {
      const stores = ((k - e) % E + E) % E < Qw;
      const fill = stores ? `var(--stripe-${e % 8})` : "var(--line)";
      svg += `<rect x="${lw + c * cw}" y="${k * rh + 2}" width="${cw - 3}" height="${rh - 4}" rx="2" fill="${fill}" opacity="${stores ? 0.9 : 0.45}"/>`;
    }
    if (cols <= 12 || c % 4 === 0 || e === last) svg += `<text x="${lw + c * cw}" y="${E * rh + 11}">${e}</text>`;
  }
  if (!cols) svg += `<text x="${lw}" y="12">no entry yet</text>`;
  return svg + "</svg>";
}

function drawLedgers(L) {
  if (!L.items.length) { $("ledgers").innerHTML = `<div class="empty">no ledger</div>`; return; }
  $("ledgers").innerHTML = L.items.map((l) => {
    if (l.error) return `<div class="ledger" data-ledger="${l.id}"><b>ledger ${l.id}</b> <span class="err">${esc(l.error)}</span></div>`;
    const lac = push("lac:" + l.id, l.lac);
    const segs = l.segments.map((s) => `<span class="chip">from ${s.first_entry}: ${s.ensemble.map(esc).join(", ")}</span>`).join("");
    return `<div class="ledger" data-ledger="${l.id}" data-lac="${l.lac}" data-state="${esc(l.state)}" data-segments="${l.segments.length + l.segments_more}">
      <div class="head"><b>ledger ${l.id}</b><span class="mono muted">${esc(l.topic.replace("persistent://", ""))}</span>
        <span class="badge ${stateClass(l.state)}">${esc(l.state)}</span>${l.writing ? `<span class="badge info">written here</span>` : ""}
        <span>LAC <b class="mono">${l.lac}</b></span>${spark(lac, "var(--info)", 90, 18)}
        <span class="muted">E=${l.ensemble_size} Qw=${l.write_quorum} Qa=${l.ack_quorum}${l.state === "CLOSED" ? " · " + bytes(l.length) : ""}</span></div>
      <div class="chips">${segs}${l.segments_more ? `<span class="chip">+${l.segments_more} older segments</span>` : ""}</div>
      <div style="margin-top:6px">${striping(l)}</div></div>`;
  }).join("") + more(L.more, "ledgers");
}

function render(s) {
  $("broker-id").textContent = s.broker.id;
  const bookies = s.bookies.items;
  $("t-writable").textContent = bookies.filter((b) => b.state === "writable").length;
  $("t-readonly").textContent = bookies.filter((b) => b.state !== "writable").length;
  $("t-brokers").textContent = s.brokers.length;
  $("t-topics").textContent = s.topics.items.length + s.topics.more;
  $("t-rate").textContent = fmt(s.topics.items.reduce((a, t) => a + t.msg_rate_in, 0), 1);
  $("t-backlog").textContent = fmt(s.topics.items.reduce((a, t) => a + t.backlog, 0));
  $("bookies-count").textContent = `${bookies.length + s.bookies.more}`;
  $("brokers-count").textContent = `${s.brokers.length}`;
  $("topics-count").textContent = `${s.topics.items.length + s.topics.more}`;
  $("ledgers-count").textContent = `${s.ledgers.items.length + s.ledgers.more}`;
  drawBookies(s.bookies); drawBrokers(s.brokers); drawTopics(s.topics); drawCursors(s.topics); drawLedgers(s.ledgers);
}

async function poll() {
  try {
    const r = await fetch("/dashboard/api/state", {cache: "no-store"});
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
    polls++;
    const u = $("updated");
    u.dataset.polls = polls;
    u.textContent = `updated ${new Date().toLocaleTimeString()}`;
    $("live").className = "live";
  } catch (e) {
    $("updated").textContent = `not answering (${e.message}); retrying`;
    $("live").className = "live stale";
  }
  setTimeout(poll, POLL_MS);
}
poll();
