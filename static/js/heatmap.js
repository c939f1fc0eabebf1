// heatmap.js — where a token looked over the others, for recompute and one strategy side by side,
// plus their difference (strategy − recompute, PuOr diverging scale centred at 0, its sign also
// drawn as a solid / dotted underline for greyscale). The query is the decision by default; any
// question or answer token can be picked. For the decision: one head in the layer × head grid, a
// whole layer, or all layers, mean or max over heads (other queries are kept averaged over both).
// The server sends one vector per view (/api/runs/{id}/attention), cached here, and every colour:
// the panels' with the view's most-attended rows (/runs/{id}/attention/paint) and the grid's, on an absolute scale of how far each head
// moved from recompute (/runs/{id}/attention/heads). No colour is computed here.
// The view is a permalink: it opens from ?strategy=&layer=&head=&agg=&query= (checked by the server,
// `query` counting the question and answer tokens from 0) and every change rewrites the URL in place
// (history.replaceState: no history entry per click) and the export links that carry the view.
(function () {
  "use strict";
  var root = document.getElementById("attention");
  if (!root) return;
  var runId = root.dataset.run, layers = +root.dataset.layers, heads = +root.dataset.heads;
  // the server names the reference (vocabulary.REFERENCE) and the segments whose start the strip
  // marks (vocabulary.regions.MARKED_SEGMENTS): no strategy or segment name is written here
  var reference = root.dataset.reference;
  var marked = (root.dataset.marks || "").split(",").filter(Boolean);
  var fields = (root.dataset.fields || "").split(",").filter(Boolean).map(function (s) { return s.split("-").map(Number); });
  function intOrNull(v) { return v === undefined || v === "" ? null : +v; }
  var state = { strategy: document.getElementById("hm-strategy").value, layer: intOrNull(root.dataset.viewLayer),
    head: intOrNull(root.dataset.viewHead), agg: root.dataset.viewAgg || "mean", query: intOrNull(root.dataset.viewQuery) };
  var cache = {}; // url → promise of json
  var rendered = { ref: null, res: null };
  var current = null; // {ref, res, map, inverse, diff}
  var tip = document.getElementById("token-tip");
  var statusEl = document.getElementById("hm-status");
  var boxes = { ref: document.getElementById("hm-ref"), res: document.getElementById("hm-res"), diff: document.getElementById("hm-diff") };

  function get(url) {
    if (!cache[url]) cache[url] = fetch(url, { headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) return r.text().then(function (t) { throw new Error(t); });
      return r.json();
    });
    return cache[url];
  }
  function attentionUrl(strategy, queryStart) {
    var q = "strategy=" + encodeURIComponent(strategy) + "&agg=" + state.agg;
    if (state.query !== null) return "/api/runs/" + runId + "/attention?" + q + "&query=" + (queryStart + state.query);
    if (state.layer !== null) q += "&layer=" + state.layer;
    if (state.head !== null) q += "&head=" + state.head;
    return "/api/runs/" + runId + "/attention?" + q;
  }

  function drawTokens(box, tokens) {
    var frag = document.createDocumentFragment();
    tokens.forEach(function (t, i) {
      var span = document.createElement("span");
      span.className = "tok seg-" + t.segment;
      span.dataset.i = i;
      span.textContent = t.text;
      frag.appendChild(span);
    });
    box.textContent = "";
    box.appendChild(frag);
  }

  function paint(box, side) { // the colours the server computed (/runs/{id}/attention/paint)
    var spans = box.children;
    for (var i = 0; i < spans.length; i++) {
      spans[i].style.backgroundColor = side.bg[i];
      spans[i].style.color = side.fg[i];
    }
  }

  function pickLabel() {
    if (state.query !== null) return "query=" + state.query + " (question and answer tokens counted from 0), mean over layers and heads; the decision's view (" + decisionLabel() + ") is kept";
    return decisionLabel();
  }
  function decisionLabel() {
    if (state.layer === null) return "all layers, " + state.agg + " over heads";
    if (state.head === null) return "layer " + state.layer + ", " + state.agg + " over heads";
    return "layer " + state.layer + ", head " + state.head;
  }

  function markQuery(box, data) {
    var q = data.query;
    Array.prototype.forEach.call(box.querySelectorAll(".tok.query"), function (s) { s.classList.remove("query"); });
    if (box.children[q]) box.children[q].classList.add("query");
  }

  function fillQueries(ref) { // the question and answer tokens of recompute, once; then show the query
    var select = document.getElementById("hm-query");
    if (select.options.length <= 1 && ref.query_start !== null) addQueryOptions(select, ref);
    select.value = state.query === null ? "" : String(state.query);
  }
  function addQueryOptions(select, ref) {
    for (var i = ref.query_start; i < ref.tokens.length; i++) {
      if (i === ref.decision) continue; // the first option, "the decision", is this token
      var t = ref.tokens[i], o = document.createElement("option");
      o.value = i - ref.query_start;
      o.textContent = "query=" + (i - ref.query_start) + " · " + (t.segment === "answer" ? "answer " : "question ") + JSON.stringify(t.text);
      select.appendChild(o);
    }
  }

  // --- the URL is the view: rewritten in place, and carried by the export links ------------------
  function viewQuery() {
    var q = "strategy=" + encodeURIComponent(state.strategy); // every control, whatever else is set
    if (state.layer !== null) q += "&layer=" + state.layer;
    if (state.head !== null) q += "&head=" + state.head;
    if (state.query !== null) q += "&query=" + state.query;
    if (state.agg !== "mean") q += "&agg=" + state.agg;
    return q;
  }
  function syncUrl() {
    var q = viewQuery();
    if (location.search !== "?" + q) history.replaceState(history.state, "", location.pathname + "?" + q + location.hash);
    document.querySelectorAll("[data-view-link]").forEach(function (a) { a.href = a.dataset.viewLink + "?" + q + (a.dataset.viewExtra || ""); });
  }

  function update() {
    var strategy = state.strategy;
    statusEl.textContent = "loading " + pickLabel() + "…";
    document.getElementById("hm-pick").textContent = state.query === null ? pickLabel() : "kept for the decision only";
    grid.classList.toggle("disabled", state.query !== null);
    var box = document.getElementById("hm-strategy-box");
    box.className = "heatmap s-" + strategy;
    box.querySelector("[data-title]").innerHTML = '<span class="strategy ' + strategy + '"></span>';
    box.querySelector("[data-title] .strategy").textContent = strategy;
    root.querySelector('#hm-top [data-col="strategy"]').textContent = strategy;
    root.querySelector('#hm-top-lines [data-col="strategy"]').textContent = strategy;
    var t0 = performance.now();
    syncUrl();
    // the query start of each strategy is learnt from its decision view (always fetched first)
    Promise.all([get(decisionUrl(reference)), get(decisionUrl(strategy))]).then(function (base) {
      return Promise.all([
        get(attentionUrl(reference, base[0].query_start)), get(attentionUrl(strategy, base[1].query_start)),
        get("/runs/" + runId + "/attention/heads?strategy=" + encodeURIComponent(strategy)),
        get(paintUrl())]);
    }).then(function (parts) {
      var ref = parts[0], res = parts[1], headData = parts[2], colours = parts[3];
      fillQueries(ref);
      if (rendered.ref !== reference) { drawTokens(boxes.ref, ref.tokens); rendered.ref = reference; }
      if (rendered.res !== strategy) { drawTokens(boxes.res, res.tokens); drawTokens(boxes.diff, res.tokens); rendered.res = strategy; paintGrid(headData); }
      var map = headData.map, inverse = new Array(ref.values.length).fill(-1);
      map.forEach(function (j, i) { if (j >= 0) inverse[j] = i; });
      var diff = res.values.map(function (v, i) { return map[i] >= 0 ? v - ref.values[map[i]] : v; });
      paint(boxes.ref, colours.ref);
      paint(boxes.res, colours.res);
      paint(boxes.diff, colours.diff);
      Array.prototype.forEach.call(boxes.diff.children, function (s, i) {
        s.classList.toggle("unmatched", colours.diff.unmatched[i]);
        s.classList.toggle("sign-pos", colours.diff.sign[i] === "pos");
        s.classList.toggle("sign-neg", colours.diff.sign[i] === "neg");
      });
      markQuery(boxes.ref, ref); markQuery(boxes.res, res); markQuery(boxes.diff, res);
      current = { ref: ref, res: res, map: map, inverse: inverse, diff: diff };
      document.getElementById("seq-scale").textContent = "0 … " + colours.vmax.toFixed(4);
      document.getElementById("div-scale").textContent = "±" + colours.dmax.toFixed(4);
      root.querySelector('[data-max="ref"]').textContent = ref.tokens.length + " tokens";
      root.querySelector('[data-max="res"]').textContent = res.tokens.length + " tokens";
      ++topSeq; showTop(colours.rows, colours);
      statusEl.textContent = pickLabel() + " · " + Math.round(performance.now() - t0) + " ms";
    }).catch(function (err) { statusEl.textContent = "Could not load attention: " + err.message; });
  }
  function decisionUrl(strategy) { return "/api/runs/" + runId + "/attention?strategy=" + encodeURIComponent(strategy) + "&agg=mean"; }

  // --- the most-attended notes of the view, ranked by the server as every other view ranks them ---
  var allTokens = root.querySelector("#hm-top-all"), topSeq = 0, topShown = [];
  function paintUrl() { // the view's colours and its most-attended rows, computed in one go
    return "/runs/" + runId + "/attention/paint?" + viewQuery() + "&rows=1" + (allTokens && allTokens.checked ? "&all=1" : "");
  }
  // lines and sentences (attention summed over their tokens) or tokens: the reader's pick, else
  // lines when the view's top tokens are all function words (the server says which)
  var topBy = null;
  function showTopBy(by, why) {
    root.querySelector("#hm-top-lines-box").hidden = by !== "lines";
    root.querySelector("#hm-top-tokens-box").hidden = by !== "tokens";
    root.querySelectorAll('input[name="hm-top-by"]').forEach(function (r) { r.checked = r.value === by; });
    root.querySelector("#hm-top-why").textContent = why || "";
  }
  root.querySelectorAll('input[name="hm-top-by"]').forEach(function (r) {
    r.addEventListener("change", function () { topBy = r.value; showTopBy(topBy); });
  });
  function showTop(html, colours) {
    if (colours && colours.lines !== undefined) {
      root.querySelector("#hm-top-lines tbody").innerHTML = colours.lines;
      if (topBy === null) showTopBy(colours.lines_default ? "lines" : "tokens",
        colours.lines_default ? "shown first: the top tokens are all function words" : "");
    }
    var body = root.querySelector("#hm-top tbody");
    body.innerHTML = html;
    topShown = Array.prototype.map.call(body.querySelectorAll("tr[data-i]"), function (tr) { return +tr.dataset.i; });
    drawOverview();
  }
  function drawTop() { // the toggle: the same view's rows with or without the sink; the newest wins
    var seq = ++topSeq;
    get(paintUrl()).then(function (colours) { if (seq === topSeq) showTop(colours.rows, colours); })
      .catch(function (err) { if (seq === topSeq) statusEl.textContent = "Could not load the most-attended notes: " + err.message; });
  }
  if (allTokens) allTokens.addEventListener("change", function () { if (current) drawTop(); });
  root.querySelector("#hm-top-lines").addEventListener("click", function (e) {
    var tr = e.target.closest("tr[data-i]"); if (tr) jumpTo(+tr.dataset.i);
  });
  root.querySelector("#hm-top").addEventListener("click", function (e) {
    var tr = e.target.closest("tr[data-i]"); if (tr) jumpTo(+tr.dataset.i);
  });
  root.querySelector("#hm-top").addEventListener("keydown", function (e) {
    var tr = e.target.closest("tr[data-i]"); if (tr && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); jumpTo(+tr.dataset.i); }
  });

  // --- overview strip: where the fields, errata, skills, question and top tokens sit; click to jump
  var overview = document.getElementById("hm-overview");
  function drawOverview() {
    var c = current, n = c.res.tokens.length, frag = document.createDocumentFragment();
    function mark(i, kind, label) {
      var b = document.createElement("button");
      b.type = "button"; b.className = "mark " + kind; b.dataset.i = i; b.title = label;
      b.setAttribute("aria-label", label);
      b.style.left = (100 * i / n) + "%";
      frag.appendChild(b);
    }
    c.res.tokens.forEach(function (t, i) {
      if (marked.indexOf(t.segment) >= 0) {
        if (i === 0 || c.res.tokens[i - 1].segment !== t.segment) mark(i, t.segment, t.segment + " starts here");
      } else if (t.segment === "document" && t.start >= 0) {
        fields.forEach(function (f) { if (t.start < f[1] && f[0] < t.end && (i === 0 || !(c.res.tokens[i - 1].start < f[1] && f[0] < c.res.tokens[i - 1].end))) mark(i, "field", "the changed field"); });
      }
    });
    topShown.slice(0, 5).forEach(function (i, k) {
      if (c.res.tokens[i]) mark(i, "top", "most attended #" + (k + 1) + ": " + JSON.stringify(c.res.tokens[i].text));
    });
    overview.textContent = "";
    overview.appendChild(frag);
  }
  overview.addEventListener("click", function (e) { var b = e.target.closest("[data-i]"); if (b) jumpTo(+b.dataset.i); });

  function jumpTo(i) { // strategy-side token index: scroll its panel (the others follow) and flash it
    var span = boxes.res.children[i];
    if (!span) return;
    boxes.res.scrollTop = span.offsetTop - boxes.res.offsetTop - boxes.res.clientHeight / 3;
    [span, boxes.diff.children[i], current.map[i] >= 0 ? boxes.ref.children[current.map[i]] : null].forEach(function (s) {
      if (!s) return;
      s.classList.add("flash");
      setTimeout(function () { s.classList.remove("flash"); }, 1200);
    });
  }

  // --- the three panels scroll together (by share of their height: their token counts differ) -----
  var syncing = false;
  Object.keys(boxes).forEach(function (key) {
    boxes[key].addEventListener("scroll", function () {
      if (syncing) return;
      syncing = true;
      var src = boxes[key], ratio = src.scrollTop / Math.max(1, src.scrollHeight - src.clientHeight);
      Object.keys(boxes).forEach(function (other) {
        if (other === key) return;
        var b = boxes[other];
        b.scrollTop = ratio * (b.scrollHeight - b.clientHeight);
      });
      requestAnimationFrame(function () { syncing = false; });
    });
  });

  // --- layer × head grid (the decision only) ------------------------------------------------------
  var grid = document.getElementById("hm-grid");
  function buildGrid() {
    grid.style.gridTemplateColumns = "2.2rem repeat(" + heads + ", 14px)";
    var all = document.createElement("button");
    all.type = "button"; all.className = "axis"; all.textContent = "all"; all.title = "all layers";
    all.style.cssText = "width:auto;background:none"; all.dataset.layer = ""; all.setAttribute("aria-pressed", "false");
    grid.appendChild(all);
    for (var h = 0; h < heads; h++) { var ax = document.createElement("span"); ax.className = "axis"; ax.textContent = h % 4 === 0 ? h : ""; ax.style.textAlign = "center"; grid.appendChild(ax); }
    for (var l = 0; l < layers; l++) {
      var lb = document.createElement("button");
      lb.type = "button"; lb.className = "axis"; lb.textContent = "L" + l; lb.title = "layer " + l + ", " + state.agg + " over heads";
      lb.style.cssText = "width:auto;background:none"; lb.dataset.layer = l; lb.setAttribute("aria-pressed", "false");
      grid.appendChild(lb);
      for (h = 0; h < heads; h++) {
        var cell = document.createElement("button");
        cell.type = "button"; cell.dataset.layer = l; cell.dataset.head = h; cell.setAttribute("aria-pressed", "false");
        cell.setAttribute("aria-label", "layer " + l + " head " + h);
        grid.appendChild(cell);
      }
    }
  }
  function paintGrid(data) { // absolute: 0 → 100% of the head's attention moved; the server's colours
    grid.querySelectorAll("button[data-head]").forEach(function (cell) {
      var layer = +cell.dataset.layer, head = +cell.dataset.head, v = data.head_diff[layer][head];
      cell.style.background = data.colours[layer][head];
      cell.title = "layer " + layer + " head " + head + ": " + (100 * v).toFixed(2) +
        "% of its attention moved (total variation vs " + reference + ")" + (v < data.zero ? ", drawn as no change" : "");
    });
  }
  grid.addEventListener("click", function (event) {
    var b = event.target.closest("button");
    if (!b) return;
    state.query = null;
    document.getElementById("hm-query").value = "";
    state.layer = b.dataset.layer === "" ? null : +b.dataset.layer;
    state.head = b.dataset.head === undefined ? null : +b.dataset.head;
    grid.querySelectorAll("button").forEach(function (x) { x.setAttribute("aria-pressed", String(x === b)); });
    update();
  });
  grid.addEventListener("keydown", function (event) { // arrow keys move between cells
    var b = event.target.closest("button[data-head]");
    if (!b) return;
    var l = +b.dataset.layer, h = +b.dataset.head;
    if (event.key === "ArrowRight") h = Math.min(heads - 1, h + 1);
    else if (event.key === "ArrowLeft") h = Math.max(0, h - 1);
    else if (event.key === "ArrowDown") l = Math.min(layers - 1, l + 1);
    else if (event.key === "ArrowUp") l = Math.max(0, l - 1);
    else return;
    event.preventDefault();
    var next = grid.querySelector('button[data-layer="' + l + '"][data-head="' + h + '"]');
    if (next) { next.focus(); next.click(); }
  });

  root.querySelectorAll("[data-agg]").forEach(function (b) {
    b.addEventListener("click", function () {
      state.agg = b.dataset.agg;
      root.querySelectorAll("[data-agg]").forEach(function (x) { x.setAttribute("aria-pressed", String(x === b)); });
      update();
    });
  });
  document.getElementById("hm-strategy").addEventListener("change", function (e) { state.strategy = e.target.value; update(); });
  document.getElementById("hm-query").addEventListener("change", function (e) {
    state.query = e.target.value === "" ? null : +e.target.value;
    update();
  });
  root.addEventListener("click", function (event) { // a question or answer token becomes the query
    var span = event.target.closest(".tok.seg-question, .tok.seg-answer");
    if (!span || !current) return;
    var data = span.parentElement === boxes.ref ? current.ref : current.res, i = +span.dataset.i;
    state.query = i === data.decision ? null : i - data.query_start;
    document.getElementById("hm-query").value = state.query === null ? "" : String(state.query);
    update();
  });

  // --- hover: exact values -------------------------------------------------------------------------
  root.addEventListener("mousemove", function (event) {
    var span = event.target.closest(".tok");
    if (!span || !current) { tip.hidden = true; return; }
    var i = +span.dataset.i, panel = span.parentElement.id, r, s, tok;
    if (panel === "hm-ref") { r = i; s = current.inverse[i]; tok = current.ref.tokens[i]; }
    else { s = i; r = current.map[i]; tok = current.res.tokens[i]; }
    var rv = r >= 0 ? current.ref.values[r] : null, sv = s >= 0 ? current.res.values[s] : null;
    var lines = ["token #" + i + "  id " + tok.id + "  " + JSON.stringify(tok.text) + "  (" + tok.segment + ")",
      reference + " " + (rv === null ? "—" : rv.toFixed(5)) + "   " + state.strategy + " " + (sv === null ? "—" : sv.toFixed(5))];
    if (rv !== null && sv !== null) lines.push("difference " + (sv - rv >= 0 ? "+" : "") + (sv - rv).toFixed(5));
    else lines.push("no counterpart in " + (rv === null ? reference : state.strategy));
    if (tok.segment === "question" || tok.segment === "answer") lines.push("click: make this token the query");
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    tip.style.left = Math.min(event.clientX + 14, window.innerWidth - 380) + "px";
    tip.style.top = (event.clientY + 16) + "px";
  });
  root.addEventListener("mouseleave", function () { tip.hidden = true; });

  function pressInitialView() { // the buttons that match a view opened from its URL
    var sel = state.layer === null ? 'button[data-layer=""]'
      : state.head === null ? 'button.axis[data-layer="' + state.layer + '"]'
      : 'button[data-layer="' + state.layer + '"][data-head="' + state.head + '"]';
    var b = grid.querySelector(sel);
    if (b && state.query === null) b.setAttribute("aria-pressed", "true");
    root.querySelectorAll("[data-agg]").forEach(function (x) { x.setAttribute("aria-pressed", String(x.dataset.agg === state.agg)); });
  }

  buildGrid();
  pressInitialView();
  update();
})();
