// Renders the math that pymdownx.arithmatex (generic: true) marks up: an inline
// <span class="arithmatex">\(...\)</span> or a display <div class="arithmatex">\[...\]</div>.
// KaTeX 0.19.1 (MIT, see katex/LICENSE) is vendored in katex/ (its woff2 fonts only), so the
// site needs no CDN.
(function () {
  function render(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (el.querySelector(".katex")) return;
      var tex = el.textContent.trim();
      var display = el.tagName !== "SPAN";
      var m = tex.match(/^\\\(([\s\S]*)\\\)$/) || tex.match(/^\\\[([\s\S]*)\\\]$/);
      if (m) tex = m[1];
      katex.render(tex, el, { displayMode: display, throwOnError: false });
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(function (doc) { render(doc.body || document.body); });
  } else {
    document.addEventListener("DOMContentLoaded", function () { render(document.body); });
  }
})();
