// The little glue the dashboard needs: show whether the live socket is connected.
document.body.addEventListener("htmx:wsOpen", () => document.getElementById("live-indicator")?.classList.add("on"));
document.body.addEventListener("htmx:wsClose", () => document.getElementById("live-indicator")?.classList.remove("on"));
