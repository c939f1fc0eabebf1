// reveal.js — where the eye is: when a run starts, its progress box (swapped in out of band with
// data-reveal) is scrolled into view if it is not already wholly on screen, so a long document
// never leaves only a sliver of it below the fold.
(function () {
  "use strict";
  document.addEventListener("htmx:afterSettle", function () {
    var box = document.querySelector("#run-progress[data-reveal]");
    if (!box) return;
    box.removeAttribute("data-reveal");
    var r = box.getBoundingClientRect();
    if (r.top < 0 || r.bottom > window.innerHeight) box.scrollIntoView({ block: "center" });
  });
})();
