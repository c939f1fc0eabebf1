// present.js — presentation mode: the steps of one run, moved through with the arrow keys
// (→ / PageDown / Space forward, ← / PageUp back, Home / End), by clicking anywhere on the slide, or with the
// step links; the URL follows the step in place (history.replaceState: no entry per step). F goes
// full screen, T switches dark and light (remembered). Without this script every step is a page.
(function () {
  "use strict";
  var body = document.body, total = +body.dataset.steps, run = body.dataset.run, query = body.dataset.query || "";
  var step = +body.dataset.step, root = document.documentElement;
  var THEME_KEY = "kvnotes-present-theme";

  function url(n) { return "/runs/" + run + "/present/" + n + query; }

  function scrollInside(slide) { // bring what matters into view inside the slide's scrolling boxes
    slide.querySelectorAll("[data-scroll-to]").forEach(function (box) {
      var target = box.querySelector(box.dataset.scrollTo);
      if (target) box.scrollTop = Math.max(0, target.offsetTop - box.offsetTop - box.clientHeight / 3);
    });
    var maps = slide.querySelector("[data-top-res]");
    if (maps) {
      [["#pr-res", +maps.dataset.topRes], ["#pr-diff", +maps.dataset.topRes], ["#pr-ref", +maps.dataset.topRef]].forEach(function (pair) {
        var box = maps.querySelector(pair[0]), tok = box && pair[1] >= 0 ? box.children[pair[1]] : null;
        if (tok) { box.scrollTop = Math.max(0, tok.offsetTop - box.offsetTop - box.clientHeight / 3); tok.classList.add("query-top"); }
      });
    }
  }

  function show(n) {
    n = Math.max(1, Math.min(total, n));
    step = n;
    document.querySelectorAll(".slide").forEach(function (s) { s.hidden = +s.dataset.step !== n; });
    var slide = document.getElementById("step-" + n);
    history.replaceState(history.state, "", url(n));
    document.title = slide.querySelector("h1").textContent + " · run #" + run + " · kvnotes";
    body.dataset.step = n;
    var prev = document.querySelector('[data-go="prev"]'), next = document.querySelector('[data-go="next"]');
    prev.href = url(Math.max(1, n - 1)); next.href = url(Math.min(total, n + 1));
    prev.setAttribute("aria-disabled", String(n === 1)); next.setAttribute("aria-disabled", String(n === total));
    document.querySelectorAll(".step-dots a").forEach(function (a) {
      if (+a.dataset.go === n) a.setAttribute("aria-current", "step"); else a.removeAttribute("aria-current");
    });
    scrollInside(slide);
  }

  function effectiveTheme() {
    return root.dataset.theme || (window.matchMedia && matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
  }
  function setTheme(theme, remember) {
    root.dataset.theme = theme;
    document.querySelector("[data-theme-toggle]").setAttribute("aria-pressed", String(theme === "dark"));
    if (remember) try { localStorage.setItem(THEME_KEY, theme); } catch (e) { /* private mode: not remembered */ }
  }
  function toggleTheme() { setTheme(effectiveTheme() === "dark" ? "light" : "dark", true); }
  function fullscreen() {
    if (document.fullscreenElement) document.exitFullscreen();
    else if (root.requestFullscreen) root.requestFullscreen().catch(function () { /* refused: stay as is */ });
  }

  try { var saved = localStorage.getItem(THEME_KEY); if (saved) setTheme(saved, false); } catch (e) { /* no storage */ }
  document.querySelector("[data-theme-toggle]").setAttribute("aria-pressed", String(effectiveTheme() === "dark"));

  document.addEventListener("keydown", function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey || /^(INPUT|SELECT|TEXTAREA)$/.test(e.target.tagName)) return;
    var k = e.key;
    if (k === "ArrowRight" || k === "PageDown" || (k === " " && e.target.tagName !== "BUTTON" && e.target.tagName !== "A")) { e.preventDefault(); show(step + 1); }
    else if (k === "ArrowLeft" || k === "PageUp") { e.preventDefault(); show(step - 1); }
    else if (k === "Home") { e.preventDefault(); show(1); }
    else if (k === "End") { e.preventDefault(); show(total); }
    else if (k === "f" || k === "F") fullscreen();
    else if (k === "t" || k === "T") toggleTheme();
  });
  document.addEventListener("click", function (e) {
    var go = e.target.closest("[data-go]");
    if (go) {
      e.preventDefault();
      var where = go.dataset.go;
      show(where === "next" ? step + 1 : where === "prev" ? step - 1 : +where);
      return;
    }
    if (e.target.closest("[data-theme-toggle]")) { toggleTheme(); return; }
    if (e.target.closest("[data-fullscreen]")) { fullscreen(); return; }
    // a click anywhere on the slide moves on (documents, cards and heatmaps included); links,
    // buttons, form controls and a click that ends selecting text do not
    if (e.button !== 0 || e.target.closest("a, button, input, select, textarea, summary, label")) return;
    if (String(window.getSelection()).trim()) return;
    if (e.target.closest(".slides")) show(step + 1);
  });
  show(step);
})();
