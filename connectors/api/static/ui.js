// firstfault pages: small progressive enhancements; every page works without this script.
(function () {
  "use strict";

  // Show each UTC stamp's local time on hover: on-call engineers think in their own zone.
  function localTimes() {
    document.querySelectorAll("time[datetime]").forEach(function (t) {
      var when = new Date(t.getAttribute("datetime"));
      if (!isNaN(when)) t.title = "local: " + when.toLocaleString();
    });
  }

  // Flag which summary elements fit the first screen. The summary is meant to be
  // read without scrolling; the flag lets screenshots and tests check that it is.
  function markFirstScreen() {
    var height = window.innerHeight || document.documentElement.clientHeight;
    document.querySelectorAll("[data-summary]").forEach(function (el) {
      var r = el.getBoundingClientRect();
      el.setAttribute("data-first-screen", r.top >= 0 && r.bottom <= height ? "true" : "false");
    });
  }

  // Hovering a timeline mark highlights its row in the event table.
  function linkMarks() {
    document.querySelectorAll(".mark[href^='#']").forEach(function (m) {
      var row = document.getElementById(m.getAttribute("href").slice(1));
      if (!row) return;
      m.addEventListener("mouseenter", function () { row.classList.add("hover"); row.style.outline = "2px solid #fdd663"; });
      m.addEventListener("mouseleave", function () { row.classList.remove("hover"); row.style.outline = ""; });
    });
  }

  function ready() {
    localTimes();
    markFirstScreen();
    linkMarks();
    document.documentElement.setAttribute("data-ui-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
})();
