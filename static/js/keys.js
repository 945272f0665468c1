// The API keys page: a Copy button beside the new key, the Home Assistant fields and each
// example. Without this script the buttons stay hidden and the text is selected by hand.
// navigator.clipboard exists only on secure pages (https or localhost); a box on the LAN is
// usually plain http, so the fallback selects the text and asks the browser to copy it.
(function () {
  "use strict";

  function copyText(text, source) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    var done = false;
    try { done = document.execCommand("copy"); } catch (e) { done = false; }
    // The text stays selected when copying failed, ready for Ctrl+C.
    if (done) selection.removeAllRanges();
    return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  document.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
    var source = document.getElementById(button.dataset.copy);
    if (!source) return;
    button.hidden = false;
    var label = button.textContent;
    button.addEventListener("click", function () {
      copyText(source.textContent, source).then(
        function () { button.textContent = "Copied"; },
        function () { button.textContent = "Selected: press Ctrl+C"; }
      ).then(function () {
        setTimeout(function () { button.textContent = label; }, 2000);
      });
    });
  });
})();
