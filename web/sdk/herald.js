/*
 * Herald's page script for Web Push: it registers the service worker,
 * asks for permission, subscribes with the app's VAPID public key (which
 * Herald's public route gives) and hands the subscription to the site's
 * backend, which registers the device with Herald under the signed-in user
 * (a page never holds an API key). Plain JavaScript, no build step; served
 * by Herald at /sdk/herald.js, versioned with it.
 *
 *   <script src="https://push.example.com/sdk/herald.js"></script>
 *   button.onclick = () => Herald.subscribe({
 *     herald: "https://push.example.com",   // Herald's public address
 *     app: "default",                        // the app's name in Herald
 *     backend: "/push/subscription",        // the site's own route
 *     worker: "/herald-sw.js",              // the site's copy of the worker
 *   });
 *
 * subscribe must run from a user's gesture (a click): browsers ask for the
 * permission only then. It resolves to the registration it handed over:
 *   {channel: "webpush", app, subscription, application_server_key, installation_id}
 * which the backend posts to Herald's POST /v1/devices with the user's id.
 * unsubscribe ends the subscription and sends the backend the same body
 * with DELETE, so that it can delete the device.
 */
(function (global) {
  "use strict";

  var INSTALLATION = "herald.installation";

  function base(url) {
    return String(url || global.location.origin).replace(/\/+$/, "");
  }

  // installation is this browser's own id for the site, kept across
  // subscriptions: a subscription registered again under it replaces the
  // old one in Herald instead of adding a device.
  function installation() {
    var id = null;
    try {
      id = global.localStorage.getItem(INSTALLATION);
      if (!id) {
        id = global.crypto.randomUUID();
        global.localStorage.setItem(INSTALLATION, id);
      }
    } catch (e) {
      id = id || global.crypto.randomUUID();
    }
    return id;
  }

  function decodeKey(key) {
    var s = key.replace(/-/g, "+").replace(/_/g, "/");
    while (s.length % 4) s += "=";
    var raw = global.atob(s);
    var out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  function encodeKey(buf) {
    var bytes = new Uint8Array(buf);
    var s = "";
    for (var i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
    return global.btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function supported() {
    return "serviceWorker" in global.navigator && "PushManager" in global && "Notification" in global;
  }

  // register registers the service worker with the kit's settings in its
  // URL (see herald-sw.js) and resolves once it is active.
  function register(o) {
    var herald = base(o.herald);
    var worker = o.worker || herald + "/sdk/herald-sw.js";
    var q = new URLSearchParams({herald: herald, app: o.app || "default", installation: installation()});
    if (o.backend) q.set("backend", new URL(o.backend, global.location.href).href);
    var url = worker + (worker.indexOf("?") < 0 ? "?" : "&") + q.toString();
    var opts = o.scope ? {scope: o.scope} : undefined;
    return global.navigator.serviceWorker.register(url, opts).then(function (reg) {
      return global.navigator.serviceWorker.ready.then(function () { return reg; });
    });
  }

  // vapidKey is the app's VAPID public key, from Herald's public route.
  function vapidKey(o) {
    var url = base(o.herald) + "/v1/vapid-public-key?app=" + encodeURIComponent(o.app || "default");
    return global.fetch(url, {credentials: "omit"}).then(function (r) {
      return r.json().then(function (body) {
        if (!r.ok) throw new Error("Herald: " + ((body.error && body.error.message) || r.status));
        return body.vapid_public_key;
      });
    });
  }

  function send(o, method, body) {
    if (!o.backend) return Promise.resolve();
    return global.fetch(o.backend, {
      method: method, credentials: "include",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    }).then(function (r) {
      if (!r.ok) throw new Error("the backend answered " + r.status + " to " + method + " " + o.backend);
    });
  }

  function subscribe(o) {
    o = o || {};
    if (!supported()) return Promise.reject(new Error("this browser has no Web Push"));
    return global.Notification.requestPermission().then(function (permission) {
      if (permission !== "granted") throw new Error("notifications are " + permission + " for this site");
      return Promise.all([register(o), vapidKey(o)]);
    }).then(function (both) {
      var reg = both[0], key = both[1];
      return reg.pushManager.getSubscription().then(function (old) {
        // A subscription made with another key (the app's key was rotated)
        // is ended: pushes to it would be signed with a key it does not take.
        if (old && old.options.applicationServerKey && encodeKey(old.options.applicationServerKey) === key) return old;
        return (old ? old.unsubscribe() : Promise.resolve()).then(function () {
          return reg.pushManager.subscribe({userVisibleOnly: true, applicationServerKey: decodeKey(key)});
        });
      }).then(function (sub) {
        var registration = {
          channel: "webpush", app: o.app || "default", subscription: sub.toJSON(),
          application_server_key: key, installation_id: installation(),
        };
        return send(o, "POST", registration).then(function () { return registration; });
      });
    });
  }

  function unsubscribe(o) {
    o = o || {};
    if (!supported()) return Promise.resolve(false);
    return global.navigator.serviceWorker.getRegistration(o.scope).then(function (reg) {
      return reg ? reg.pushManager.getSubscription() : null;
    }).then(function (sub) {
      if (!sub) return false;
      var body = {channel: "webpush", app: o.app || "default", subscription: sub.toJSON(), installation_id: installation()};
      return sub.unsubscribe().then(function () { return send(o, "DELETE", body); }).then(function () { return true; });
    });
  }

  global.Herald = {
    version: "1",
    supported: supported,
    register: register,
    vapidKey: vapidKey,
    subscribe: subscribe,
    unsubscribe: unsubscribe,
    installation: installation,
  };
})(window);
