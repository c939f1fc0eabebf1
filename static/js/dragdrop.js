// dragdrop.js — place compiled skills into the document: drag one from the palette onto a drop
// zone (between paragraphs, or at the end); drag a placement to move it; ↑ / ↓ / ✕ buttons on a
// placement. Keyboard: Enter on a palette skill starts placing, ↑/↓ choose the spot, Enter
// places, Esc cancels; on a focused placement Alt+↑/↓ moves it and Delete removes it.
// Requests go to the page routes; their answer swaps the document out of band (htmx.swap).
(function () {
  "use strict";
  var dragged = null; // {skill: id} or {placement: id}
  var keyboard = null; // {skill: id, zones: [...], index}

  function notebookId() { var d = document.getElementById("document"); return d ? d.dataset.notebook : null; }

  function post(url, values) {
    var body = new URLSearchParams(values || {});
    return fetch(url, { method: "POST", body: body, headers: { "HX-Request": "true" } }).then(function (resp) {
      return resp.text().then(function (text) {
        if (!resp.ok) {
          var message = text;
          try { message = JSON.parse(text).detail; } catch (e) { /* plain text */ }
          announce("Could not place the skill: " + message, true);
          return;
        }
        htmx.swap(document.body, text, { swapStyle: "none" });
      });
    });
  }

  function announce(message, isError) {
    var status = document.getElementById("token-status");
    if (status) { status.textContent = message; status.style.color = isError ? "var(--bad)" : ""; }
  }

  function place(skillId, position) {
    return post("/notebooks/" + notebookId() + "/placements", { skill_id: skillId, position: position });
  }
  function move(placementId, values) {
    return post("/notebooks/" + notebookId() + "/placements/" + placementId + "/move", values);
  }

  // --- mouse -----------------------------------------------------------------------------------
  document.addEventListener("dragstart", function (event) {
    var skill = event.target.closest && event.target.closest(".palette-skill");
    var placement = event.target.closest && event.target.closest(".placement");
    if (!skill && !placement) return;
    dragged = skill ? { skill: skill.dataset.skillId } : { placement: placement.dataset.placementId };
    event.dataTransfer.effectAllowed = skill ? "copy" : "move";
    event.dataTransfer.setData("text/plain", skill ? skill.dataset.skillName : "placement");
    document.body.classList.add("dragging-skill");
  });
  document.addEventListener("dragend", function () {
    dragged = null;
    document.body.classList.remove("dragging-skill");
    document.querySelectorAll(".dropzone.over").forEach(function (z) { z.classList.remove("over"); });
  });
  document.addEventListener("dragover", function (event) {
    var zone = event.target.closest && event.target.closest(".dropzone");
    if (!zone || !dragged) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = dragged.skill ? "copy" : "move";
    document.querySelectorAll(".dropzone.over").forEach(function (z) { if (z !== zone) z.classList.remove("over"); });
    zone.classList.add("over");
  });
  document.addEventListener("drop", function (event) {
    var zone = event.target.closest && event.target.closest(".dropzone");
    if (!zone || !dragged) return;
    event.preventDefault();
    var what = dragged;
    dragged = null;
    document.body.classList.remove("dragging-skill");
    if (what.skill) place(what.skill, zone.dataset.position);
    else move(what.placement, { position: zone.dataset.position });
  });

  // --- buttons on a placement -------------------------------------------------------------------
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest(".placement button");
    if (!button) return;
    var id = button.closest(".placement").dataset.placementId;
    if (button.hasAttribute("data-remove")) post("/notebooks/" + notebookId() + "/placements/" + id + "/delete");
    else move(id, { step: button.dataset.move });
  });

  // --- keyboard ---------------------------------------------------------------------------------
  function showKeyboardZone() {
    keyboard.zones.forEach(function (z, i) { z.classList.toggle("active", i === keyboard.index); });
    var zone = keyboard.zones[keyboard.index];
    zone.scrollIntoView({ block: "center", behavior: "smooth" });
    announce("Placing a skill: ↑/↓ choose a spot (" + (keyboard.index + 1) + " of " + keyboard.zones.length + "), Enter places, Esc cancels");
  }
  function stopKeyboard() {
    if (!keyboard) return;
    keyboard.zones.forEach(function (z) { z.classList.remove("kbd-target", "active"); });
    if (keyboard.source) { keyboard.source.setAttribute("aria-pressed", "false"); keyboard.source.focus(); }
    keyboard = null;
  }
  document.addEventListener("keydown", function (event) {
    if (keyboard) {
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        keyboard.index = Math.max(0, Math.min(keyboard.zones.length - 1, keyboard.index + (event.key === "ArrowDown" ? 1 : -1)));
        showKeyboardZone();
      } else if (event.key === "Enter") {
        event.preventDefault();
        var zone = keyboard.zones[keyboard.index], skill = keyboard.skill;
        stopKeyboard();
        place(skill, zone.dataset.position);
      } else if (event.key === "Escape") {
        stopKeyboard();
        announce("");
      }
      return;
    }
    var skill = event.target.closest && event.target.closest(".palette-skill");
    if (skill && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      var zones = Array.prototype.slice.call(document.querySelectorAll("#document .dropzone"));
      if (!zones.length) return;
      zones.forEach(function (z) { z.classList.add("kbd-target"); });
      skill.setAttribute("aria-pressed", "true");
      keyboard = { skill: skill.dataset.skillId, zones: zones, index: zones.length - 1, source: skill };
      showKeyboardZone();
      return;
    }
    var placement = event.target.closest && event.target.closest(".placement");
    if (placement && event.target === placement) {
      if (event.altKey && (event.key === "ArrowUp" || event.key === "ArrowDown")) {
        event.preventDefault();
        move(placement.dataset.placementId, { step: event.key === "ArrowUp" ? "-1" : "1" }).then(function () {
          var again = document.getElementById(placement.id);
          if (again) again.focus();
        });
      } else if (event.key === "Delete" || event.key === "Backspace") {
        event.preventDefault();
        post("/notebooks/" + notebookId() + "/placements/" + placement.dataset.placementId + "/delete");
      }
    }
  });
})();
