// art-proxy dashboard: live updates, filters that apply on change. No other script runs here
// (the Content-Security-Policy allows this file only).
//
// Every element with `data-live` and an id is refreshed from the same page every two seconds.
// The server renders (and escapes) the fresh page; DOMParser builds it without running anything;
// a region is swapped only when its HTML changed, and open <details> stay open. A fresh page
// with no live region left (a trajectory that finished) ends the polling.
"use strict";

(() => {
  const PERIOD_MS = 2000;
  const status = document.getElementById("live-status");
  const served = new Map(); // region id -> the HTML the server last sent for it

  for (const region of document.querySelectorAll("[data-live][id]")) {
    served.set(region.id, region.innerHTML);
  }

  function say(text, offline) {
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("offline", offline);
  }

  function swap(region, html) {
    const open = new Set(
      Array.from(region.querySelectorAll("details[id][open]"), (details) => details.id),
    );
    const closed = new Set(
      Array.from(region.querySelectorAll("details[id]:not([open])"), (details) => details.id),
    );
    region.innerHTML = html;
    for (const details of region.querySelectorAll("details[id]")) {
      if (open.has(details.id)) details.open = true;
      if (closed.has(details.id)) details.open = false;
    }
  }

  let timer = null;

  async function refresh() {
    if (document.hidden) return;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const [id, html] of served) {
        const region = document.getElementById(id);
        const next = fresh.getElementById(id);
        if (region === null || next === null || next.innerHTML === html) continue;
        served.set(id, next.innerHTML);
        swap(region, next.innerHTML);
      }
      if (fresh.querySelector("[data-live]") === null) {
        window.clearInterval(timer);
        say("up to date", false);
        return;
      }
      say(`live · ${new Date().toLocaleTimeString()}`, false);
    } catch (error) {
      say(`not updating (${error.message}); retrying`, true);
    }
  }

  for (const form of document.querySelectorAll("form[data-autosubmit]")) {
    for (const select of form.querySelectorAll("select")) {
      select.addEventListener("change", () => form.submit());
    }
  }

  if (served.size > 0) {
    say("live", false);
    timer = window.setInterval(refresh, PERIOD_MS);
  }
})();
