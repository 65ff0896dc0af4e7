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
      var toast = close.closest(".toast");
      if (toast) {
        toast.remove();
      }
    }
  });

  document.addEventListener("change", function (event) {
    var select = event.target;
    if (select.matches && select.matches("[data-autosubmit]") && select.form) {
      select.form.requestSubmit();
    }
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
    if (xhr && xhr.status >= 400 && xhr.getResponseHeader("HX-Retarget") === "#toasts") {
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
  document.addEventListener("keydown", function (event) {
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
        if (control) { control.click(); }
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

  // Keep only the newest few toasts.
  document.addEventListener("htmx:afterSwap", function () {
    var toasts = document.querySelectorAll("#toasts .toast");
    for (var i = 6; i < toasts.length; i++) {
      toasts[i].remove();
    }
  });
})();
