// report.js — inlined into the standalone report (/runs/{id}/report.html), which must work as a
// file with no network: it reads the data embedded beside it (#report-data) and lets the reader
// switch the strategy shown against recompute (the decision's attention, mean over layers and
// heads), repainting the panels and showing its most-attended notes as the server ranked them. Without it
// the report still shows the view it was made from, drawn by the server.
(function () {
  "use strict";
  var holder = document.getElementById("report-data"), select = document.getElementById("rp-strategy");
  if (!holder || !select) return;
  var data = JSON.parse(holder.textContent);
  var SEQ = data.colours.seq.map(rgbOf), DIV = data.colours.div.map(rgbOf);

  function rgbOf(hex) { return [1, 3, 5].map(function (i) { return parseInt(hex.slice(i, i + 2), 16); }); }
  function ramp(stops, t) {
    t = Math.max(0, Math.min(1, t));
    var x = t * (stops.length - 1), i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
    return [0, 1, 2].map(function (k) { return Math.round(stops[i][k] + (stops[i + 1][k] - stops[i][k]) * f); });
  }
  function css(c) { return "rgb(" + c.join(",") + ")"; }
  function luminance(c) {
    var l = c.map(function (v) { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2];
  }
  function contrast(a, b) { var x = luminance(a), y = luminance(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); }
  var FAINT = rgbOf(data.colours.faint);
  function textOn(c) { // as heatmap.js: the page's colour while the faint grey reads at 4.5:1, else white or black
    if (contrast(FAINT, c) >= 4.5) return "";
    return contrast([255, 255, 255], c) >= contrast([0, 0, 0], c) ? "#fff" : "#000";
  }
  function scaleMax(v) { var m = 0; for (var i = 1; i < v.length; i++) m = Math.max(m, Math.abs(v[i])); return m || 1e-9; }
  function fixed(v, n) { return v === null ? "—" : v.toFixed(n); }

  function paint(box, tokens, values, colour, extra) {
    var frag = document.createDocumentFragment();
    tokens.forEach(function (t, i) {
      var span = document.createElement("span"), c = colour(values[i]);
      span.className = "tok seg-" + t[1] + (extra ? extra(i) : "");
      span.style.backgroundColor = css(c);
      span.style.color = textOn(c);
      span.textContent = t[0];
      frag.appendChild(span);
    });
    box.textContent = "";
    box.appendChild(frag);
  }

  function show(name) {
    var ref = data.recompute, s = data.strategies[name], map = s.map;
    var rv = ref.values, sv = s.values;
    var diff = sv.map(function (v, i) { return map[i] >= 0 ? v - rv[map[i]] : v; });
    var vmax = Math.max(scaleMax(rv), scaleMax(sv)), dmax = scaleMax(diff);
    function seq(v) { return ramp(SEQ, 0.9 * Math.pow(Math.max(0, v) / vmax, 0.6)); }
    paint(document.getElementById("rp-ref"), ref.tokens, rv, seq);
    paint(document.getElementById("rp-res"), s.tokens, sv, seq);
    paint(document.getElementById("rp-diff"), s.tokens, diff, function (d) {
      return ramp(DIV, 0.5 + 0.5 * Math.sign(d) * Math.sqrt(Math.abs(d) / dmax));
    }, function (i) {
      return (map[i] < 0 ? " unmatched" : "") + (diff[i] > 0.1 * dmax ? " sign-pos" : diff[i] < -0.1 * dmax ? " sign-neg" : "");
    });
    var box = document.querySelector("[data-res-box]");
    box.className = "heatmap s-" + name;
    box.querySelector("[data-res-title]").innerHTML = '<span class="strategy"></span>';
    box.querySelector("[data-res-title] .strategy").className = "strategy " + name;
    box.querySelector("[data-res-title] .strategy").textContent = name;
    box.querySelector("[data-res-count]").textContent = s.tokens.length + " tokens";
    document.querySelector("[data-label]").textContent = "all layers, mean over heads";
    document.querySelector("[data-seq-scale]").textContent = "0 … " + vmax.toFixed(4);
    document.querySelector("[data-div-scale]").textContent = "±" + dmax.toFixed(4);
    var body = document.querySelector("#rp-top tbody");
    body.textContent = "";
    document.querySelector('#rp-top [data-col="strategy"]').textContent = name;
    s.top.forEach(function (t, k) { // ranked by the server (top_tokens), as every view ranks them
      var tr = document.createElement("tr");
      [String(k + 1), JSON.stringify(t.text), null, t.segment, fixed(t.recompute, 4), t.strategy.toFixed(4),
        t.change].forEach(function (text, col) {
        var td = document.createElement("td");
        if (text === null) { td.className = "in-context"; td.appendChild(inContext(t)); } else td.textContent = text;
        if (col >= 4) td.className = "num";
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }
  function inContext(t) {
    var frag = document.createDocumentFragment();
    [["span", t.before], ["mark", t.inline], ["span", t.after]].forEach(function (p) {
      var el = document.createElement(p[0]); el.textContent = p[1]; if (p[0] === "span") el.className = "faint"; frag.appendChild(el);
    });
    return frag;
  }

  document.querySelectorAll("[data-needs-script]").forEach(function (el) { el.hidden = false; });
  select.addEventListener("change", function () { show(select.value); });
})();
