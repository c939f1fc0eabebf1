// selection.js — select a span of the document with the mouse (or keyboard) and turn it into a
// field. Character offsets are computed against the document's raw text: every rendered piece of
// #document carries data-start / data-end, and the parts of a field chip that are not document
// text (the arrow, the new value, the label) are mapped to the chip's end.
(function () {
  "use strict";

  function pieceOf(node) {
    var el = node.nodeType === Node.TEXT_NODE ? node.parentElement : node;
    return el ? el.closest("[data-start]") : null;
  }

  // Offset in the raw document of a DOM boundary point (container, offset).
  function docOffset(doc, container, offset) {
    if (container.nodeType === Node.TEXT_NODE) {
      var piece = pieceOf(container);
      if (!piece || !doc.contains(piece)) return null;
      var start = +piece.dataset.start, end = +piece.dataset.end;
      // only text pieces (.t) hold document characters; anything else snaps to the piece's end
      if (piece.classList.contains("t") && container.parentElement === piece) return Math.min(start + offset, end);
      return end;
    }
    var child = container.childNodes[offset];
    if (child && child.nodeType === Node.ELEMENT_NODE && child.dataset.start !== undefined) return +child.dataset.start;
    var before = container.childNodes[offset - 1];
    if (before && before.nodeType === Node.ELEMENT_NODE && before.dataset.end !== undefined) return +before.dataset.end;
    var own = pieceOf(container);
    return own ? (offset === 0 ? +own.dataset.start : +own.dataset.end) : null;
  }

  function rawText(doc) {
    // the document's raw text, rebuilt from its text pieces (chips contribute only their old text)
    var out = [];
    doc.querySelectorAll(".t").forEach(function (t) { out[+t.dataset.start] = t.textContent; });
    return out.join("");
  }

  function currentSpan(doc) {
    var sel = window.getSelection();
    if (!sel || sel.rangeCount === 0 || sel.isCollapsed) return null;
    var range = sel.getRangeAt(0);
    if (!doc.contains(range.commonAncestorContainer)) return null;
    var a = docOffset(doc, range.startContainer, range.startOffset);
    var b = docOffset(doc, range.endContainer, range.endOffset);
    if (a === null || b === null) return null;
    var start = Math.min(a, b), end = Math.max(a, b);
    var text = rawText(doc);
    // trim surrounding whitespace: a double-click often grabs the following space
    while (start < end && /\s/.test(text[start])) start++;
    while (end > start && /\s/.test(text[end - 1])) end--;
    if (end <= start) return null;
    return { start: start, end: end, text: text.slice(start, end), rect: range.getBoundingClientRect() };
  }

  function openForm(span) {
    var form = document.getElementById("selection-form");
    if (!form) return;
    form.querySelector("[name=start]").value = span.start;
    form.querySelector("[name=end]").value = span.end;
    form.querySelector("[name=selected]").value = span.text;
    form.querySelector("[data-quote]").textContent = span.text.length > 120 ? span.text.slice(0, 117) + "…" : span.text;
    form.querySelector("[data-span]").textContent = "[" + span.start + ", " + span.end + ")";
    form.hidden = false;
    var top = window.scrollY + span.rect.bottom + 8;
    var left = Math.max(12, Math.min(window.scrollX + span.rect.left, window.scrollX + document.documentElement.clientWidth - 340));
    form.style.top = top + "px";
    form.style.left = left + "px";
    lastPos = { top: form.style.top, left: form.style.left };
    var label = form.querySelector("[name=label]");
    if (label) label.focus({ preventScroll: true });
  }

  var lastPos = null;

  function closeForm() {
    var form = document.getElementById("selection-form");
    if (form) form.hidden = true;
  }

  function onSelect(event) {
    var doc = document.getElementById("document");
    if (!doc || document.body.classList.contains("dragging-skill")) return;
    if (event && event.target && event.target.closest && event.target.closest(".placement")) return;
    var span = currentSpan(doc);
    if (span) openForm(span);
  }

  document.addEventListener("mouseup", function (event) {
    if (event.target.closest && event.target.closest("#selection-form")) return;
    setTimeout(function () { onSelect(event); }, 0);
  });
  // keyboard: select with Shift+arrows inside the document (it is focusable), then press Enter
  document.addEventListener("keydown", function (event) {
    var doc = document.getElementById("document");
    if (event.key === "Escape") {
      var form = document.getElementById("selection-form");
      var wasOpen = form && !form.hidden;
      closeForm();
      if (wasOpen && doc && form.contains(document.activeElement)) doc.focus({ preventScroll: true });
    }
    if (event.key === "Enter" && doc && document.activeElement === doc) { event.preventDefault(); onSelect(null); }
  });

  // A caret for the keyboard in the read-only document: arrows move it, Shift+arrows select
  // (Ctrl or Alt: a word at a time; Home / End: to the line's edge). Selection.modify works on text
  // that is not editable, but browsers draw no caret there, so it is drawn here (.kbd-caret).
  var MOVES = { ArrowLeft: ["backward", "character"], ArrowRight: ["forward", "character"], ArrowUp: ["backward", "line"],
    ArrowDown: ["forward", "line"], Home: ["backward", "lineboundary"], End: ["forward", "lineboundary"] };
  var caret = null;
  function placeCaretAtStart(doc) {
    var first = doc.querySelector(".t");
    var sel = window.getSelection();
    if (first && first.firstChild && (!sel.rangeCount || !doc.contains(sel.anchorNode))) sel.collapse(first.firstChild, 0);
  }
  function drawCaret() {
    var doc = document.getElementById("document"), sel = window.getSelection();
    if (!caret) { caret = document.createElement("span"); caret.className = "kbd-caret"; caret.setAttribute("aria-hidden", "true"); document.body.appendChild(caret); }
    if (!doc || document.activeElement !== doc || !sel.rangeCount || !doc.contains(sel.focusNode)) { caret.hidden = true; return; }
    var r = document.createRange();
    r.setStart(sel.focusNode, sel.focusOffset);
    var rect = r.getClientRects()[0] || r.getBoundingClientRect();
    if (!rect || (!rect.height && !rect.top)) { caret.hidden = true; return; }
    caret.hidden = false;
    caret.style.left = (window.scrollX + rect.left) + "px";
    caret.style.top = (window.scrollY + rect.top) + "px";
    caret.style.height = (rect.height || 20) + "px";
    if (rect.top < 0 || rect.bottom > window.innerHeight) window.scrollBy(0, rect.top - window.innerHeight / 2);
  }
  document.addEventListener("keydown", function (event) {
    var doc = document.getElementById("document"), move = MOVES[event.key];
    if (!doc || document.activeElement !== doc || !move) return;
    placeCaretAtStart(doc);
    var granularity = (event.ctrlKey || event.altKey) && move[1] === "character" ? "word" : move[1];
    window.getSelection().modify(event.shiftKey ? "extend" : "move", move[0], granularity);
    event.preventDefault();
    drawCaret();
  });
  document.addEventListener("focusin", function (event) {
    if (event.target.id === "document") { placeCaretAtStart(event.target); drawCaret(); }
  });
  document.addEventListener("focusout", function (event) { if (event.target.id === "document" && caret) caret.hidden = true; });
  // after a field is made by "find text", focus goes back to its (fresh) form for the next one, once
  // htmx has swapped the regions out of band (the form that sent it is gone by then)
  var findPending = false;
  document.addEventListener("htmx:beforeRequest", function (event) {
    findPending = !!(event.detail && event.detail.elt && event.detail.elt.id === "find-form");
  });
  document.addEventListener("htmx:oobAfterSwap", function () {
    if (!findPending || !document.querySelector("#find-field .flash-msg")) return;
    findPending = false;
    setTimeout(function () { var input = document.getElementById("find-text"); if (input) input.focus(); }, 50);
  });
  // make the document focusable so keyboard users can select text in it
  function focusable() {
    var d = document.getElementById("document");
    if (d && !d.hasAttribute("tabindex")) { d.setAttribute("tabindex", "0"); d.setAttribute("aria-describedby", "doc-keys"); }
  }
  document.addEventListener("DOMContentLoaded", focusable);
  document.addEventListener("htmx:afterSettle", focusable);
  window.kvnotesSelection = { docOffset: docOffset, rawText: rawText };
})();
