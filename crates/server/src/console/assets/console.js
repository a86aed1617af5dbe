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
