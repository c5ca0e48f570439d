"use strict";
// The dashboard (controller-api.md §13). Every string from the server is inserted as a
// text node (DASH-003); the only requests go to this controller's own API (DASH-002).
(function () {
  const KEY = "rc_token"; // the one sessionStorage key (DASH-010)
  const POLL_MS = 5000, DEBOUNCE_MS = 250, DESCRIBE_MS = 15000;
  const LONG_WAIT = 600, STALE_HOST = 30, STALE_LABEL = 3600, FEED_CAP = 120;

  const DEVICE_WORDS = { ready: "free", busy: "in use", unknown: "not reporting", unhealthy: "out of the pool" };
  const DEVICE_CLASS = { ready: "free", busy: "busy", unknown: "unknown", unhealthy: "out" };
  const JOB_WORDS = { queued: "waiting for a device", assigned: "starting", running: "running",
    succeeded: "finished", failed: "failed", killed: "stopped", lost: "lost", preempted: "preempted" };
  const TERMINAL = new Set(["succeeded", "failed", "killed", "lost"]);

  let isAdmin = false, identity = "", state = null, lastOk = 0, pollTimer = 0, tickTimer = 0;
  let source = null, nudgeTimer = 0, reopenTimer = 0, panelStack = [];
  const describeCache = new Map(); // device id -> {at, body}
  const knownJobs = new Map(); // job id -> job object, for naming feed entries

  const $ = (id) => document.getElementById(id);
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    if (attrs) for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v; else if (k === "title") e.title = v; else e.setAttribute(k, v);
    }
    for (const kid of kids) if (kid !== null && kid !== undefined) e.append(typeof kid === "string" ? document.createTextNode(kid) : kid);
    return e;
  }
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);
  const cmdText = (c) => (Array.isArray(c) ? c.join(" ") : String(c || ""));

  function age(sec) {
    if (typeof sec !== "number") return "age unknown";
    if (sec < 0) return "future?";
    if (sec < 60) return sec + " s";
    if (sec < 3600) return Math.floor(sec / 60) + " min " + (sec % 60) + " s";
    if (sec < 86400) return Math.floor(sec / 3600) + " h " + Math.floor((sec % 3600) / 60) + " min";
    return Math.floor(sec / 86400) + " d " + Math.floor((sec % 86400) / 3600) + " h";
  }
  function bytes(v) {
    if (!/^\d+$/.test(v)) return v;
    let n = Number(v), u = 0; const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    while (n >= 1024 && u < units.length - 1) { n /= 1024; u++; }
    return u === 0 ? v + " B" : n.toFixed(1) + " " + units[u];
  }
  // A memory size as probes write it: nvidia-smi's MiB count with an "M" suffix
  // ("81559M", worker PROBE-012), or a drop-in's "80G", "81559MiB" or plain bytes. The
  // suffixes are binary, as the selector reads them. null when it is no quantity
  // ("[N/A]M" on a card that does not say).
  const SIZE_SUFFIX = { "": 1, K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 };
  function size(v) {
    const m = /^(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:i?B)?|B)?$/i.exec(String(v || "").trim());
    return m ? bytes(String(Math.round(Number(m[1]) * SIZE_SUFFIX[(m[2] || "").toUpperCase()]))) : null;
  }
  // How a label's value is shown: byte counts and memory sizes in binary units, the rest as written.
  function labelText(key, value) {
    if (/_bytes$/.test(key)) return bytes(value);
    if (key === "vram" || key === "vram_free") return size(value) || value;
    return value;
  }
  const showResult = (text, bad) => { const r = $("result"); r.textContent = text; r.className = bad ? "result error" : "result"; };

  // ---- credentials (DASH-010..015) ------------------------------------------------------
  const token = () => sessionStorage.getItem(KEY) || "";
  function api(path, opts) {
    const o = opts || {};
    return fetch(path, { method: o.method || "GET", headers: Object.assign({ Authorization: "Bearer " + token() }, o.headers || {}), body: o.body, cache: "no-store" });
  }
  async function errorText(r) {
    try { const b = await r.json(); if (b && typeof b.error === "string") return b.error + ": " + String(b.message || ""); } catch (_) { /* not JSON */ }
    return "HTTP " + r.status;
  }
  function gate(message) {
    sessionStorage.removeItem(KEY);
    stopLive();
    closePanel();
    state = null; lastOk = 0; isAdmin = false; $("badge").hidden = true;
    $("main").hidden = true; $("gate").hidden = false;
    $("gate-error").textContent = message || "";
    $("gate-token").focus();
  }
  async function connect() {
    $("gate").hidden = true; $("main").hidden = false;
    const w = await api("/v1/whoami");
    if (w.status === 401 || w.status === 403) return gate("That token was refused.");
    isAdmin = w.ok && (await w.json()).role === "admin";
    $("badge").hidden = !isAdmin;
    await refresh();
    if (!token()) return;
    pollTimer = setInterval(refresh, POLL_MS);
    tickTimer = setInterval(freshness, 1000);
    openStream();
  }
  function stopLive() {
    clearInterval(pollTimer); clearInterval(tickTimer); clearTimeout(nudgeTimer); clearTimeout(reopenTimer);
    if (source) { source.close(); source = null; }
  }

  // ---- event stream and refresh (DASH-015, DASH-028) -------------------------------------
  function openStream() {
    if (!token()) return;
    source = new EventSource("/v1/events?token=" + encodeURIComponent(token()));
    source.onopen = () => { $("polling").hidden = true; };
    source.onmessage = (m) => {
      try { const ev = JSON.parse(m.data); if (ev.kind === "jobs" && ev.payload) jobEvent(ev.payload); } catch (_) { /* a nudge all the same */ }
      clearTimeout(nudgeTimer); nudgeTimer = setTimeout(refresh, DEBOUNCE_MS);
    };
    source.onerror = () => {
      $("polling").hidden = false;
      if (source && source.readyState === EventSource.CLOSED) {
        source = null; reopenTimer = setTimeout(openStream, POLL_MS);
      }
    };
  }
  // One fetch at a time; a refresh asked for meanwhile runs once it ends, so that a
  // change whose event arrived during the fetch is never left to the next poll (DASH-028).
  let inFlight = false, again = false;
  async function refresh() {
    if (!token()) return;
    if (inFlight) { again = true; return; }
    inFlight = true; again = false;
    try {
      const r = await api("/v1/state");
      if (r.status === 401 || r.status === 403) return gate("The controller refused the token (" + r.status + ").");
      if (!r.ok) { showResult(await errorText(r), true); return; }
      const next = await r.json();
      diffFeed(state, next);
      state = next; lastOk = Date.now();
      for (const j of next.jobs.concat(next.queued)) knownJobs.set(j.id, j);
      render(); freshness();
    } catch (e) { showResult("cannot reach the controller", true); }
    finally { inFlight = false; if (again) refresh(); }
  }
  function freshness() {
    const f = $("fresh");
    if (!lastOk) { f.textContent = "connecting…"; return; }
    const s = Math.floor((Date.now() - lastOk) / 1000);
    f.textContent = s < 10 ? "live" : "updated " + age(s) + " ago";
    f.className = "fresh" + (s > 30 ? " stale" : s > 10 ? " warn" : "");
  }

  // ---- quarantine explanations (DASH-041) ----------------------------------------------
  function explain(reason) {
    const r = reason || "";
    if (r === "") return { head: "no reason was recorded", what: "It was taken out before reasons were kept, or by something that said nothing.", todo: "Check the host, then return it to the pool. A reboot does not clear it." };
    if (r === "fault") return { head: "the host reported a problem with the device", what: "The worker took the device out itself; the worker's log says what went wrong.", todo: "Someone must look at the host. A reboot does not clear it." };
    if (r === "worker_lost") return { head: "the host stopped reporting", what: "Contact with the host was lost, so every device of that host was held back, claimed or not. Work on it may still be running.", todo: "A reboot brings it back on its own once the worker registers; otherwise check the worker." };
    if (r === "lease_expired") return { head: "the claim on the device ran out", what: "The holder stopped renewing its claim and nothing proved the work ended.", todo: "Check for a leftover process, then return it to the pool. A reboot clears it." };
    if (r === "registration") return { head: "the worker restarted with work in flight", what: "The job may still be running on the machine.", todo: "Confirm nothing is running, then return it to the pool. A reboot clears it." };
    if (r.startsWith("verify failed: ")) return { head: "a check after the last job found the device not clean", what: "The job itself finished; usually a leftover process is still holding the card.", todo: "Fix it on the host, then return it to the pool. A reboot clears a leftover process.", quote: r.slice("verify failed: ".length) };
    return { head: "the host reported a problem with the device", what: "The host gave its own description, quoted below.", todo: "Someone must look at the host. A reboot does not clear it.", quote: r };
  }

  // ---- rendering (DASH-020..023) -------------------------------------------------------
  function pill(stateName) { return el("span", { class: "pill " + (DEVICE_CLASS[stateName] || "") }, DEVICE_WORDS[stateName] || "unrecognised state"); }
  function labelValue(d, key) {
    const ls = d.labels || [];
    const det = ls.find((l) => l.key === key && l.source === "detected");
    const dec = ls.find((l) => l.key === key && l.source === "declared");
    return det ? det.value : dec ? dec.value : "";
  }
  // The one-line hardware summary (DASH-022) from the keys the worker's probes publish on
  // a gpu<N> device (worker PROBE-012): model (or else vendor) and total VRAM.
  function hardware(d) {
    const vram = size(labelValue(d, "vram"));
    return [labelValue(d, "model") || labelValue(d, "vendor"), vram ? vram + " VRAM" : ""].filter(Boolean).join(", ");
  }
  // The panel's portrait adds what the summary leaves out.
  function portrait(d) {
    const free = size(labelValue(d, "vram_free")), driver = labelValue(d, "driver"), vendor = labelValue(d, "vendor");
    return [hardware(d), vendor && labelValue(d, "model") ? "vendor " + vendor : "",
      free ? free + " free at the last probe" : "", driver ? "driver " + driver : ""].filter(Boolean).join("; ");
  }
  // EXT-DRAIN-3a: a flag beside the state, with who and why; words only.
  function drainText(d) {
    return "draining — " + (d.drain_reason ? d.drain_reason + ", " : "") + "by " + (d.drained_by || "someone");
  }
  function waits(next) { return (next && next.queued_waiting_seconds) || {}; }

  function render() {
    const devs = state.devices, queued = state.queued, w = waits(state);
    const count = (s) => devs.filter((v) => v.device.state === s).length;
    const sum = $("summary"); sum.replaceChildren();
    if (!devs.length) sum.append("No devices yet.");
    else {
      sum.append(count("ready") + " free, " + count("busy") + " in use, " + count("unknown") + " not reporting, ");
      sum.append(el("em", { class: count("unhealthy") ? "out" : "" }, count("unhealthy") + " out of the pool"));
      const draining = devs.filter((v) => v.device.draining).length;
      sum.append(draining ? "; " + draining + " draining." : ".");
    }
    const qs = $("queue-summary"); qs.replaceChildren();
    if (!queued.length) qs.append("Nothing waiting.");
    else {
      const longest = Math.max(...queued.map((j) => w[j.id] || 0));
      qs.append(queued.length + " waiting; the longest for ");
      qs.append(el("span", { class: longest >= LONG_WAIT ? "long" : "" }, age(longest)), ".");
    }
    renderFleet(); renderWork(); rerenderPanel();
  }

  function renderFleet() {
    const fleet = $("fleet"); fleet.replaceChildren();
    if (!state.devices.length) { fleet.append(el("p", null, "No devices are registered. Starting a worker on a host makes its devices appear here.")); return; }
    const hosts = new Map();
    for (const v of state.devices) { const h = v.device.host; if (!hosts.has(h)) hosts.set(h, []); hosts.get(h).push(v); }
    for (const host of [...hosts.keys()].sort()) {
      const rows = hosts.get(host).sort((a, b) => (a.device.id < b.device.id ? -1 : 1));
      const first = rows[0].device;
      // Host-wide probe facts reach every device of the host (worker PROBE-004, API-032).
      const disk = labelValue(first, "disk_free_bytes"), cpus = labelValue(first, "cpus"), mem = labelValue(first, "mem_total_bytes");
      const facts = [disk ? "free disk " + bytes(disk) : "", cpus ? cpus + " CPUs" : "", mem ? bytes(mem) + " memory" : ""].filter(Boolean).join(", ");
      fleet.append(el("h3", null, host + " — " + rows.length + (rows.length === 1 ? " device" : " devices") + (facts ? " — " + facts : "")));
      const ul = el("ul", { class: "rows" });
      for (const v of rows) ul.append(deviceRow(v));
      fleet.append(ul);
    }
  }

  function queuedFor(deviceId) { return state.queued.filter((j) => j.device_id === deviceId); }

  function deviceRow(v) {
    const d = v.device;
    const li = el("li", { class: "device", tabindex: "0" });
    li.append($("glyph").content.cloneNode(true));
    li.append(" ", el("strong", { title: d.id }, d.name), " ", pill(d.state));
    if (d.draining) li.append(" ", el("span", { class: "pill draining" }, "draining"));
    const hw = hardware(d); if (hw) li.append(" ", el("span", { class: "dim" }, hw));
    if (d.draining) li.append(el("div", { class: "drain" }, drainText(d) + "; it finishes what it runs and takes nothing new."));
    if (v.holder !== undefined) {
      li.append(el("div", null, (v.kind === "hold" ? "held by " : "used by ") + v.holder + " for " + age(v.elapsed_seconds) +
        (v.kind === "hold" && v.reason ? " — " + clip(v.reason, 60) : "")));
    }
    if (v.heartbeat_age_seconds > STALE_HOST) li.append(el("div", { class: "warning" }, "The host has not reported for " + age(v.heartbeat_age_seconds) + "."));
    if (d.state === "unhealthy") {
      const x = explain(v.quarantine_reason);
      li.append(el("div", { class: "error" }, "Out of the pool: " + x.head + (x.quote ? " — “" + clip(x.quote, 160) + "”" : "")));
      const b = el("button", null, "Return to pool");
      b.addEventListener("click", (e) => { e.stopPropagation(); clearDevice(v); });
      li.append(b);
    }
    if (v.command && v.kind !== "hold") li.append(el("div", { class: "cmd" }, clip(cmdText(v.command), 200)));
    const w = waits(state);
    for (const j of queuedFor(d.id)) {
      const s = w[j.id] || 0;
      li.append(el("div", { class: s >= LONG_WAIT ? "long" : "dim" }, j.submitter + " waiting " + age(s)));
    }
    li.addEventListener("click", () => openDevice(d.id, false));
    li.addEventListener("keydown", (e) => { if (e.key === "Enter") openDevice(d.id, false); });
    return li;
  }

  function killButton(job) {
    if (!identity || TERMINAL.has(job.state)) return null;
    const mine = job.submitter === identity;
    const b = el("button", { class: mine ? "" : "outline", title: mine ? "" : "This is " + job.submitter + "'s job; the controller refuses unless your token is admin." },
      job.kind === "hold" ? "Release" : "Kill");
    b.addEventListener("click", (e) => { e.stopPropagation(); killJob(job); });
    return b;
  }

  function renderWork() {
    const list = $("work-list"); list.replaceChildren();
    const running = state.devices.filter((v) => v.job_id);
    $("work").hidden = !running.length && !state.queued.length;
    // An array's tasks show as one row with their counts (EXT-ARRAY-3).
    const arrays = new Map();
    const inArray = (job, counted) => {
      if (!job || !job.array_id) return false;
      const a = arrays.get(job.array_id) || { job: job, running: 0, queued: 0 };
      a[counted] += 1; arrays.set(job.array_id, a);
      return true;
    };
    for (const v of running) {
      const job = knownJobs.get(v.job_id) || { id: v.job_id, submitter: v.holder, kind: v.kind, state: "running", command: v.command || [] };
      if (inArray(job, "running")) continue;
      const row = el("li", { class: "device" }, el("span", { class: "pill busy" }, v.kind === "hold" ? "held" : "running"), " ",
        v.holder + " on " + v.device.id + " for " + age(v.elapsed_seconds) + " ",
        v.kind === "hold" ? null : el("div", { class: "cmd" }, clip(cmdText(v.command), 200)), killButton(job));
      row.addEventListener("click", () => openJob(v.job_id, false));
      list.append(row);
    }
    const w = waits(state), why = state.queued_waiting_for || {};
    for (const j of state.queued) {
      if (inArray(j, "queued")) continue;
      const s = w[j.id] || 0;
      const li = el("li", { class: "device" }, el("span", { class: "pill" }, "queued"), " ", j.submitter + " — " +
        (j.device_id ? j.device_id : "any device matching " + j.selector) + " — waiting ",
        el("span", { class: s >= LONG_WAIT ? "long" : "" }, age(s)), " ");
      if (j.kind !== "hold") li.append(el("div", { class: "cmd" }, clip(cmdText(j.command), 200)));
      for (const b of why[j.id] || []) li.append(el("div", { class: "dim" }, blocker(b)));
      const k = killButton(j); if (k) li.append(k);
      li.addEventListener("click", () => openJob(j.id, false));
      list.append(li);
    }
    for (const [id, a] of arrays) {
      const li = el("li", { class: "device" }, el("span", { class: "pill busy" }, "array"), " ",
        a.job.submitter + " — array " + id + " — " + a.running + " running · " + a.queued + " queued",
        el("div", { class: "cmd" }, clip(cmdText(a.job.command), 200)));
      const k = killButton({ id: id, submitter: a.job.submitter, kind: "array", state: "running" }); if (k) li.append(k);
      li.addEventListener("click", () => openJob(a.job.id, false));
      list.append(li);
    }
  }

  // What the worker measured of a finished job's GPUs (EXT-ACCT-1); "" when nothing was.
  function gpuText(j) {
    const parts = [];
    if (typeof j.gpu_util_mean === "number") parts.push(j.gpu_util_mean.toFixed(0) + "% busy on average");
    if (typeof j.gpu_mem_peak_bytes === "number") parts.push((j.gpu_mem_peak_bytes / 1073741824).toFixed(1) + " GiB memory at most");
    if (!parts.length) return "";
    return "GPU " + parts.join(", ") + (typeof j.samples === "number" ? " (" + j.samples + (j.samples === 1 ? " reading)" : " readings)") : "");
  }

  function blocker(b) {
    if (b.submitter_limit !== undefined) return b.submitter + " is at the limit of " + b.submitter_limit + " devices";
    if (b.after !== undefined) return "waits for job " + b.after + " to end";
    if (b.holder !== undefined) return b.device_id + " is " + (b.kind === "hold" ? "held" : "used") + " by " + b.holder + (b.until ? ", at most until " + new Date(b.until).toLocaleString() : "");
    if (b.reserved_by !== undefined) return b.device_id + " is reserved for job " + b.reserved_by + ", ahead in the queue";
    if (b.draining) return b.device_id + " is draining";
    if (b.state !== undefined) return b.device_id + " is " + (DEVICE_WORDS[b.state] || "unavailable") + (b.quarantine_reason !== undefined ? ": " + explain(b.quarantine_reason).head : "");
    return b.device_id + " is not available";
  }

  // ---- activity feed (DASH-024) --------------------------------------------------------
  function feed(text, secondsAgo) {
    const ol = $("feed");
    const when = new Date(Date.now() - (secondsAgo || 0) * 1000).toLocaleTimeString();
    ol.prepend(el("li", null, el("span", { class: "dim" }, when + " "), text));
    while (ol.children.length > FEED_CAP) ol.lastChild.remove();
  }
  async function jobEvent(p) {
    let job = knownJobs.get(p.job_id);
    if (!job) {
      try { const r = await api("/v1/jobs/" + encodeURIComponent(p.job_id)); if (r.ok) { job = (await r.json()).job; knownJobs.set(p.job_id, job); } } catch (_) { /* name it by ID */ }
    }
    const who = job ? job.submitter + "'s " + (job.kind === "hold" ? "hold" : "job") : "job " + p.job_id;
    const where = job && job.device_id ? " on " + job.device_id : "";
    feed(who + where + ": " + (JOB_WORDS[p.state] || "changed"));
  }
  function diffFeed(prev, next) {
    if (!prev) {
      // The first snapshot seeds the feed, backdated by server ages, oldest first so the
      // newest ends on top.
      const w = waits(next), seeds = [];
      for (const v of next.devices) if (v.holder !== undefined) seeds.push([v.holder + " took " + v.device.id, v.elapsed_seconds]);
      for (const j of next.queued) seeds.push([j.submitter + " started waiting" + (j.device_id ? " for " + j.device_id : ""), w[j.id] || 0]);
      seeds.sort((a, b) => b[1] - a[1]);
      for (const [text, ago] of seeds) feed(text, ago);
      const out = next.devices.filter((v) => v.device.state === "unhealthy").length;
      if (out) feed(out + (out === 1 ? " device was" : " devices were") + " already out of the pool");
      return;
    }
    const before = new Map(prev.devices.map((v) => [v.device.id, v]));
    for (const v of next.devices) {
      const id = v.device.id, old = before.get(id); before.delete(id);
      if (!old) { feed(id + " joined the fleet"); continue; }
      const a = old.device.state, b = v.device.state;
      if (a !== b) {
        if (b === "unhealthy") feed(id + " left the pool: " + explain(v.quarantine_reason).head);
        else if (a === "unhealthy") feed(id + " is back in the pool");
        else if (b === "unknown") feed(id + " stopped reporting");
        else if (a === "unknown") feed(id + " is reporting again");
      }
      if (!old.device.draining && v.device.draining) feed(id + " started " + drainText(v.device));
      if (old.device.draining && !v.device.draining) feed(id + " is no longer draining");
      if (old.kind !== "hold" && v.kind === "hold") feed(v.holder + " took a hold on " + id);
      if (old.kind === "hold" && v.kind !== "hold") feed(old.holder + " released the hold on " + id);
    }
    for (const id of before.keys()) feed(id + " was retired");
  }

  // ---- actions (DASH-050, DASH-051, DASH-013) -----------------------------------------
  async function finish(request, done) {
    try {
      const r = await request;
      if (r.ok) { showResult(done, false); describeCache.clear(); refresh(); }
      else showResult(await errorText(r), true);
    } catch (_) { showResult("cannot reach the controller", true); }
  }
  function killJob(job) {
    const what = job.kind === "hold" ? "Release the hold" : job.kind === "array" ? "Kill every task of the array" : "Kill the job";
    let msg = what + " of " + job.submitter + "?";
    if (job.submitter !== identity) msg += "\nIt is not yours (you are " + identity + "): the controller refuses unless your token is admin.";
    if (!confirm(msg)) return;
    finish(api("/v1/jobs/" + encodeURIComponent(job.id) + "/kill", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ submitter: identity }) }),
      job.kind === "hold" ? "Hold released." : "Kill sent.");
  }
  function adminRequest(path, method) {
    // The admin token lives only in this call: asked at the click, dropped once sent.
    let t = isAdmin ? token() : prompt("Admin token for this one action:") || "";
    if (!t) return null;
    const req = fetch(path, { method: method, headers: { Authorization: "Bearer " + t }, cache: "no-store" });
    t = "";
    return req;
  }
  function clearDevice(v) {
    const x = explain(v.quarantine_reason);
    if (!confirm("Return " + v.device.id + " to the pool?\nIt was taken out because " + x.head + ".\nThis only works if nothing holds it.")) return;
    const req = adminRequest("/v1/devices/" + encodeURIComponent(v.device.id) + "/clear", "POST");
    if (req) finish(req, v.device.id + " is back in the pool.");
  }
  function retireDevice(id) {
    if (!confirm("Retire " + id + "?\nIts job history is kept. A worker that still declares this device brings it back on its next registration.")) return;
    const req = adminRequest("/v1/devices/" + encodeURIComponent(id), "DELETE");
    if (req) finish(req, id + " was retired.");
  }

  // ---- device panel (DASH-025) ---------------------------------------------------------
  async function describe(id) {
    const hit = describeCache.get(id);
    if (hit && Date.now() - hit.at < DESCRIBE_MS) return hit.body;
    const r = await api("/v1/devices/" + encodeURIComponent(id) + "/describe");
    if (!r.ok) throw new Error(await errorText(r));
    const body = await r.json();
    describeCache.set(id, { at: Date.now(), body: body });
    return body;
  }
  function openPanel(subject, stack) {
    // Panels stack one level (DASH-028): the current one and the one it was opened from.
    if (stack && panelStack.length) panelStack = [panelStack[panelStack.length - 1], subject]; else panelStack = [subject];
    $("panel").hidden = false; $("backdrop").hidden = false;
    rerenderPanel();
  }
  // The claim bar (DASH-025): empty when free; the share of the holder's time limit
  // used, or full when its job has none.
  function claimed(info) {
    if (info.holder === undefined) return 0;
    const job = knownJobs.get(info.job_id);
    const limit = job ? job.max_runtime_seconds : 0;
    return limit > 0 ? Math.min(1, Math.max(0, info.elapsed_seconds / limit)) : 1;
  }
  const openDevice = (id, stack) => openPanel({ type: "device", id: id }, stack);
  const openJob = (id, stack) => openPanel({ type: "job", id: id }, stack);
  function closePanel() { panelStack = []; stopOutput(); $("panel").hidden = true; $("backdrop").hidden = true; }
  async function rerenderPanel() {
    if (!panelStack.length) return;
    const top = panelStack[panelStack.length - 1];
    $("back").hidden = panelStack.length < 2;
    if (top.type === "job") return renderJobPanel(top);
    stopOutput();
    const id = top.id;
    const body = $("panel-body");
    let info;
    try { info = await describe(id); } catch (e) { body.replaceChildren(el("h2", null, id), el("p", { class: "error" }, String(e.message))); return; }
    if (panelStack[panelStack.length - 1] !== top) return;
    const scroll = $("panel").scrollTop;
    const d = info.device, view = (state.devices.find((v) => v.device.id === id)) || {};
    const out = [el("h2", null, d.id), el("p", null, pill(d.state), d.draining ? " " : null, d.draining ? el("span", { class: "pill draining" }, "draining") : null)];
    if (d.draining) {
      out.push(el("p", { class: "drain" }, drainText(d) + (d.drained_at ? " (since " + new Date(d.drained_at).toLocaleString() + ")" : "") + "."),
        el("p", null, "It finishes the work it has and is given nothing new; jobs may still queue for it. An admin ends this with rc undrain."));
    }
    if (info.holder !== undefined) out.push(el("p", null, "Used by " + info.holder + " for " + age(info.elapsed_seconds) + "."));
    else if (d.state === "unknown") out.push(el("p", null, "The host has been silent for " + age(info.heartbeat_age_seconds) + "."));
    else out.push(el("p", null, "Nothing is using it."));
    if (info.heartbeat_age_seconds > STALE_HOST && info.holder !== undefined) out.push(el("p", { class: "warning" }, "Caution: the host has been silent for " + age(info.heartbeat_age_seconds) + " while holding work; the work may or may not still be running."));
    if (d.state === "unhealthy") {
      const x = explain(info.quarantine_reason);
      out.push(el("h3", null, "Out of the pool: " + x.head), el("p", null, x.what));
      if (x.quote !== undefined) out.push(el("blockquote", null, x.quote));
      out.push(el("p", null, x.todo));
      const b = el("button", null, "Return to pool"); b.addEventListener("click", () => clearDevice(Object.assign({}, view, { device: d, quarantine_reason: info.quarantine_reason }))); out.push(b);
    }
    if (info.holder === undefined) { const b = el("button", null, "Retire"); b.addEventListener("click", () => retireDevice(d.id)); out.push(" ", b); }
    const claim = el("progress", { max: "1", value: String(claimed(info)), "aria-label": "claim" });
    out.push(el("h3", null, "Hardware"), el("p", null, portrait(d) || "no hardware summary in its labels", " ", claim));
    const labels = info.labels || [];
    if (labels.length) {
      const t = el("table", { class: "labels" });
      const ages = info.label_age_seconds || {};
      for (const l of labels) {
        const a = ages[l.key + "/" + l.source];
        t.append(el("tr", null, el("td", null, l.key), el("td", null, labelText(l.key, l.value)),
          el("td", { class: "dim" }, l.source === "declared" ? "written by hand" : "detected"),
          el("td", { class: "dim" }, a === undefined ? "age unknown" : "seen " + age(a) + " ago")));
      }
      out.push(t);
      if (view.oldest_label_age_seconds > STALE_LABEL) out.push(el("p", { class: "warning" }, "Some labels have not been confirmed for " + age(view.oldest_label_age_seconds) + "."));
    }
    if (info.sheet) {
      out.push(el("h3", null, (info.sheet_is_host_wide ? "Usage notes for the host" : "Usage notes for this device") + " (written " + age(info.sheet_age_seconds) + " ago)"));
      out.push(markdown(info.sheet));
    }
    const recent = (info.recent_jobs || []).filter((j) => j.id !== info.job_id);
    if (recent.length) {
      const ul = el("ul", { class: "rows" });
      for (const j of recent) {
        const gpu = gpuText(j);
        const li = el("li", { class: "device" }, (JOB_WORDS[j.state] || "unknown") + " — " + j.submitter + " — ", el("span", { class: "cmd" }, clip(cmdText(j.command), 200)), gpu ? el("span", { class: "dim" }, " — " + gpu) : "");
        li.addEventListener("click", () => openJob(j.id, true));
        ul.append(li);
      }
      out.push(el("h3", null, "Recent jobs"), ul);
    }
    if (info.job_id) { const b = el("button", null, "Open the current work"); b.addEventListener("click", () => openJob(info.job_id, true)); out.push(el("p", null, b)); }
    body.replaceChildren(...out);
    $("panel").scrollTop = scroll;
  }

  // ---- job panel and live output (DASH-026, DASH-027) ----------------------------------
  const LOG_CAP = 400000;
  let output = null; // {jobId, abort, box}
  function stopOutput() { if (output) { output.abort.abort(); output = null; } }
  async function renderJobPanel(top) {
    const r = await api("/v1/jobs/" + encodeURIComponent(top.id));
    if (panelStack[panelStack.length - 1] !== top) return;
    const body = $("panel-body");
    if (!r.ok) { body.replaceChildren(el("h2", null, "Job " + top.id), el("p", { class: "error" }, await errorText(r))); return; }
    const view = await r.json(), j = view.job;
    knownJobs.set(j.id, j);
    const scroll = $("panel").scrollTop;
    const out = [el("h2", null, (j.kind === "hold" ? "Hold by " : "Job by ") + j.submitter), el("p", null, el("span", { class: "pill" }, JOB_WORDS[j.state] || "unknown"))];
    if (j.device_id) { const b = el("button", null, j.device_id); b.addEventListener("click", () => openDevice(j.device_id, true)); out.push(el("p", null, "Device: ", b)); }
    else out.push(el("p", null, "Any device matching " + j.selector));
    if (j.state === "queued") {
      const wait = waits(state)[j.id];
      const pos = view.queue_position;
      out.push(el("p", null, "Waiting " + age(wait) + (typeof pos === "number" ? (pos === 1 ? "; next in line" : "; " + (pos - 1) + (pos === 2 ? " job" : " jobs") + " ahead") : "")));
      for (const b of view.waiting_for || []) out.push(el("p", { class: "dim" }, blocker(b)));
    } else if (!TERMINAL.has(j.state)) {
      const v = state.devices.find((d) => d.job_id === j.id);
      if (v) out.push(el("p", null, "Running for " + age(v.elapsed_seconds)));
    }
    if (j.kill_reason) out.push(el("p", null, "Why it stopped: " + j.kill_reason));
    const facts = el("table", { class: "labels" });
    const fact = (k, v) => { if (v !== undefined && v !== "") facts.append(el("tr", null, el("td", null, k), el("td", null, String(v)))); };
    const when = (t) => (t ? new Date(t).toLocaleString() : undefined);
    fact("job ID", j.id); fact("submitted", when(j.submitted_at)); fact("started", when(j.started_at)); fact("finished", when(j.finished_at));
    fact("exit code", j.exit_code); fact("GPU use", gpuText(j) || undefined); fact("priority", j.priority); fact("time limit", j.max_runtime_seconds ? age(j.max_runtime_seconds) : undefined);
    fact("working directory", j.cwd);
    if (j.array_id) fact("array", "task " + j.array_index + " of array " + j.array_id);
    if (j.kind === "hold") fact("note", "a hold reserves the device and runs nothing" + (j.reason ? ": " + j.reason : ""));
    if (j.stdio) fact("note", "attached job (" + j.stdio + "): its output went to whoever attached");
    out.push(facts);
    if ((j.attempts || []).length > 1) {
      // EXT-RETRY-1, EXT-PREEMPT-2: every attempt, a preempted one with the job it made room for.
      const tries = el("table", { class: "labels" });
      for (const a of j.attempts) {
        const how = (JOB_WORDS[a.state] || a.state) + (typeof a.exit_code === "number" ? ", exit " + a.exit_code : "") + (a.kill_reason ? " — " + a.kill_reason : "");
        tries.append(el("tr", null, el("td", null, "attempt " + a.attempt), el("td", null, (a.device_id || "") + " — " + how)));
      }
      out.push(el("h3", null, "Attempts"), tries);
    }
    const cmd = cmdText(j.command);
    const copy = el("button", null, "Copy");
    copy.addEventListener("click", () => { if (navigator.clipboard) navigator.clipboard.writeText(cmd).then(() => showResult("Command copied.", false), () => showResult("Copy failed.", true)); });
    out.push(el("h3", null, "Command" + (cmd.length > 400 ? " (" + cmd.length + " characters)" : "")), el("pre", null, cmd), copy);
    const k = killButton(j); if (k) out.push(" ", k);
    out.push(el("h3", null, "Output"));
    let box = output && output.jobId === j.id ? output.box : null;
    if (!box) {
      stopOutput();
      box = el("pre", { class: "output" });
      if (j.kind === "hold") box.append("A hold produces no output.");
      else if (j.stdio) box.append("This job's output went to whoever attached to it.");
      else if (j.state === "queued" && !(j.attempt > 1)) box.append("Nothing has run yet.");
      else followOutput(j.id, box);
    }
    out.push(box);
    body.replaceChildren(...out);
    $("panel").scrollTop = scroll;
  }
  async function followOutput(jobId, box) {
    const abort = new AbortController();
    output = { jobId: jobId, abort: abort, box: box };
    let size = 0, any = false;
    try {
      const r = await fetch("/v1/jobs/" + encodeURIComponent(jobId) + "/logs", { headers: { Authorization: "Bearer " + token() }, signal: abort.signal, cache: "no-store" });
      if (!r.ok) { box.append(await errorText(r)); return; }
      const reader = r.body.getReader(), dec = new TextDecoder();
      for (;;) {
        const { done, value } = await reader.read();
        const text = done ? dec.decode() : dec.decode(value, { stream: true });
        if (text) {
          any = true;
          const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
          box.append(document.createTextNode(text)); size += text.length;
          while (size > LOG_CAP && box.firstChild) {
            const first = box.firstChild, over = size - LOG_CAP;
            if (first.data.length <= over) { size -= first.data.length; first.remove(); }
            else { first.data = first.data.slice(over); size -= over; }
          }
          if (atBottom) box.scrollTop = box.scrollHeight;
        }
        if (done) break;
      }
      box.append(el("div", { class: "dim" }, any ? "— output ended —" : "There was no output."));
    } catch (e) {
      if (!abort.signal.aborted) box.append(el("div", { class: "error" }, "output stream broke off"));
    }
  }

  // ---- usage-sheet Markdown, DOM nodes only (DASH-060, DASH-061) ------------------------
  const INLINE = /`([^`]+)`|\*\*(.+?)\*\*|__(.+?)__|\*([^*]+)\*|_([^_]+)_|\[([^\]]*)\]\(([^)\s]*)\)/;
  function inline(text) {
    const frag = document.createDocumentFragment();
    let rest = text;
    for (;;) {
      const m = INLINE.exec(rest);
      if (!m) { if (rest) frag.append(document.createTextNode(rest)); return frag; }
      if (m.index) frag.append(document.createTextNode(rest.slice(0, m.index)));
      if (m[1] !== undefined) frag.append(el("code", null, m[1]));
      else if (m[2] !== undefined || m[3] !== undefined) frag.append(el("strong", null, m[2] !== undefined ? m[2] : m[3]));
      else if (m[4] !== undefined || m[5] !== undefined) frag.append(el("em", null, m[4] !== undefined ? m[4] : m[5]));
      else frag.append(document.createTextNode(m[6] + " (" + m[7] + ")"));
      rest = rest.slice(m.index + m[0].length);
    }
  }
  function markdown(src) {
    const root = el("div", { class: "sheet" });
    const lines = src.replace(/\r\n?/g, "\n").split("\n");
    let para = null, list = null, listOrdered = false, quote = null;
    const endAll = () => { para = null; list = null; quote = null; };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i], t = line.trim();
      if (/^\s*```/.test(line)) {
        endAll();
        const code = [];
        for (i++; i < lines.length && !/^\s*```/.test(lines[i]); i++) code.push(lines[i]);
        root.append(el("pre", null, code.join("\n")));
        continue;
      }
      if (t === "") { endAll(); continue; }
      if (/^([-*_])\1{2,}$/.test(t)) { endAll(); root.append(el("hr")); continue; }
      let m = /^(#{1,6}) (.*)$/.exec(t);
      if (m) { endAll(); const el2 = el(m[1].length <= 2 ? "h4" : "h5"); el2.append(inline(m[2])); root.append(el2); continue; }
      if (t.startsWith(">")) {
        para = null; list = null;
        const text = t.replace(/^>\s?/, "");
        if (!quote) { quote = el("blockquote"); quote.dataset.text = text; root.append(quote); }
        else quote.dataset.text += " " + text;
        quote.replaceChildren(inline(quote.dataset.text));
        continue;
      }
      m = /^([-*+]|\d+[.)]) (.*)$/.exec(t);
      if (m) {
        para = null; quote = null;
        const ordered = /^\d/.test(m[1]);
        if (!list || ordered !== listOrdered) { list = el(ordered ? "ol" : "ul"); listOrdered = ordered; root.append(list); }
        const li = el("li"); li.append(inline(m[2])); list.append(li);
        continue;
      }
      list = null; quote = null;
      if (!para) { para = el("p"); para.dataset.text = t; root.append(para); }
      else para.dataset.text += " " + t;
      para.replaceChildren(inline(para.dataset.text));
    }
    return root;
  }

  // ---- wiring ----------------------------------------------------------------------------
  $("gate-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const t = $("gate-token").value.trim();
    $("gate-token").value = "";
    if (!t) return;
    sessionStorage.setItem(KEY, t);
    connect();
  });
  $("identity").addEventListener("input", (e) => { identity = e.target.value.trim(); if (state) render(); });
  $("close").addEventListener("click", closePanel);
  $("backdrop").addEventListener("click", closePanel);
  $("back").addEventListener("click", () => { panelStack.pop(); rerenderPanel(); });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closePanel(); });
  if (token()) connect(); else gate("");
})();
