// tether serve: the inbox refreshes itself. Plain script from the page's own origin (the
// content security policy allows nothing else); no framework, no CDN.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var every = Math.max(1, Number(live.getAttribute("data-every")) || 5) * 1000;

  function busy() {
    // never swap the lists under a person who is typing a name or a note
    var active = document.activeElement;
    if (active && live.contains(active) && active.tagName === "INPUT") { return true; }
    var fields = live.querySelectorAll("input[type=text]");
    for (var i = 0; i < fields.length; i++) { if (fields[i].value) { return true; } }
    return false;
  }

  function stamp(text) {
    var el = document.getElementById("live-stamp");
    if (el) { el.textContent = text; }
  }

  function refresh() {
    if (busy()) { stamp("(not refreshed while you type)"); return; }
    fetch(live.getAttribute("data-src"), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null || busy()) { return; }
        live.innerHTML = html;
        stamp("(updated " + new Date().toLocaleTimeString() + ")");
      })
      .catch(function () { stamp("(could not refresh)"); });
  }

  setInterval(refresh, every);
})();
