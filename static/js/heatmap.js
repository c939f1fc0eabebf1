// heatmap.js — the decision's attention over the cached tokens, for recompute and one strategy
// side by side, plus their difference (strategy − recompute, PuOr diverging scale centred at 0).
// Pick one head in the layer × head grid, a whole layer, or all layers; mean or max over heads.
// The server sends one aggregated vector per view (/api/runs/{id}/attention), cached here; the
// grid is coloured by how far each head moved from recompute (/runs/{id}/attention/heads).
(function () {
  "use strict";
  var root = document.getElementById("attention");
  if (!root) return;
  var runId = root.dataset.run, layers = +root.dataset.layers, heads = +root.dataset.heads;
  var state = { strategy: document.getElementById("hm-strategy").value, layer: null, head: null, agg: "mean" };
  var cache = {}; // url → promise of json
  var rendered = { ref: null, res: null }; // strategy whose tokens are drawn in each panel
  var current = null; // {ref, res, map, diff}
  var tip = document.getElementById("token-tip");
  var statusEl = document.getElementById("hm-status");

  function cssColor(name) {
    var hex = getComputedStyle(document.documentElement).getPropertyValue(name).trim().replace("#", "");
    return [parseInt(hex.slice(0, 2), 16), parseInt(hex.slice(2, 4), 16), parseInt(hex.slice(4, 6), 16)];
  }
  var SEQ = ["--seq-0", "--seq-1", "--seq-2", "--seq-3", "--seq-4"].map(cssColor);
  var DIV = ["--div-neg-2", "--div-neg-1", "--div-0", "--div-pos-1", "--div-pos-2"].map(cssColor);

  function ramp(stops, t) { // t in [0, 1]
    t = Math.max(0, Math.min(1, t));
    var x = t * (stops.length - 1), i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
    var a = stops[i], b = stops[i + 1];
    return [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * f); });
  }
  function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
  function dark(c) { return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 140; }

  function gradient(el, stops) {
    el.style.background = "linear-gradient(90deg," + stops.map(rgb).join(",") + ")";
  }
  gradient(document.getElementById("ramp-seq"), SEQ);
  gradient(document.getElementById("ramp-div"), DIV);

  function get(url) {
    if (!cache[url]) cache[url] = fetch(url).then(function (r) {
      if (!r.ok) return r.text().then(function (t) { throw new Error(t); });
      return r.json();
    });
    return cache[url];
  }
  function attentionUrl(strategy) {
    var q = "strategy=" + encodeURIComponent(strategy) + "&agg=" + state.agg;
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

  // the colour scale's top: the largest value away from the first token (the attention sink)
  function scaleMax(values) {
    var m = 0;
    for (var i = 1; i < values.length; i++) if (Math.abs(values[i]) > m) m = Math.abs(values[i]);
    return m || 1e-9;
  }

  function paint(box, values, colour) {
    var spans = box.children;
    for (var i = 0; i < spans.length; i++) {
      var c = colour(values[i], i);
      spans[i].style.backgroundColor = rgb(c);
      spans[i].style.color = dark(c) ? "#fff" : "";
    }
  }

  function pickLabel() {
    if (state.layer === null) return "all layers, " + state.agg + " over heads";
    if (state.head === null) return "layer " + state.layer + ", " + state.agg + " over heads";
    return "layer " + state.layer + ", head " + state.head;
  }

  function update() {
    var strategy = state.strategy;
    statusEl.textContent = "loading " + pickLabel() + "…";
    document.getElementById("hm-pick").textContent = pickLabel();
    var box = document.getElementById("hm-strategy-box");
    box.className = "heatmap s-" + strategy;
    box.querySelector("[data-title]").innerHTML = '<span class="strategy ' + strategy + '"></span>';
    box.querySelector("[data-title] .strategy").textContent = strategy;
    var t0 = performance.now();
    Promise.all([get(attentionUrl("recompute")), get(attentionUrl(strategy)), get("/runs/" + runId + "/attention/heads?strategy=" + encodeURIComponent(strategy))])
      .then(function (parts) {
        var ref = parts[0], res = parts[1], heads = parts[2];
        var refBox = document.getElementById("hm-ref"), resBox = document.getElementById("hm-res"), diffBox = document.getElementById("hm-diff");
        if (rendered.ref !== "recompute") { drawTokens(refBox, ref.tokens); rendered.ref = "recompute"; }
        if (rendered.res !== strategy) { drawTokens(resBox, res.tokens); drawTokens(diffBox, res.tokens); rendered.res = strategy; paintGrid(heads); }
        var map = heads.map, inverse = new Array(ref.values.length).fill(-1);
        map.forEach(function (j, i) { if (j >= 0) inverse[j] = i; });
        var diff = res.values.map(function (v, i) { return map[i] >= 0 ? v - ref.values[map[i]] : v; });
        var vmax = Math.max(scaleMax(ref.values), scaleMax(res.values)), dmax = scaleMax(diff);
        function seq(v) { return ramp(SEQ, 0.9 * Math.pow(Math.max(0, v) / vmax, 0.6)); }
        paint(refBox, ref.values, seq);
        paint(resBox, res.values, seq);
        paint(diffBox, diff, function (d) { return ramp(DIV, 0.5 + 0.5 * Math.sign(d) * Math.sqrt(Math.abs(d) / dmax)); });
        Array.prototype.forEach.call(diffBox.children, function (s, i) { s.classList.toggle("unmatched", map[i] < 0); });
        current = { ref: ref, res: res, map: map, inverse: inverse, diff: diff };
        root.querySelector('[data-max="ref"]').textContent = "scale max " + vmax.toFixed(4);
        root.querySelector('[data-max="res"]').textContent = res.tokens.length + " tokens";
        statusEl.textContent = pickLabel() + " · " + ref.tokens.length + " tokens · " + Math.round(performance.now() - t0) + " ms";
      })
      .catch(function (err) { statusEl.textContent = "Could not load attention: " + err.message; });
  }

  // --- layer × head grid ---------------------------------------------------------------------------
  var grid = document.getElementById("hm-grid");
  function buildGrid() {
    grid.style.gridTemplateColumns = "2.2rem repeat(" + heads + ", 14px)";
    var all = document.createElement("button");
    all.type = "button"; all.className = "axis"; all.textContent = "all"; all.title = "all layers";
    all.style.cssText = "width:auto;background:none"; all.dataset.layer = ""; all.setAttribute("aria-pressed", "true");
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
  function paintGrid(data) {
    var max = 1e-9;
    data.head_diff.forEach(function (row) { row.forEach(function (v) { if (v > max) max = v; }); });
    grid.querySelectorAll("button[data-head]").forEach(function (cell) {
      var v = data.head_diff[+cell.dataset.layer][+cell.dataset.head];
      cell.style.background = rgb(ramp(DIV.slice(2), Math.sqrt(v / max)));
      cell.title = "layer " + cell.dataset.layer + " head " + cell.dataset.head + ": attention moved " + (100 * v).toFixed(1) + "% (total variation vs recompute)";
    });
  }
  grid.addEventListener("click", function (event) {
    var b = event.target.closest("button");
    if (!b) return;
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

  // --- hover: exact values -------------------------------------------------------------------------
  root.addEventListener("mousemove", function (event) {
    var span = event.target.closest(".tok");
    if (!span || !current) { tip.hidden = true; return; }
    var i = +span.dataset.i, panel = span.parentElement.id, r, s, tok;
    if (panel === "hm-ref") { r = i; s = current.inverse[i]; tok = current.ref.tokens[i]; }
    else { s = i; r = current.map[i]; tok = current.res.tokens[i]; }
    var rv = r >= 0 ? current.ref.values[r] : null, sv = s >= 0 ? current.res.values[s] : null;
    var lines = ["token #" + i + "  id " + tok.id + "  " + JSON.stringify(tok.text) + "  (" + tok.segment + ")",
      "recompute " + (rv === null ? "—" : rv.toFixed(5)) + "   " + state.strategy + " " + (sv === null ? "—" : sv.toFixed(5))];
    if (rv !== null && sv !== null) lines.push("difference " + (sv - rv >= 0 ? "+" : "") + (sv - rv).toFixed(5));
    else lines.push("no counterpart in " + (rv === null ? "recompute" : state.strategy));
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    tip.style.left = Math.min(event.clientX + 14, window.innerWidth - 380) + "px";
    tip.style.top = (event.clientY + 16) + "px";
  });
  root.addEventListener("mouseleave", function () { tip.hidden = true; });

  buildGrid();
  update();
})();
