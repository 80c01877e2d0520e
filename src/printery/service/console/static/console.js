// printery console: live fragments over server-sent events, and confirmations.
// The server renders every fragment; this only puts it in place.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var url = live && live.getAttribute("data-live");
  if (url && window.EventSource) {
    var source = new EventSource(url), pending = null;
    var put = function () {
      // Never replace a form someone is filling in: wait until they leave it.
      if (pending === null || live.contains(document.activeElement)) { return; }
      var open = {};
      live.querySelectorAll("details").forEach(function (d, i) { open[i] = d.open; });
      live.innerHTML = pending;
      pending = null;
      live.querySelectorAll("details").forEach(function (d, i) { if (open[i]) { d.open = true; } });
      live.setAttribute("data-updated", String(Date.now()));
    };
    source.onmessage = function (event) { pending = JSON.parse(event.data).html; put(); };
    live.addEventListener("focusout", function () { setTimeout(put, 0); });
    source.addEventListener("end", function () {
      source.close();
      live.setAttribute("data-ended", "true");
    });
  }
  document.addEventListener("submit", function (event) {
    var message = event.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) { event.preventDefault(); }
  });
})();
