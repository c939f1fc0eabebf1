// tokens.js — point at (or tap) the document to see its tokens (index in the cache and token id). The app
// cannot tokenize, so the spans come from the latest finished run that fits the document as it is
// now (/notebooks/{id}/tokens.json); before any run the hover stays quiet.
(function () {
  "use strict";
  var tokens = [];
  var tip, status;

  function load() {
    status = document.getElementById("token-status");
    tip = document.getElementById("token-tip");
    if (!status || !status.dataset.tokensUrl) return;
    fetch(status.dataset.tokensUrl).then(function (r) { return r.json(); }).then(function (data) {
      tokens = data.tokens || [];
      if (tokens.length) status.textContent = "Point at or tap a word for its tokens: " + tokens.length + " document tokens from run #" + data.run_id;
    }).catch(function () { tokens = []; });
  }

  function caretAt(x, y) {
    if (document.caretPositionFromPoint) {
      var p = document.caretPositionFromPoint(x, y);
      return p ? { node: p.offsetNode, offset: p.offset } : null;
    }
    if (document.caretRangeFromPoint) {
      var r = document.caretRangeFromPoint(x, y);
      return r ? { node: r.startContainer, offset: r.startOffset } : null;
    }
    return null;
  }

  function tokenAt(offset) {
    var lo = 0, hi = tokens.length - 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1, t = tokens[mid];
      if (offset < t.start) hi = mid - 1;
      else if (offset >= t.end) lo = mid + 1;
      else return t;
    }
    return null;
  }

  function rangeFor(doc, t) {
    // the DOM range of [t.start, t.end) inside the text pieces that hold it
    var range = document.createRange(), started = false;
    var pieces = doc.querySelectorAll(".t");
    for (var i = 0; i < pieces.length; i++) {
      var p = pieces[i], s = +p.dataset.start, e = +p.dataset.end, node = p.firstChild;
      if (!node || e <= t.start) continue;
      if (!started) { range.setStart(node, Math.max(0, t.start - s)); started = true; }
      if (e >= t.end) { range.setEnd(node, t.end - s); return range; }
    }
    return null;
  }

  function hide() {
    if (tip) tip.hidden = true;
    if (window.CSS && CSS.highlights) CSS.highlights.delete("token-hover");
  }

  // a mouse shows the token under it as it moves; a finger, the token it tapped
  document.addEventListener("mousemove", show);
  document.addEventListener("pointerup", function (event) { if (event.pointerType !== "mouse") show(event); });

  function show(event) {
    var doc = document.getElementById("document");
    if (!tokens.length || !doc || !doc.contains(event.target) || !event.target.closest(".t")) { hide(); return; }
    var caret = caretAt(event.clientX, event.clientY);
    if (!caret || caret.node.nodeType !== Node.TEXT_NODE) { hide(); return; }
    var piece = caret.node.parentElement.closest(".t");
    if (!piece) { hide(); return; }
    var t = tokenAt(+piece.dataset.start + caret.offset);
    if (!t) { hide(); return; }
    tip.textContent = "token #" + t.i + "  id " + t.id + "  " + JSON.stringify(t.text) + "  chars [" + t.start + ", " + t.end + ")";
    tip.hidden = false;
    tip.style.left = (event.clientX + 14) + "px";
    tip.style.top = (event.clientY + 16) + "px";
    if (window.CSS && CSS.highlights && window.Highlight) {
      var range = rangeFor(doc, t);
      if (range) CSS.highlights.set("token-hover", new Highlight(range));
    }
  }
  document.addEventListener("DOMContentLoaded", load);
  document.addEventListener("htmx:afterSettle", function (e) { if (e.target && e.target.id === "run-progress") load(); });
})();
