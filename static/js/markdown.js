/* Model output as markdown, made inert: marked turns it into HTML, DOMPurify keeps only
   harmless elements and attributes. Nothing from a model ever reaches innerHTML otherwise. */
(function () {
  "use strict";

  const parser = new marked.Marked({ gfm: true, breaks: true });

  // Beyond DOMPurify's defaults: no images or media (a remote image in an answer could carry
  // the conversation out to a stranger's server), no forms, no styles, no embedded documents.
  const PURIFY = {
    FORBID_TAGS: ["style", "img", "picture", "video", "audio", "source", "track", "svg", "math",
      "iframe", "frame", "object", "embed", "form", "input", "button", "textarea", "select",
      "option", "link", "meta", "base", "dialog"],
    FORBID_ATTR: ["style", "class", "id", "srcset"],
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#|\/(?!\/))/i,
  };

  DOMPurify.addHook("afterSanitizeAttributes", function (node) {
    if (node.tagName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  });

  function toSafeHtml(text) {
    return DOMPurify.sanitize(parser.parse(String(text || ""), { async: false }), PURIFY);
  }

  window.Markdown = {
    toSafeHtml: toSafeHtml,
    renderInto: function (element, text) {
      element.innerHTML = toSafeHtml(text);
    },
  };
})();
