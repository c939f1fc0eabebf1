// exports.js — the run page's share and export buttons that need the browser: "Copy link" (the
// address bar is the permalink of the current view) and PNG pictures, drawn here from the server's
// SVG of the same view (the SVG URL is the link's href, so without scripts it downloads the SVG).
(function () {
  "use strict";
  var status = document.getElementById("copy-status");

  function say(text) { if (status) { status.textContent = text; setTimeout(function () { status.textContent = ""; }, 4000); } }

  function download(blob, name) {
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    setTimeout(function () { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }

  // SVG text → PNG blob at twice the SVG's size (sharp on high-density screens and in slides)
  function svgToPng(svgText) {
    return new Promise(function (resolve, reject) {
      var url = URL.createObjectURL(new Blob([svgText], { type: "image/svg+xml" }));
      var img = new Image();
      img.onload = function () {
        var scale = 2, canvas = document.createElement("canvas");
        canvas.width = img.naturalWidth * scale;
        canvas.height = img.naturalHeight * scale;
        var ctx = canvas.getContext("2d");
        ctx.fillStyle = "#fff";
        ctx.fillRect(0, 0, canvas.width, canvas.height);
        ctx.scale(scale, scale);
        ctx.drawImage(img, 0, 0);
        URL.revokeObjectURL(url);
        canvas.toBlob(function (blob) { blob ? resolve(blob) : reject(new Error("the picture could not be drawn")); }, "image/png");
      };
      img.onerror = function () { URL.revokeObjectURL(url); reject(new Error("the SVG could not be read")); };
      img.src = url;
    });
  }
  window.kvnotesExports = { svgToPng: svgToPng };

  document.addEventListener("click", function (event) {
    var png = event.target.closest("a[data-png]");
    if (png) {
      event.preventDefault();
      say("drawing " + png.dataset.png + "…");
      fetch(png.href).then(function (r) {
        if (!r.ok) throw new Error("the server answered " + r.status);
        return r.text();
      }).then(svgToPng).then(function (blob) {
        download(blob, png.dataset.png);
        say("saved " + png.dataset.png);
      }).catch(function (err) { say("Could not make the PNG: " + err.message); });
      return;
    }
    var copy = event.target.closest("[data-copy-link]");
    if (copy) {
      var link = location.href;
      (navigator.clipboard ? navigator.clipboard.writeText(link) : Promise.reject(new Error("no clipboard")))
        .then(function () { say("Link copied: " + link); })
        .catch(function () { window.prompt("Copy this link", link); });
    }
  });
})();
