// The example page's script: subscribe on a click, show the registration,
// and list the pushes and clicks the service worker reports.
(function () {
  "use strict";
  var q = new URLSearchParams(location.search);
  var app = q.get("app") || "default";
  var opts = {herald: location.origin, app: app, worker: "/sdk/herald-sw.js", scope: "/sdk/", backend: q.get("backend") || ""};
  document.getElementById("app").textContent = app;
  var status = document.getElementById("status");

  // The worker registers on load, so that pushes are shown even before
  // this browser subscribes here (a test may deliver one directly).
  window.heraldReady = Herald.supported() ? Herald.register(opts) : Promise.reject(new Error("no Web Push here"));

  document.getElementById("subscribe").addEventListener("click", function () {
    status.textContent = "Subscribing...";
    Herald.subscribe(opts).then(function (registration) {
      status.textContent = "Subscribed.";
      document.getElementById("registration").textContent = JSON.stringify(registration, null, 2);
    }, function (err) {
      status.textContent = "Not subscribed: " + err.message;
    });
  });

  if ("serviceWorker" in navigator) {
    navigator.serviceWorker.addEventListener("message", function (event) {
      var m = event.data || {};
      var li = document.createElement("li");
      if (m.type === "herald-push") li.textContent = "push " + m.push.herald_message_id + ": " + (m.push.title || "(silent)");
      else if (m.type === "herald-click") li.textContent = "click " + m.message_id + (m.action ? " (" + m.action + ")" : "") + " -> " + (m.url || "(no url)");
      else return;
      li.className = m.type;
      document.getElementById("pushes").appendChild(li);
    });
  }
})();
