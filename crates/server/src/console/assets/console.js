// sked console: the little that must happen in the browser. Pages work without it, except
// for following a running run's output live.
"use strict";

// Forms that change something for good ask first.
document.addEventListener("submit", (event) => {
  const question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// A run's output, streamed while the run is not over; the page reloads once it ends so its
// state and attempts are current.
async function follow(pre) {
  const url = pre.getAttribute("data-follow");
  const live = document.getElementById("live");
  try {
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok || !response.body) {
      if (live) live.textContent = "not live: " + response.status;
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      pre.textContent = text;
      pre.scrollTop = pre.scrollHeight;
    }
    if (live) live.textContent = "ended";
    window.setTimeout(() => window.location.reload(), 500);
  } catch (error) {
    if (live) live.textContent = "not live";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const pre = document.querySelector("pre[data-follow]");
  if (pre) follow(pre);
});

// The job form shows the inputs of the schedule and target kinds chosen.
function showChosenKinds(form) {
  for (const field of form.querySelectorAll("[data-shown-with]")) {
    const [select, value] = field.getAttribute("data-shown-with").split("=");
    const chosen = form.querySelector("select[name='" + select + "']");
    field.hidden = chosen !== null && chosen.value !== value;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.querySelector("form.job");
  if (!form) return;
  showChosenKinds(form);
  form.addEventListener("change", () => showChosenKinds(form));
});

// The keyboard: "/" goes to the search box, "g" then a letter goes to a page. Keys typed into
// a field are the field's.
const PAGES = { o: "/", j: "/jobs", r: "/grid", g: "/graph", w: "/workers", a: "/audit", p: "/preferences" };
let awaitingPage = 0;
document.addEventListener("keydown", (event) => {
  if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
  const target = event.target;
  if (target instanceof HTMLElement &&
      (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName))) {
    return;
  }
  if (awaitingPage && Date.now() - awaitingPage < 1500 && PAGES[event.key]) {
    awaitingPage = 0;
    event.preventDefault();
    window.location.assign(PAGES[event.key]);
    return;
  }
  awaitingPage = 0;
  if (event.key === "/") {
    const search = document.getElementById("search");
    if (search) {
      event.preventDefault();
      search.focus();
    }
  } else if (event.key === "g") {
    awaitingPage = Date.now();
  }
});

// Times in "this browser's zone": the preferences form learns the zone from the browser, and
// a page renews the visitor's choice when the browser's zone has moved (a laptop travels).
function browserZone() {
  try {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    return /^[A-Za-z0-9_+\/-]{1,64}$/.test(zone) ? zone : "";
  } catch (error) {
    return "";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const zone = browserZone();
  const field = document.getElementById("browser-zone");
  if (field) field.value = zone;
  const chosen = document.documentElement.getAttribute("data-zone") || "";
  if (zone && chosen.startsWith("browser:") && chosen !== "browser:" + zone) {
    const secure = window.location.protocol === "https:" ? "; Secure" : "";
    document.cookie = "sked_zone=browser:" + zone + "; Path=/; SameSite=Strict; Max-Age=31536000" + secure;
  }
});
