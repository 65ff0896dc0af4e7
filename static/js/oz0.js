/* oz0 console: live updates over the page's websocket, and a few small behaviours.
   No inline scripts anywhere (the CSP forbids them); htmx is configured by a meta tag. */
(function () {
  "use strict";

  // The page's socket (data-live on <body>) forwards {"type": "run.changed", ...}; every
  // fragment that listens for `oz0:changed from:body` fetches itself again.
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

  // A live refresh whose HTML is the same as the last one (relative times aside) is not
  // swapped: nothing on the page moves under the person's pointer for nothing.
  var lastHtml = new WeakMap();
  function stable(html) {
    return html.replace(/(<time[^>]*>)[^<]*(<\/time>)/g, "$1$2");
  }
  document.addEventListener("htmx:beforeSwap", function (event) {
    var elt = event.detail.elt;
    if (!elt || event.detail.target !== elt || (elt.getAttribute("hx-trigger") || "").indexOf("oz0:changed") < 0) {
      return;
    }
    var html = stable(event.detail.serverResponse || "");
    if (lastHtml.get(elt) === html) {
      event.detail.shouldSwap = false;
    }
    lastHtml.set(elt, html);
  });

  // Keep only the newest few toasts.
  document.addEventListener("htmx:afterSwap", function () {
    var toasts = document.querySelectorAll("#toasts .toast");
    for (var i = 6; i < toasts.length; i++) {
      toasts[i].remove();
    }
  });
})();
