// The semantic firewall (sandboxd/browser/_firewall.py, docs/browser.md "The semantic firewall").
//
// One function expression, called by _firewall.py's script() with (rules, onlyMainContent,
// limits). The agent evaluates it in an ISOLATED WORLD of the page (CDP
// Page.createIsolatedWorld + Runtime.evaluate with its contextId, returnByValue): the
// page's own JavaScript (its patched prototypes, JSON, getComputedStyle, setters on
// Object.prototype) lives in another world and is never called from here. It reads the live
// DOM (computed styles, boxes) and NEVER changes it: it serializes the flattened tree
// while skipping what a rule removes, in one synchronous pass, so no page script runs
// between the check and the copy (the capture is a consistent snapshot).
//
// Value: {html, removed: {rule: count}, removed_chars}. A count is one element (or
// comment) per removed subtree, under the first rule that removed it, in this order:
// non_content, hidden, aria_hidden, offscreen, zero_size, same_color. Text hidden on its own
// (an inherited visibility, font size or colour) counts once per element where the hiding
// starts. removed_chars: characters of text (and comments) left out, scripts' and styles'
// source excepted. Work is bounded (limits.nodes, limits.ms, limits.chars): what is left
// when a bound is hit is left out, counted under "limit" (once per unfinished level) and
// its text added to removed_chars (fail closed, and said so). Whatever the rules, the
// copy never holds on* handlers, style attributes, javascript:/vbscript: anywhere in an
// attribute, or SVG animation elements (which can set either).
(function (rules, onlyMainContent, limits) {
  "use strict";
  var on = {};
  for (var i = 0; i < rules.length; i++) on[rules[i]] = true;
  var judging = rules.length > 0; // with no rules, nothing is measured: a plain copy
  var removed = {};
  var removedChars = 0;
  var out = [];
  var outChars = 0;
  var visited = 0;
  var started = performance.now();
  var stopped = false;

  var HTML_NS = "http://www.w3.org/1999/xhtml";
  var NON_CONTENT = set("script style noscript template iframe frame frameset object embed " +
    "applet portal fencedframe head link meta base");
  // Replaced elements whose children are fallback, never rendered when the element is
  // (scripting is on, the element is supported): the element is kept, its children are not.
  var FALLBACK = set("canvas video audio progress meter");
  // SVG animation (SMIL) can set any attribute, an href to javascript: or an on* handler:
  // never copied, whatever the rules (it carries no text).
  var SMIL = set("animate set animateMotion animateTransform animateColor discard");
  var SVG_NS = "http://www.w3.org/2000/svg";
  var VOID = set("area base br col embed hr img input link meta source track wbr param keygen");
  var CODE_SOURCE = set("script style");
  var URL_ATTRS = set("href src action formaction poster cite background longdesc");
  var SAFE_NAME = /^[A-Za-z][A-Za-z0-9_.:-]*$/;
  var SAFE_TAG = /^[A-Za-z][A-Za-z0-9-]*$/;
  var BAD_SCHEME = /^(javascript|vbscript):/i;
  var BAD_SCHEME_ANYWHERE = /(javascript|vbscript):/i;
  var MAX_DEPTH = limits.depth;
  var MIN_FONT_PX = 2;
  var MIN_OPACITY = 0.05;
  var SAME_COLOR_DELTA_E = 10;

  function set(words) {
    var s = Object.create(null);
    words.split(" ").forEach(function (w) { s[w] = true; });
    return s;
  }

  function count(rule) {
    removed[rule] = (removed[rule] || 0) + 1;
  }

  function visibleText(s) {
    return /\S/.test(s);
  }

  // -- the page's geometry ---------------------------------------------------------------

  var root = document.documentElement;
  var vw = root.clientWidth || window.innerWidth;
  var vh = root.clientHeight || window.innerHeight;
  var sx = window.scrollX;
  var sy = window.scrollY;
  var VIEWPORT = {left: 0, top: 0, right: vw, bottom: vh};
  var INFINITE = {left: -Infinity, top: -Infinity, right: Infinity, bottom: Infinity};

  // The area a person can reach by scrolling, in viewport coordinates: the scroll area,
  // except along an axis the root does not scroll (overflow hidden or clip), where it is
  // the viewport.
  function documentArea() {
    var body = document.body;
    var rs = getComputedStyle(root);
    var bs = body ? getComputedStyle(body) : null;
    function clipsAxis(prop) {
      var v = rs[prop];
      if (v === "visible" && bs) v = bs[prop]; // the body's overflow propagates to the viewport
      return v === "hidden" || v === "clip";
    }
    var width = Math.max(root.scrollWidth, body ? body.scrollWidth : 0, vw);
    var height = Math.max(root.scrollHeight, body ? body.scrollHeight : 0, vh);
    var area = {left: -sx, top: -sy, right: width - sx, bottom: height - sy};
    if (clipsAxis("overflowX")) { area.left = 0; area.right = vw; }
    if (clipsAxis("overflowY")) { area.top = 0; area.bottom = vh; }
    return area;
  }
  var DOC_AREA = documentArea();

  // The canvas under everything: Chromium paints it #121212 under a dark colour scheme
  // (the root's color-scheme, else the color-scheme meta tag; "light dark" follows the
  // reader's preference), white otherwise. The root's and body's backgrounds are laid over
  // it by the walk (backgroundOf).
  function canvasColor() {
    var scheme = getComputedStyle(root).colorScheme || "normal";
    if (scheme === "normal") {
      var meta = document.querySelector("meta[name=color-scheme i]");
      scheme = meta ? (meta.getAttribute("content") || "normal") : "normal";
    }
    var words = scheme.toLowerCase().split(/\s+/);
    var dark = words.indexOf("dark") !== -1;
    if (dark && words.indexOf("light") !== -1) {
      dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
    }
    return dark ? [18, 18, 18, 1] : [255, 255, 255, 1];
  }
  var CANVAS = canvasColor();
  // In-flow content's right edge: an absolutely positioned box wholly beyond it (and the
  // viewport) is reachable only by scrolling sideways to it, which no reader does.
  var FLOW_RIGHT_DOC = Math.max(vw, root.getBoundingClientRect().right + sx);

  function intersect(a, b) {
    return {
      left: Math.max(a.left, b.left), top: Math.max(a.top, b.top),
      right: Math.min(a.right, b.right), bottom: Math.min(a.bottom, b.bottom)
    };
  }

  function outside(r, clip) {
    if (clip.right <= clip.left || clip.bottom <= clip.top) return true;
    return r.right <= clip.left || r.left >= clip.right || r.bottom <= clip.top ||
      r.top >= clip.bottom;
  }

  function clipsOverflow(v) {
    return v === "hidden" || v === "clip";
  }

  function scrolls(v) {
    return v === "auto" || v === "scroll";
  }

  // -- colours -----------------------------------------------------------------------------

  var colorCache = Object.create(null);
  var canvasContext = null;

  // [r, g, b, a] in sRGB 0-255 and alpha 0-1, or null when the value is not a colour.
  function parseColor(value) {
    if (value in colorCache) return colorCache[value];
    var c = null;
    var m = /^rgba?\(\s*([\d.]+)[,\s]+([\d.]+)[,\s]+([\d.]+)(?:\s*[,/]\s*([\d.]+)(%?))?\s*\)$/
      .exec(value);
    if (m) {
      var a = m[4] === undefined ? 1 : parseFloat(m[4]) / (m[5] ? 100 : 1);
      c = [parseFloat(m[1]), parseFloat(m[2]), parseFloat(m[3]), a];
    } else if (value === "transparent") {
      c = [0, 0, 0, 0];
    } else {
      c = paintColor(value);
    }
    colorCache[value] = c;
    return c;
  }

  // Modern colour syntaxes (oklch(), color(), lab()) as painted: one pixel on a canvas
  // that is never attached to the page.
  function paintColor(value) {
    try {
      if (!canvasContext) {
        var canvas = document.createElement("canvas");
        canvas.width = 1;
        canvas.height = 1;
        canvasContext = canvas.getContext("2d", {willReadFrequently: true});
      }
      var cx = canvasContext;
      cx.clearRect(0, 0, 1, 1);
      cx.fillStyle = "rgba(0, 0, 0, 0)";
      cx.fillStyle = value;
      cx.fillRect(0, 0, 1, 1);
      var d = cx.getImageData(0, 0, 1, 1).data;
      return [d[0], d[1], d[2], d[3] / 255];
    } catch (e) {
      return null;
    }
  }

  function over(top, bottom) { // top composited over an opaque bottom
    var a = top[3];
    return [top[0] * a + bottom[0] * (1 - a), top[1] * a + bottom[1] * (1 - a),
      top[2] * a + bottom[2] * (1 - a), 1];
  }

  function lab(c) {
    function lin(v) { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }
    var r = lin(c[0]), g = lin(c[1]), b = lin(c[2]);
    var x = (r * 0.4124 + g * 0.3576 + b * 0.1805) / 0.95047;
    var y = r * 0.2126 + g * 0.7152 + b * 0.0722;
    var z = (r * 0.0193 + g * 0.1192 + b * 0.9505) / 1.08883;
    function f(t) { return t > 0.008856 ? Math.cbrt(t) : 7.787 * t + 16 / 116; }
    var fx = f(x), fy = f(y), fz = f(z);
    return [116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)];
  }

  function deltaE(a, b) {
    var p = lab(a), q = lab(b);
    return Math.sqrt((p[0] - q[0]) * (p[0] - q[0]) + (p[1] - q[1]) * (p[1] - q[1]) +
      (p[2] - q[2]) * (p[2] - q[2]));
  }

  // An element's background as an opaque colour over its parent's, or null when an image
  // we cannot read lies under its text (then same_color cannot judge it and keeps it).
  function backgroundOf(cs, parentBg) {
    var image = cs.backgroundImage;
    var color = parseColor(cs.backgroundColor) || [0, 0, 0, 0];
    var base = parentBg;
    if (image && image !== "none") {
      var solid = solidGradient(image);
      if (!solid) return color[3] >= 0.99 ? null : null;
      base = base ? over(solid, base) : null;
    }
    if (color[3] >= 0.99) return [color[0], color[1], color[2], 1];
    if (!base) return null;
    return color[3] > 0 ? over(color, base) : base;
  }

  // The one colour a gradient paints, or null when it paints several or cannot be read. In
  // a single linear or radial gradient whose stops are placed in % (or at 0), a colour that
  // covers no length (a hard edge at 100%) paints nothing and does not count; anything
  // else (several layers, repeating, lengths) needs every stop to be the one colour.
  function solidGradient(image) {
    if (image.indexOf("url(") !== -1 || !/gradient\(/.test(image)) return null;
    var stops = [];
    var re = /(rgba?\([^)]*\))((?:\s+-?[\d.]+(?:px|%))*)/g, m;
    while ((m = re.exec(image))) {
      var c = parseColor(m[1]);
      if (!c) return null;
      var positions = m[2].trim() ? m[2].trim().split(/\s+/) : [];
      stops.push({color: c, positions: positions});
    }
    if (!stops.length) return null;
    var simple = (image.match(/gradient\(/g) || []).length === 1 && !/repeating/.test(image) &&
      /^(linear|radial)-gradient\(/.test(image);
    var painting = simple ? paintingStops(stops) : null;
    var colors = painting || stops.map(function (st) { return st.color; });
    var first = colors[0];
    for (var i = 1; i < colors.length; i++) {
      var k = colors[i];
      if (Math.abs(k[3] - first[3]) > 0.05 || deltaE(k, first) > 2) return null;
    }
    return first;
  }

  // The colours of a gradient's stops that paint some length of its line, or null when a
  // position is not in % (or 0px).
  function paintingStops(stops) {
    var flat = [];
    for (var i = 0; i < stops.length; i++) {
      var ps = stops[i].positions;
      if (!ps.length) { flat.push({color: stops[i].color, at: null}); continue; }
      for (var j = 0; j < ps.length; j++) {
        var v = ps[j];
        var at = /%$/.test(v) ? parseFloat(v) : parseFloat(v) === 0 ? 0 : NaN;
        if (isNaN(at)) return null;
        flat.push({color: stops[i].color, at: at});
      }
    }
    var n = flat.length;
    if (flat[0].at === null) flat[0].at = 0;
    if (flat[n - 1].at === null) flat[n - 1].at = 100;
    for (i = 1; i < n; i++) { // unplaced stops share the space between placed ones
      if (flat[i].at !== null) continue;
      var next = i;
      while (flat[next].at === null) next++;
      var from = flat[i - 1].at, step = (flat[next].at - from) / (next - i + 1);
      for (j = i; j < next; j++) flat[j].at = from + step * (j - i + 1);
    }
    for (i = 1; i < n; i++) flat[i].at = Math.max(flat[i].at, flat[i - 1].at);
    var painting = [];
    function covers(a, b) { return Math.min(b, 100) - Math.max(a, 0) > 0; }
    if (covers(-Infinity, flat[0].at)) painting.push(flat[0].color);
    for (i = 0; i + 1 < n; i++) {
      if (covers(flat[i].at, flat[i + 1].at)) painting.push(flat[i].color, flat[i + 1].color);
    }
    if (covers(flat[n - 1].at, Infinity)) painting.push(flat[n - 1].color);
    return painting.length ? painting : [flat[0].color];
  }

  // -- the rules, element by element ---------------------------------------------------------

  function px(v) {
    var n = parseFloat(v);
    return isNaN(n) ? 0 : n;
  }

  function filterOpacity(filter) {
    if (!filter || filter === "none") return 1;
    var o = 1;
    var re = /opacity\(\s*([\d.]+)(%?)\s*\)/g, m;
    while ((m = re.exec(filter))) o *= parseFloat(m[1]) / (m[2] ? 100 : 1);
    return o;
  }

  // A transform that flattens the box (scale(0), an edge-on rotation) shows nothing.
  function flattened(transform) {
    if (!transform || transform === "none") return false;
    var m = /^matrix(3d)?\(([^)]*)\)$/.exec(transform);
    if (!m) return false;
    var v = m[2].split(",").map(parseFloat);
    var det = m[1] ? v[0] * v[5] - v[1] * v[4] : v[0] * v[3] - v[1] * v[2];
    return Math.abs(det) < 1e-6;
  }

  // clip (absolutely positioned boxes) or clip-path that leaves nothing visible. A
  // clip-path this cannot measure (url(), path(), shape()) counts as hiding (fail closed).
  function clippedAway(cs, r, pos) {
    if ((pos === "absolute" || pos === "fixed") && cs.clip && cs.clip !== "auto") {
      var m = /rect\(([^)]*)\)/.exec(cs.clip);
      if (m) {
        var p = m[1].split(/[,\s]+/).filter(Boolean);
        if (p.length === 4) {
          var top = p[0] === "auto" ? 0 : px(p[0]);
          var right = p[1] === "auto" ? r.width : px(p[1]);
          var bottom = p[2] === "auto" ? r.height : px(p[2]);
          var left = p[3] === "auto" ? 0 : px(p[3]);
          if (right - left <= 1 || bottom - top <= 1) return true;
        }
      }
    }
    var cp = cs.clipPath;
    if (!cp || cp === "none") return false;
    return clipPathEmpty(cp, r.width, r.height);
  }

  function length(v, ref) {
    v = v.trim();
    if (/%$/.test(v)) return parseFloat(v) / 100 * ref;
    return px(v);
  }

  function clipPathEmpty(cp, w, h) {
    var m = /^(inset|circle|ellipse|polygon|rect|xywh)\((.*)\)(\s+[a-z-]+)?$/.exec(cp.trim());
    if (!m) return !/^[a-z-]+-box$/.test(cp.trim()); // a bare reference box clips nothing
    var args = m[2];
    var parts, i;
    switch (m[1]) {
      case "inset": {
        parts = args.split(/\s+round\s+/)[0].trim().split(/\s+/);
        var t = parts[0], rgt = parts[1] || t, b = parts[2] || t, l = parts[3] || rgt;
        return length(t, h) + length(b, h) >= h - 0.5 || length(l, w) + length(rgt, w) >= w - 0.5;
      }
      case "circle": {
        var radius = args.split(/\s+at\s+/)[0].trim();
        if (!radius || /closest|farthest/.test(radius)) return false;
        return length(radius, Math.sqrt((w * w + h * h) / 2)) < 0.5;
      }
      case "ellipse": {
        var radii = args.split(/\s+at\s+/)[0].trim().split(/\s+/);
        if (!radii[0] || /closest|farthest/.test(radii.join(" "))) return false;
        return length(radii[0], w) < 0.5 || length(radii[1] || radii[0], h) < 0.5;
      }
      case "polygon": {
        var pts = args.replace(/^\s*(nonzero|evenodd)\s*,/, "").split(",").map(function (p) {
          var xy = p.trim().split(/\s+/);
          return [length(xy[0] || "0", w), length(xy[1] || "0", h)];
        });
        var area = 0;
        for (i = 0; i < pts.length; i++) {
          var a = pts[i], b2 = pts[(i + 1) % pts.length];
          area += a[0] * b2[1] - b2[0] * a[1];
        }
        return Math.abs(area) / 2 < 1;
      }
      case "rect": {
        parts = args.split(/\s+round\s+/)[0].trim().split(/\s+/);
        if (parts.length < 4) return false;
        var rt = parts[0] === "auto" ? 0 : length(parts[0], h);
        var rr = parts[1] === "auto" ? w : length(parts[1], w);
        var rb = parts[2] === "auto" ? h : length(parts[2], h);
        var rl = parts[3] === "auto" ? 0 : length(parts[3], w);
        return rr - rl < 1 || rb - rt < 1;
      }
      case "xywh": {
        parts = args.split(/\s+round\s+/)[0].trim().split(/\s+/);
        if (parts.length < 4) return false;
        return length(parts[2], w) < 1 || length(parts[3], h) < 1;
      }
    }
    return true;
  }

  function carriesText(el) {
    if (el.shadowRoot || visibleText(el.textContent || "")) return true;
    if (el.hasAttribute("alt") || el.hasAttribute("value") || el.hasAttribute("placeholder")) {
      return true;
    }
    return !!el.querySelector("[alt],[value],[placeholder]");
  }

  // The context an element's children inherit.
  function Ctx(parent) {
    this.opacity = parent ? parent.opacity : 1;
    this.bg = parent ? parent.bg : CANVAS;
    this.clip = parent ? parent.clip : DOC_AREA;
    this.absClip = parent ? parent.absClip : DOC_AREA;
    this.containsFixed = parent ? parent.containsFixed : false;
    this.depth = parent ? parent.depth : 0;
    this.textRule = undefined; // the rule that hides this element's own text (null: none)
    this.textOrigin = null; // {rule, counted}: where that hiding started
  }

  function ariaHidden(el) {
    return /^\s*true\s*$/i.test(el.getAttribute("aria-hidden") || "");
  }

  // What happens to an element: [verdict, rule, ctx], verdict "remove" (its subtree, counted
  // under rule) or "keep" (ctx is what its children inherit; ctx.textRule, set later, may
  // still hide its own text).
  function judge(el, parent) {
    var ctx = new Ctx(parent);
    if (on.non_content && NON_CONTENT[el.localName]) return ["remove", "non_content", ctx];
    // Each computed property read costs: each is read once, and only where a rule needs it.
    var cs = getComputedStyle(el);
    var display = cs.display;
    var box = display !== "contents" && display !== "none";
    var filter = box ? cs.filter : "none";
    if (box) ctx.opacity *= px(cs.opacity) * filterOpacity(filter);
    var r = box ? el.getBoundingClientRect() : null;
    var pos = cs.position;
    if (on.hidden && (el.hasAttribute("hidden") || display === "none" ||
        cs.contentVisibility === "hidden" || (box && ctx.opacity < MIN_OPACITY) ||
        (box && clippedAway(cs, r, pos)) || (box && !rendered(el)))) {
      return ["remove", "hidden", ctx];
    }
    if (on.aria_hidden && ariaHidden(el)) return ["remove", "aria_hidden", ctx];
    var transform = box ? cs.transform : "none";
    var ox = false, oy = false, scrollX = false, scrollY = false;
    // The root and the body: their overflow is the viewport's (DOC_AREA has it).
    var canvas = el === root || el === document.body;
    if (box && !canvas && display !== "inline") { // overflow does not apply to inline boxes
      var overflowX = cs.overflowX, overflowY = cs.overflowY;
      ox = clipsOverflow(overflowX);
      oy = clipsOverflow(overflowY);
      scrollX = scrolls(overflowX);
      scrollY = scrolls(overflowY);
    }
    var clip = parent ? parent.clip : DOC_AREA;
    if (pos === "fixed") clip = parent && parent.containsFixed ? parent.absClip : VIEWPORT;
    else if (pos === "absolute") clip = parent ? parent.absClip : DOC_AREA;
    if (box && !canvas && (on.offscreen || on.zero_size)) {
      var rule = geometryRule(el, cs, r, clip, pos, transform, ox, oy, scrollX || scrollY);
      if (rule && carriesText(el)) return ["remove", rule, ctx];
    }
    var childClip = clip;
    if (ox || oy) {
      childClip = intersect(clip, {
        left: ox ? r.left : -Infinity, right: ox ? r.right : Infinity,
        top: oy ? r.top : -Infinity, bottom: oy ? r.bottom : Infinity
      });
    }
    if (scrollX || scrollY) {
      // A scroll container: a reader scrolls it through all of its scroll area.
      childClip = {left: childClip.left, right: childClip.right, top: childClip.top,
        bottom: childClip.bottom};
      if (scrollX) {
        childClip.left = r.left - el.scrollLeft;
        childClip.right = childClip.left + Math.max(el.scrollWidth, r.width);
      }
      if (scrollY) {
        childClip.top = r.top - el.scrollTop;
        childClip.bottom = childClip.top + Math.max(el.scrollHeight, r.height);
      }
    }
    ctx.clip = childClip;
    var transformed = transform !== "none" || filter !== "none";
    if (pos !== "static" || transformed) ctx.absClip = childClip;
    else ctx.absClip = parent ? parent.absClip : DOC_AREA;
    if (transformed) ctx.containsFixed = true;
    if (box && on.same_color) ctx.bg = backgroundOf(cs, parent ? parent.bg : CANVAS);
    ctx.cs = cs;
    ctx.rect = r;
    ctx.closedDetails = el.localName === "details" && el.namespaceURI === HTML_NS && !el.open;
    if (pseudoRules && box && display !== "inline" && (on.same_color || on.zero_size)) {
      var lineRule = firstLineRule(el, cs, ctx);
      if (lineRule && carriesText(el)) return ["remove", lineRule, ctx];
    }
    return ["keep", null, ctx];
  }

  // ::first-line and ::first-letter restyle a block's first words (and its inline
  // descendants'), which the element's own style does not show. When either hides its text
  // (a colour its background swallows, a font too small), the whole block is judged
  // hidden: which words the first line holds depends on the layout (with white-space:
  // nowrap, all of them), so fail closed. Read only when some style sheet names them.
  function firstLineRule(el, cs, ctx) {
    for (var i = 0; i < FIRST_PSEUDOS.length; i++) {
      var ps = getComputedStyle(el, FIRST_PSEUDOS[i]);
      if (ps.color === cs.color && ps.webkitTextFillColor === cs.webkitTextFillColor &&
          ps.fontSize === cs.fontSize) continue;
      if (on.zero_size && px(ps.fontSize) < MIN_FONT_PX) return "zero_size";
      if (!on.same_color) continue;
      var fill = parseColor(ps.webkitTextFillColor || ps.color) || parseColor(ps.color);
      var own = parseColor(ps.backgroundColor);
      var base = own && own[3] >= 0.99 ? own : ctx.bg;
      if (fill && base && !shows(fill, base, ctx.opacity)) return "same_color";
    }
    return null;
  }

  // Chromium's own answer for a box that is not painted though its style says display:
  // the content of a closed <details>, of a content-visibility:hidden ancestor (it still
  // lays them out when asked for their boxes).
  function rendered(el) {
    return typeof el.checkVisibility !== "function" || el.checkVisibility();
  }

  // offscreen or zero_size for a box (a box with no text is never removed for it: see
  // carriesText), or null.
  function geometryRule(el, cs, r, clip, pos, transform, ox, oy, scroller) {
    if (on.offscreen) {
      if (outside(r, clip)) return "offscreen";
      if (pos === "absolute" && r.left + sx >= FLOW_RIGHT_DOC) return "offscreen";
    }
    if (on.zero_size) {
      if (flattened(transform)) return "zero_size";
      // A scroll container under 2 px shows no content, however far it scrolls. A box that
      // clips its overflow to less than half its font size on an axis (the 1x1 px
      // screen-reader idiom without its clip, a 3 px box) shows at most a sliver of one
      // glyph: less than an x-height high, or half a letter wide.
      if (scroller && (r.width < 2 || r.height < 2)) return "zero_size";
      var sliver = Math.max(MIN_FONT_PX, px(cs.fontSize) / 2);
      if ((ox && r.width < sliver) || (oy && r.height < sliver)) return "zero_size";
      if (r.width * r.height === 0) {
        if (isVoid(el) || el.getClientRects().length === 0) return "zero_size";
        if ((r.width === 0 && ox) || (r.height === 0 && oy)) return "zero_size";
      }
      if (oy) {
        var lineHeight = cs.lineHeight;
        if (lineHeight !== "normal" && px(lineHeight) === 0 && r.height < px(cs.fontSize)) {
          return "zero_size";
        }
      }
    }
    return null;
  }

  var FIRST_PSEUDOS = ["::first-line", "::first-letter"];
  var PSEUDO_LINE = /:first-(line|letter)/i;
  var rulesScanned = 0;

  // Whether style sheets name ::first-line or ::first-letter (or cannot be read: a
  // cross-origin sheet, too many rules), so firstLineRule must be asked.
  function sheetsMention(sheets) {
    if (!sheets) return false;
    for (var i = 0; i < sheets.length; i++) {
      var rules;
      try { rules = sheets[i].cssRules; } catch (e) { return true; }
      if (rules && rulesMention(rules)) return true;
    }
    return false;
  }

  function rulesMention(rules) {
    for (var i = 0; i < rules.length; i++) {
      if (++rulesScanned > 100000) return true;
      var rule = rules[i];
      if (rule.selectorText && PSEUDO_LINE.test(rule.selectorText)) return true;
      if (rule.styleSheet && sheetsMention([rule.styleSheet])) return true; // @import
      if (rule.cssRules && rulesMention(rule.cssRules)) return true; // @media, nesting
    }
    return false;
  }

  var pseudoRules = sheetsMention(document.styleSheets) ||
    sheetsMention(document.adoptedStyleSheets);

  function isVoid(el) {
    return el.namespaceURI === HTML_NS && VOID[el.localName] === true;
  }

  // Why an element's own text nodes are hidden (inherited properties a child may undo).
  function ownTextRule(el, ctx) {
    var cs = ctx.cs;
    if (!cs) return null;
    if (on.hidden && (cs.visibility === "hidden" || cs.visibility === "collapse")) return "hidden";
    if (on.zero_size) {
      var size = px(cs.fontSize);
      var r = ctx.rect;
      if (r && el.offsetWidth > 0 && r.width > 0) size *= Math.min(1, r.width / el.offsetWidth);
      if (r && el.offsetHeight > 0 && r.height > 0) size *= Math.min(1, r.height / el.offsetHeight);
      if (size < MIN_FONT_PX) return "zero_size";
    }
    if (on.same_color) {
      var under;
      var base = ctx.bg;
      var paint = textPaint(el, cs);
      if (paint === undefined) return null; // a paint that cannot be judged (an image)
      if (paint) {
        // In the viewport, what is painted under the text decides (a box laid under it,
        // a picture); elsewhere, or when that is its ancestors, their background does.
        under = paintedUnder(el, ctx.rect, cs);
        base = under === undefined ? ctx.bg : under;
        if (!base || shows(paint, base, ctx.opacity)) return null;
      }
      if (!base) return null;
      // The fill does not show: another paint may draw the glyphs (a stroke, a shadow).
      if (otherPaintShows(el, cs, base, ctx.opacity)) return null;
      return "same_color";
    }
    return null;
  }

  function shows(color, base, opacity) {
    var seen = over([color[0], color[1], color[2], color[3] * opacity], base);
    return deltaE(seen, base) >= SAME_COLOR_DELTA_E;
  }

  // What fills an element's glyphs: a colour, null for no fill (SVG fill="none"), or
  // undefined when it cannot be judged (an SVG paint server, a background image clipped to
  // the text that is not one colour). SVG text is painted by fill and stroke, not color.
  function textPaint(el, cs) {
    if (el.namespaceURI === SVG_NS) {
      var paint = svgPaint(cs.fill, cs.fillOpacity);
      if (paint && paint[3] < MIN_OPACITY) return null;
      return paint && svgShapesUnder(el) ? undefined : paint;
    }
    var fill = parseColor(cs.webkitTextFillColor || cs.color) || parseColor(cs.color);
    var textClip = cs.webkitBackgroundClip === "text" || cs.backgroundClip === "text";
    if (textClip && cs.backgroundImage && cs.backgroundImage !== "none") {
      var solid = solidGradient(cs.backgroundImage);
      if (!solid) return undefined;
      // The fill is drawn over the clipped background: the background shows through it.
      return fill && fill[3] >= 0.99 ? fill : solid;
    }
    return fill || undefined;
  }

  function svgPaint(value, opacity) {
    if (!value || value === "none") return null;
    if (value.indexOf("url(") !== -1) return undefined;
    var c = parseColor(value);
    if (!c) return undefined;
    return [c[0], c[1], c[2], c[3] * px(opacity)];
  }

  // SVG text may lie on a shape of its own drawing (a chart's bar), which is no background:
  // then only "no paint at all" is judged. Cached per outermost svg.
  var svgShapes = new Map();
  function svgShapesUnder(el) {
    var svg = el.ownerSVGElement;
    while (svg && svg.ownerSVGElement) svg = svg.ownerSVGElement;
    if (!svg) return false;
    if (!svgShapes.has(svg)) {
      svgShapes.set(svg, !!svg.querySelector(
        "rect, circle, ellipse, path, polygon, polyline, line, image, use, foreignObject"));
    }
    return svgShapes.get(svg);
  }

  // A stroke (-webkit-text-stroke, SVG stroke) or a sharp text shadow that shows on base.
  function otherPaintShows(el, cs, base, opacity) {
    var size = px(cs.fontSize);
    if (el.namespaceURI === SVG_NS) {
      var stroke = svgPaint(cs.stroke, cs.strokeOpacity);
      if (stroke === undefined) return true;
      var drawn = stroke && px(cs.strokeWidth) > 0;
      if (drawn && (svgShapesUnder(el) || shows(stroke, base, opacity))) return true;
    } else if (px(cs.webkitTextStrokeWidth) > 0) {
      var sc = parseColor(cs.webkitTextStrokeColor);
      if (sc && shows(sc, base, opacity)) return true;
    }
    var shadow = cs.textShadow;
    if (!shadow || shadow === "none") return false;
    var re = /(rgba?\([^)]*\))\s+(-?[\d.]+)px\s+(-?[\d.]+)px(?:\s+([\d.]+)px)?/g, m;
    while ((m = re.exec(shadow))) {
      // Readable: blurred by at most a quarter of the font size, drawn near the text.
      var c = parseColor(m[1]);
      var blur = m[4] === undefined ? 0 : parseFloat(m[4]);
      var near = Math.abs(parseFloat(m[2])) <= 2 * size && Math.abs(parseFloat(m[3])) <= 2 * size;
      if (c && near && blur <= size / 4 && shows(c, base, opacity)) return true;
    }
    return false;
  }

  var PICTURES = set("img video canvas svg picture object embed iframe input textarea select");

  // What is painted under an element's centre when that is in the viewport and not its
  // own ancestors' (a hero image, a sibling box laid under it): that box's opaque colour,
  // null when it is a picture or an image we cannot read, undefined when the ancestors
  // are what lies under it (or the centre is outside the viewport: hit-testing works
  // there only, and scrolling to test would change the page).
  function paintedUnder(el, r, cs) {
    if (!r || r.width * r.height <= 0) return undefined;
    if (cs.backgroundImage !== "none") return undefined; // its own background is under it
    var own = parseColor(cs.backgroundColor);
    if (own && own[3] > 0) return undefined;
    var x = r.left + r.width / 2, y = r.top + r.height / 2;
    if (x < 0 || y < 0 || x >= vw || y >= vh) return undefined;
    var stack = document.elementsFromPoint(x, y);
    var at = stack.indexOf(el);
    if (at === -1) return undefined;
    for (var i = at + 1; i < stack.length; i++) {
      var below = stack[i];
      if (below.contains(el) || (el.getRootNode() !== document && composedContains(below, el))) {
        return undefined;
      }
      if (PICTURES[below.localName] || below.namespaceURI === SVG_NS) return null;
      var bcs = getComputedStyle(below);
      if (bcs.backgroundImage && bcs.backgroundImage !== "none") return null;
      var c = parseColor(bcs.backgroundColor);
      if (c && c[3] >= 0.99) return [c[0], c[1], c[2], 1];
    }
    return undefined;
  }

  function composedContains(outer, el) {
    for (var n = el; n; n = n.parentNode || n.host) if (n === outer) return true;
    return false;
  }

  // -- text geometry (text-indent, overflow clipping of bare text) ------------------------

  var range = document.createRange();

  // Whether an element's own text surely lies inside its box and its box inside what is
  // visible, so its text needs no measuring (most text; measuring every node is slow). An
  // inline box wraps its text; a block's text may overflow it (scroll size) or be indented
  // away (text-indent).
  function textInside(ctx) {
    if (ctx.inside !== undefined) return ctx.inside;
    var r = ctx.rect, c = ctx.clip, cs = ctx.cs, el = ctx.el;
    var inside = !!r && r.width * r.height > 0 && r.left >= c.left && r.right <= c.right &&
      r.top >= c.top && r.bottom <= c.bottom;
    if (inside && cs.display !== "inline") {
      inside = px(cs.textIndent) >= 0 && el.scrollWidth <= el.clientWidth + 1 &&
        el.scrollHeight <= el.clientHeight + 1;
    }
    ctx.inside = inside;
    return inside;
  }

  // A line box shows when at least half its height and 2 px of its width lie inside the
  // clip: less than half a line shows no legible glyph (the bottom of a descender, the top
  // of a capital). Wholly inside: shown, no need to measure its words.
  function lineShows(q, clip) {
    var i = intersect(q, clip);
    return i.bottom - i.top >= q.height / 2 && i.right - i.left >= Math.min(2, q.width);
  }

  function wholly(q, clip) {
    return q.left >= clip.left - 0.5 && q.right <= clip.right + 0.5 &&
      q.top >= clip.top - 0.5 && q.bottom <= clip.bottom + 0.5;
  }

  // What clipping leaves of a text node: null (all of it shows), a rule (none of it does),
  // or "split" (some of its lines do: emitVisibleWords keeps the words that show).
  function textGeometryRule(node, ctx) {
    if (!(on.offscreen || on.zero_size)) return null;
    range.selectNodeContents(node);
    var rects = range.getClientRects();
    var anyArea = false, anyShown = false, allWhole = true;
    for (var i = 0; i < rects.length; i++) {
      var q = rects[i];
      if (q.width * q.height <= 0) continue;
      anyArea = true;
      if (!wholly(q, ctx.clip)) allWhole = false;
      if (lineShows(q, ctx.clip)) anyShown = true;
    }
    if (!anyArea) return on.zero_size ? "zero_size" : null;
    if (!anyShown) return on.offscreen ? "offscreen" : null;
    if (allWhole || !on.offscreen) return null;
    return "split";
  }

  // The words of a partly clipped text node that show (more than half of a word's box
  // inside the clip, each way); the others are counted, under offscreen, with ctx's origin.
  // Each word is one Range measurement (about 0.1 ms): the work bound is checked here too.
  function emitVisibleWords(node, ctx, origin) {
    var data = node.data;
    var re = /\s*\S+\s*/g, m, kept = "", left = 0, words = 0;
    while ((m = re.exec(data))) {
      if ((++words & 255) === 0 && overBudget()) { // a huge node: the rest is left out
        stopped = true;
        count("limit");
        left += data.length - m.index;
        break;
      }
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      var rects = range.getClientRects(), shown = false;
      for (var i = 0; i < rects.length && !shown; i++) {
        var q = rects[i];
        var x = intersect(q, ctx.clip);
        shown = q.width * q.height > 0 && x.bottom - x.top >= q.height / 2 &&
          x.right - x.left >= q.width / 2;
      }
      if (shown) kept += m[0];
      else left += m[0].length;
    }
    if (left) {
      if (!origin.counted) { count(origin.rule); origin.counted = true; }
      removedChars += left;
    }
    emit(escapeText(kept));
  }

  // -- serialization -----------------------------------------------------------------------

  function escapeText(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/\u00a0/g, "&nbsp;");
  }

  function escapeAttr(s) {
    return s.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;")
      .replace(/>/g, "&gt;");
  }

  function absolute(url) {
    try {
      var u = new URL(url.trim(), document.baseURI).href;
      if (BAD_SCHEME.test(u)) return null;
      return u.replace(/\(/g, "%28").replace(/\)/g, "%29");
    } catch (e) {
      return null;
    }
  }

  // A srcset's candidates ("url descriptors, ..."), each URL made absolute; a URL is a run
  // of non-spaces (a data: URL may hold commas).
  function srcset(value) {
    var parts = [];
    var i = 0, n = value.length;
    while (i < n) {
      while (i < n && /[\s,]/.test(value[i])) i++;
      var start = i;
      while (i < n && !/\s/.test(value[i])) i++;
      var url = value.slice(start, i);
      var descriptor = "";
      if (/,$/.test(url)) {
        url = url.replace(/,+$/, "");
      } else {
        var d = i, depth = 0;
        while (i < n && (value[i] !== "," || depth > 0)) {
          if (value[i] === "(") depth++;
          if (value[i] === ")") depth--;
          i++;
        }
        descriptor = value.slice(d, i).trim();
      }
      if (!url) continue;
      var abs = absolute(url);
      if (abs !== null) parts.push(descriptor ? abs + " " + descriptor : abs);
    }
    return parts.join(", ");
  }

  function emit(s) {
    out.push(s);
    outChars += s.length;
    if (outChars > limits.chars) stopped = true;
  }

  function openTag(el) {
    var s = "<" + el.localName;
    var attrs = el.attributes;
    for (var i = 0; i < attrs.length; i++) {
      var a = attrs[i];
      var an = a.name.toLowerCase();
      if (!SAFE_NAME.test(a.name) || an.slice(0, 2) === "on" || an === "style") continue;
      if (an === "title" && on.hidden) continue; // a tooltip: unseen until hovered
      var v = a.value;
      if (URL_ATTRS[an] || an === "xlink:href") {
        v = absolute(v);
        if (v === null) continue;
      } else if (an === "srcset" || an === "imagesrcset") {
        v = srcset(v);
      } else if (BAD_SCHEME_ANYWHERE.test(v.replace(/[\s\u0000-\u001f]+/g, ""))) {
        continue;
      }
      s += " " + a.name + '="' + escapeAttr(v) + '"';
    }
    return s + ">";
  }

  function emitComment(node) {
    var d = node.data.replace(/--/g, "- -").replace(/-$/, "- ");
    if (/^-?>/.test(d)) d = " " + d;
    emit("<!--" + d + "-->");
  }

  // A node's children in the flattened tree (its first child, or an array): an open shadow
  // root's (a closed one is out of
  // reach: its content is left out, the host's light children are judged as if unslotted),
  // a slot's assigned nodes (or its fallback content), a template's content.
  function childrenOf(node) {
    if (node.shadowRoot) return node.shadowRoot.firstChild;
    if (node.localName === "slot" && typeof node.assignedNodes === "function") {
      var assigned = node.assignedNodes();
      if (assigned.length) return assigned;
    }
    if (node.localName === "template" && node.content) return node.content.firstChild;
    return node.firstChild;
  }

  // Text a removed subtree held: scripts' and styles' source is code, not text.
  function subtreeChars(el) {
    if (CODE_SOURCE[el.localName]) return 0;
    var holder = el.localName === "template" && el.content ? el.content : el;
    var n = (holder.textContent || "").length;
    var code = holder.querySelectorAll("script, style");
    for (var i = 0; i < code.length; i++) n -= (code[i].textContent || "").length;
    if (el.shadowRoot) n += (el.shadowRoot.textContent || "").length;
    n += (el.getAttribute("alt") || "").length; // an image's words are its alt text
    var pictures = holder.querySelectorAll("[alt]");
    for (i = 0; i < pictures.length; i++) n += (pictures[i].getAttribute("alt") || "").length;
    return Math.max(0, n);
  }

  // A shadow host's light children that no slot shows are not rendered: hidden.
  function countUnslotted(host) {
    if (!on.hidden) return;
    var kids = host.childNodes;
    for (var i = 0; i < kids.length; i++) {
      var k = kids[i];
      if (k.assignedSlot || (k.nodeType !== 1 && k.nodeType !== 3)) continue;
      var t = k.textContent || "";
      if (k.nodeType === 1 || visibleText(t)) {
        count("hidden");
        removedChars += k.nodeType === 1 ? subtreeChars(k) : t.length;
      }
    }
  }

  // The text a work bound leaves out: this node's and its later siblings' (scripts' source
  // included: an upper bound, cheap to take).
  function leftOutChars(node, frame) {
    var n = (node.textContent || "").length;
    if (frame.list) {
      var list = frame.list;
      for (var i = frame.at; i < list.length; i++) n += (list[i].textContent || "").length;
    } else {
      for (var s = frame.next; s; s = s.nextSibling) n += (s.textContent || "").length;
    }
    return n;
  }

  function overBudget() {
    return visited > limits.nodes || performance.now() - started > limits.ms;
  }

  // The walk: iterative (a 10,000-deep tree cannot overflow the stack). Each frame is a
  // cursor over one node's children in the flattened tree (a sibling chain, or an array
  // for a slot's assigned nodes), with the ctx they inherit, whether they are in scope and
  // the closing tag to emit after them. Out of scope (main-content mode) only the main
  // content's ancestors are visited, to judge them, and nothing is emitted.
  function walk(start, path, main, prune) {
    var stack = [{next: start, list: null, at: 0, ctx: null, scope: !path, close: null}];
    while (stack.length) {
      var frame = stack[stack.length - 1];
      var node;
      if (frame.list) {
        node = frame.at < frame.list.length ? frame.list[frame.at++] : null;
      } else {
        node = frame.next;
        if (node) frame.next = node === start ? null : node.nextSibling;
      }
      if (!node) {
        stack.pop();
        if (frame.close) emit(frame.close);
        continue;
      }
      if (stopped || ((++visited & 255) === 0 && overBudget())) {
        stopped = true;
        count("limit"); // this node and its later siblings: left out, and counted
        if (frame.scope) removedChars += leftOutChars(node, frame);
        frame.list = null;
        frame.next = null;
        continue;
      }
      var parent = frame.ctx, inScope = frame.scope;
      var type = node.nodeType;
      if (!inScope && !(type === 1 && path.has(node))) continue;
      if (type === 3) { text(node, parent); continue; }
      if (type === 8) { comment(node); continue; }
      if (type !== 1) continue;
      if (SMIL[node.localName] && node.namespaceURI === SVG_NS) continue;
      if (prune && prune(node)) continue;
      var verdict = judging ? judge(node, parent) : ["keep", null, new Ctx(parent)];
      var ctx = verdict[2];
      if (verdict[0] === "remove") {
        count(verdict[1]);
        removedChars += subtreeChars(node);
        continue;
      }
      ctx.depth = parent ? parent.depth + 1 : 1;
      ctx.el = node;
      ctx.parent = parent;
      if (judging && node.shadowRoot) countUnslotted(node);
      if (judging && node.shadowRoot && !pseudoRules) {
        pseudoRules = sheetsMention(node.shadowRoot.styleSheets) ||
          sheetsMention(node.shadowRoot.adoptedStyleSheets);
      }
      var childScope = inScope || node === main;
      var close = null;
      if (childScope && ctx.depth <= MAX_DEPTH && SAFE_TAG.test(node.localName) &&
          node.localName !== "slot") {
        emit(openTag(node));
        if (isVoid(node)) continue;
        close = "</" + node.localName + ">";
      }
      if (judging && on.non_content && FALLBACK[node.localName] && node.namespaceURI === HTML_NS) {
        // Fallback content, never rendered: the element stays, its children do not.
        if (node.firstElementChild || visibleText(node.textContent || "")) {
          count("non_content");
          removedChars += (node.textContent || "").length;
        }
        if (close) emit(close);
        continue;
      }
      var kids = childrenOf(node);
      if (Array.isArray(kids)) {
        stack.push({next: null, list: kids, at: 0, ctx: ctx, scope: childScope, close: close});
      } else if (kids) {
        stack.push({next: kids, list: null, at: 0, ctx: ctx, scope: childScope, close: close});
      } else if (close) {
        emit(close);
      }
    }
  }

  // An element's own-text rule, worked out at its first words: the hiding is counted once
  // where it starts (a parent hidden the same way, already judged, shares its count).
  function settleTextRule(ctx) {
    ctx.textRule = ownTextRule(ctx.el, ctx);
    var parent = ctx.parent;
    if (ctx.textRule) {
      ctx.textOrigin = parent && parent.textRule === ctx.textRule && parent.textOrigin
        ? parent.textOrigin : {rule: ctx.textRule, counted: false};
    }
  }

  function comment(node) {
    if (on.non_content) {
      count("non_content");
      removedChars += node.data.length;
    } else {
      emitComment(node);
    }
  }

  function text(node, ctx) {
    var data = node.data;
    if (!visibleText(data)) { emit(escapeText(data)); return; }
    if (ctx && judging && ctx.textRule === undefined) settleTextRule(ctx);
    var rule = ctx ? ctx.textRule : null;
    var origin = ctx ? ctx.textOrigin : null;
    if (!rule && ctx && ctx.closedDetails && on.hidden) {
      // Text directly inside a closed <details>: only its summary is rendered.
      rule = "hidden";
      if (!ctx.detailsOrigin) ctx.detailsOrigin = {rule: rule, counted: false};
      origin = ctx.detailsOrigin;
    }
    if (!rule && ctx && ctx.cs && !textInside(ctx)) {
      rule = textGeometryRule(node, ctx);
      if (rule === "split") {
        if (!ctx.geometryOrigin) ctx.geometryOrigin = {rule: "offscreen", counted: false};
        emitVisibleWords(node, ctx, ctx.geometryOrigin);
        return;
      }
      if (rule) {
        if (!ctx.geometryOrigin) ctx.geometryOrigin = {rule: rule, counted: false};
        origin = ctx.geometryOrigin;
      }
    }
    if (rule) {
      if (!origin.counted) { count(origin.rule); origin.counted = true; }
      removedChars += data.length;
      return;
    }
    emit(escapeText(data));
  }

  // -- main content ------------------------------------------------------------------------

  var BOILERPLATE = "head, nav, aside, dialog, [role=navigation], [role=banner], " +
    "[role=contentinfo], [role=complementary], [role=search], [role=dialog], " +
    "[role=alertdialog], [aria-modal=true]";
  var COOKIE = /(^|[^a-z])(cookies?|consent|gdpr|cmp|onetrust|cookiebot)([^a-z]|$)/i;
  var SECTIONING = "article, aside, main, nav, section";

  // What main-content mode leaves out of a page that has no main or article element.
  function boilerplate(el) {
    if (el.matches(BOILERPLATE)) return true;
    var name = el.localName;
    if ((name === "header" || name === "footer") &&
        !(el.parentElement && el.parentElement.closest(SECTIONING))) {
      return true;
    }
    var label = (el.id || "") + " " + (el.getAttribute("class") || "");
    if (COOKIE.test(label)) {
      var p = getComputedStyle(el).position;
      if (p === "fixed" || p === "sticky" || (el.textContent || "").length < 3000) return true;
    }
    return false;
  }

  // The main content: the largest rendered main (or [role=main]), else the largest article.
  function mainContent() {
    var found = document.querySelectorAll("main, [role=main]");
    if (!found.length) found = document.querySelectorAll("article");
    var best = null, bestSize = -1;
    for (var i = 0; i < found.length; i++) {
      var r = found[i].getBoundingClientRect();
      var size = (r.width * r.height > 0 ? 1e15 : 0) + (found[i].textContent || "").length;
      if (size > bestSize) { best = found[i]; bestSize = size; }
    }
    return best;
  }

  // -- the capture --------------------------------------------------------------------------

  var main = onlyMainContent ? mainContent() : null;
  if (main) {
    var path = new Set();
    for (var n = main; n; n = n.parentNode || n.host) path.add(n);
    emit("<html><body>");
    walk(root, path, main, null);
    emit("</body></html>");
  } else {
    walk(root, null, null, onlyMainContent ? boilerplate : null);
  }
  return {html: out.join(""), removed: removed, removed_chars: removedChars};
})
