/*
 * Herald's service worker for Web Push: it shows each push Herald sends as
 * the payload promises (title, body, icon, image, badge, actions, tag, the
 * url opened on a click), tells Herald what the browser saw (a "delivered"
 * receipt when the push arrives, "opened" when it is clicked), and
 * subscribes again when the browser replaces the subscription.
 *
 * Served by Herald at /sdk/herald-sw.js, versioned with it. A service worker
 * must come from the page's own origin, so a site either serves a copy of
 * this file, or a worker of its own that sets its settings and imports it:
 *
 *   self.HERALD = {url: "https://push.example.com", app: "default", backend: "/push/subscription"};
 *   importScripts("https://push.example.com/sdk/herald-sw.js");
 *
 * The settings may also come in the worker's own URL, as herald.js
 * registers it: herald-sw.js?herald=URL&app=NAME&backend=PATH&installation=ID.
 *   url           Herald's public address, where receipts go (default: this
 *                 worker's origin)
 *   app           the app whose VAPID key a new subscription is made with
 *   backend       where the site's backend takes a subscription (herald.js's
 *                 body: POST to register, DELETE to forget); it registers the
 *                 device with Herald under the signed-in user
 *   installation  the browser's installation id, so that a replaced
 *                 subscription stays the same device in Herald
 *
 * Pushes that are not Herald's (no herald_message_id) are left alone, for
 * the site's own handlers.
 */
(function () {
  "use strict";

  var KIT = "herald-sw/1";

  function settings() {
    var q = new URL(self.location.href).searchParams;
    var s = self.HERALD || {};
    var url = s.url || q.get("herald") || self.location.origin;
    return {
      url: String(url).replace(/\/+$/, ""),
      app: s.app || q.get("app") || "default",
      backend: s.backend || q.get("backend") || "",
      installation: s.installation || q.get("installation") || "",
    };
  }

  // extend keeps the worker alive until work is done. An event a script
  // made (not the browser) cannot be extended, and its work runs all the
  // same.
  function extend(event, work) {
    try {
      event.waitUntil(work);
    } catch (e) {
      // untrusted event: nothing to extend
    }
    return work;
  }

  // postReceipt tells Herald what became of a push. A receipt that cannot
  // be posted is dropped: the push itself matters more than its receipt.
  function postReceipt(token, event) {
    if (!token) return Promise.resolve();
    return fetch(settings().url + "/v1/receipts", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({receipts: [{token: token, event: event, device_time: new Date().toISOString()}]}),
      credentials: "omit",
      keepalive: true,
    }).catch(function () {});
  }

  // tell hands an event to the site's open pages, which may listen with
  // navigator.serviceWorker.addEventListener("message", ...).
  function tell(message) {
    return self.clients.matchAll({type: "window", includeUncontrolled: true}).then(function (pages) {
      pages.forEach(function (p) { p.postMessage(message); });
    });
  }

  // options are the Notification API's options of a push: Herald names its
  // display fields as they are named there. A push without a tag of its own
  // takes its message's id, so that a second copy of a message replaces
  // the first instead of showing twice.
  function options(push) {
    var body = push.body || "";
    if (push.subtitle) body = body ? push.subtitle + "\n" + body : push.subtitle;
    var o = {
      body: body,
      tag: push.tag || push.herald_message_id,
      data: {
        herald_message_id: push.herald_message_id,
        herald_receipt: push.herald_receipt || "",
        url: push.url || "",
        data: push.data || {},
      },
    };
    ["icon", "image", "badge", "actions"].forEach(function (k) {
      if (push[k]) o[k] = push[k];
    });
    if (push.renotify) o.renotify = true;
    if (push.requireInteraction) o.requireInteraction = true;
    return o;
  }

  function badge(count) {
    if (count === undefined || count === null || !self.navigator.setAppBadge) return Promise.resolve();
    var set = count > 0 ? self.navigator.setAppBadge(count) : self.navigator.clearAppBadge();
    return set.catch(function () {});
  }

  self.addEventListener("push", function (event) {
    var push = null;
    try {
      push = event.data ? event.data.json() : null;
    } catch (e) {
      push = null;
    }
    if (!push || !push.herald_message_id) return;
    var work = [postReceipt(push.herald_receipt, "delivered"), badge(push.app_badge), tell({type: "herald-push", push: push})];
    if (!push.silent) {
      work.push(self.registration.showNotification(push.title || "", options(push)));
    }
    extend(event, Promise.all(work));
  });

  // open focuses a page already at url, else opens one; without a url, the
  // worker's scope (the site).
  function open(url) {
    var target = new URL(url || self.registration.scope, self.location.href).href;
    return self.clients.matchAll({type: "window", includeUncontrolled: true}).then(function (pages) {
      for (var i = 0; i < pages.length; i++) {
        if (pages[i].url === target && "focus" in pages[i]) return pages[i].focus();
      }
      return self.clients.openWindow(target);
    });
  }

  self.addEventListener("notificationclick", function (event) {
    var d = event.notification.data || {};
    if (!d.herald_message_id) return;
    event.notification.close();
    extend(event, Promise.all([
      postReceipt(d.herald_receipt, "opened"),
      tell({type: "herald-click", action: event.action || "", message_id: d.herald_message_id, url: d.url, data: d.data}),
      open(d.url).catch(function () {}),
    ]));
  });

  function decodeKey(key) {
    var s = key.replace(/-/g, "+").replace(/_/g, "/");
    while (s.length % 4) s += "=";
    var raw = atob(s);
    var out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  function encodeKey(buf) {
    var bytes = new Uint8Array(buf);
    var s = "";
    for (var i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  // The browser replaced the subscription (it expired, or the push service
  // rotated it): subscribe again with the app's key as Herald gives it now,
  // and hand the new subscription to the site's backend, with the
  // installation id that makes it the same device in Herald.
  function resubscribe(event) {
    var s = settings();
    var fresh = event.newSubscription
      ? Promise.resolve(event.newSubscription)
      : fetch(s.url + "/v1/vapid-public-key?app=" + encodeURIComponent(s.app), {credentials: "omit"})
        .then(function (r) {
          if (!r.ok) throw new Error("Herald answered " + r.status + " for the app's VAPID key");
          return r.json();
        })
        .then(function (k) {
          return self.registration.pushManager.subscribe({userVisibleOnly: true, applicationServerKey: decodeKey(k.vapid_public_key)});
        });
    return fresh.then(function (sub) {
      var key = sub.options && sub.options.applicationServerKey ? encodeKey(sub.options.applicationServerKey) : "";
      var registration = {channel: "webpush", app: s.app, subscription: sub.toJSON(), application_server_key: key};
      if (s.installation) registration.installation_id = s.installation;
      var sent = s.backend
        ? fetch(new URL(s.backend, self.location.href).href, {
          method: "POST", credentials: "include",
          headers: {"Content-Type": "application/json"}, body: JSON.stringify(registration),
        })
        : Promise.resolve();
      return Promise.all([sent, tell({type: "herald-subscription", registration: registration})]);
    });
  }

  self.addEventListener("pushsubscriptionchange", function (event) {
    extend(event, resubscribe(event).catch(function () {}));
  });

  // A new version of the kit takes over at once, rather than after every
  // page of the site was closed.
  self.addEventListener("install", function () { self.skipWaiting(); });
  self.addEventListener("activate", function (event) { extend(event, self.clients.claim()); });

  self.HERALD_KIT = KIT;
})();
