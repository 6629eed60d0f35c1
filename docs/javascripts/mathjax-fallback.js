// A page whose maths did not load says so. If MathJax (loaded after this file from
// $DILOCO_MATHJAX_URL or the CDN) never ran, by the time the page has loaded the equations
// are still raw LaTeX; put a visible warning above them instead of leaving the reader to guess.
(function () {
  "use strict";

  function mathJaxRan() {
    // javascripts/mathjax.js sets window.MathJax to a plain configuration object;
    // MathJax itself replaces it with an object that has a startup component.
    return Boolean(window.MathJax && window.MathJax.startup);
  }

  function warn() {
    var formulas = document.querySelectorAll(".arithmatex");
    if (mathJaxRan() || formulas.length === 0 || document.getElementById("diloco-maths-not-loaded")) {
      return;
    }
    var note = document.createElement("div");
    note.id = "diloco-maths-not-loaded";
    note.className = "admonition warning";
    note.setAttribute("role", "alert");
    var title = document.createElement("p");
    title.className = "admonition-title";
    title.textContent = "The equations on this page did not load";
    var body = document.createElement("p");
    body.appendChild(document.createTextNode(
      "MathJax could not be loaded, so the " + formulas.length + " formulas below are shown as raw " +
      "LaTeX. Reading offline? Build the site with "));
    var command = document.createElement("code");
    command.textContent = "make docs-offline";
    body.appendChild(command);
    body.appendChild(document.createTextNode(", which ships MathJax with it."));
    note.appendChild(title);
    note.appendChild(body);
    var content = document.querySelector("article") || document.body;
    content.insertBefore(note, content.firstChild);
  }

  // "load" fires once every script has run or failed, MathJax's included.
  window.addEventListener("load", warn);
})();
