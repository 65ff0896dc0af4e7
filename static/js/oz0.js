/* oz0 console: live updates over the page's websocket, and a few small behaviours.
   No inline scripts anywhere (the CSP forbids them); htmx is configured by a meta tag. */
(function () {
  "use strict";

  // The page's socket (data-live on <body>) forwards {"type": "run.changed", ...}; every
  // fragment that listens for `oz0:changed from:body` fetches itself again, sending the
  // fingerprint of what it shows: the server answers 204 (nothing to swap) when that is unchanged.
  function connect(path) {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var wait = 500;
    var opened = false;
    function open() {
      var socket = new WebSocket(scheme + window.location.host + path);
      socket.onopen = function () {
        wait = 500;
        document.body.classList.add("live-on");
        document.body.classList.remove("live-off");
        if (opened) {
          signal({ type: "reconnected" }); // catch up on what happened while we were away
        }
        opened = true;
      };
      socket.onmessage = function (message) {
        var data;
        try {
          data = JSON.parse(message.data);
        } catch (e) {
          return;
        }
        if (data && data.type === "run.changed") {
          signal(data);
        }
      };
      socket.onclose = function (event) {
        document.body.classList.remove("live-on");
        document.body.classList.add("live-off");
        if (event.code === 4403) {
          return; // no longer a member of this workspace: nothing more will come
        }
        window.setTimeout(open, wait);
        wait = Math.min(wait * 2, 10000);
      };
    }
    open();
  }

  function signal(data) {
    document.body.setAttribute("data-last-seq", String(data.seq || ""));
    if (window.htmx) {
      window.htmx.trigger(document.body, "oz0:changed", data);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var path = document.body.getAttribute("data-live");
    if (path) {
      connect(path);
    }
    document.body.classList.add("js");
  });

  document.addEventListener("click", function (event) {
    var close = event.target.closest && event.target.closest(".toast-close");
    if (close) {
      var toast = close.closest(".toast, .meanwhile");
      if (toast) {
        toast.remove();
      }
    }
  });

  // The task drawer closes in place (its link, without script, goes back to the run page).
  document.addEventListener("click", function (event) {
    var close = event.target.closest && event.target.closest(".drawer-close");
    var drawer = close && close.closest("#task-drawer");
    if (drawer) {
      event.preventDefault();
      drawer.innerHTML = "";
    }
  });

  document.addEventListener("change", function (event) {
    var select = event.target;
    if (select.matches && select.matches("[data-autosubmit]") && select.form) {
      select.form.requestSubmit();
    }
  });

  // Bulk repair's preview: unticking a run keeps the count, the button and the confirm's words
  // true to what is sent (the server repairs only the ticked ids, whatever this says).
  document.addEventListener("change", function (event) {
    var box = event.target;
    var form = box.matches && box.matches(".bulk-tick") && box.form;
    if (!form) { return; }
    var ticks = form.querySelectorAll(".bulk-tick");
    var ticked = 0, others = 0, secret = 0;
    for (var i = 0; i < ticks.length; i++) {
      if (!ticks[i].checked) { continue; }
      ticked += 1;
      var row = ticks[i].closest("tr");
      if (row && !row.hasAttribute("data-mine")) { others += 1; }
      if (row && row.hasAttribute("data-private")) { secret += 1; }
    }
    var shown = form.querySelector("[data-ticked]");
    if (shown) { shown.textContent = String(ticked); }
    var button = form.querySelector("button[data-bulk-confirm]");
    var words = form.getAttribute("data-verb-word") + " " + ticked + " ticked run" + (ticked === 1 ? "" : "s");
    if (button) {
      button.disabled = ticked === 0;
      button.textContent = words;
    }
    var whose = others ? " " + others + " of them other people's, " + secret + " private." : (secret ? " " + secret + " of them private." : "");
    form.setAttribute("hx-confirm", words + "?" + whose + " Each run is repaired as one click would; this cannot be undone.");
  });

  // Relative times ("waited 3m 02s", "23h 59m left") tick in the browser from <time datetime>.
  function duration(total) {
    total = Math.max(0, Math.floor(total));
    var days = Math.floor(total / 86400), hours = Math.floor((total % 86400) / 3600);
    var minutes = Math.floor((total % 3600) / 60), secs = total % 60;
    function two(n) { return (n < 10 ? "0" : "") + n; }
    if (days) { return days + "d " + hours + "h"; }
    if (hours) { return hours + "h " + two(minutes) + "m"; }
    if (minutes) { return minutes + "m " + two(secs) + "s"; }
    return secs + "s";
  }
  function tick() {
    var now = Date.now();
    var times = document.querySelectorAll("time[data-rel]");
    for (var i = 0; i < times.length; i++) {
      var at = Date.parse(times[i].getAttribute("datetime"));
      if (isNaN(at)) { continue; }
      var seconds = times[i].getAttribute("data-rel") === "left" ? (at - now) / 1000 : (now - at) / 1000;
      var text = duration(seconds);
      if (times[i].textContent !== text) { times[i].textContent = text; }
    }
  }
  window.setInterval(tick, 1000);

  // A refused POST (403, 404, 409) tells its reason as a toast, as a lost race does. htmx swaps
  // no error response by default: an answer the server made a toast (it names #toasts as its
  // target) is swapped like any other; any other error becomes a toast built here.
  var REFUSALS = {
    400: "The server could not read that request.",
    403: "Not allowed: your role cannot do this, or the page is stale (reload it).",
    404: "Not found: it is gone, or not yours to see.",
    409: "Not done: something changed first. The page shows what it is now.",
    429: "Too many requests: wait a moment and try again."
  };
  function showToast(title, detail) {
    var box = document.getElementById("toasts");
    if (!box) { return; }
    var toast = document.createElement("div");
    toast.className = "toast toast-warn";
    toast.setAttribute("role", "status");
    toast.setAttribute("data-outcome", "error");
    var body = document.createElement("div");
    var strong = document.createElement("strong");
    strong.textContent = title;
    body.appendChild(strong);
    body.appendChild(document.createTextNode(" " + detail));
    var close = document.createElement("button");
    close.type = "button";
    close.className = "toast-close";
    close.setAttribute("aria-label", "dismiss");
    close.textContent = "\u00d7";
    toast.appendChild(body);
    toast.appendChild(close);
    box.insertBefore(toast, box.firstChild);
  }
  function isWrite(detail) {
    var config = detail && detail.requestConfig;
    return !!config && String(config.verb || "").toLowerCase() !== "get";
  }
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    var target = event.detail.target;
    var toToasts = xhr && (xhr.getResponseHeader("HX-Retarget") === "#toasts" || (target && target.id === "toasts"));
    if (xhr && xhr.status >= 400 && toToasts) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
  document.addEventListener("htmx:responseError", function (event) {
    if (!isWrite(event.detail)) { return; }
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    showToast("Refused (" + status + ")", REFUSALS[status] || "The server could not do that; nothing was changed by this page.");
  });
  document.addEventListener("htmx:sendError", function (event) {
    if (!isWrite(event.detail)) { return; }
    showToast("Not sent", "The server could not be reached; check the connection and try again.");
  });

  // The inbox by keyboard: j/k move between items, a approves, d opens deny with its reason
  // focused, r focuses the answer. Keys typed into a field stay the field's.
  var current = { id: null, index: -1 };
  function inboxItems() {
    var list = document.getElementById("inbox-items");
    return list ? Array.prototype.slice.call(list.querySelectorAll("article.item")) : [];
  }
  function select(items, index, focus) {
    if (!items.length) { current = { id: null, index: -1 }; return null; }
    index = Math.max(0, Math.min(index, items.length - 1));
    for (var i = 0; i < items.length; i++) { items[i].classList.toggle("is-current", i === index); }
    current = { id: items[index].id, index: index };
    if (focus) {
      items[index].focus();
      items[index].scrollIntoView({ block: "nearest" });
    }
    return items[index];
  }
  function currentItem(items) {
    for (var i = 0; i < items.length; i++) {
      if (items[i].id === current.id) { return items[i]; }
    }
    return null;
  }
  function typing(target) {
    if (!target || !target.closest) { return false; }
    return !!target.closest("input, textarea, select, [contenteditable], [contenteditable='true']");
  }
  // A call that is not replayable has effects: `a` arms its approval (the hint shows), a second
  // `a` ticks its confirmation and approves; any other key disarms it.
  function disarm() {
    var armed = document.querySelectorAll("#inbox-items article.item[data-armed]");
    for (var i = 0; i < armed.length; i++) {
      armed[i].removeAttribute("data-armed");
      var hint = armed[i].querySelector(".confirm-hint");
      if (hint) { hint.hidden = true; }
    }
  }
  function approveWithEffects(item, control) {
    if (item.getAttribute("data-armed") !== "true") {
      disarm();
      item.setAttribute("data-armed", "true");
      var hint = item.querySelector(".confirm-hint");
      if (hint) { hint.hidden = false; }
      return;
    }
    disarm();
    var box = control.form && control.form.querySelector("input[name=confirm_effects]");
    if (box) { box.checked = true; }
    control.click();
  }
  // Ctrl+Enter (Cmd+Enter on a Mac) in an answer or an edited call sends its form.
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) { return; }
    var field = event.target;
    if (!field || !field.matches || !field.matches("textarea") || !field.form) { return; }
    event.preventDefault();
    field.form.requestSubmit();
  });
  document.addEventListener("keydown", function (event) {
    if (event.key !== "a") { disarm(); }
    if (event.key === "Escape" && typing(event.target)) {
      var owner = event.target.closest("article.item");
      if (owner) { owner.focus(); }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) { return; }
    var items = inboxItems();
    if (!items.length) { return; }
    var item = currentItem(items);
    var index = item ? items.indexOf(item) : -1;
    var control = null;
    switch (event.key) {
      case "j": select(items, index + 1, true); break;
      case "k": select(items, index < 0 ? 0 : index - 1, true); break;
      case "a":
        control = item && item.querySelector('button[data-verb="approve"]');
        if (control && control.getAttribute("data-effects") === "true") {
          approveWithEffects(item, control);
        } else if (control) {
          control.click();
        }
        break;
      case "d":
        control = item && item.querySelector("details.deny");
        if (control) {
          control.open = true;
          control.querySelector("input[name=reason]").focus();
        }
        break;
      case "r":
        control = item && item.querySelector("textarea[name=value]");
        if (control) { control.focus(); }
        break;
      default: return;
    }
    event.preventDefault();
  });
  // A click or tab into an item makes it the current one.
  document.addEventListener("focusin", function (event) {
    var item = event.target.closest && event.target.closest("#inbox-items article.item");
    if (item) { select(inboxItems(), inboxItems().indexOf(item), false); }
  });
  // A live refresh redraws the list: keep the current item (or the one now in its place), and
  // give it back the focus only when the focus was lost with the old markup. After the settle:
  // htmx's settling puts back the server's class on elements that keep their id.
  document.addEventListener("htmx:afterSettle", function (event) {
    if (current.id === null || !event.detail.target || event.detail.target.id !== "inbox-items") { return; }
    var items = inboxItems();
    var item = currentItem(items);
    var lost = !document.activeElement || document.activeElement === document.body;
    select(items, item ? items.indexOf(item) : current.index, lost);
  });

  // A half-typed deny reason or answer survives a live refresh (its box is hx-preserve'd). When
  // the refresh drops its item (someone decided it first), the refresh names the item as a draft,
  // the server says who decided it meanwhile, and the words typed are shown there, unsent.
  var drafts = {};
  function draftOf(field) {
    var item = field.closest("article.item");
    return item && item.getAttribute("data-task") ? item.getAttribute("data-run") + ":" + item.getAttribute("data-task") : null;
  }
  document.addEventListener("htmx:configRequest", function (event) {
    if (!event.detail.elt || event.detail.elt.id !== "inbox-items") { return; }
    var keep = {};
    var fields = document.querySelectorAll('#inbox-items details.deny input[name=reason], #inbox-items form.answer-form textarea[name=value]');
    for (var i = 0; i < fields.length; i++) {
      var key = draftOf(fields[i]);
      if (key && fields[i].value.trim()) { keep[key] = fields[i].value; }
    }
    var shown = document.querySelectorAll("#inbox-items .meanwhile[data-draft]");
    for (var j = 0; j < shown.length; j++) {
      var gone = shown[j].getAttribute("data-draft");
      if (drafts[gone] !== undefined) { keep[gone] = drafts[gone]; }
    }
    drafts = keep;
    var names = Object.keys(keep);
    if (names.length) { event.detail.parameters.draft = names; }
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    if (!event.detail.target || event.detail.target.id !== "inbox-items") { return; }
    var notes = document.querySelectorAll("#inbox-items .meanwhile[data-draft]");
    for (var i = 0; i < notes.length; i++) {
      var text = drafts[notes[i].getAttribute("data-draft")];
      var slot = notes[i].querySelector(".draft-text");
      if (slot && text) { slot.textContent = "What you typed was not sent: \u201c" + text + "\u201d"; }
    }
  });

  // Keep only the newest few toasts; each leaves by itself after a while (a refusal stays longer,
  // and none leaves while the pointer rests on it).
  var TOAST_MS = { ok: 6000, other: 15000 };
  function expire(toast) {
    if (toast.getAttribute("data-expires")) { return; }
    toast.setAttribute("data-expires", "true");
    var wait = toast.getAttribute("data-outcome") === "ok" ? TOAST_MS.ok : TOAST_MS.other;
    (function later() {
      window.setTimeout(function () {
        if (toast.matches(":hover")) { later(); return; }
        toast.remove();
      }, wait);
    })();
  }
  function tidyToasts() {
    var toasts = document.querySelectorAll("#toasts .toast");
    for (var i = 0; i < toasts.length; i++) {
      if (i >= 6) { toasts[i].remove(); } else { expire(toasts[i]); }
    }
  }
  document.addEventListener("htmx:afterSwap", tidyToasts);
  document.addEventListener("DOMContentLoaded", function () {
    var box = document.getElementById("toasts");
    if (box) { new MutationObserver(tidyToasts).observe(box, { childList: true }); }
    tidyToasts();
  });

  // The page title carries how many items wait on a person (the inbox's "All" count less the
  // client awaits, read-only here: its data-pending), kept as it changes.
  function titleCount() {
    var count = document.querySelector('#inbox-items [data-count="all"]');
    if (!count) { return; }
    var base = document.title.replace(/^\(\S+\) /, "");
    var text = (count.getAttribute("data-pending") || count.textContent).trim();
    document.title = text && text !== "0" ? "(" + text + ") " + base : base;
  }
  // A panel that starts collapsed on a narrow screen (Repair many) opens on a wide one.
  function openWide() {
    if (!window.matchMedia || !window.matchMedia("(min-width: 821px)").matches) { return; }
    document.querySelectorAll("details[data-open-wide]:not([data-opened])").forEach(function (panel) {
      panel.open = true;
      panel.setAttribute("data-opened", "");
    });
  }
  document.addEventListener("DOMContentLoaded", openWide);
  document.addEventListener("DOMContentLoaded", titleCount);
  document.addEventListener("htmx:afterSettle", titleCount);
})();
