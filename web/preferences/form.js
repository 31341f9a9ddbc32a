// The user's own notification settings: the page a link Herald made opens
// (POST /v1/users/{id}/preferences/link). The link's fragment holds its
// token, the only credential, which goes to Herald in a header and never
// in an address. Once read, it is kept in this tab's session storage and
// taken off the address bar, so that an address copied or shown on a
// screenshot carries none.
(function () {
  "use strict";

  // The channels an opt-out may name, as a person knows them.
  const CHANNELS = [["apns", "iPhone/iPad"], ["fcm", "Android"], ["webpush", "Browser"]];
  const STORE = "herald-preferences-token";
  // Relative, as the page's own files are: Herald may be under a path of
  // its site.
  const API = "v1/preferences";

  const el = (id) => document.getElementById(id);
  const form = el("form"), status = el("status"), save = el("save");
  // The view as Herald last answered it: what the form started from.
  let shown = null;
  // Whether the person changed the quiet hours' choice since.
  let quietTouched = false;

  function takeToken() {
    const fromLink = new URLSearchParams(location.hash.slice(1)).get("token");
    try {
      if (!fromLink) return sessionStorage.getItem(STORE);
      sessionStorage.setItem(STORE, fromLink);
    } catch (err) {
      return fromLink; // No storage: the token lives as long as the page.
    }
    history.replaceState(null, "", location.pathname + location.search);
    return fromLink;
  }
  let token = takeToken();

  function say(text, isError) {
    status.textContent = text;
    status.classList.toggle("error", !!isError);
  }

  async function call(method, body) {
    const init = {method, headers: {"Authorization": "Bearer " + token}, cache: "no-store", credentials: "omit"};
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(API, init);
    const data = await res.json().catch(() => null);
    if (!res.ok) {
      const message = data && data.error && data.error.message;
      throw new Error(message || "Herald answered " + res.status + "; try again later.");
    }
    return data;
  }

  function checkbox(id, label, checked, channel) {
    const wrap = document.createElement("div");
    wrap.className = "check";
    const input = document.createElement("input");
    input.type = "checkbox";
    input.id = id;
    input.checked = checked;
    input.dataset.channel = channel;
    const text = document.createElement("label");
    text.htmlFor = id;
    text.textContent = label;
    wrap.append(input, text);
    return wrap;
  }

  // syncChannels lets a category's channels be chosen only while the
  // category is sent at all; what they say is kept either way.
  function syncChannels(group) {
    const all = group.querySelector('input[data-channel="all"]');
    for (const input of group.querySelectorAll(".channels input")) input.disabled = all.disabled || !all.checked;
  }

  function categoryRow(category, i, optedOut) {
    const group = document.createElement("fieldset");
    group.className = "group category";
    group.dataset.category = category.name;
    const legend = document.createElement("legend");
    legend.textContent = category.name;
    group.append(legend);
    const on = (channel) => category.critical || !optedOut.has(category.name + ":" + channel);
    const all = checkbox("c" + i + "-all", "Send me these", on(""), "all");
    group.append(all);
    const channels = document.createElement("div");
    channels.className = "channels";
    channels.setAttribute("role", "group");
    channels.setAttribute("aria-label", category.name + ": on which devices");
    for (const [channel, label] of CHANNELS) channels.append(checkbox("c" + i + "-" + channel, label, on(channel), channel));
    group.append(channels);
    if (category.critical) {
      group.dataset.critical = "true";
      for (const input of group.querySelectorAll("input")) input.disabled = true;
      const note = document.createElement("p");
      note.className = "hint";
      note.id = "c" + i + "-note";
      note.textContent = "Always sent: these cannot be turned off.";
      all.querySelector("input").setAttribute("aria-describedby", note.id);
      group.append(note);
    } else {
      all.querySelector("input").addEventListener("change", () => syncChannels(group));
      syncChannels(group);
    }
    return group;
  }

  function render(view) {
    shown = view;
    quietTouched = false;
    const optedOut = new Set(view.opt_outs.map((o) => o.category + ":" + (o.channel || "")));
    // The declared categories, then those the person opted out of that
    // are not declared, so that none is hidden from them.
    const categories = view.categories.slice();
    for (const o of view.opt_outs) {
      if (!categories.some((c) => c.name === o.category)) categories.push({name: o.category, critical: false});
    }
    const box = el("categories");
    box.replaceChildren(...categories.map((c, i) => categoryRow(c, i, optedOut)));
    if (categories.length === 0) {
      const none = document.createElement("p");
      none.textContent = "There are no kinds of reminders to choose from.";
      box.append(none);
    }
    renderQuiet(view);
  }

  function renderQuiet(view) {
    const def = view.default_quiet_hours, q = view.quiet_hours;
    const hasDefault = def !== null && def.start !== def.end;
    el("quiet-default-choice").hidden = !hasDefault;
    el("quiet-default-times").textContent = hasDefault ? "(" + def.start + " to " + def.end + ")" : "";
    el("quiet-zone").textContent = "Times are in the time zone " + view.timezone + ".";
    let mode = "on";
    if (q === null) mode = hasDefault ? "default" : "off";
    else if (q.start === q.end) mode = "off";
    el("quiet-" + mode).checked = true;
    const from = mode === "on" ? q : hasDefault ? def : {start: "22:00", end: "07:00"};
    el("quiet-start").value = from.start;
    el("quiet-end").value = from.end;
    syncQuiet();
  }

  function syncQuiet() {
    const own = el("quiet-on").checked;
    el("quiet-times").hidden = !own;
    el("quiet-start").disabled = el("quiet-end").disabled = !own;
  }

  function optOuts() {
    const out = [];
    for (const group of el("categories").querySelectorAll("fieldset.category")) {
      const name = group.dataset.category;
      if (group.dataset.critical) {
        // Shown as always on, which it is; what was stored stays.
        out.push(...shown.opt_outs.filter((o) => o.category === name));
        continue;
      }
      for (const input of group.querySelectorAll("input[type=checkbox]")) {
        if (input.checked) continue;
        const channel = input.dataset.channel;
        out.push(channel === "all" ? {category: name} : {category: name, channel});
      }
    }
    return out;
  }

  function quietHours() {
    const mode = form.querySelector("input[name=quiet]:checked").value;
    if (mode === "default") return null;
    if (mode === "off") {
      // Off as the person found it, with no default of the app's: they
      // set none, and take the app's should it set some later.
      if (!quietTouched && shown.quiet_hours === null) return null;
      return {start: "00:00", end: "00:00"};
    }
    const start = el("quiet-start").value.slice(0, 5), end = el("quiet-end").value.slice(0, 5);
    if (!start || !end) throw new Error("Choose when your quiet hours start and when they end.");
    if (start === end) throw new Error("Quiet hours must start and end at different times; choose Off for none.");
    return {start, end};
  }

  form.addEventListener("change", (ev) => {
    if (ev.target.name === "quiet") {
      quietTouched = true;
      syncQuiet();
    }
  });

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let body;
    try {
      body = {opt_outs: optOuts(), quiet_hours: quietHours()};
    } catch (err) {
      say(err.message, true);
      return;
    }
    save.disabled = true;
    say("Saving…");
    try {
      render(await call("PUT", body));
      say("Saved");
    } catch (err) {
      say(err.message, true);
    } finally {
      save.disabled = false;
    }
  });

  async function load() {
    const loading = el("loading");
    form.hidden = true;
    say("");
    if (!token) {
      loading.hidden = true;
      say("This page opens from a link in the app: open your notification settings from the app again.", true);
      return;
    }
    loading.hidden = false;
    try {
      render(await call("GET"));
      form.hidden = false;
    } catch (err) {
      say(err.message, true);
    } finally {
      loading.hidden = true;
    }
  }
  load();

  // A new link opened in this tab changes only the fragment: no page load.
  window.addEventListener("hashchange", () => {
    if (!new URLSearchParams(location.hash.slice(1)).has("token")) return;
    token = takeToken();
    load();
  });
})();
