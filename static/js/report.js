// report.js — inlined into the standalone report (/runs/{id}/report.html), which must work as a
// file with no network: it reads the data embedded beside it (#report-data) and lets the reader
// switch the strategy shown against recompute (in the view the report was made from: its layer,
// head, aggregate and query). Every colour and the most-attended notes were computed by the server
// (the one colour model the app, presentation, compare and SVG share); this only puts them in place. Without it
// the report still shows the view it was made from, drawn by the server.
(function () {
  "use strict";
  var holder = document.getElementById("report-data"), select = document.getElementById("rp-strategy");
  if (!holder || !select) return;
  var data = JSON.parse(holder.textContent);

  function fixed(v, n) { return v === null ? "—" : v.toFixed(n); }
  function draw(box, tokens, side, extra) {
    var frag = document.createDocumentFragment();
    tokens.forEach(function (t, i) {
      var span = document.createElement("span");
      span.className = "tok seg-" + t[1] + (extra ? extra(i) : "");
      span.style.backgroundColor = side.bg[i];
      span.style.color = side.fg[i];
      span.textContent = t[0];
      frag.appendChild(span);
    });
    box.textContent = "";
    box.appendChild(frag);
  }

  function show(name) {
    var s = data.strategies[name], p = s.paint;
    draw(document.getElementById("rp-ref"), data.recompute.tokens, p.ref);
    draw(document.getElementById("rp-res"), s.tokens, p.res);
    draw(document.getElementById("rp-diff"), s.tokens, p.diff, function (i) {
      return (p.diff.unmatched[i] ? " unmatched" : "") + (p.diff.sign[i] ? " sign-" + p.diff.sign[i] : "");
    });
    var box = document.querySelector("[data-res-box]");
    box.className = "heatmap s-" + name;
    box.querySelector("[data-res-title]").innerHTML = '<span class="strategy"></span>';
    box.querySelector("[data-res-title] .strategy").className = "strategy " + name;
    box.querySelector("[data-res-title] .strategy").textContent = name;
    box.querySelector("[data-res-count]").textContent = s.tokens.length + " tokens";
    document.querySelector("[data-label]").textContent = p.label;
    document.querySelector("[data-seq-scale]").textContent = "0 … " + p.vmax.toFixed(4);
    document.querySelector("[data-div-scale]").textContent = "±" + p.dmax.toFixed(4);
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
